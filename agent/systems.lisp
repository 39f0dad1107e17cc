;;;; agent/systems.lisp --- the session's definitions and loading systems
;;;;
;;;; list-definitions and load-system.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; Entry point: the session's definitions

(defvar *baseline-packages* (list-all-packages)
  "Packages that existed when the agent was first loaded.  Packages created
later belong to the session (see `session-packages').")

(defun session-packages ()
  "CL-USER and every package created since the agent was loaded."
  (cons (find-package "COMMON-LISP-USER")
        (set-difference (list-all-packages) *baseline-packages*)))

(defun lambda-list-text (function-designator)
  "The lambda list of FUNCTION-DESIGNATOR as a programmer writes it:
parameter names without package prefixes, keywords and default values as
written (strings quoted)."
  (labels ((write-part (part out)
             (typecase part
               (keyword (format out ":~A" (symbol-name part)))
               (symbol (write-string (symbol-name part) out))
               (cons (write-char #\( out)
                     (loop for (item . rest) on part
                           do (write-part item out)
                              (typecase rest
                                (null)
                                (cons (write-char #\Space out))
                                (t (write-string " . " out) (write-part rest out))))
                     (write-char #\) out))
               (t (prin1 part out)))))
    (handler-case
        (let ((lambda-list (sb-introspect:function-lambda-list function-designator))
              (*print-pretty* nil)
              (*print-length* 20)
              (*print-level* 4))
          (if lambda-list
              (with-output-to-string (out) (write-part lambda-list out))
              "()"))
      (serious-condition () "(...)"))))

(defun variable-text (symbol)
  "SYMBOL's value, printed on one line of at most 80 characters."
  (one-line (with-result-printing ()
              (let ((*print-pretty* nil))
                (safe-print (symbol-value symbol) #'prin1-to-string)))
            80))

(defun class-kind (class)
  "\"structure\", \"condition\" or \"class\": what kind of class CLASS is."
  (typecase class
    (structure-class "structure")
    (sb-pcl::condition-class "condition")
    (t "class")))

(defun symbol-definitions (symbol kinds)
  "The definitions SYMBOL names, as (KIND NAME DETAIL) lists."
  (let ((name (symbol-designator symbol))
        (found '()))
    (when (and (member :functions kinds) (fboundp symbol)
               (not (macro-function symbol)) (not (special-operator-p symbol)))
      (push (list :function name (lambda-list-text (fdefinition symbol))) found))
    (when (and (member :variables kinds) (boundp symbol) (not (keywordp symbol)))
      (push (list :variable name (variable-text symbol)) found))
    (when (and (member :macros kinds) (macro-function symbol))
      (push (list :macro name (lambda-list-text (macro-function symbol))) found))
    (when (member :classes kinds)
      (let ((class (find-class symbol nil)))
        (when class
          (push (list :class name (class-kind class)) found))))
    found))

(defun list-definitions (&key (type "all"))
  "The session's definitions of TYPE (\"all\", \"functions\", \"variables\",
\"macros\" or \"classes\") as a list of (KIND NAME DETAIL), sorted by kind
and name: KIND is :function, :variable, :macro or :class; NAME the symbol
as written from CL-USER; DETAIL the lambda list, the printed value, or the
kind of class."
  (let ((kinds (if (string= type "all")
                   '(:functions :variables :macros :classes)
                   (list (intern (string-upcase type) :keyword))))
        (definitions '()))
    (dolist (package (session-packages))
      (do-symbols (symbol package)
        (when (eq (symbol-package symbol) package)
          (setf definitions
                (nconc (symbol-definitions symbol kinds) definitions)))))
    (sort (remove-duplicates definitions :test #'equal)
          (lambda (a b)
            (or (string< (symbol-name (first a)) (symbol-name (first b)))
                (and (eq (first a) (first b))
                     (string< (second a) (second b))))))))

;;;; Entry point: loading systems

(defun quicklisp-setup-file ()
  "Quicklisp's setup file in the home directory, if it is there."
  (probe-file (merge-pathnames "quicklisp/setup.lisp" (user-homedir-pathname))))

(defun ensure-quicklisp ()
  "True when Quicklisp is loaded, loading it from ~/quicklisp when present."
  (or (find-package "QL")
      (let ((setup (quicklisp-setup-file)))
        (when setup
          (load setup)
          (find-package "QL")))))

(defun system-version (name)
  "The version of ASDF system NAME, or nil."
  (let ((system (asdf:find-system name nil)))
    (and system (asdf:component-version system))))

(defparameter *redefinition-warning*
  (first (existing-symbols '(("SB-KERNEL" "REDEFINITION-WARNING"))))
  "SBCL's class of warnings about redefining a function or macro.")

(defun redefinition-p (warning)
  "True for a redefinition warning: ASDF compiles a file, then loads it into
the same image, so every macro of a freshly compiled system is 'redefined'."
  (and *redefinition-warning* (typep warning *redefinition-warning*)))

(defun missing-system-p (condition name)
  "True when CONDITION says that system NAME itself cannot be found (not one
of its dependencies)."
  (or (and (typep condition 'asdf:missing-component)
           (not (typep condition 'asdf:missing-dependency))
           (equal (asdf/find-component:missing-requires condition) name))
      (string= (symbol-name (type-of condition)) "SYSTEM-NOT-FOUND")))

(defun %load-system (name quicklisp stdout record-warning)
  "Load NAME with output to STDOUT; return (:ok) or (:error PLIST).
Warnings other than redefinitions go to RECORD-WARNING as (TYPE MESSAGE)."
  (block loading
    (flet ((fail (c)
             (return-from loading
               (list :error
                     (if (missing-system-p c name)
                         (list :type (condition-type-name c)
                               :message (format nil "System ~S not found." name)
                               :backtrace nil)
                         (describe-error c (frame-lines (error-frames) c
                                                        *backtrace-frame-limit*)))))))
      (handler-bind ((warning
                       (lambda (w)
                         (unless (redefinition-p w)
                           (funcall record-warning
                                    (list (public-type-name w 'warning) (condition-message w))))
                         (muffle-warning w)))
                     (serious-condition #'fail))
        (with-standard-streams (stdout stdout)
          ;; BREAK and INVOKE-DEBUGGER end the load too.
          (with-debugger-calling (#'fail)
            (if quicklisp
                (funcall (find-symbol "QUICKLOAD" "QL") name :silent t)
                (asdf:load-system name))
            (list :ok)))))))

(defun load-system (name &key (max-output 20000) (tag nil))
  "Load the ASDF system NAME (a string), through Quicklisp when it is
available.  Return a plist: :status (:ok, :error, or :aborted when
cancelled under TAG), :system, :loader (\"quicklisp\" or \"asdf\"),
:warnings as (TYPE MESSAGE) lists, and :version or :error.  Compiler
chatter goes to a capped stream (MAX-OUTPUT characters) and is dropped.
Packages the system creates are libraries, not the session's own
definitions."
  (let* ((stdout (make-capped-output-stream max-output))
         (warnings '())
         (before (list-all-packages))
         (quicklisp (ensure-quicklisp))
         (outcome (with-running (tag sb-thread:*current-thread*)
                    (or (catch 'load-cancelled
                          (%load-system name quicklisp stdout
                                        (lambda (w) (push w warnings))))
                        (list :aborted)))))
    (setf *baseline-packages*
          (union *baseline-packages* (set-difference (list-all-packages) before)))
    (list* :status (first outcome)
           :system name
           :loader (if quicklisp "quicklisp" "asdf")
           :warnings (nreverse warnings)
           (case (first outcome)
             (:ok (list :version (system-version name)))
             (:error (list :error (second outcome)))))))
