;;;; agent/profile.lisp --- profile: code run under SB-SPROF, a flat report
;;;;
;;;; The code runs in the thread that read the request (as inspect's code
;;;; does, `evaluate-for-inspection'), and only that thread is sampled.
;;;; SB-SPROF is required the first time, so it is looked up by name.
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

(defun report-rows (text)
  "The rows of SB-SPROF's flat report TEXT: (SELF-PERCENT TOTAL-PERCENT
FUNCTION) each, in its order.  The rows lie between the report's two
dashed lines: Nr, then count and percentage for self, total (with the
callees) and the running sum, calls, and the function's name."
  (with-input-from-string (in text)
    (loop for line = (read-line in nil)
          until (or (null line) (search "-----" line)))
    (loop for line = (read-line in nil)
          until (or (null line) (search "-----" line))
          collect (let ((fields (split-fields line)))
                    (list (parse-percent (third fields)) (parse-percent (fifth fields))
                          (format nil "~{~A~^ ~}" (nthcdr 8 fields)))))))

(defun parse-percent (text)
  "TEXT (such as \"57.1\") in tenths of a percent, an integer."
  (let ((dot (position #\. text)))
    (+ (* 10 (parse-integer text :end dot))
       (if dot (parse-integer text :start (1+ dot) :end (min (length text) (+ dot 2))) 0))))

(defun report-samples (text)
  "The sample count in SB-SPROF's report TEXT (its \"Number of samples:\" line)."
  (let ((at (search "Number of samples:" text)))
    (if at (parse-integer text :start (+ at 18) :junk-allowed t) 0)))

(defun profile-of (code &key (mode :cpu) (max-rows 20) package (timeout 30))
  "Run CODE (read and evaluated in PACKAGE, CL-USER when nil; output
dropped; at most TIMEOUT seconds) under SB-SPROF in MODE (:cpu or :alloc),
sampling this thread only.  Return :status :ok, :samples (in all), :mode,
:value (the last form's first value, printed on one line) and :rows, the
first MAX-ROWS rows of the flat report by self samples, each (:self S
:total T :function NAME), S and T in tenths of a percent of the samples;
or a :status :error plist."
  (let ((target (if package (find-named-package package) (find-package "COMMON-LISP-USER"))))
    (unless target
      (return-from profile-of
        (name-error "PACKAGE-ERROR" (format nil "The package ~S does not exist." package))))
    (funcall (sprof "RESET"))
    (multiple-value-bind (value failure)
        (call-with-profiling-signal
         (lambda ()
           (funcall (sprof "START-PROFILING") :mode mode :max-samples *profile-max-samples*
                                              :threads (list sb-thread:*current-thread*))
           (unwind-protect (evaluate-for-inspection code target timeout)
             (funcall (sprof "STOP-PROFILING")))))
      (when failure
        (return-from profile-of failure))
      (let ((text (with-output-to-string (out)
                    (funcall (sprof "REPORT") :type :flat :max max-rows :stream out))))
        (list :status :ok :mode mode :samples (report-samples text)
              :value (one-line (safe-print value #'prin1-to-string) 200)
              :rows (loop for (self total function) in (report-rows text)
                          collect (list :self self :total total :function function)))))))
