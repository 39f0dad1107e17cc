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
  "The variables a REPL maintains, in the order of a session's values of
them (`session-record-repl-history').")

(defvar *history-lock* (sb-thread:make-mutex :name "cl-mcp history")
  "Guards the changes to the sessions' REPL histories and the kept values.")

(defmacro with-history-lock (() &body body)
  "Run BODY holding `*history-lock*', with interrupts deferred: a deadline
that lands there would wait at its error holding the lock."
  `(with-agent-lock (*history-lock*) ,@body))

(defun call-with-repl-variables (thunk)
  "Call THUNK with the REPL's variables bound to this session's history
(`-' to the last form, as `+'): each attached cl-mcp has its own."
  (let ((history (session-record-repl-history (session-record))))
    (progv (cons '- *repl-variables*) (cons (nth 6 history) history)
      (funcall thunk))))

(defun note-repl-values (form values)
  "FORM has returned VALUES: shift cl-mcp's history as a REPL does, and set
this evaluation's bindings of the REPL's variables to it."
  (let* ((record (session-record))
         (history (with-history-lock ()
                    (let ((old (session-record-repl-history record)))
                      (setf (session-record-repl-history record)
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
;;; the others have moved on.  Under memory pressure the oldest give way
;;; (see "Giving way" below): their entries then hold weak pointers.

(defconstant +kept-values+ 100
  "How many evaluations' values are kept.")

(defstruct (kept-entry (:constructor make-kept-entry (number value session)))
  "The value of evaluation NUMBER, of SESSION (`current-session'): VALUE
itself, or, once it has given way to free memory, a weak pointer to it
\(WEAK true)."
  (number 0 :type (integer 1) :read-only t)
  (value nil)
  (session nil :read-only t)
  (weak nil))

(defvar *kept-entries* (make-array +kept-values+ :initial-element nil)
  "A ring of `kept-entry', one for each of the last evaluations that
returned, in the order they returned; nil in a slot not used yet.")

(defvar *kept-next* 0
  "The slot of `*kept-entries*' the next value goes into.")

(defvar *evicted-below* 1
  "Evaluations numbered below this may have had their value pushed out of
the ring.")

(defun reset-below ()
  "The asking session's evaluations numbered below this were made before
its last reset."
  (session-record-reset-below (session-record)))

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
                 (:dropped
                  (format stream "Evaluation ~D's value is no longer kept: it was dropped to ~
                                  free memory (the heap was more than half full after a ~
                                  garbage collection, so the oldest values gave way)."
                          number))
                 (:none
                  (format stream "Evaluation ~D has no value: it has not returned (it is ~
                                  running, or waiting at an error), or it never will (it ~
                                  ended at an error or was aborted)."
                          number))))))
  (:documentation "`value' was asked for a value it does not keep."))

(defun keep-value (number value)
  "Keep VALUE as the value of evaluation NUMBER, in place of the oldest kept;
then let the oldest values give way if memory is short (`give-way')."
  (with-history-lock ()
    (let ((old (aref *kept-entries* *kept-next*)))
      (when old
        (setf *evicted-below* (max *evicted-below* (1+ (kept-entry-number old))))))
    (setf (aref *kept-entries* *kept-next*) (make-kept-entry number value (current-session))
          *kept-next* (mod (1+ *kept-next*) +kept-values+)))
  (give-way))

(defun value (number)
  "The primary value of evaluation NUMBER (its last form's, as `*' had it
after that form), while it is among the last `+kept-values+' evaluations
that returned and has not been dropped to free memory.  Any other NUMBER
is a `value-not-kept' error that says why."
  (check-type number (integer 1))
  (let ((entry (with-history-lock ()
                 (find number *kept-entries* :key (lambda (entry) (and entry (kept-entry-number entry)))))))
    (when entry
      (if (kept-entry-weak entry)
          (multiple-value-bind (object alive) (sb-ext:weak-pointer-value (kept-entry-value entry))
            (when alive
              (return-from value object)))
          (return-from value (kept-entry-value entry))))
    (error 'value-not-kept
           :number number
           :reason (cond ((> number *evaluation-counter*) :future)
                         ((< number *evicted-below*) :evicted)
                         ((< number (reset-below)) :reset)
                         (entry :dropped)
                         (t :none)))))

;;;; Giving way
;;;
;;; Kept values must not exhaust the heap (a 200 MB array evaluated five
;;; times in a 1 GiB heap did).  When a value is kept and SBCL's own last
;;; collection left the heap more than half full, the oldest half of the
;;; values still held are turned into weak pointers, once for each such
;;; collection.  A value still referenced elsewhere (by `*', `**', `***',
;;; or the user's own variables) costs nothing more and stays reachable by
;;; `value'; the rest is freed by SBCL's next collections, and `value' says
;;; it was dropped.
;;;
;;; Why no collection of cl-mcp's own: in a shared image the heap is the
;;; programmer's, and a full collection stops every thread, Emacs's
;;; included; with their data over half the heap it would follow every
;;; evaluation that conses (ten of 32 MB each took 3.9 s, against 0.28 s).
;;; What SBCL's collections leave, noted by an after-GC hook, says as much
;;; for free.  Why at the next kept value and not in the hook: the hook
;;; runs in whichever thread collected, perhaps holding the history lock.

(defparameter *crowded-fraction* 1/2
  "The part of the dynamic space in use, after one of SBCL's collections,
above which the oldest kept values give way.")

(defvar *crowded-after-gc* nil
  "True when SBCL's last collection left the heap crowded and no kept value
has given way since.")

(defun note-heap-after-gc ()
  "Note whether the collection that just ended left more than
`*crowded-fraction*' of the dynamic space in use (in `sb-ext:*after-gc-hooks*')."
  (setf *crowded-after-gc* (crowded-now-p)))

;;; Put on by `prepare-embedded-image' and `prepare-attached-connection';
;;; taken off by `detach-from-image' with cl-mcp's other hooks.

(defun weaken-oldest-half ()
  "Turn the oldest half (at least one) of the kept values still held into
weak pointers."
  (with-history-lock ()
    (let* ((held (loop for offset below +kept-values+
                       for kept = (aref *kept-entries* (mod (+ *kept-next* offset) +kept-values+))
                       when (and kept (not (kept-entry-weak kept)))
                         collect kept)))
      (loop for kept in held
            repeat (ceiling (length held) 2)
            do (setf (kept-entry-value kept) (sb-ext:make-weak-pointer (kept-entry-value kept))
                     (kept-entry-weak kept) t)))))

(defparameter *nearly-full-fraction* 3/4
  "The part of the dynamic space in use, garbage included, above which
`give-way' collects once the oldest kept values gave way.")

(defun crowded-now-p (&optional (fraction *crowded-fraction*))
  "Whether more than FRACTION of the dynamic space is in use now, garbage
included: read, not collected."
  (> (sb-kernel:dynamic-usage) (* fraction (sb-ext:dynamic-space-size))))

(defun give-way ()
  "When SBCL's last collection left the heap crowded, or it is crowded now
(large values kept one after another fill it between two collections), let
the oldest half of the kept values give way.  Weak, they go at SBCL's next
collection, which an allocation the heap cannot take starts anyway."
  (when (or (shiftf *crowded-after-gc* nil) (crowded-now-p))
    (weaken-oldest-half)
    ;; Nearly full: SBCL's next collection may take only the young
    ;; generations, and a large value weakened in an older one would stay
    ;; until the heap is exhausted.  The one collection cl-mcp forces.
    (when (crowded-now-p *nearly-full-fraction*)
      (sb-ext:gc :full t))))

(defun forget-history ()
  "Forget this session's REPL history and the values it kept (`soft-reset')."
  ;; Only this session's values: another assistant's stay (in an image
  ;; cl-mcp owns, the one session's are all of them).
  (let ((session (current-session))
        (record (session-record)))
    (with-history-lock ()
      (setf (session-record-repl-history record) (make-list 9)
            *kept-entries* (map 'vector (lambda (entry)
                                          (and entry (not (eq (kept-entry-session entry) session)) entry))
                                *kept-entries*)
            (session-record-reset-below record) (1+ *evaluation-counter*)))))
