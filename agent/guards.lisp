;;;; agent/guards.lisp --- keeping the terminal and the debugger out, the agent's threads
;;;;
;;;; Nothing a user evaluates may wait for a terminal or reach Swank's
;;;; debugger; the threads the agent makes get the same guards.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; Keeping the terminal and the debugger out
;;;
;;; Nobody is at a terminal to answer a read, and nobody will ever answer a
;;; debugger: the code cl-mcp runs gets input streams that fail at once, and
;;; a hook that hands any entry into the debugger to the agent.

(define-condition no-input (end-of-file)
  ()
  (:report "No input: cl-mcp evaluates without a terminal, so *STANDARD-INPUT*, *QUERY-IO* and *DEBUG-IO* are empty.")
  (:documentation "A read from a `no-input-stream'."))

(defclass no-input-stream (sb-gray:fundamental-character-input-stream
                           sb-gray:fundamental-character-output-stream)
  ()
  (:documentation "A stream that fails at once, with a reason, when read
from, instead of waiting for input that can never come; what is written to
it goes nowhere."))

(defmethod sb-gray:stream-read-char ((stream no-input-stream))
  "Fail: there is no input."
  (error 'no-input :stream stream))

(defmethod sb-gray:stream-read-line ((stream no-input-stream))
  "Fail: there is no input."
  (error 'no-input :stream stream))

(defmethod sb-gray:stream-listen ((stream no-input-stream))
  "No input is ready, nor ever will be."
  nil)

(defmethod sb-gray:stream-read-char-no-hang ((stream no-input-stream))
  "No character is ready."
  nil)

(defmethod sb-gray:stream-unread-char ((stream no-input-stream) char)
  "Nothing was read, so nothing goes back."
  (declare (ignore char))
  nil)

(defmethod sb-gray:stream-clear-input ((stream no-input-stream))
  "There is no input to clear."
  nil)

(defmethod sb-gray:stream-write-char ((stream no-input-stream) char)
  "Drop CHAR."
  char)

(defmethod sb-gray:stream-write-string ((stream no-input-stream) string
                                        &optional start end)
  "Drop STRING."
  (declare (ignore start end))
  string)

(defmethod sb-gray:stream-line-column ((stream no-input-stream))
  "The column is unknown."
  nil)

(defmethod sb-gray:stream-finish-output ((stream no-input-stream))
  "Nothing is buffered."
  nil)

(defmethod sb-gray:stream-force-output ((stream no-input-stream))
  "Nothing is buffered."
  nil)

(defmethod sb-gray:stream-clear-output ((stream no-input-stream))
  "Nothing is buffered."
  nil)

(defmacro with-standard-streams ((output error-output) &body body)
  "Run BODY with the standard output streams bound to OUTPUT and
ERROR-OUTPUT (trace output going with the error output), and every input
stream failing at once: nobody is at a terminal to answer.  What is written
to *DEBUG-IO* or *QUERY-IO* goes nowhere."
  (let ((no-input (gensym "NO-INPUT")))
    `(let* ((,no-input (make-instance 'no-input-stream))
            (*standard-output* ,output)
            (*error-output* ,error-output)
            (*trace-output* *error-output*)
            (*terminal-io* (make-two-way-stream ,no-input *standard-output*))
            (*standard-input* ,no-input)
            (*debug-io* ,no-input)
            (*query-io* ,no-input))
       ,@body)))

(defun debugger-hook-calling (function)
  "A value for SB-EXT:*INVOKE-DEBUGGER-HOOK* that hands the condition to
FUNCTION.  BREAK and direct calls of INVOKE-DEBUGGER bypass handlers (and
BREAK binds *DEBUGGER-HOOK* to nil); only this hook sees them."
  (lambda (condition hook)
    (declare (ignore hook))
    (funcall function condition)))

(defmacro with-debugger-calling ((function) &body body)
  "Run BODY with any entry into the debugger handed to FUNCTION instead."
  `(let ((sb-ext:*invoke-debugger-hook* (debugger-hook-calling ,function))
         (*debugger-hook* nil))
     ,@body))

(defmacro with-agent-lock ((mutex) &body body)
  "BODY holding MUTEX, one of the agent's locks, with interrupts deferred:
SB-THREAD:WITH-MUTEX runs its body with interrupts allowed, and a thread
interrupted there (threads :interrupt, a deadline) would wait at its stop
holding the lock, and every call that takes it, replies to cl-mcp among
them, with it.  For short bodies that wait for nothing else."
  `(sb-sys:without-interrupts
     (sb-thread:with-mutex (,mutex) ,@body)))

;;;; Threads the agent makes

(defparameter *unblock-deferrable-signals*
  (let ((name (first (existing-symbols '(("SB-UNIX" "UNBLOCK-DEFERRABLE-SIGNALS"))))))
    (and name (fboundp name) name))
  "SBCL's function that unblocks the signals carrying interrupts, when this
SBCL has it.")

;;; SIGPROF is not among SBCL's deferrable signals, yet a handler blocks it
;;; too: a thread made inside an interrupt (`leave-lane' after a deadline
;;; or an answer window) inherits it blocked, and SB-SPROF never samples it.

(defun change-sigprof-mask (how)
  "pthread_sigmask(HOW, {SIGPROF}) for this thread (HOW: 0 block, 1
unblock, as on Linux); true when SIGPROF was blocked before."
  (sb-alien:with-alien ((set (array (sb-alien:unsigned 64) 16))  ; sigset_t: 1024 bits
                        (old (array (sb-alien:unsigned 64) 16)))
    (dotimes (i 16) (setf (sb-alien:deref set i) 0))
    (setf (sb-alien:deref set 0) (ash 1 (1- sb-unix:sigprof)))
    (sb-alien:alien-funcall
     (sb-alien:extern-alien "pthread_sigmask"
                            (function sb-alien:int sb-alien:int
                                      sb-alien:system-area-pointer sb-alien:system-area-pointer))
     how (sb-alien:alien-sap set) (sb-alien:alien-sap old))
    (logbitp (1- sb-unix:sigprof) (sb-alien:deref old 0))))

(defvar *making-agent-thread* nil
  "True while `make-agent-thread' makes a thread: the agent's own threads
are never watched as a user's (agent/user-threads.lisp).")

(defun make-agent-thread (function name &rest arguments)
  "A thread running FUNCTION on ARGUMENTS that can be interrupted (for its
deadline, a cancel, or SB-EXT:EXIT) wherever it was made.  SBCL 2.2.9 gives
a new thread the signal mask of the thread that made it, and inside an
interrupt (a deadline's, where an evaluation waits at its error) the
signals that carry interrupts are blocked: a thread made there would never
hear one."
  (let ((*making-agent-thread* t))
    (sb-thread:make-thread (lambda ()
                             (when *unblock-deferrable-signals*
                               (funcall *unblock-deferrable-signals*))
                             (change-sigprof-mask 1)
                             (apply function arguments))
                           :name name)))

;;;; Replies that fit a Swank frame
;;;
;;; Swank's frame header holds 24 bits of length: a reply of 16 MB or more
;;; does not fail, it drops the connection (and, in a shared image, hands a
;;; waiting evaluation to the programmer's debugger).  cl-mcp's calls each
;;; return through `fitted-reply', the one place that measures a reply.

(defconstant +frame-limit+ (- (expt 2 24) 1 64)
  "Bytes a reply's value may take in a Swank frame: the most the header
can say, less the `(:return (:ok ...) ID)' around it.")

(defstruct (printed-reply (:constructor printed-reply (text value)))
  "A reply VALUE already printed as Swank prints it: printed again, it is
its TEXT (the watch still reads VALUE)."
  (text "" :type string)
  value)

(defmethod print-object ((reply printed-reply) stream)
  (write-string (printed-reply-text reply) stream))

(defun reply-value (reply)
  "The value REPLY, a reply's value or a `printed-reply', stands for."
  (if (printed-reply-p reply) (printed-reply-value reply) reply))

(defun fitted-reply (value)
  "VALUE as Swank will write it when it fits a frame (printed once, here,
as Swank prints a reply); else (:cl-mcp-reply-too-large BYTES), which
cl-mcp reports as an error, and the connection stays."
  (let ((printer (find-symbol "PRIN1-TO-STRING-FOR-EMACS" "SWANK/RPC")))
    (if (not (and printer (fboundp printer)))
        value
        (let* ((text (funcall printer value (symbol-value (find-symbol "*SWANK-IO-PACKAGE*" "SWANK"))))
               (bytes (if (< (* 4 (length text)) +frame-limit+)
                          (length text) ; at most 4 bytes a character: it fits
                          (length (sb-ext:string-to-octets text :external-format :utf-8)))))
          (if (> bytes +frame-limit+)
              (list :cl-mcp-reply-too-large bytes)
              (printed-reply text value))))))
