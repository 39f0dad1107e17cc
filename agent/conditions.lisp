;;;; agent/conditions.lisp --- naming conditions, backtraces and reading code
;;;;
;;;; How an error is told to the model: the condition's class and message,
;;;; the frames between the signal and the evaluation's boundary, and reading
;;;; the submitted code one form at a time.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; Naming conditions and describing errors

(defun internal-package-p (package)
  "True for SBCL's own packages and this agent's, whose condition classes
are details of how a condition was signalled."
  (and package
       (let ((name (package-name package)))
         (or (string= name "CL-MCP-AGENT")
             (and (> (length name) 3) (string= "SB-" name :end2 3))))))

(defun public-type-name (condition &optional (kind 'condition))
  "A type name for CONDITION that a user can act on: its own class, or for
internal classes the nearest superclass of type KIND from outside SBCL (so
SB-INT:SIMPLE-STYLE-WARNING shows as STYLE-WARNING)."
  (let ((class (class-of condition)))
    (symbol-designator
     (or (loop for super in (sb-mop:class-precedence-list class)
               for name = (class-name super)
               when (and (not (internal-package-p (symbol-package name)))
                         (subtypep name kind))
                 return name)
         (class-name class)))))

(defparameter *named-agent-conditions* '(thread-interrupted)
  "The agent's condition classes a model meets by their own name: what a
thread the threads tool stopped waits at (threads.lisp).")

(defun detail-class-name-p (name)
  "True for the names of classes that are details of an implementation:
this agent's (but `*named-agent-conditions*'), and SBCL's internal
(unexported) ones."
  (let ((package (symbol-package name)))
    (and (not (member name *named-agent-conditions*))
         (or (eq package (find-package "CL-MCP-AGENT"))
             (and (internal-package-p package)
                  (not (eq (nth-value 1 (find-symbol (symbol-name name) package)) :external)))))))

(defun condition-type-name (condition)
  "The condition's class name, package-qualified outside CL.  For a class
that is an implementation detail (SB-KERNEL::RETRY-UNDEFINED-FUNCTION), its
nearest superclass that is not (UNDEFINED-FUNCTION)."
  (symbol-designator
   (or (loop for class in (sb-mop:class-precedence-list (class-of condition))
             for name = (class-name class)
             unless (detail-class-name-p name) return name)
       (type-of condition))))

(defun reader-error-type (condition)
  "Reader problems are reported by their standard type."
  (cond ((typep condition 'end-of-file) "END-OF-FILE")
        ((typep condition 'reader-error) "READER-ERROR")
        (t (condition-type-name condition))))

(defun error-message (condition timeout)
  "The text that explains CONDITION.  A few of SBCL's reports are replaced
by plainer ones that say what happened to the evaluation."
  (typecase condition
    (sb-ext:timeout
     (format nil "Evaluation exceeded its deadline of ~A and was interrupted."
             (seconds-text timeout)))
    (undefined-function
     (format nil "The function ~A is undefined."
             (function-name-text (cell-error-name condition))))
    (t (condition-message condition))))

(defun describe-error (condition backtrace &key reading timeout)
  "The :error plist for CONDITION."
  (list :type (if reading
                  (reader-error-type condition)
                  (condition-type-name condition))
        :message (error-message condition timeout)
        :backtrace backtrace))

(defun command-error (type message)
  "A report of an error that is no condition of the user's code: TYPE (a
string such as \"CL-MCP:NO-SUCH-FRAME\") and MESSAGE, with no backtrace."
  (list :status :error :error (list :type type :message message :backtrace nil)
        :stdout "" :stderr "" :warnings '()))

(defparameter *warning-limit* 50
  "Warnings reported per stretch; each message is cut to 1,000 characters.")

(defun warning-entries (warnings error)
  "WARNINGS as (TYPE MESSAGE) lists, in the order signalled, leaving out the
compiler's note that a function is undefined when calling it is the ERROR.
At most `*warning-limit*', so that a reply stays within a Swank frame."
  (loop for w in (reverse warnings)
        unless (and (typep error 'undefined-function)
                    (typep w 'simple-condition)
                    (member (cell-error-name error)
                            (simple-condition-format-arguments w) :test #'equal))
          collect (list (public-type-name w 'warning)
                        (condition-message w 1000))
            into entries
        finally (return (subseq entries 0 (min (length entries) *warning-limit*)))))

;;;; Backtraces
;;;
;;; A backtrace shows the frames between the one that signalled and the
;;; evaluation's boundary, `%eval-form', leaving out the condition system,
;;; SBCL's evaluator and this agent.

(defun %eval-form (form)
  "Evaluate FORM.  A named frame that marks where a backtrace ends (debug 3
keeps the frame: no tail call)."
  (declare (optimize (debug 3)))
  (eval form))
(declaim (notinline %eval-form))

(defparameter *backtrace-frame-limit* 20
  "Frames shown for an error.")

(defparameter *frame-line-limit* 300
  "Characters shown per backtrace frame.")

(defparameter *interruption-frames*
  (existing-symbols '(("SB-THREAD" "RUN-INTERRUPTION") ("SB-SYS" "INVOKE-INTERRUPTION")))
  "The functions a thread runs an interrupt in (INTERRUPT-THREAD's).")

(defparameter *signalling-frames*
  (append (existing-symbols
           '(("COMMON-LISP" "INVOKE-DEBUGGER") ("SB-KERNEL" "%SIGNAL") ("SB-KERNEL" "INTERNAL-ERROR")
             ("SB-IMPL" "RUN-EXPIRED-TIMER") ("SB-IMPL" "RUN-EXPIRED-TIMERS")
             ("SB-UNIX" "SIGALRM-HANDLER") ("SB-UNIX" "RUN-HANDLER")))
          *interruption-frames*)
  "Functions of the condition system and the timer machinery.  Frames up to
the last of these near the top of the stack are how the condition was
signalled, not where.")

(defparameter *evaluator-frames*
  (existing-symbols
   '(("SB-INT" "SIMPLE-EVAL-IN-LEXENV") ("SB-IMPL" "SIMPLE-EVAL-PROGN-BODY")
     ("SB-IMPL" "%SIMPLE-EVAL") ("SB-IMPL" "EVAL-IN-LEXENV")))
  "SBCL's evaluator: present in every backtrace, never informative.")

(defun frame-name (frame)
  "The name of FRAME's function, or nil when SBCL cannot tell."
  (ignore-errors (sb-debug::frame-call frame)))

(defun frame-line (frame)
  "FRAME printed as (FUNCTION ARGS...) on one line of at most
`*frame-line-limit*' characters, then \" ...\" when cut.  The printer is
stopped one character past the limit, so that a huge argument costs what
is shown.  *print-circle* is bound to true inside, not around
`print-within': SBCL prints each argument on its own, with its own labels,
and a first pass over the whole frame would label what two arguments
share."
  (multiple-value-bind (text cut)
      (handler-case
          (let ((*print-length* 10) (*print-level* 3)
                (*print-pretty* nil) (*print-circle* nil)
                (*print-readably* nil)
                (*package* (find-package "COMMON-LISP-USER")))
            (print-within frame
                          (lambda (frame out)
                            (let ((*print-circle* t))
                              (sb-debug::print-frame-call frame out)))
                          *frame-line-limit* 1))
        (serious-condition () "#<unprintable frame>"))
    (if (member cut '(0 nil))
        text
        (concatenate 'string text " ..."))))

(defun agent-name-p (name)
  "True when the function NAME (a symbol, or a list such as (FLET F :IN G)
or (:METHOD M (CLASS))) mentions a symbol of this agent."
  (let ((agent (find-package "CL-MCP-AGENT")))
    (labels ((walk (x)
               (typecase x
                 (symbol (eq (symbol-package x) agent))
                 (cons (or (walk (car x)) (walk (cdr x)))))))
      (walk name))))

(defun evaluation-wrapper-p (name below)
  "True for the (LAMBDA ()) SBCL's evaluator wraps a form in, as the
evaluation's own code runs: the frames BELOW it (their names) are only
the evaluator's.  A user's (LAMBDA ()), and the one a test framework's
EVAL makes of a test, have other frames below, or none (a thread's)."
  (and (equal name '(lambda ()))
       below
       (every (lambda (below) (or (eq below 'eval) (member below *evaluator-frames* :test #'equal)))
              below)))

(defun internal-frame-p (name below)
  "True for frames the user never wrote: the evaluator and its wrapper
(`evaluation-wrapper-p' of NAME and BELOW, the names of the frames under
it), this agent's own functions, and frames SBCL cannot name."
  (or (member name *evaluator-frames* :test #'equal)
      (evaluation-wrapper-p name below)
      (and (stringp name) (string/= name "undefined function"))
      (agent-name-p name)))

(defparameter *thread-start-frames*
  (existing-symbols '(("SB-THREAD" "RUN")))
  "The function SBCL starts a thread in: its frames, and the local
functions it calls (named (FLET ... :IN SB-THREAD::RUN)), lie below the
thread's own function.")

(defun thread-start-frame-p (name)
  "True for the frames SBCL starts a thread with."
  (or (member name *thread-start-frames* :test #'equal)
      (and (consp name) (member (car (last name)) *thread-start-frames* :test #'equal))))

(defparameter *frame-walk-limit* 200
  "Frames examined for one error.")

(defun signalling-frame-p (name)
  "True for a frame of `*signalling-frames*', or of a local function named
as one of them (SBCL's signal handler is (FLET SB-UNIX::RUN-HANDLER :IN
...))."
  (or (member name *signalling-frames* :test #'equal)
      (and (consp name) (member (first name) '(flet labels))
           (member (second name) *signalling-frames* :test #'equal))))

(defparameter *condition-frames*
  (existing-symbols '(("COMMON-LISP" "INVOKE-DEBUGGER") ("SB-KERNEL" "%SIGNAL")))
  "Signalling functions whose first argument is the condition signalled.")

(defun nested-signal-start (frames end)
  "The position in FRAMES, before END, of the first frame that signals a
condition other than the one the topmost such frame signals: a handler
that signalled a condition of its own (usocket's turns SB-BSD-SOCKETS'
HOST-NOT-FOUND-ERROR into its NS-HOST-NOT-FOUND-ERROR), and the frames
from there down are how the first condition came about, the handler's
among them.  END when no frame does."
  (let ((signalled nil))
    (loop for (name . frame) in frames
          for index below end
          when (member name *condition-frames* :test #'equal)
            do (let ((condition (first (nth-value 1 (ignore-errors (sb-debug::frame-call frame))))))
                 (when (typep condition 'condition)
                   (cond ((null signalled) (setf signalled condition))
                         ((not (eq condition signalled)) (return-from nested-signal-start index))))))
    end))

(defun signal-end (frames)
  "The position in FRAMES, (NAME . FRAME) entries from the top of the
stack, of the last frame of how a condition was signalled: the last
signalling frame near the top, above any signal of another condition, or
when none is, this agent's handler (the agent's own frames count only
then: run-tests' frames lie below the user's code)."
  (let ((end (nested-signal-start frames (min 40 (length frames)))))
    (or (position-if (lambda (entry) (signalling-frame-p (car entry))) frames :end end :from-end t)
        (position-if (lambda (entry) (agent-name-p (car entry))) frames :end end :from-end t))))

(defun interruption-end (frames)
  "The position in FRAMES of the last frame of the interrupt nearest the
top of the stack: the frames below it are the interrupted thread's own."
  (let ((start (position-if (lambda (entry) (member (car entry) *interruption-frames* :test #'equal))
                            frames)))
    (when start
      (1- (or (position-if-not (lambda (entry)
                                 (or (stringp (car entry)) (signalling-frame-p (car entry))))
                               frames :start start)
              (length frames))))))

(defun error-frames (&key interrupted)
  "The frames between the point a condition was signalled (with
INTERRUPTED, the interrupt that asks for them: `thread-backtrace') and the
evaluation boundary (or a watched thread's start, or SBCL's start of the
thread), user-relevant ones only, as frame objects.  Called from inside
the handler, before anything unwinds, so the frames stay valid while the
evaluation waits there."
  (let ((frames '()))
    (block walk
      (sb-debug::map-backtrace
       (lambda (frame)
         (let ((name (frame-name frame)))
           ;; Below: the evaluator, or where a watched thread began
           ;; (`call-watched', agent/user-threads.lisp).
           (when (or (member name '(%eval-form call-watched)) (thread-start-frame-p name))
             (return-from walk))
           (push (cons name frame) frames)))
       ;; From this frame: SBCL's default, the debugger's top (which
       ;; INTERNAL-ERROR sets to the frame that erred), would skip the
       ;; signalling frames that `signal-end' looks for.
       :from :current-frame :count *frame-walk-limit*))
    (setf frames (nreverse frames))
    (let ((last (if interrupted (interruption-end frames) (signal-end frames))))
      (when last (setf frames (nthcdr (1+ last) frames))))
    (loop for ((name . frame) . below) on frames
          unless (internal-frame-p name (mapcar #'car below)) collect frame)))

(defun undefined-function-line (frame condition)
  "SBCL shows a call to an undefined function as a frame named
\"undefined function\"; show the name that was called instead."
  (let ((line (frame-line frame))
        (name (function-name-text (cell-error-name condition))))
    (concatenate 'string "(" name
                 (subseq line (length "(\"undefined function\"")))))

(defun frame-lines (frames condition count)
  "The first COUNT of FRAMES as one-line strings."
  (loop for frame in frames
        repeat count
        collect (if (and (typep condition 'undefined-function)
                         (equal (frame-name frame) "undefined function"))
                    (undefined-function-line frame condition)
                    (frame-line frame))))

(defun frame-locals (frame)
  "FRAME's local variables as (NAME VALUE) strings, where the compiler kept
them; each value on one line of at most 200 characters (`printed-line')."
  (let ((location (sb-di:frame-code-location frame))
        (locals '()))
    (handler-case
        (sb-di:do-debug-fun-vars (var (sb-di:frame-debug-fun frame))
          (when (and (sb-di:debug-var-symbol var)
                     (eq (sb-di:debug-var-validity var location) :valid))
            (push (list (symbol-designator (sb-di:debug-var-symbol var))
                        (with-result-printing ()
                          (let ((*print-pretty* nil))
                            (printed-line (sb-di:debug-var-value var frame) 200))))
                  locals)))
      (serious-condition () nil))
    (nreverse locals)))

;;;; Where a frame is in its source
;;;
;;; A frame's place is the form its code is running, as SLDB's `v' finds
;;; it: Swank's `frame-source-location', then the resolver every other
;;; place goes through (names.lisp's `location-plist', loaded after this
;;; part), so a file edited since the code was compiled still gives the
;;; form's line as the file is now.

(defparameter *frame-form-limit* 200
  "Characters shown of the form a frame of evaluated code is running.")

(defun share-compiled-text (frame)
  "Swank finds the form FRAME is running in the text of its file that its
source cache holds from when the code was compiled (else in the file as it
is now, where the form's number may lead elsewhere), looked up by the
file's namestring.  A compile-file (cl-mcp's, or SLIME's C-c C-k) keeps
that text under the file's pathname: file the entry under the namestring
too when it holds the compiled version."
  (let* ((source (sb-di:code-location-debug-source (sb-di:frame-code-location frame)))
         (namestring (sb-int:debug-source-namestring source))
         (cache (and (not (missing-internals-message :source-cache))
                     swank/source-file-cache::*source-file-cache*)))
    (when (and namestring cache (not (gethash namestring cache)))
      (let* ((truename (probe-file namestring))
             (entry (and truename (gethash truename cache))))
        (when (and entry (equal (swank/source-file-cache::source-cache-entry.date entry)
                                (sb-int:debug-source-created source)))
          (setf (gethash namestring cache) entry))))))

(defun frame-swank-location (frame)
  "Swank's source location of the form FRAME is running.  Swank counts
frames from the top of the stack it is given: sb-debug:*stack-top-hint*,
which `call-with-debugging-environment' resolves, makes FRAME its frame 0.
Swank's warnings (a form-number table out of step with an edited file) are
its own business, not the evaluation's."
  (share-compiled-text frame)
  (handler-bind ((warning #'muffle-warning))
    (let ((sb-debug:*stack-top-hint* frame))
      (swank/backend:call-with-debugging-environment
       (lambda () (swank/backend:frame-source-location 0))))))

(defun frame-function-name (frame)
  "The name FRAME's function was defined under (FOO, (SETF FOO)), or nil."
  (handler-case (sb-di:debug-fun-name (sb-di:frame-debug-fun frame))
    (serious-condition () nil)))

(defun evaluation-defining (name)
  "The number of the newest evaluation that defined the function NAME
through evaluate-lisp, or nil (names.lisp's `repl-definition-plists')."
  (when (and name (symbolp name))
    (loop for definition in (repl-definition-plists name)
          when (string= (getf definition :type) "function")
            return (getf definition :evaluation))))

(defun blanks-collapsed (text)
  "TEXT with each run of blanks and newlines made one space."
  (with-output-to-string (out)
    (let ((blank nil))
      (loop for char across (string-trim '(#\Space #\Newline #\Tab) text)
            do (if (member char '(#\Space #\Newline #\Tab))
                   (setf blank t)
                   (progn (when blank (write-char #\Space out) (setf blank nil))
                          (write-char char out)))))))

(defun marked-form-text (form)
  "FORM, Swank's text of the form a frame runs in its enclosing forms with
SBCL's #:***HERE*** marking the part running, on one line; past
`*frame-form-limit*' characters, from the marked part on, cut."
  (let* ((line (blanks-collapsed form))
         (marker (search "(#:***HERE***" line))
         (start (if (and marker (> (length line) *frame-form-limit*)) marker 0)))
    (concatenate 'string
                 (if (plusp start) "… " "")
                 (subseq line start (min (length line) (+ start *frame-form-limit*)))
                 (if (> (length line) (+ start *frame-form-limit*)) " …" ""))))

(defun evaluated-frame-place (frame form)
  "The place of a frame whose code was compiled from a form, not a file
(an evaluation, COMPILE, an attached REPL): no file, the evaluation that
defined its function when cl-mcp kept it, and the form it is running
(`marked-form-text' of FORM)."
  (let ((evaluation (evaluation-defining (frame-function-name frame))))
    (list* :error (if evaluation
                      (format nil "no file: defined by evaluation ~D" evaluation)
                      "no file: compiled from a form, not from a file")
           :form (marked-form-text form)
           (and evaluation (list :evaluation evaluation)))))

(defun first-line (text)
  "TEXT up to its first newline."
  (subseq text 0 (or (position #\Newline text) (length text))))

(defun frame-place (frame files)
  "Where FRAME's code is, as `location-plist' gives a place (the file as it
is now; FILES keeps each file read once per reply), or (:error WHY) with
`evaluated-frame-place's facts for code that has no file.  No definition
name is given to the resolver: the place is a form inside a definition,
and a definition's opening line would be the wrong one."
  (let ((location (handler-case (frame-swank-location frame)
                    (serious-condition (c) (list :error (condition-message c))))))
    (cond ((and (consp location) (eq (first location) :location)
                (eq (first (second location)) :source-form))
           (evaluated-frame-place frame (second (second location))))
          ((and (consp location) (eq (first location) :error))
           (list :error (first-line (second location))))
          (t (location-plist (counted-from-one location frame) files :characters t)))))

(defun counted-from-one (location frame)
  "LOCATION, FRAME's, with its :position counted from 1 as the resolver
reads every place's.  Swank places a frame whose code has debug blocks at
the form it runs, counted from 0 (`stream-source-position'), its snippet
read there; one without (code compiled with low debug) at its function's
definition, counted from 1 as a definition's.  Taken as counted from 1, a
form opening right after another parenthesis (DO's end test
\"((safe-endp tail) ...)\") read as moved by an edit."
  (destructuring-bind (buffer position &rest hints) (rest location)
    (if (and (eq (first buffer) :file) (eq (first position) :position) (integerp (second position))
             (handler-case (progn (sb-di:code-location-debug-block (sb-di:frame-code-location frame)) t)
               (sb-di:no-debug-blocks () nil)))
        (list* :location buffer (list :position (1+ (second position))) hints)
        location)))

;;;; Reading code

(defun find-package-designator (name)
  "The package named NAME (exactly, or upcased), or nil."
  (or (find-package name) (find-package (string-upcase name))))

(define-condition incomplete-form (end-of-file)
  ()
  (:report "Incomplete form: the code ends before the form is complete (a missing \")\" or an unterminated string?).")
  (:documentation "The code ended inside a form."))

(defun read-next-form (stream eof)
  "Read one form from STREAM, or EOF at its end.  An incomplete form
signals `incomplete-form' rather than a bare END-OF-FILE on a string
stream."
  (handler-case (read stream nil eof)
    (end-of-file () (error 'incomplete-form :stream stream))))

(defun read-all-forms (code)
  "The forms of CODE as one PROGN (read with the evaluation's *PACKAGE*)."
  (let ((stream (make-string-input-stream code))
        (eof (make-symbol "EOF")))
    (cons 'progn (loop for form = (read-next-form stream eof)
                       until (eq form eof)
                       collect form))))
