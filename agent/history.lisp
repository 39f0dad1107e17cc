;;;; agent/history.lisp --- the REPL's variables, and the values kept
;;;;
;;;; cl-mcp's own history of `*', `+', `/' and the rest, bound around each
;;;; of its evaluations as a REPL would set them; and the primary values of
;;;; the last evaluations, reachable by number with `value'.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; The REPL's variables
;;;
;;; As in SLIME's REPL (swank-repl.lisp, `repl-eval') and CLHS 25.1.1:
;;; while a form is evaluated `-' is that form; once it has returned, `+'
;;; `++' `+++' shift and `+' becomes the form, `*' `**' `***' shift and `*'
;;; becomes its primary value, `/' `//' `///' shift and `/' becomes the
;;; list of its values.  Each top-level form of an evaluation counts, as if
;;; it had been typed on its own.  A form that does not return (an error
;;; or a timeout that is then aborted) changes none of them, `+' included,
;;; as in SLIME; one continued through a restart counts when it returns.
;;; eval-in-frame's forms count too, as at SBCL's debugger prompt.
;;;
;;; Why bound, never set: in an image cl-mcp shares, these variables'
;;; global values are the programmer's own REPL history (SLIME's REPL
;;; thread sets them globally).  cl-mcp keeps its history here and binds
;;; the variables to it around each of its evaluations; what a form
;;; returns goes into this history and into those bindings.  One history
;;; for the image: concurrent evaluations each add to it as they finish a
;;; form.

(defparameter *repl-variables* '(* ** *** / // /// + ++ +++)
  "The variables a REPL maintains, in the order of `*repl-history*'.")

(defvar *repl-history* (make-list 9)
  "cl-mcp's values of `*repl-variables*', a fresh list after each change (so
that it may be read without the lock).")

(defvar *history-lock* (sb-thread:make-mutex :name "cl-mcp history")
  "Guards the changes to `*repl-history*' and the kept values.")

(defmacro with-history-lock (() &body body)
  "Run BODY holding `*history-lock*', with interrupts deferred: a deadline
that lands there would wait at its error holding the lock."
  `(sb-sys:without-interrupts
     (sb-thread:with-mutex (*history-lock*)
       ,@body)))

(defun call-with-repl-variables (thunk)
  "Call THUNK with the REPL's variables bound to cl-mcp's history (`-' to
the last form, as `+')."
  (let ((history *repl-history*))
    (progv (cons '- *repl-variables*) (cons (nth 6 history) history)
      (funcall thunk))))

(defun note-repl-values (form values)
  "FORM has returned VALUES: shift cl-mcp's history as a REPL does, and set
this evaluation's bindings of the REPL's variables to it."
  (let ((history (with-history-lock ()
                   (let ((old *repl-history*))
                     (setf *repl-history*
                           (list (first values) (nth 0 old) (nth 1 old)
                                 values (nth 3 old) (nth 4 old)
                                 form (nth 6 old) (nth 7 old)))))))
    (loop for variable in *repl-variables*
          for value in history
          do (setf (symbol-value variable) value))))

(defun eval-as-typed (form evaluator)
  "The values of FORM, as a list, evaluated by EVALUATOR (a function of the
form) as a REPL evaluates a form typed at its prompt: `-' is FORM meanwhile,
and the REPL's variables are updated once it returns.  Call it where
`call-with-repl-variables' has bound them."
  (setf - form)
  (let ((values (multiple-value-list (funcall evaluator form))))
    (note-repl-values form values)
    values))

(defun eval-forms-as-typed (forms evaluator)
  "The values of the last of FORMS (nil if there are none), each evaluated
by EVALUATOR with `eval-as-typed', the REPL's variables bound to cl-mcp's
history."
  (call-with-repl-variables
   (lambda ()
     (let ((values (list nil)))
       (dolist (form forms (values-list values))
         (setf values (eval-as-typed form evaluator)))))))

;;;; The values kept
;;;
;;; The primary value of each evaluation that returns is kept under the
;;; evaluation's number, for the last `+kept-values+' of them (a ring):
;;; `(cl-mcp-agent:value N)' reaches it from later code, even once `*' and
;;; the others have moved on.

(defconstant +kept-values+ 100
  "How many evaluations' values are kept.")

(defvar *kept-values* (make-array +kept-values+ :initial-element nil)
  "A ring of (NUMBER . VALUE), one for each of the last evaluations that
returned, in the order they returned; nil in a slot not used yet.")

(defvar *kept-next* 0
  "The slot of `*kept-values*' the next value goes into.")

(defvar *evicted-below* 1
  "Evaluations numbered below this may have had their value pushed out of
the ring.")

(defvar *reset-below* 1
  "Evaluations numbered below this were made before the last reset.")

(define-condition value-not-kept (error)
  ((number :initarg :number :reader value-not-kept-number)
   (reason :initarg :reason :reader value-not-kept-reason))
  (:report (lambda (condition stream)
             (let ((number (value-not-kept-number condition)))
               (ecase (value-not-kept-reason condition)
                 (:future
                  (format stream "There is no evaluation ~D yet: the latest is ~D."
                          number *evaluation-counter*))
                 (:reset
                  (format stream "Evaluation ~D's value is no longer kept: reset-session ~
                                  forgot it."
                          number))
                 (:evicted
                  (format stream "Evaluation ~D's value is no longer kept: only the last ~D ~
                                  evaluations' values are."
                          number +kept-values+))
                 (:none
                  (format stream "Evaluation ~D has no value: it has not returned (it is ~
                                  running, or waiting at an error), or it never will (it ~
                                  ended at an error or was aborted)."
                          number))))))
  (:documentation "`value' was asked for a value it does not keep."))

(defun keep-value (number value)
  "Keep VALUE as the value of evaluation NUMBER, in place of the oldest kept."
  (with-history-lock ()
    (let ((old (aref *kept-values* *kept-next*)))
      (when old
        (setf *evicted-below* (max *evicted-below* (1+ (car old))))))
    (setf (aref *kept-values* *kept-next*) (cons number value)
          *kept-next* (mod (1+ *kept-next*) +kept-values+))))

(defun value (number)
  "The primary value of evaluation NUMBER (its last form's, as `*' had it
after that form), while it is among the last `+kept-values+' evaluations
that returned.  Any other NUMBER is a `value-not-kept' error that says why."
  (check-type number (integer 1))
  (let ((entry (with-history-lock ()
                 (find number *kept-values* :key #'car))))
    (when entry
      (return-from value (cdr entry)))
    (error 'value-not-kept
           :number number
           :reason (cond ((> number *evaluation-counter*) :future)
                         ((< number *reset-below*) :reset)
                         ((< number *evicted-below*) :evicted)
                         (t :none)))))

(defun forget-history ()
  "Forget cl-mcp's REPL history and the values kept (`soft-reset')."
  (with-history-lock ()
    (setf *repl-history* (make-list 9)
          *kept-values* (make-array +kept-values+ :initial-element nil)
          *kept-next* 0
          *reset-below* (1+ *evaluation-counter*)
          *evicted-below* *reset-below*)))
