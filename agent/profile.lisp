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

(defvar *profile-lock* (sb-thread:make-mutex :name "cl-mcp profile")
  "Held by a profile call while it profiles.  SB-SPROF keeps one profile
for the whole image, and SB-PROFILE one set of profiled functions, so a
second call waits for the first: two at once would stop, reset or
unprofile what the other started.")

(defparameter *sprof-internals*
  '(("START-PROFILING" . :function) ("STOP-PROFILING" . :function)
    ("REPORT" . :function) ("RESET" . :function)
    ("*PROFILING*" . :variable) ("*SAMPLES*" . :variable)
    ("SAMPLES-TRACE-COUNT" . :function))
  "The names of SB-SPROF profile uses, with what each must be; the
internal ones are in swank-bootstrap.lisp's table.")

(defun ensure-sprof ()
  "Load SB-SPROF, once: a library, whose package list-definitions leaves
out as it does a loaded system's."
  (unless (find-package "SB-SPROF")
    (call-loading-libraries (lambda () (require :sb-sprof)))))

(defun sprof (name)
  "The function NAME of SB-SPROF, which is loaded on the first call."
  (ensure-sprof)
  (fdefinition (find-symbol name "SB-SPROF")))

(defun sprof-value (name)
  "The value of SB-SPROF's variable NAME."
  (symbol-value (find-symbol name "SB-SPROF")))

(defun missing-sprof-internals ()
  "The names in `*sprof-internals*' this SB-SPROF lacks (it is loaded
first): profile's modes cpu and alloc need them all."
  (ensure-sprof)
  (loop for (name . kind) in *sprof-internals*
        for symbol = (find-symbol name "SB-SPROF")
        unless (and symbol (if (eq kind :function) (fboundp symbol) (boundp symbol)))
          collect (format nil "SB-SPROF::~A" name)))

(defun sprof-taken ()
  "Why SB-SPROF is not free for cl-mcp, a sentence, or nil when it is
free.  cl-mcp resets it after each of its profiles, under `*profile-lock*',
so a profile running or samples kept are someone else's (the programmer's,
in a shared image): a profile of cl-mcp's would stop theirs and mix its
samples into their report, or discard their samples."
  (let ((mode (sprof-value "*PROFILING*"))
        (samples (sprof-value "*SAMPLES*")))
    (cond (mode
           (format nil "SB-SPROF is profiling already (mode ~(~A~)), started outside cl-mcp: ~
                        profiling now would stop that profile and put cl-mcp's samples in its report. ~
                        Stop it and read its report first ((sb-sprof:stop-profiling), (sb-sprof:report)), ~
                        then (sb-sprof:reset); mode deterministic does not use SB-SPROF."
                   mode))
          ((and samples (plusp (funcall (sprof "SAMPLES-TRACE-COUNT") samples)))
           (format nil "SB-SPROF holds ~D samples of a profile taken outside cl-mcp, not reported yet: ~
                        profiling now would discard them (SB-SPROF keeps one profile). ~
                        Read them with (sb-sprof:report), then clear them with (sb-sprof:reset); ~
                        mode deterministic does not use SB-SPROF."
                   (funcall (sprof "SAMPLES-TRACE-COUNT") samples))))))

(defun call-with-profile-lock (timeout function)
  "Call FUNCTION with the seconds left of TIMEOUT once no other profile call
holds `*profile-lock*' (the wait counts against TIMEOUT, so the whole call
keeps to it); or a CL-MCP:PROFILER-BUSY error when the other call holds
it for all of TIMEOUT.  FUNCTION returns a plist, never nil."
  (let ((start (get-internal-real-time)))
    (or (sb-thread:with-mutex (*profile-lock* :timeout timeout)
          (let ((waited (/ (- (get-internal-real-time) start) internal-time-units-per-second)))
            ;; TIMEOUT as it was when nothing was waited for: the code's
            ;; deadline is named in a timeout's message.
            (funcall function (if (< waited 1/100)
                                  timeout
                                  (max 1/100 (/ (round (* 100 (- timeout waited))) 100.0))))))
        (error-report "CL-MCP:PROFILER-BUSY"
                      "Another profile call held the profilers for all of this call's ~A seconds: ~
                       profile calls run one at a time, each waiting for the one before."
                      timeout))))

