;;;; agent/profile.lisp --- profile: code run under SB-SPROF, a flat report,
;;;; or under SB-PROFILE, the calls of named functions
;;;;
;;;; The code runs in the thread that read the request (as inspect's code
;;;; does, `evaluate-for-inspection'), and only that thread is sampled.
;;;; SB-SPROF is required the first time, so it is looked up by name.
;;;; SB-PROFILE is part of SBCL's core; the image may be the programmer's,
;;;; so only the functions asked for (and not profiled already) are
;;;; profiled, and exactly those are unprofiled afterwards.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

(defparameter *profile-max-samples* 200000
  "Samples kept per profile: 2,000 s of CPU at the default 0.01 s interval.")

(defun sprof (name)
  "The function NAME of SB-SPROF, which is loaded on the first call."
  (unless (find-package "SB-SPROF")
    (require :sb-sprof))
  (fdefinition (find-symbol name "SB-SPROF")))

(defun call-with-profiling-signal (thunk)
  "Call THUNK with SIGPROF unblocked in this thread.  A thread that waits
inside an interrupt (a deadline's), or that was made there, has it
blocked, and SB-SPROF would take no sample of it."
  (let ((blocked (change-sigprof-mask 1)))
    (unwind-protect (funcall thunk)
      (when blocked (change-sigprof-mask 0)))))

(defun table-lines (text)
  "The lines of a profiler's report TEXT between its first two dashed
lines: the rows of its table (SB-SPROF's and SB-PROFILE's alike)."
  (with-input-from-string (in text)
    (loop for line = (read-line in nil)
          until (or (null line) (search "-----" line)))
    (loop for line = (read-line in nil)
          until (or (null line) (search "-----" line))
          collect line)))

(defun report-rows (text)
  "The rows of SB-SPROF's flat report TEXT: (SELF-PERCENT TOTAL-PERCENT
FUNCTION) each, in its order.  A row is Nr, then count and percentage for
self, total (with the callees) and the running sum, calls, and the
function's name."
  (loop for line in (table-lines text)
        collect (let ((fields (split-fields line)))
                  (list (parse-percent (third fields)) (parse-percent (fifth fields))
                        (format nil "~{~A~^ ~}" (nthcdr 8 fields))))))

(defun parse-percent (text)
  "TEXT (such as \"57.1\") in tenths of a percent, an integer."
  (let ((dot (position #\. text)))
    (+ (* 10 (parse-integer text :end dot))
       (if dot (parse-integer text :start (1+ dot) :end (min (length text) (+ dot 2))) 0))))

(defun report-samples (text)
  "The sample count in SB-SPROF's report TEXT (its \"Number of samples:\" line)."
  (let ((at (search "Number of samples:" text)))
    (if at (parse-integer text :start (+ at 18) :junk-allowed t) 0)))

(defun sample-code (code package mode max-rows timeout)
  "Run CODE in PACKAGE under SB-SPROF in MODE, sampling this thread only;
the result `profile-of' describes."
  (funcall (sprof "RESET"))
  (multiple-value-bind (value failure)
      (call-with-profiling-signal
       (lambda ()
         (funcall (sprof "START-PROFILING") :mode mode :max-samples *profile-max-samples*
                                            :threads (list sb-thread:*current-thread*))
         (unwind-protect (evaluate-for-inspection code package timeout)
           (funcall (sprof "STOP-PROFILING")))))
    (when failure
      (return-from sample-code failure))
    (let ((text (with-output-to-string (out)
                  (funcall (sprof "REPORT") :type :flat :max max-rows :stream out))))
      (list :status :ok :mode mode :samples (report-samples text)
            :value (one-line (safe-print value #'prin1-to-string) 200)
            :rows (loop for (self total function) in (report-rows text)
                        collect (list :self self :total total :function function))))))

;;;; Deterministic profiling: SB-PROFILE

(defun profilable-p (name)
  "Whether NAME (a symbol or (setf symbol)) names a function SB-PROFILE
can wrap: not a macro or special operator."
  (and (fboundp name)
       (not (and (symbolp name) (or (macro-function name) (special-operator-p name))))))

(defun named-function (text package-name)
  "The function name TEXT gives, FOO or (SETF FOO) read in PACKAGE-NAME,
as (values NAME nil); or (values nil ERROR-PLIST) naming TEXT when it
names no function.  Nothing is interned."
  (let* ((trimmed (string-trim " " text))
         (setf-p (and (> (length trimmed) 6) (string-equal "(setf " trimmed :end2 6)
                      (char= #\) (char trimmed (1- (length trimmed)))))))
    (multiple-value-bind (symbol failure)
        (resolve-symbol (if setf-p (subseq trimmed 6 (1- (length trimmed))) trimmed) package-name)
      (let ((name (if setf-p (list 'setf symbol) symbol)))
        (cond (failure (values nil failure))
              ((profilable-p name) (values name nil))
              (t (values nil (name-error "CL-MCP:UNDEFINED-FUNCTION"
                                         (format nil "~A names no function (a macro or special operator cannot be profiled)."
                                                 text)))))))))

(defun package-functions (package)
  "The functions named by PACKAGE's own symbols and their SETF functions,
as SB-PROFILE:PROFILE picks them for a package name."
  (let ((names '()))
    (do-symbols (symbol package)
      (when (eq (symbol-package symbol) package)
        (when (profilable-p symbol)
          (push symbol names))
        (when (fboundp (list 'setf symbol))
          (push (list 'setf symbol) names))))
    (remove-duplicates names :test #'equal)))

(defun requested-functions (functions packages package-name)
  "The function names FUNCTIONS (texts read in PACKAGE-NAME) and PACKAGES
(package names) give, as (values NAMES nil), or (values nil ERROR-PLIST)
at the first that gives none.  A locked package (SBCL's own, CL) and the
agent's are refused: wrapping them all would slow or break the image."
  (let ((names '()))
    (dolist (text functions)
      (multiple-value-bind (name failure) (named-function text package-name)
        (when failure
          (return-from requested-functions (values nil failure)))
        (push name names)))
    (dolist (package-name packages)
      (let ((package (find-named-package package-name)))
        (cond ((null package)
               (return-from requested-functions
                 (values nil (name-error "PACKAGE-ERROR"
                                         (format nil "The package ~S does not exist." package-name)))))
              ((or (sb-ext:package-locked-p package) (eq package (find-package "CL-MCP-AGENT")))
               (return-from requested-functions
                 (values nil (error-report "CL-MCP:INVALID-ARGUMENTS"
                                           "The package ~A is ~:[cl-mcp's own~;locked (SBCL's)~]: ~
                                            name its functions in functions instead."
                                           (package-name package) (sb-ext:package-locked-p package)))))
              (t (setf names (append (package-functions package) names))))))
    (values (remove-duplicates (nreverse names) :test #'equal) nil)))

(defun set-profiling (operator names)
  "SB-PROFILE:PROFILE or UNPROFILE (OPERATOR) on the function NAMES, its
warnings (a function redefined meanwhile) muffled."
  (when names
    (handler-bind ((warning #'muffle-warning))
      (eval `(,operator ,@names)))))

(defmacro with-keyword-printing (&body body)
  "Run BODY printing symbols with their package's name, as READ takes them."
  `(with-standard-io-syntax
     (let ((*package* (find-package "KEYWORD"))
           (*print-readably* nil))
       ,@body)))

(defun call-report-text ()
  "SB-PROFILE's report of every profiled function, names printed in full.
Its first call measures the profiler's overhead and says so on *DEBUG-IO*."
  (with-keyword-printing
    (let ((*debug-io* (make-two-way-stream (make-string-input-stream "") (make-broadcast-stream))))
      (with-output-to-string (*trace-output*)
        (sb-profile:report :print-no-call-list nil)))))

(defun micro-units (text)
  "The decimal TEXT (such as \"0.000136\") in millionths, an integer."
  (let* ((dot (position #\. text))
         (digits (if dot (subseq text (1+ dot)) "")))
    (+ (* 1000000 (parse-integer text :end dot))
       (if (string= digits "")
           0
           (round (* (parse-integer digits) 1000000) (expt 10 (length digits)))))))

(defun report-integer (text)
  "TEXT, an integer printed with commas (SB-PROFILE's ~:D)."
  (parse-integer (remove #\, text)))

(defun call-rows (text names package)
  "The rows of SB-PROFILE's report TEXT for the functions NAMES, in its
order (most seconds first): (:function :calls :seconds :consed :per-call),
seconds in millionths, the name printed as read in PACKAGE.  A row's
fields are seconds, GC seconds, bytes consed, calls, seconds per call,
and the name after the fifth bar (a name may hold bars itself)."
  (let ((mine (make-hash-table :test #'equal)))
    (with-keyword-printing
      (dolist (name names)
        (setf (gethash (prin1-to-string name) mine) name)))
    (loop for line in (table-lines text)
          for bars = (loop with at = -1 repeat 5
                           do (setf at (position #\| line :start (1+ at)))
                           while at collect at)
          for fields = (and (= (length bars) 5)
                            (loop for start in (cons -1 bars) for end in (append bars (list nil))
                                  collect (string-trim " " (subseq line (1+ start) end))))
          for name = (and fields (gethash (sixth fields) mine))
          when name
            collect (list :function (let ((*package* package)) (prin1-to-string name))
                          :calls (report-integer (fourth fields))
                          :seconds (micro-units (first fields))
                          :consed (report-integer (third fields))
                          :per-call (micro-units (fifth fields))))))

(defun count-calls (code package functions packages max-rows timeout)
  "Run CODE in PACKAGE with the FUNCTIONS (names read in PACKAGE) and the
functions of PACKAGES profiled by SB-PROFILE; the result `profile-of'
describes.  Functions profiled already (the programmer's) are left as
they are, counters and all; the others start with counters of their own,
and are unprofiled when the code ends, however it ends."
  (when (and (null functions) (null packages))
    (return-from count-calls
      (error-report "CL-MCP:INVALID-ARGUMENTS"
                    "Mode deterministic needs functions or packages: what to count the calls of.")))
  (multiple-value-bind (names failure) (requested-functions functions packages (package-name package))
    (when failure
      (return-from count-calls failure))
    (let* ((before (sb-profile:profile))
           (theirs (remove-if-not (lambda (name) (member name before :test #'equal)) names))
           (ours (set-difference names theirs :test #'equal)))
      (unwind-protect
           (progn
             (set-profiling 'sb-profile:profile ours)
             (multiple-value-bind (value failure) (evaluate-for-inspection code package timeout)
               (when failure
                 (return-from count-calls failure))
               (let ((rows (call-rows (call-report-text) ours package)))
                 (list :status :ok :mode :deterministic
                       :value (one-line (safe-print value #'prin1-to-string) 200)
                       :profiled (length ours) :called (length rows)
                       :already-profiled (let ((*package* package))
                                           (mapcar #'prin1-to-string theirs))
                       :rows (subseq rows 0 (min max-rows (length rows)))))))
        (set-profiling 'sb-profile:unprofile
                       (intersection ours (sb-profile:profile) :test #'equal))))))

(defun profile-of (code &key (mode :cpu) (max-rows 20) package functions packages (timeout 30))
  "Run CODE (read and evaluated in PACKAGE, CL-USER when nil; output
dropped; at most TIMEOUT seconds) under a profiler.  MODE :cpu or :alloc:
SB-SPROF samples this thread; return :status :ok, :samples (in all),
:mode, :value (the last form's first value, printed on one line) and
:rows, the first MAX-ROWS rows of the flat report by self samples, each
(:self S :total T :function NAME), S and T in tenths of a percent of the
samples.  MODE :deterministic: SB-PROFILE counts the calls of FUNCTIONS
(names read in PACKAGE) and of every function of PACKAGES (names); return
:status :ok, :mode, :value, :profiled and :called (how many functions
were profiled, and called), :already-profiled (the names asked for that
were profiled before, left alone) and :rows, the first MAX-ROWS of the
called ones by seconds, each (:function :calls :seconds :consed
:per-call), seconds in millionths.  Or a :status :error plist."
  (let ((target (if package (find-named-package package) (find-package "COMMON-LISP-USER"))))
    (cond ((null target)
           (name-error "PACKAGE-ERROR" (format nil "The package ~S does not exist." package)))
          ((eq mode :deterministic)
           (count-calls code target functions packages max-rows timeout))
          ((or functions packages)
           (error-report "CL-MCP:INVALID-ARGUMENTS"
                         "functions and packages are for mode deterministic; mode ~(~A~) samples the whole thread."
                         mode))
          (t (sample-code code target mode max-rows timeout)))))
