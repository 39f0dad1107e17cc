;;;; tests/truth/backtraces.lisp --- the backtraces oracle, inside cl-mcp's image
;;;;
;;;; Loaded by tests/truth/backtraces.py into the image of a cl-mcp that
;;;; loaded a library.  `library-functions' lists the library's exported
;;;; functions; `start-call' calls one in a thread of its own with wrong
;;;; arguments (`call-here', in the evaluation's own thread), under a handler that takes `sb-debug:list-backtrace' at the
;;;; signal and declines, so that the error goes on to the debugger (and
;;;; cl-mcp stops the thread there).  The handler is the thread's outermost:
;;;; it sees only an error no handler of the library took.  Nothing here
;;;; asks cl-mcp's agent anything.

(require :sb-introspect)

(defpackage #:truth-backtraces
  (:use #:cl)
  (:export #:library-functions #:start-call #:call-here #:outcome))
(in-package #:truth-backtraces)

(defvar *outcomes* (make-hash-table :test 'equal :synchronized t)
  "Each call's outcome, by its thread's name: see `run-call'.")

(defun under-p (pathname directory)
  "True when PATHNAME names a file under DIRECTORY (a namestring ending in /)."
  (and pathname
       (let ((name (namestring pathname)))
         (and (>= (length name) (length directory))
              (string= directory name :end2 (length directory))))))

(defun source-file (symbol)
  "The file SYMBOL's function was compiled from, or nil."
  (let ((source (ignore-errors (sb-introspect:find-definition-source (fdefinition symbol)))))
    (and source (sb-introspect:definition-source-pathname source))))

(defun library-functions (directory)
  "The external symbols of every package that name a function (not a macro
nor a special operator) compiled from a file under DIRECTORY, printed as
PACKAGE:NAME, sorted, each once."
  (let ((names '()))
    (dolist (package (list-all-packages))
      (do-external-symbols (symbol package)
        (when (and (eq (symbol-package symbol) package)
                   (fboundp symbol)
                   (not (macro-function symbol))
                   (not (special-operator-p symbol))
                   (under-p (source-file symbol) directory))
          (pushnew (let ((*package* (find-package "KEYWORD"))) (prin1-to-string symbol)) names
                   :test #'string=))))
    (sort names #'string<)))

(defun wrong-arguments (function value)
  "VALUE for each required parameter of FUNCTION; one VALUE when it has
none but takes an optional or rest one; none otherwise (keywords only)."
  (let* ((lambda-list (sb-introspect:function-lambda-list function))
         (required (or (position-if (lambda (p) (member p lambda-list-keywords)) lambda-list)
                       (length lambda-list))))
    (make-list (if (and (zerop required) (intersection '(&optional &rest) lambda-list))
                   1
                   required)
               :initial-element value)))

(defun first-position (names wanted &key (start 0))
  (position-if (lambda (name) (member name wanted :test #'equal)) names :start start))

(defun thread-start-p (name)
  "True for SBCL's start of a thread: SB-THREAD::RUN, and its local functions."
  (or (eq name 'sb-thread::run)
      (and (consp name) (eq (car (last name)) 'sb-thread::run))))

(defun agent-p (name)
  "True when the function NAME mentions a symbol of cl-mcp's agent (its
wrapper of a watched thread lies below the user's outermost frame)."
  (if (consp name)
      (or (agent-p (car name)) (agent-p (cdr name)))
      (and name (symbolp name) (string= (package-name (symbol-package name)) "CL-MCP-AGENT"))))

(defparameter *evaluator*
  '(sb-int:simple-eval-in-lexenv sb-impl::simple-eval-progn-body sb-impl::%simple-eval
    sb-impl::eval-in-lexenv)
  "SBCL's evaluator, whose frames cl-mcp hides on purpose.")

(defun sbcl-name-p (name)
  "True when the function NAME is SBCL's own: a symbol of COMMON-LISP or
of an SB- package, or a list whose first such symbol is one (FLET, LAMBDA
and :METHOD aside), or a foreign frame's string."
  (typecase name
    (string t)
    (symbol (let ((package (symbol-package name)))
              (and package
                   (or (eq package (find-package "COMMON-LISP"))
                       (eql 0 (search "SB-" (package-name package)))))))
    (cons (sbcl-name-p (find-if (lambda (part)
                                  (and (symbolp part) (not (member part '(flet labels lambda :method)))))
                                name)))))

(defun evaluator-wrapper-p (name below)
  "True for the (LAMBDA ()) SBCL's evaluator wraps an evaluated form in:
NAME, with only EVAL and the evaluator's frames BELOW it (docs/tools.md:
cl-mcp leaves it out with them)."
  (and (equal name '(lambda ()))
       below
       (every (lambda (name) (or (eq name 'eval) (member name *evaluator*))) below)))

(defun oracle-frames ()
  "Called by the handler: the names of the frames from the one that
signalled (below SIGNAL's %SIGNAL that called the handler; when the
signal came from a trap in compiled code, below INTERNAL-ERROR, reached
through SBCL's own frames only) down to the thread's outermost frame of its
own (above SBCL's start of the thread or cl-mcp's wrapper), printed as
docs/tools.md says a frame is (in CL-USER, *print-length* 10,
*print-level* 3; SBCL prints a frame's function name as a whole, not
nested in its call); foreign frames and SBCL's evaluator left out."
  (let* ((names (mapcar #'first (sb-debug:list-backtrace :from :current-frame)))
         (from (1+ (or (first-position names '(sb-kernel::%signal))
                       (error "no %SIGNAL frame in ~S" names))))
         (trap (first-position names '(sb-kernel:internal-error) :start from)))
    (when (and trap (every #'sbcl-name-p (subseq names from trap)))
      (setf from (1+ trap)))
    (let ((to (or (position-if (lambda (name) (or (thread-start-p name) (agent-p name))) names :start from)
                  (length names)))
          (*package* (find-package "COMMON-LISP-USER"))
          (*print-pretty* nil) (*print-length* 10) (*print-level* 3))
      (loop for (name . below) on (subseq names from to)
            unless (or (stringp name) (member name *evaluator*) (evaluator-wrapper-p name below))
              collect (prin1-to-string name)))))

(defun run-call (function arguments outcome)
  "Call FUNCTION with ARGUMENTS; OUTCOME's car (a cons kept in `*outcomes*') becomes (:SIGNALLED TYPE
FRAMES...) at each error signalled that reaches this handler (the last
one is the one the debugger gets), or (:RETURNED) when it returns."
  (handler-bind ((error (lambda (condition)
                          (setf (car outcome)
                                (list* :signalled (prin1-to-string (type-of condition)) (oracle-frames))))))
    (apply function arguments))
  (setf (car outcome) (list :returned)))

(defun outcome (thread-name &key (seconds 5))
  "The outcome of the call in thread THREAD-NAME once it signalled or
returned, or after SECONDS (the thread then terminated), printed one item
a line: SIGNALLED, RETURNED or RUNNING, then with SIGNALLED the
condition's type and the oracle's frames, innermost first.  An evaluation
of this that is waiting when the thread stops is answered \"still running\"
at once (and awaited: `lines_of' of tests/truth/backtraces.py)."
  (let ((cell (gethash thread-name *outcomes*))
        (*print-pretty* nil))
    (loop repeat (* seconds 100)
          until (car cell)
          do (sleep 0.01))
    (unless (car cell)
      (let ((thread (find thread-name (sb-thread:list-all-threads)
                          :key #'sb-thread:thread-name :test #'equal)))
        (when thread (ignore-errors (sb-thread:terminate-thread thread)))))
    (case (first (car cell))
      (:signalled (format t "SIGNALLED~%~{~A~%~}" (rest (car cell))))
      (:returned (format t "RETURNED~%"))
      (t (format t "RUNNING~%")))
    (values)))

(defun call-here (name value key)
  "Call the function NAME with `wrong-arguments' of VALUE in this thread
(an evaluation's), its outcome kept under KEY for `outcome'."
  (let ((symbol (read-from-string name)))
    (run-call symbol (wrong-arguments (fdefinition symbol) value)
              (setf (gethash key *outcomes*) (list nil)))))

(defun start-call (name value thread-name)
  "Call the function NAME (a string, PACKAGE:NAME) with `wrong-arguments'
of VALUE in a new thread named THREAD-NAME; `outcome' tells what became
of it."
  (let* ((symbol (read-from-string name))
         (arguments (wrong-arguments (fdefinition symbol) value))
         (cell (setf (gethash thread-name *outcomes*) (list nil))))
    (sb-thread:make-thread (lambda () (run-call symbol arguments cell)) :name thread-name)
    (values)))
