;;;; agent/evaluate.lisp --- the evaluation's thread, waiting at an error, and its entry points
;;;;
;;;; Read and evaluate the code, report how it went, and wait at an error
;;;; with the restarts intact for the commands later requests bring.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; The evaluation's thread
;;;
;;; Read and evaluate the code, and report how it went.  An error sends the
;;; thread to `stop-at-error' (next section), which reports it and may keep
;;; the thread waiting there.

(defun timing-since (real run gc bytes)
  "The (REAL-MS RUN-MS GC-MS BYTES) elapsed since the given readings."
  (flet ((ms (ticks) (round (* 1000 ticks) internal-time-units-per-second)))
    (list (ms (- (get-internal-real-time) real))
          (ms (- (get-internal-run-time) run))
          (ms (- sb-ext:*gc-run-time* gc))
          (- (sb-ext:get-bytes-consed) bytes))))

(defparameter *inline-output* 1000000
  "Characters of each stream a report carries; cl-mcp reads the rest with
`output-slice', so that every reply fits one Swank frame.")

(defparameter *value-print-limit* 1000000
  "Characters of an evaluation's printed values, at most; the values
themselves stay reachable with `value'.")

(defvar *last-output* nil
  "(NUMBER STDOUT STDERR): the output buffers of the latest report, for
`output-slice'.")

(defun output-buffers (number)
  "The (STDOUT STDERR) buffers of evaluation NUMBER: the latest report's, or
those of an evaluation in the background (running, or its outcome not yet
kept by its caller); else nil."
  (destructuring-bind (&optional id stdout stderr) *last-output*
    (if (eql id number)
        (list stdout stderr)
        (let ((evaluation (find-background number)))
          (and evaluation
               (evaluation-stdout evaluation)
               (list (buffer (evaluation-stdout evaluation))
                     (buffer (evaluation-stderr evaluation))))))))

(defun output-slice (number stream start end)
  "Characters START to END of STREAM (:stdout or :stderr) of evaluation
NUMBER (see `output-buffers'), which may still be running; else nil."
  (destructuring-bind (&optional stdout stderr) (output-buffers number)
    (when stdout
      (let* ((buffer (if (eq stream :stdout) stdout stderr))
             (fill (fill-pointer buffer)))
        ;; A running evaluation may be growing the buffer meanwhile.
        (ignore-errors (subseq buffer (min start fill) (min end fill)))))))

(defun inline-text (stream)
  "What a report carries of STREAM's text: at most `*inline-output*'."
  (let ((buffer (buffer stream)))
    (subseq buffer 0 (min (fill-pointer buffer) *inline-output*))))

(defvar *report-additions* nil
  "Nil, or a function of no arguments whose plist `stretch-report' adds to
the reports of evaluations begun in its binding's extent (run-tests: its
results, once the run is over).")

(defun stretch-report (evaluation status &rest more)
  "The plist describing the stretch that just ended, numbered with the
evaluation's number.  Empty output, no warnings and an unchanged package
are left out: the reply is printed and read on every call.  A stream
longer than `*inline-output*' also gives its :stdout-length (or
:stderr-length): the rest is read with `output-slice'."
  (let* ((stdout (evaluation-stdout evaluation))
         (stderr (evaluation-stderr evaluation))
         (warnings (warning-entries (evaluation-warnings evaluation)
                                    (evaluation-condition evaluation)))
         (report (list* :status status :number (evaluation-id evaluation)
                        :package (package-name *package*) more)))
    ;; A background evaluation's buffers are found through it until its
    ;; outcome is taken (`output-buffers').
    (unless (evaluation-background evaluation)
      (setf *last-output* (list (evaluation-id evaluation) (buffer stdout) (buffer stderr))))
    (flet ((add (key value) (setf report (list* key value report))))
      (when (plusp (kept stdout)) (add :stdout (inline-text stdout)))
      (when (> (kept stdout) *inline-output*) (add :stdout-length (kept stdout)))
      (when (plusp (dropped stdout)) (add :stdout-dropped (dropped stdout)))
      (when (plusp (kept stderr)) (add :stderr (inline-text stderr)))
      (when (> (kept stderr) *inline-output*) (add :stderr-length (kept stderr)))
      (when (plusp (dropped stderr)) (add :stderr-dropped (dropped stderr)))
      (when warnings (add :warnings warnings))
      (unless (eq *package* (evaluation-package evaluation)) (add :package-changed t))
      (when (evaluation-capture-time evaluation)
        (add :timing (apply #'timing-since (evaluation-readings evaluation)))))
    (when *report-additions*
      (setf report (append report (funcall *report-additions*))))
    report))

(defun image-exiting-p ()
  "True once SB-EXT:EXIT has begun to shut the image down."
  (let ((flag (find-symbol "*EXIT-IN-PROGRESS*" "SB-SYS")))
    (and flag (boundp flag) (symbol-value flag) t)))

(defparameter *control-stack-exhausted*
  (first (existing-symbols '(("SB-KERNEL" "CONTROL-STACK-EXHAUSTED"))))
  "SBCL's condition class for a control stack overflow.")

(defun control-stack-exhausted-p (condition)
  "True when CONDITION is a control stack overflow."
  (and *control-stack-exhausted* (typep condition *control-stack-exhausted*)))

(defun park-thread ()
  "Keep this thread alive, idle, for the rest of the image's life.

Why: SBCL 2.2.9 reuses the memory of an exited thread for the next one.
After a stack overflow the guard page's bookkeeping in that memory is
stale, and the next thread to overflow there kills the whole image
(\"control_stack_guard_page_protected not NIL\").  A thread that never
exits is never reused; it costs its stack and nothing else."
  (setf (sb-thread:thread-name sb-thread:*current-thread*)
        "cl-mcp evaluation (parked after a stack overflow)")
  (loop (sleep 3600)))

(defun %read-and-evaluate (evaluation)
  "The loop of `read-and-evaluate'; its value kept once the forms have all
returned, outside `*running-work*', where no deadline reaches it."
  (let ((outcome (let ((*running-work* evaluation))
                   (evaluate-forms evaluation))))
    (when (eq (first outcome) :ok)
      (keep-value (evaluation-id evaluation) (first (second outcome))))
    outcome))

(defun evaluate-forms (evaluation)
  "Read the forms of EVALUATION's code and evaluate each in turn: (:ok
VALUES-OF-THE-LAST) or (:reader-error ERROR-PLIST)."
  (let ((stream (make-string-input-stream (evaluation-code evaluation)))
        (eof (make-symbol "EOF"))
        (values '()))
    (loop
      (let* ((start (file-position stream))
             (form (handler-case (read-next-form stream eof)
                     (serious-condition (c)
                       (return (list :reader-error (describe-error c nil :reading t)))))))
        (when (eq form eof)
          (return (list :ok values)))
        ;; Each form sets the REPL's variables, as if typed on its own (see
        ;; agent/history.lisp; `read-and-evaluate' binds them).
        (setf values (eval-as-typed form #'%eval-form))
        ;; A definition's source is kept for find-definition (see
        ;; `note-repl-definitions', in agent/names.lisp).
        (when (consp form)
          (note-repl-definitions form evaluation (evaluation-code evaluation)
                                 start (file-position stream)))))))

(defun read-and-evaluate (evaluation)
  "Read the forms of the code one after another and evaluate each, the
REPL's variables bound to cl-mcp's own history; return
(:ok VALUES-OF-THE-LAST) or (:reader-error ERROR-PLIST)."
  (call-with-repl-variables
   (lambda ()
     (if *track-session*
         (call-tracking-session (lambda () (%read-and-evaluate evaluation)))
         (%read-and-evaluate evaluation)))))

(defun %run-evaluation (evaluation)
  "Evaluate EVALUATION's code with its output captured, its ABORT restart
set up and every error sent to `stop-at-error'; post the report of a run
that ends without waiting at an error."
  (setf (evaluation-stdout evaluation) (make-capped-output-stream (evaluation-max-output evaluation))
        (evaluation-stderr evaluation) (make-capped-output-stream (evaluation-max-output evaluation)))
  (let ((*package* (evaluation-package evaluation))
        ;; Printing a circular structure must end: without this, PRINT of a
        ;; circular list fills the heap in the pretty printer's buffer.
        (*print-circle* t))
    (with-standard-streams ((evaluation-stdout evaluation) (evaluation-stderr evaluation))
      (let ((outcome
              (catch evaluation
                (restart-bind ((abort (lambda (&optional reported)
                                        (throw evaluation (list :aborted reported)))
                                 :report-function
                                 (lambda (stream) (write-string "Abort this evaluation." stream))))
                  (setf (evaluation-abort-restart evaluation) (find-restart 'abort))
                  (flet ((stop (condition) (stop-at-error evaluation condition)))
                    (handler-bind ((warning
                                     (lambda (w)
                                       (push w (evaluation-warnings evaluation))
                                       (muffle-warning w)))
                                   (serious-condition #'stop))
                      (with-debugger-calling (#'stop)
                        (start-stretch evaluation (evaluation-timeout evaluation))
                        ;; The deadline ends while the handlers still stand, so
                        ;; an interrupt that lands as the code finishes is
                        ;; either a timeout like any other or nothing.
                        (unwind-protect (let ((*inside-evaluation* evaluation))
                                          (read-and-evaluate evaluation))
                          (stop-deadline evaluation)))))))))
        (stop-deadline evaluation)
        ;; The code has ended: what is left of the report is read from
        ;; the streams as they are now, and what threads write to them
        ;; later is theirs.
        (end-capture (evaluation-stdout evaluation) :stdout)
        (end-capture (evaluation-stderr evaluation) :stderr)
        (forget-evaluation evaluation)
        (setf (evaluation-abort-restart evaluation) nil)
        (destructuring-bind (status &optional detail) outcome
          (ecase status
            (:ok (post-report evaluation
                              (stretch-report evaluation :ok
                                              :values (print-values detail *value-print-limit*))))
            (:reader-error (post-report evaluation (stretch-report evaluation :error :error detail)))
            (:aborted
             (unless detail
               (post-report evaluation
                            (stretch-report evaluation :aborted
                                            :error (list :type "CL-MCP:ABORTED"
                                                         :message "The evaluation was aborted."
                                                         :backtrace nil)))))))))))

(defun run-evaluation (evaluation)
  "The body of an evaluation's thread: read and evaluate the code, and post
the final report (unless it was posted already, at an error).  Whatever
happens, the caller hears back: a failure of this agent itself is reported
as CL-MCP:INTERNAL-ERROR rather than leaving the caller waiting."
  (let ((done nil))
    (unwind-protect
         (handler-case
             (progn (%run-evaluation evaluation)
                    (setf done t))
           (serious-condition (c)
             (post-report evaluation (command-error "CL-MCP:INTERNAL-ERROR"
                                                    (condition-message c)))
             (setf done t)))
      (forget-evaluation evaluation)
      (stop-deadline evaluation)
      (unless done
        (post-report evaluation
                     (if (image-exiting-p)
                         (command-error "CL-MCP:IMAGE-EXITING"
                                        "The image is exiting (SB-EXT:EXIT was called).")
                         (command-error "CL-MCP:ABORTED" "The evaluation's thread was ended."))))
      (when (and (evaluation-continuation evaluation)
                 (or (not done) (evaluation-overflowed evaluation)))
        ;; This thread is being ended, or is about to park: it will not
        ;; return to its request.
        (answer-directly evaluation (take-report-now evaluation)))
      ;; A caller that could not be answered from inside (not cl-mcp) must
      ;; get its reply the normal way, so its thread cannot be parked.
      (when (and (evaluation-overflowed evaluation) (evaluation-may-wait evaluation))
        (park-thread)))))

;;;; Waiting at an error
;;;
;;; `stop-at-error' runs inside the handler, where the condition was
;;; signalled, before anything unwinds; an evaluation that may wait then
;;; stays in `command-loop', carrying out the commands that come through
;;; its mailbox, until one of them leaves the error.

(defun evaluation-restarts-for (evaluation condition)
  "The restarts for CONDITION from the user's code up to this evaluation's
own ABORT; the thread's restarts beyond it are not the user's business."
  (let* ((restarts (compute-restarts condition))
         (ours (position (evaluation-abort-restart evaluation) restarts)))
    (if ours (subseq restarts 0 (1+ ours)) restarts)))

(defun restart-entries (restarts)
  "RESTARTS as (NAME DESCRIPTION) lists."
  (loop for restart in restarts
        collect (list (let ((name (restart-name restart)))
                        (if name (symbol-name name) "(unnamed)"))
                      (one-line (safe-print restart #'princ-to-string) 200))))

(defun find-restart-designator (evaluation designator)
  "The restart DESIGNATOR names: an index into the listed restarts, or a
restart name (case-insensitive)."
  (let ((restarts (evaluation-restarts evaluation)))
    (etypecase designator
      (integer (nth designator restarts))
      (string (find-if (lambda (r)
                         (and (restart-name r)
                              (string-equal (symbol-name (restart-name r)) designator)))
                       restarts)))))

(defun evaluate-value-codes (codes &optional (evaluator #'eval))
  "The values of the forms in CODES, each given to EVALUATOR, or nil and an
error report."
  (handler-case
      (values (loop for code in codes
                    collect (funcall evaluator (let ((*read-eval* t)) (read-from-string code))))
              nil)
    (serious-condition (c)
      (values nil (command-error (condition-type-name c)
                                 (format nil "Could not compute a restart value: ~A"
                                         (condition-message c)))))))

(defun run-on (evaluation timeout)
  "EVALUATION no longer waits at its error: it runs on, with a deadline of
TIMEOUT seconds; a user's thread back at its own work, with none."
  (forget-evaluation evaluation)
  (setf (evaluation-condition evaluation) nil
        (evaluation-waiting evaluation) nil)
  (start-stretch evaluation (and (not (thread-stop-p evaluation)) timeout)))

(defun leave-error (evaluation timeout transfer)
  "Let EVALUATION leave its error through TRANSFER, a function that passes
control elsewhere and never returns, its run going on with a deadline of
TIMEOUT seconds.  When TRANSFER does return, it returns why: the evaluation
waits at its error again and that is reported."
  (let ((condition (evaluation-condition evaluation)))
    (run-on evaluation timeout)
    (let ((message (funcall transfer)))
      (stop-deadline evaluation)
      (setf (evaluation-condition evaluation) condition
            (evaluation-waiting evaluation) t)
      (register-suspended evaluation)
      (post-report evaluation (command-error "CL-MCP:RESTART-FAILED" message)))))

(defparameter *frame-commands* '("RESTART-FRAME" "RETURN-FROM-FRAME")
  "The restart names that act on a frame, as sldb's r and R do.")

(defun resume (evaluation designator value-codes timeout &optional frame)
  "Invoke the restart DESIGNATOR with the values of VALUE-CODES (strings of
Lisp code, evaluated here); with FRAME, a frame number, DESIGNATOR is one of
`*frame-commands*' instead (see `resume-at-frame').  A failure is reported
and the evaluation keeps waiting."
  (when frame
    (return-from resume (resume-at-frame evaluation designator frame value-codes timeout)))
  (let ((restart (find-restart-designator evaluation designator)))
    (unless restart
      (return-from resume
        (post-report evaluation (command-error "CL-MCP:NO-SUCH-RESTART"
                                               (format nil "No restart ~S is available~@[ (~A ~
                                                            needs a frame number)~]; ~
                                                            the evaluation still waits."
                                                       designator
                                                       (and (stringp designator)
                                                            (find designator *frame-commands*
                                                                  :test #'string-equal)))))))
    (multiple-value-bind (values failure) (evaluate-value-codes value-codes)
      (when failure
        (return-from resume (post-report evaluation failure)))
      (leave-error evaluation timeout
                   (lambda ()
                     ;; A restart that transfers control never comes back
                     ;; here.  One that refuses the values does so before
                     ;; control leaves.
                     (handler-case (progn (apply #'invoke-restart restart values)
                                          (format nil "Restart ~A returned without leaving ~
                                                       the error; the evaluation still waits."
                                                  (restart-name restart)))
                       (program-error (c)
                         (format nil "Restart ~A did not accept ~D value~:P (~A); ~
                                      the evaluation still waits."
                                 (restart-name restart) (length values)
                                 (condition-message c)))))))))

(defun resume-at-frame (evaluation command index value-codes timeout)
  "Carry out the frame COMMAND on frame INDEX (counted as `backtrace-of'
lists them) of the waiting evaluation, as sldb's r and R do: RESTART-FRAME
calls the frame's function again (as now defined) with its arguments;
RETURN-FROM-FRAME makes the frame return the values of VALUE-CODES, each
evaluated in the frame.  Swank's backend does both, from the frame Swank's
frame numbers count from; SBCL can do it only for a frame compiled with a
debug catch tag (debug 1 or more, SBCL's default)."
  (let ((frame (nth index (evaluation-frames evaluation)))
        (command (find command *frame-commands* :test #'string-equal)))
    (flet ((refuse (type control &rest arguments)
             (return-from resume-at-frame
               (post-report evaluation (command-error type (apply #'format nil control arguments))))))
      (unless command
        (refuse "CL-MCP:NO-SUCH-RESTART"
                "With a frame, the restart is RESTART-FRAME or RETURN-FROM-FRAME; ~
                 the evaluation still waits."))
      (unless frame
        (refuse "CL-MCP:NO-SUCH-FRAME" "There is no frame ~D; the evaluation still waits." index))
      (when (missing-internals-message :frame-commands)
        (refuse "CL-MCP:NOT-IMPLEMENTED" "~A The evaluation still waits."
                (missing-internals-message :frame-commands)))
      (unless (swank/backend:frame-restartable-p frame)
        (refuse "CL-MCP:RESTART-FAILED"
                "Frame ~D cannot be restarted or returned from: its function was compiled ~
                 without SBCL's debug catch tag (with (debug 0), as some of SBCL's own ~
                 are); the evaluation still waits." index))
      (multiple-value-bind (values failure)
          (evaluate-value-codes value-codes (lambda (form) (sb-di:eval-in-frame frame form)))
        (when failure
          (return-from resume-at-frame (post-report evaluation failure)))
        (leave-error evaluation timeout
                     (lambda ()
                       ;; Swank's backend finds frame 0 here; what it
                       ;; returns is why it could not.
                       (let ((swank/sbcl::*sldb-stack-top* frame))
                         (if (string= command "RESTART-FRAME")
                             (let ((warning (rebuilt-call-warning frame)))
                               (when warning
                                 (push warning (evaluation-warnings evaluation)))
                               (swank/backend:restart-frame 0))
                             (swank/backend:return-from-frame 0 `(values-list ',values))))))))))

(defun rebuilt-call-warning (frame)
  "A warning that RESTART-FRAME calls FRAME's function with arguments SBCL
rebuilds from the frame's variables (`sb-debug::frame-call'), when its
lambda list has optional, keyword or rest parameters: each is passed as
it is now, supplied in the original call or not; nil when it has none."
  (let ((parameters (ignore-errors (sb-di:debug-fun-lambda-list (sb-di:frame-debug-fun frame)))))
    (when (some (lambda (parameter)
                  (or (eq parameter :deleted)
                      (and (consp parameter) (member (first parameter) '(:optional :keyword :rest :more)))))
                parameters)
      (multiple-value-bind (name arguments) (ignore-errors (sb-debug::frame-call frame))
        (make-condition 'simple-warning
                        :format-control "RESTART-FRAME calls ~A again as ~A, the call SBCL rebuilds ~
                                         from the frame's variables as they are now: each optional ~
                                         and keyword parameter is passed, with its default when the ~
                                         original call left it out, and a &rest parameter's list as ~
                                         it is now. The original call may have differed."
                        :format-arguments
                        (let ((*print-length* 10) (*print-level* 3) (*print-readably* nil))
                          (list (prin1-to-string name)
                                (let ((call (prin1-to-string (cons name arguments))))
                                  (if (> (length call) 500) (concatenate 'string (subseq call 0 500) "...") call)))))))))

(defun frames-report (evaluation &optional (count *backtrace-frame-limit*))
  "Frames of the waiting evaluation with their local variables and places
(`frame-place')."
  (let ((files (make-hash-table :test 'equal)))
    (list :status :ok
          :frames (loop for frame in (evaluation-frames evaluation)
                        for line in (frame-lines (evaluation-frames evaluation)
                                                 (evaluation-condition evaluation)
                                                 count)
                        collect (list line (frame-locals frame) (frame-place frame files))))))

(defun call-with-deadline-throw (timeout thunk record-warning)
  "Call THUNK; return (:ok VALUES), (:error CONDITION) or (:timeout).  Used
for work done while an evaluation waits at an error, where no condition may
be left to the debugger and the deadline unwinds instead of signalling."
  (catch 'deadline-passed
    (let* ((live t)   ; the timer's interrupt may land after the unschedule
           (timer (and timeout (plusp timeout)
                       (sb-ext:make-timer (lambda ()
                                            (when live (throw 'deadline-passed (list :timeout))))
                                          :name "cl-mcp frame deadline"
                                          :thread sb-thread:*current-thread*))))
      (when timer (sb-ext:schedule-timer timer timeout))
      (unwind-protect
           (block call
             (flet ((fail (condition) (return-from call (list :error condition))))
               (handler-bind ((warning (lambda (w)
                                         (funcall record-warning w)
                                         (muffle-warning w)))
                              (serious-condition #'fail))
                 (with-debugger-calling (#'fail)
                   (list :ok (multiple-value-list (funcall thunk)))))))
        (setf live nil)
        (when timer (sb-ext:unschedule-timer timer))))))

(defun frame-package (frame)
  "The package code evaluated in FRAME is read in, as SLIME's debugger
reads it (`swank:frame-package-name'): that of the name of FRAME's function
(FOO or (SETF FOO)); the current package when the function has no such name
or is SBCL's own (COMMON-LISP's, an SB- package's: ERROR's frame, say) or the
agent's, where the model's new symbols do not belong."
  (let* ((name (frame-function-name frame))
         (symbol (if (and (consp name) (eq (first name) 'setf) (consp (rest name)))
                     (second name)
                     name))
         (package (and symbol (symbolp symbol) (symbol-package symbol))))
    (if (and package
             (not (member (package-name package) '("COMMON-LISP" "KEYWORD" "CL-MCP-AGENT")
                          :test #'string=))
             (not (eql 0 (search "SB-" (package-name package)))))
        package
        *package*)))

(defun frame-eval-report (evaluation index code &optional timeout tag)
  "Evaluate the forms of CODE in frame INDEX of the waiting evaluation, with
that frame's local variables in scope, for at most TIMEOUT seconds,
cancellable under TAG (`call-cancellable'); CODE is read in the frame's
package (`frame-package')."
  (let ((frame (nth index (evaluation-frames evaluation))))
    (unless frame
      (return-from frame-eval-report
        (command-error "CL-MCP:NO-SUCH-FRAME" (format nil "There is no frame ~D." index))))
    (start-stretch evaluation nil)
    (let ((outcome (call-cancellable
                    tag
                    (lambda ()
                      (call-with-deadline-throw
                       timeout
                       (lambda ()
                         (let ((form (handler-case (let ((*package* (frame-package frame)))
                                                     (read-all-forms code))
                                       (serious-condition (c)
                                         (return-from frame-eval-report
                                           (stretch-report evaluation :error
                                                           :error (describe-error c nil :reading t)))))))
                           ;; Each form sets the REPL's variables, as an
                           ;; evaluation's forms do.
                           (eval-forms-as-typed (rest form)
                                                (lambda (each) (sb-di:eval-in-frame frame each)))))
                       (lambda (w) (push w (evaluation-warnings evaluation)))))
                    (list :cancelled))))
      (ecase (first outcome)
        (:ok (stretch-report evaluation :ok
                             :values (print-values (second outcome) *value-print-limit*)))
        (:error (stretch-report evaluation :error :error (describe-error (second outcome) nil)))
        (:cancelled (command-error "CL-MCP:CANCELLED"
                                   "The evaluation in the frame was cancelled; the evaluation still waits."))
        (:timeout (stretch-report evaluation :error
                                  :error (list :type "SB-EXT:TIMEOUT"
                                               :message (format nil "Evaluation in the frame exceeded ~
                                                                     its deadline of ~A; the evaluation ~
                                                                     still waits."
                                                                (seconds-text timeout))
                                               :backtrace nil)))))))

(defun eval-in-frame-command (evaluation index code &optional timeout tag)
  "Report `frame-eval-report'.  Code that leaves the error instead (a
restart it invokes, swank/backend:return-from-frame) lets the evaluation
run on, with a deadline of TIMEOUT seconds, and its next report answers."
  (let ((left t))
    (unwind-protect
         (progn (post-report evaluation (frame-eval-report evaluation index code timeout tag))
                (setf left nil))
      (when left
        (run-on evaluation timeout)))))

(defun command-loop (evaluation)
  "Wait at the error for commands until one continues or aborts the
evaluation, or until `*suspend-seconds*' pass."
  (setf (evaluation-waiting evaluation) t)
  ;; Swank's backend counts frames from its debugger's stack top, which
  ;; only sldb binds: bound here, code evaluated in a frame may call
  ;; swank/backend:restart-frame or return-from-frame, frame 0 being the
  ;; backtrace's frame 0.
  (let ((swank/sbcl::*sldb-stack-top* (first (evaluation-frames evaluation))))
    (loop
      (let ((command (await-command evaluation *suspend-seconds*)))
        ;; SBCL binds its hook to nil while a hook runs, and this loop may run
        ;; inside one (after BREAK): bind it again for the commands.
        (with-debugger-calling ((lambda (condition) (stop-at-error evaluation condition)))
          (unless command
            (forget-evaluation evaluation)
            ;; A caller that found it just before it was forgotten still hears back.
            (when (await-command evaluation 0)
              (post-report evaluation (no-suspended-report (evaluation-id evaluation))))
            (invoke-restart (evaluation-abort-restart evaluation) t))
          (catch 'command-failed
            (destructuring-bind (kind &rest arguments) command
              (ecase kind
                (:restart (apply #'resume evaluation arguments))
                (:backtrace (post-report evaluation (apply #'frames-report evaluation arguments)))
                (:eval-in-frame (apply #'eval-in-frame-command evaluation arguments))
                (:abort (forget-evaluation evaluation)
                        (invoke-restart (evaluation-abort-restart evaluation) nil))))))))))

(defun stop-at-error (evaluation condition)
  "Called where CONDITION was signalled, before anything unwinds.  Report
the error with its backtrace and restarts; then either wait here for
commands or, when no more evaluations may wait, abort."
  (when (evaluation-waiting evaluation)
    ;; A failure while carrying out a command, in this agent's own code.
    (post-report evaluation (command-error "CL-MCP:INTERNAL-ERROR" (condition-message condition)))
    (throw 'command-failed nil))
  (stop-deadline evaluation)
  (when (control-stack-exhausted-p condition)
    (setf (evaluation-overflowed evaluation) t))
  (let ((frames (error-frames)))
    (setf (evaluation-condition evaluation) condition
          (evaluation-frames evaluation) frames
          (evaluation-restarts evaluation) (evaluation-restarts-for evaluation condition))
    (let* ((waiting (and (evaluation-may-wait evaluation)
                         (register-suspended evaluation)))
           (report (stretch-report
                    evaluation :error
                    :error (describe-error condition
                                           (frame-lines frames condition *backtrace-frame-limit*)
                                           :timeout (evaluation-timeout evaluation))
                    :restarts (restart-entries (evaluation-restarts evaluation))
                    :evaluation (and waiting (evaluation-id evaluation)))))
      (if waiting (deliver-report evaluation report) (post-report evaluation report))
      (if waiting
          (command-loop evaluation)
          (invoke-restart (evaluation-abort-restart evaluation) t)))))

;;;; Running on in the background
;;;
;;; At the close of its answer window an evaluation answers its request
;;; "still running" and runs on in its thread (registries.lisp keeps it);
;;; `await-evaluation-of' takes its outcome, or stops it.

(defparameter *running-tail* 20000
  "Characters of each stream's latest output a still-running report carries.")

(defun latest-text (stream)
  "The last `*running-tail*' characters STREAM has kept; read from another
thread while output may still be coming, so it only reads."
  (let* ((buffer (buffer stream))
         (fill (fill-pointer buffer)))
    (or (ignore-errors (subseq buffer (max 0 (- fill *running-tail*)) fill)) "")))

(defun running-report (evaluation &optional forgotten)
  "The report that EVALUATION is still running: its number, the
milliseconds since it began, for each stream with output its latest
`*running-tail*' characters and its whole length (:stdout-length), and
the numbers of the outcomes FORGOTTEN to make room for it (:forgotten,
see `register-background')."
  (let ((report (list :status :running :number (evaluation-id evaluation)
                      :elapsed-ms (round (* 1000 (- (get-internal-real-time)
                                                    (evaluation-started evaluation)))
                                         internal-time-units-per-second))))
    (when forgotten
      (setf report (list* :forgotten forgotten report)))
    (loop for (key length-key stream) in (list (list :stdout :stdout-length (evaluation-stdout evaluation))
                                               (list :stderr :stderr-length (evaluation-stderr evaluation)))
          when (and stream (plusp (kept stream)))
            do (setf report (list* key (latest-text stream) length-key (kept stream) report)))
    report))

(defun too-many-background-error (evaluation window)
  "The error that EVALUATION, still running after WINDOW seconds, was
stopped because `*max-background*' evaluations run in the background."
  (list :type "CL-MCP:TOO-MANY-BACKGROUND"
        :message (format nil "Evaluation ~D was still running after ~A, and ~D evaluation~:P ~
                              already run~:[s~;~] in the background (~{~D~^, ~}), the limit ~
                              (--max-background): so it was stopped.  Wait for one with ~
                              await-evaluation, or stop one with await-evaluation and ~
                              \"abort\": true, then try again."
                         (evaluation-id evaluation) (seconds-text window) *max-background*
                         (/= *max-background* 1)
                         (sort (mapcar #'evaluation-id (background-running)) #'<))
        :backtrace nil))

(defun run-in-background (evaluation token)
  "In EVALUATION's thread, at the close of its answer window (TOKEN is
(TIMEOUT :answer WINDOW)): answer its request \"still running\" and run on
in the background, with a deadline for the rest of TIMEOUT; or, when
`*max-background*' evaluations run there already, stop it with an error
that says so."
  (destructuring-bind (timeout kind window) token
    (declare (ignore kind))
    (setf (evaluation-deadline evaluation) nil)
    (multiple-value-bind (registered forgotten) (register-background evaluation)
      (cond (registered
             (when timeout
               (schedule-deadline evaluation (list timeout :timeout) (max 0 (- timeout window))))
             (answer-directly evaluation (running-report evaluation forgotten)))
            (t
             (post-report evaluation (stretch-report evaluation :error
                                                     :error (too-many-background-error evaluation window)))
             (invoke-restart (evaluation-abort-restart evaluation) t))))))

;;; Loads and compilations run in their request's thread too, with an
;;; ABORT that throws to their own catch tag; the same window sends them to
;;; the background, their report numbered as an evaluation's.

(defun call-within-window (work answer-within tag)
  "Call WORK, a function of no arguments that returns a report plist and
leaves through its `call-cancellable' catch when aborted, in this thread
(its request's).  Still running after ANSWER-WITHIN seconds, it answers its
request with `running-report' and goes on in the background like an
evaluation, its report (numbered) posted for `await-evaluation-of'; this
then returns :ANSWERED.  Without ANSWER-WITHIN, or a request of cl-mcp's
to answer, WORK's report."
  (let ((request (cl-mcp-request))
        (answer-within (window-first answer-within nil)))
    (unless (and answer-within request)
      (return-from call-within-window (funcall work)))
    (let ((evaluation (make-evaluation :thread sb-thread:*current-thread* :continuation request
                                       :answer-within answer-within :tag tag :package *package*
                                       :stdout (make-capped-output-stream 0)
                                       :stderr (make-capped-output-stream 0))))
      (restart-bind ((abort (lambda (&optional reported)
                              (declare (ignore reported))
                              (throw *cancel-point* nil))
                       :report-function (lambda (stream) (write-string "Abort this work." stream))))
        (setf (evaluation-abort-restart evaluation) (find-restart 'abort))
        (schedule-deadline evaluation (list nil :answer answer-within) answer-within)
        (let ((report (unwind-protect (let ((*running-work* evaluation)) (funcall work))
                        (stop-deadline evaluation)
                        (setf (evaluation-abort-restart evaluation) nil))))
          (cond ((take-report-now evaluation))  ; stopped at its window: too many in the background
                ((evaluation-background evaluation)
                 (post-report evaluation (list* :number (evaluation-id evaluation) report))
                 :answered)
                (t report)))))))

(defun no-background-report (id)
  "The report that no background evaluation ID has an outcome to take."
  (command-error "CL-MCP:NO-SUCH-EVALUATION"
                 (format nil "Evaluation ~D is not in the background: its outcome was taken ~
                              already, it finished within its answer window, the session ~
                              was reset, or it was forgotten, finished, to keep at most ~D ~
                              evaluations in the background." id *max-unclaimed*)))

(defun stop-background (evaluation)
  "Abort EVALUATION, running in the background or waiting there at an
error; the report that it was aborted follows in its mailbox."
  (cond ((evaluation-waiting evaluation)
         (take-report-now evaluation)  ; its error, superseded
         (post-command evaluation (list :abort)))
        (t
         (loop repeat 100
               until (or (evaluation-report evaluation) (interrupt-running evaluation))
               do (sleep 0.01)))))

(defun await-evaluation-of (id &key (wait 0) (abort nil))
  "The outcome of background evaluation ID, once it has one, waiting up to
WAIT seconds for it: a plist as `evaluate' returns (an error report with
its restarts when it stopped at an error, where it waits for
`invoke-restart-of').  While it is still running, `running-report'.  With
ABORT, stop it first (or, waiting at an error whose outcome was taken,
abort it there) and return that it was aborted.  The outcome stays here,
its output readable with `output-slice', until `forget-outcome': a caller
that is gone before it has kept it loses nothing."
  (let ((evaluation (find-background id))
        (waiting (and abort (find-suspended id))))
    (cond ((and evaluation (not (own-evaluation-p evaluation))) (not-own-report evaluation))
          ((and waiting (not (own-evaluation-p waiting))) (not-own-report waiting))
          (evaluation
           (when abort (stop-background evaluation))
           ;; A caller that wakes to find the outcome taken by another (its
           ;; report cleared by `forget-outcome') answers so, not that the
           ;; evaluation still runs.
           (let ((outcome (take-slot evaluation
                                     (lambda (evaluation)
                                       (or (evaluation-report evaluation)
                                           (and (not (evaluation-background evaluation)) :taken)))
                                     nil (if abort 10 wait))))
             (case outcome
               ((nil) (running-report evaluation))
               (:taken (no-background-report id))
               (t outcome))))
          (waiting
           (post-command waiting (list :abort))
           (await-report waiting *report-grace*))
          (t (no-background-report id)))))

(defun forget-outcome (id)
  "Background evaluation ID's outcome has been kept by its caller: take it
out of its mailbox (one waiting at an error answers its next command
there) and stop keeping the evaluation; return t."
  (let ((evaluation (find-background id)))
    (when evaluation
      (take-report-now evaluation)
      (forget-background evaluation))
    t))

;;;; Entry points: evaluations

(defun cl-mcp-request ()
  "The id of the Swank request this thread serves, when cl-mcp sent it (any
request, in an image cl-mcp owns) and no evaluation in this thread has it
already; else nil, and an error in the evaluation is reported without
waiting, because nobody could send it commands."
  (and (not *inside-evaluation*)
       (or (not *track-session*) (member swank::*emacs-connection* *connections*))
       (first swank::*pending-continuations*)))

(defun evaluate (code &key package (explicit-package nil) (capture-time nil)
                        (timeout nil) (answer-within nil) (max-output 1000000) (tag nil))
  "Read and evaluate the forms of CODE one after another, in PACKAGE, and
return a plist describing the outcome:

  :status   :ok, :error, or :aborted (through its ABORT restart)
  :values   printed values of the last form (strings)
  :stdout, :stderr   captured output, with :stdout-dropped and
            :stderr-dropped counting characters beyond MAX-OUTPUT
  :warnings list of (TYPE MESSAGE)
  :error    (:type :message :backtrace) when :status is :error
  :restarts (NAME DESCRIPTION) lists, and :evaluation, the number of the
            evaluation now waiting at the error (when it waits)
  :package  name of *package* afterwards, :package-changed whether the
            code changed it (IN-PACKAGE)
  :timing   (REAL-MS RUN-MS GC-MS BYTES) when CAPTURE-TIME
  :number   the evaluation's number, for `value', `output-slice' and
            `await-evaluation-of'

An evaluation still running after ANSWER-WITHIN seconds (when that is
shorter than TIMEOUT) answers with `running-report' (:status :running)
and runs on in the background, for at most TIMEOUT seconds in all.

An unknown PACKAGE is an error when EXPLICIT-PACKAGE, and falls back to
CL-USER otherwise (the session's package may have been deleted).  TIMEOUT,
in seconds, interrupts the evaluation with SB-EXT:TIMEOUT.  TAG, any
string or integer, names the evaluation for `cancel-evaluation' and
`output-tail' while the caller waits.  An evaluation that waits at its
error has sent that plist as its request's answer from inside; what this
function returns then, :ANSWERED, reaches nobody."
  (let ((target (find-package-designator package)))
    (when (and (null target) explicit-package)
      (return-from evaluate
        (list :status :error
              :error (list :type "PACKAGE-ERROR"
                           :message (format nil "The package ~S does not exist." package)
                           :backtrace nil)
              :package "COMMON-LISP-USER")))
    (let* ((request (cl-mcp-request))
           (evaluation (make-evaluation :code code
                                        :package (or target (find-package "COMMON-LISP-USER"))
                                        :capture-time capture-time
                                        :timeout timeout
                                        :answer-within answer-within
                                        :max-output max-output
                                        :tag tag
                                        :thread sb-thread:*current-thread*
                                        :continuation request
                                        :may-wait (and request t))))
      (with-running (tag evaluation)
        (run-evaluation evaluation)
        (if (and request (null (evaluation-continuation evaluation)))
            ;; Answered from inside already; Swank's reply to this is ignored.
            :answered
            (take-report-now evaluation))))))

(defun await-report-within (evaluation window seconds)
  "The next report of EVALUATION, waiting at most SECONDS (`await-report');
or, when WINDOW seconds pass first, its `running-report' once it is sent
to the background, where `await-evaluation-of' takes its outcome.  While
`*max-background*' evaluations run there, the wait goes on."
  (or (and window (take-slot evaluation #'evaluation-report #'(setf evaluation-report) window))
      (and window
           (multiple-value-bind (registered forgotten) (register-background evaluation)
             (and registered (running-report evaluation forgotten))))
      (await-report evaluation seconds)))

(defun invoke-restart-of (id restart &key values frame (timeout nil) (answer-within nil) (tag nil))
  "Invoke RESTART (an index into the listed restarts, or a name) of the
waiting evaluation ID (the newest when nil) with the values of VALUES, a
list of code strings; with FRAME, a frame number, RESTART is RESTART-FRAME
or RETURN-FROM-FRAME instead (`resume-at-frame').  The evaluation runs on with a deadline of TIMEOUT
seconds, findable under TAG as in `evaluate'; return its next report, a
plist as `evaluate' returns (its outcome, or a new error), or an error
report when no evaluation ID waits or the restart cannot be invoked (the
evaluation then still waits).  Still running after ANSWER-WITHIN seconds,
it goes on in the background and this returns `running-report'."
  (with-suspended (evaluation id :own t)
    (setf (evaluation-tag evaluation) tag)
    (with-running (tag evaluation)
      (post-command evaluation (list :restart restart values timeout frame))
      (await-report-within evaluation (window-first answer-within timeout)
                           (and timeout (+ timeout *report-grace*))))))

(defun backtrace-of (id &key (count *backtrace-frame-limit*))
  "The first COUNT frames of the waiting evaluation ID (the newest when
nil), as (:evaluation N :status :ok :frames ((LINE ((NAME VALUE) ...))
...)), each frame a printed call with the local variables the compiler
kept, all strings; or an error report when no evaluation ID waits."
  (with-suspended (evaluation id)
    (post-command evaluation (list :backtrace count))
    (append (list :evaluation (evaluation-id evaluation))
            (and (not (own-evaluation-p evaluation)) (list :another-sessions t))
            (await-report evaluation *report-grace*))))

(defun eval-in-frame-of (id frame code &key (timeout 30) (tag nil))
  "Evaluate the forms of CODE (a string) in frame number FRAME (counted as
`backtrace-of' lists them) of the waiting evaluation ID (the newest when
nil), with that frame's local variables in scope, for at most TIMEOUT
seconds, cancellable under TAG.  Return a plist as `evaluate' returns; the
evaluation keeps waiting whatever happens."
  (with-suspended (evaluation id :own t)
    (post-command evaluation (list :eval-in-frame frame code timeout tag))
    (await-report evaluation (+ timeout *report-grace*))))

(defun interrupt-running (running)
  "Ask the thread of RUNNING (an evaluation, or other work's thread and
catch tag: `call-cancellable') to abandon
its work; true once asked.  An evaluation that has not yet set up its ABORT
restart is asked again later.  The interrupt acts only while that restart
is active, so a thread that has moved on to other work is left alone."
  (handler-case
      (etypecase running
        (evaluation
         (let ((restart (evaluation-abort-restart running)))
           (when restart
             (sb-thread:interrupt-thread (evaluation-thread running)
                                         (lambda ()
                                           (when (find-restart restart)
                                             (invoke-restart restart nil))))
             t)))
        (cons
         (destructuring-bind (thread . point) running
           (sb-thread:interrupt-thread thread
                                       (lambda ()
                                         ;; A call over already has no catch left.
                                         (ignore-errors (throw point nil)))))
         t))
    ;; The thread finished in the meantime: nothing to cancel.
    (sb-thread:interrupt-thread-error () t)))

(defun cancel-evaluation (tag &optional (session (current-session)))
  "Abort the evaluation (or the load) a caller of SESSION (by default, the
asking one) waits on under TAG, and wait
(up to 5 s) until that caller has its answer.  One that went to the
background from that call is stopped and forgotten too: its \"still
running\" answer crossed the cancel, so its caller never learnt its
number, and nobody else could stop it.  Return the reply the call kept
past the cancel (`keep-past-cancel': an edit it wrote), else t if there
was one, else nil.  The cancel comes on another connection than its
call, and can overtake it: a call not yet begun is waited for (up to 1 s)."
  (let ((running (or (find-running tag session)
                     (loop repeat 100
                           until (find-background-tagged tag session)
                           do (sleep 0.01)
                              (let ((begun (find-running tag session)))
                                (when begun (return begun))))))
        (cancelled nil))
    (when running
      (let ((interrupted nil))
        (loop repeat 500
              while (find-running tag session)
              do (unless interrupted
                   (setf interrupted (interrupt-running running)))
                 (sleep 0.01)))
      (setf cancelled t))
    (let ((orphan (find-background-tagged tag session)))
      (when orphan
        (stop-background orphan)
        (take-slot orphan #'evaluation-report nil 5)
        (forget-background orphan)
        (setf cancelled t)))
    (or (reply-kept-past-cancel running) cancelled)))

(defun output-tail (tag)
  "The last non-empty line of output, at most 200 characters, of the
evaluation a caller waits on under TAG; nil when there is none."
  (let ((evaluation (find-running tag)))
    (and (evaluation-p evaluation)
         (evaluation-stdout evaluation)
         (last-line (evaluation-stdout evaluation)))))

(defun abort-all (&optional (session (current-session)) (stops t))
  "Abort every evaluation of SESSION waiting at an error (the user's
threads it stopped too, unless STOPS is nil) and every one running in the
background or for one of its calls; return how many there were."
  (flet ((its (evaluation)
           (and (eq (evaluation-session evaluation) session)
                (or stops (not (thread-stop-p evaluation))))))
    (multiple-value-bind (waiting background calls)
        (with-agent-lock (*registry-lock*)
          (values (remove-if-not #'its *suspended*)
                  (remove-if-not #'its *background*)
                  (loop for ((owner . nil) . object) in *running*
                        when (and (eq owner session) (not (member object *suspended*)))
                          collect object)))
      (with-agent-lock (*registry-lock*)
        (setf *suspended* (set-difference *suspended* waiting)
              *background* (set-difference *background* background)))
      (let ((running (append (remove-if #'evaluation-report background) calls)))
        (dolist (evaluation waiting)
          (post-command evaluation (list :abort)))
        ;; An evaluation that has not set up its ABORT restart yet is asked
        ;; again, for up to a second, as `cancel-evaluation' asks.
        (dolist (each running)
          (loop repeat 100
                until (interrupt-running each)
                do (sleep 0.01)))
        (+ (length waiting) (length running))))))

(defun configure (&key (max-suspended *max-suspended*)
                        (suspend-seconds *suspend-seconds*)
                        (max-background *max-background*)
                        (idle-poll-microseconds *lane-idle-poll-microseconds*)
                        (poll-stolen-microseconds *lane-poll-stolen-microseconds*)
                        (poll-back-off-microseconds *lane-poll-back-off-microseconds*))
  "Set the image-wide settings of the session; return t.  MAX-SUSPENDED
evaluations may wait at an error at once, each at most SUSPEND-SECONDS for
its next command; MAX-BACKGROUND may run in the background.  The lane looks for its next request for
IDLE-POLL-MICROSECONDS before its thread sleeps (0: not at all, where
cl-mcp has one CPU), and stops polling for POLL-BACK-OFF-MICROSECONDS after
a yield that took POLL-STOLEN-MICROSECONDS (see `input-soon-p'): cl-mcp's
own idle-poll policy, sent from its one definition.  A keyword left out
keeps its current value."
  (setf *max-suspended* max-suspended
        *suspend-seconds* suspend-seconds
        *max-background* max-background
        *lane-idle-poll-microseconds* idle-poll-microseconds
        *lane-poll-stolen-microseconds* poll-stolen-microseconds
        *lane-poll-back-off-microseconds* poll-back-off-microseconds)
  t)