(defun call-with-profiling-signal (thunk)
  "Call THUNK with SIGPROF unblocked in this thread.  A thread that waits
inside an interrupt (a deadline's), or that was made there, has it
blocked, and SB-SPROF would take no sample of it."
  (let ((blocked (change-sigprof-mask 1)))
    (unwind-protect (funcall thunk)
      (when blocked (change-sigprof-mask 0)))))

(defun table-lines (text)
  "The lines of a profiler's report TEXT between its first two dashed
lines: the rows of its table (SB-SPROF's and SB-PROFILE's alike); and,
as a second value, the line before the first, the table's heading."
  (with-input-from-string (in text)
    (let ((heading (loop with previous = nil
                         for line = (read-line in nil)
                         until (or (null line) (search "-----" line))
                         do (setf previous line)
                         finally (return previous))))
      (values (loop for line = (read-line in nil)
                    until (or (null line) (search "-----" line))
                    collect line)
              heading))))

(defun unreadable-report (profiler heading)
  "The CL-MCP:NOT-IMPLEMENTED error of a report whose table's HEADING is
not the one this agent reads (SBCL 2.2.9's): its rows would be misread."
  (error-report "CL-MCP:NOT-IMPLEMENTED"
                "~A's report in this SBCL (~A) has the table heading ~S, not the one cl-mcp reads ~
                 (SBCL 2.2.9's): its rows would be misread."
                profiler (lisp-implementation-version) (string-trim " " (or heading ""))))

(defparameter *sprof-heading* '("Nr" "Count" "%" "Count" "%" "Count" "%" "Calls" "Function")
  "The fields of the heading of SB-SPROF's flat report that `report-rows' reads.")

(defun report-rows (text)
  "The rows of SB-SPROF's flat report TEXT: (SELF-PERCENT TOTAL-PERCENT
FUNCTION) each, in its order, as (values ROWS nil); or (values nil
ERROR-PLIST) when its heading is not `*sprof-heading*'.  A row is Nr,
then count and percentage for self, total (with the callees) and the
running sum, calls, and the function's name."
  (multiple-value-bind (lines heading) (table-lines text)
    (if (equal (split-fields (or heading "")) *sprof-heading*)
        (values (loop for line in lines
                      collect (let ((fields (split-fields line)))
                                (list (parse-percent (third fields)) (parse-percent (fifth fields))
                                      (format nil "~{~A~^ ~}" (nthcdr 8 fields)))))
                nil)
        (values nil (unreadable-report "SB-SPROF" heading)))))

(defun parse-percent (text)
  "TEXT (such as \"57.1\") in tenths of a percent, an integer."
  (let ((dot (position #\. text)))
    (+ (* 10 (parse-integer text :end dot))
       (if dot (parse-integer text :start (1+ dot) :end (min (length text) (+ dot 2))) 0))))

(defun report-samples (text)
  "The sample count in SB-SPROF's report TEXT (its \"Number of samples:\" line)."
  (let ((at (search "Number of samples:" text)))
    (if at (parse-integer text :start (+ at 18) :junk-allowed t) 0)))

(defun trampoline-share (rows)
  "The samples of their own of SBCL's allocation trampolines (ALLOC-TRAMP,
LIST-ALLOC-TRAMP) among ROWS, in tenths of a percent: an alloc profile's
samples are taken there, and the code that allocates shows only in the
total column."
  (loop for (self nil function) in rows
        when (search "ALLOC-TRAMP" function) sum self))

(defparameter *own-frame-packages* '("CL-MCP-AGENT:" "SWANK:" "SWANK/")
  "How the names of cl-mcp's and Swank's functions begin, in a report's row.")

(defun own-row-p (row)
  "Whether ROW, (SELF TOTAL FUNCTION) of a sampling report, is not the
profiled code's: a function of cl-mcp or Swank, or one of SBCL's that
every sample passed through with none of its own (the thread's start,
the evaluator, the profile's lock), below the code as cl-mcp runs it."
  (destructuring-bind (self total function) row
    (flet ((mentions (prefix)
             (loop for at = (search prefix function) then (search prefix function :start2 (1+ at))
                   while at
                   thereis (or (zerop at) (find (char function (1- at)) " ("))))
           (sbcl-name-p ()
             ;; (FLET F :IN G) and (LAMBDA () :IN G) are G's.
             (let* ((in (search ":IN " function :from-end t))
                    (name (string-trim "() " (if in (subseq function (+ in 4)) function))))
               (or (eql 0 (search "SB-" name))
                   (eql 0 (search "foreign function " name))
                   (member name '("EVAL" "FUNCALL" "APPLY") :test #'string=)))))
      (or (some #'mentions *own-frame-packages*)
          (and (zerop self) (>= total 995) (sbcl-name-p))))))

(defun sampling-report (mode value max-rows)
  "The result of a profile in MODE that left VALUE, from SB-SPROF's flat
report of it: its first MAX-ROWS rows of the profiled code's own functions
(`own-row-p' rows left out, counted in :left-out), and how many it has
(:sampled)."
  (let ((text (with-output-to-string (out)
                (funcall (sprof "REPORT") :type :flat :stream out))))
    (multiple-value-bind (rows failure) (report-rows text)
      (or failure
          (let ((kept (remove-if #'own-row-p rows)))
            (list :status :ok :mode mode :samples (report-samples text)
                  :value (one-line (safe-print value #'prin1-to-string) 200)
                  :sampled (length kept)
                  :left-out (- (length rows) (length kept))
                  :in-trampolines (if (eq mode :alloc) (trampoline-share rows) 0)
                  :rows (loop for (self total function) in kept
                              repeat max-rows
                              collect (list :self self :total total :function function))))))))

(defun sample-code (code package mode max-rows timeout)
  "Run CODE in PACKAGE under SB-SPROF in MODE, sampling this thread only;
the result `profile-of' describes.  SB-SPROF is refused when someone
else's profile is in it (`sprof-taken'), and reset afterwards, so that
the next profile finds it free."
  (let ((missing (missing-sprof-internals))
        (taken nil))
    (cond (missing
           (error-report "CL-MCP:NOT-IMPLEMENTED"
                         "This SBCL's SB-SPROF lacks ~{~A~^, ~}, which profile's modes cpu and alloc ~
                          use; mode deterministic does not."
                         missing))
          ((setf taken (sprof-taken))
           (name-error "CL-MCP:PROFILER-IN-USE" taken))
          (t
           (unwind-protect
                (multiple-value-bind (value failure)
                    (call-with-profiling-signal
                     (lambda ()
                       (funcall (sprof "START-PROFILING") :mode mode :max-samples *profile-max-samples*
                                                          :threads (list sb-thread:*current-thread*))
                       (unwind-protect (evaluate-for-inspection code package timeout)
                         (funcall (sprof "STOP-PROFILING")))))
                  (or failure (sampling-report mode value max-rows)))
             (funcall (sprof "RESET")))))))

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

(defun refused-package (package)
  "Why profile refuses PACKAGE in packages, a phrase, or nil: SBCL's own
packages (COMMON-LISP and SB-*, which SBCL, the profiler and cl-mcp run
on) and cl-mcp's agent, which runs this very call.  A package its own
library locked (esrap locks ESRAP) is not refused: SB-PROFILE wraps
functions of a locked package all the same."
  (let ((name (package-name package)))
    (cond ((eq package (find-package "CL-MCP-AGENT"))
           "cl-mcp's own, whose functions run this very call")
          ((or (string= name "COMMON-LISP") (eql 0 (search "SB-" name)))
           (format nil "SBCL's own (COMMON-LISP and the SB- packages are refused): SBCL, the ~
                        profiler and cl-mcp call its functions all the time, and wrapping them ~
                        all would slow or break the image")))))

(defun requested-functions (functions packages package-name)
  "The function names FUNCTIONS (texts read in PACKAGE-NAME) and PACKAGES
(package names) give, as (values NAMES nil), or (values nil ERROR-PLIST)
at the first that gives none.  A package `refused-package' names is
refused whole: wrapping all its functions would slow or break the image."
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
              ((refused-package package)
               (return-from requested-functions
                 (values nil (error-report "CL-MCP:INVALID-ARGUMENTS"
                                           "The package ~A is ~A: name its functions in functions instead."
                                           (package-name package) (refused-package package)))))
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

(defparameter *profile-heading* '("seconds" "gc" "consed" "calls" "sec/call" "name")
  "The fields of the heading of SB-PROFILE's report that `call-rows' reads.")

(defun bar-fields (line)
  "The six fields of a line of SB-PROFILE's report, trimmed: the text
before each of its first five bars, and the rest (a name may hold bars
itself); nil for a line with fewer bars."
  (let ((bars (loop with at = -1 repeat 5
                    do (setf at (position #\| line :start (1+ at)))
                    while at collect at)))
    (and (= (length bars) 5)
         (loop for start in (cons -1 bars) for end in (append bars (list nil))
               collect (string-trim " " (subseq line (1+ start) end))))))

(defun call-rows (text names package)
  "The rows of SB-PROFILE's report TEXT for the functions NAMES, in its
order (most seconds first), as (values ROWS nil): each (:function :calls
:seconds :consed :per-call), seconds in millionths, the name printed as
read in PACKAGE.  Or (values nil ERROR-PLIST) when its heading is not
`*profile-heading*'.  A row's fields are seconds, GC seconds, bytes
consed, calls, seconds per call, and the name."
  (let ((mine (make-hash-table :test #'equal)))
    (with-keyword-printing
      (dolist (name names)
        (setf (gethash (prin1-to-string name) mine) name)))
    (multiple-value-bind (lines heading) (table-lines text)
      (unless (equal (bar-fields (or heading "")) *profile-heading*)
        (return-from call-rows (values nil (unreadable-report "SB-PROFILE" heading))))
      (values (loop for line in lines
                    for fields = (bar-fields line)
                    for name = (and fields (gethash (sixth fields) mine))
                    when name
                      collect (list :function (let ((*package* package)) (prin1-to-string name))
                                    :calls (report-integer (fourth fields))
                                    :seconds (micro-units (first fields))
                                    :consed (report-integer (third fields))
                                    :per-call (micro-units (fifth fields))))
              nil))))

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
               (multiple-value-bind (rows failure) (call-rows (call-report-text) ours package)
                 (or failure
                     (list :status :ok :mode :deterministic
                           :value (one-line (safe-print value #'prin1-to-string) 200)
                           :profiled (length ours) :called (length rows)
                           :already-profiled (let ((*package* package))
                                               (mapcar #'prin1-to-string theirs))
                           :rows (subseq rows 0 (min max-rows (length rows))))))))
        (set-profiling 'sb-profile:unprofile
                       (intersection ours (sb-profile:profile) :test #'equal))))))

(defun profile-of (code &key (mode :cpu) (max-rows 20) package functions packages (timeout 30) (tag nil))
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
:per-call), seconds in millionths.  Or a :status :error plist.  Cancellable
under TAG (`with-cancellable')."
  (with-cancellable (tag)
    (let ((target (if package (find-named-package package) (find-package "COMMON-LISP-USER"))))
      (cond ((null target)
             (name-error "PACKAGE-ERROR" (format nil "The package ~S does not exist." package)))
            ((and (not (eq mode :deterministic)) (or functions packages))
             (error-report "CL-MCP:INVALID-ARGUMENTS"
                           "functions and packages are for mode deterministic; mode ~(~A~) samples the whole thread."
                           mode))
            (t (call-with-profile-lock
                timeout
                (lambda (left)
                  (if (eq mode :deterministic)
                      (count-calls code target functions packages max-rows left)
                      (sample-code code target mode max-rows left)))))))))
