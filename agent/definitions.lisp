;;;; agent/definitions.lisp --- the session's definitions
;;;;
;;;; What the session's evaluations defined (list-definitions), and the
;;;; helpers that say what a symbol names, which the development tools share.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; Entry point: the session's definitions

(defvar *baseline-packages* (list-all-packages)
  "Packages that existed when the agent was first loaded.  Packages created
later belong to the session (see `session-packages').")

(defun call-loading-libraries (thunk)
  "Call THUNK, which loads systems: the packages made meanwhile are their
libraries', not the session's definitions (see `session-packages')."
  (let ((before (list-all-packages)))
    (unwind-protect (funcall thunk)
      (setf *baseline-packages*
            (union *baseline-packages* (set-difference (list-all-packages) before))))))

(defun session-packages ()
  "CL-USER and every package created since the agent was loaded."
  (cons (find-package "COMMON-LISP-USER")
        (set-difference (list-all-packages) *baseline-packages*)))

(defparameter *lambda-list-limit* 2000
  "Characters of a lambda list shown, at most: a default value can be any
object.")

(defun lambda-list-text (function-designator)
  "The lambda list of FUNCTION-DESIGNATOR as a programmer writes it:
parameter names without package prefixes, keywords with their colon, and
the default forms of optional, keyword and auxiliary parameters printed as
from CL-USER (hunchentoot's (COMPUTE-PARAMETER ...) reads as
HUNCHENTOOT::COMPUTE-PARAMETER, not as a CL-USER name); at most
`*lambda-list-limit*' characters, then \"…\"."
  (labels ((write-name (part out)
             (typecase part
               (keyword (format out ":~A" (symbol-name part)))
               (symbol (write-string (symbol-name part) out))
               (cons (write-list part out nil))
               (t (prin1 part out))))
           (write-form (form out)
             (let ((*package* (find-package "COMMON-LISP-USER")))
               (prin1 form out)))
           (write-parameter (parameter out)
             ;; (VAR INIT SUPPLIED-P), VAR perhaps (KEYWORD VAR)
             (write-char #\( out)
             (loop for (item . rest) on parameter
                   for index from 0
                   do (if (= index 1) (write-form item out) (write-name item out))
                      (typecase rest
                        (null)
                        (cons (write-char #\Space out))
                        (t (write-string " . " out) (write-name rest out))))
             (write-char #\) out))
           (write-list (list out defaulting)
             ;; A lambda list, or a part of one: after &optional, &key or
             ;; &aux (DEFAULTING) a list is a parameter with a default form.
             (write-char #\( out)
             (loop for (item . rest) on list
                   do (cond ((member item lambda-list-keywords)
                             (setf defaulting (member item '(&optional &key &aux)))
                             (write-name item out))
                            ((and defaulting (consp item)) (write-parameter item out))
                            ((consp item) (write-list item out nil))
                            (t (write-name item out)))
                      (typecase rest
                        (null)
                        (cons (write-char #\Space out))
                        (t (write-string " . " out) (write-name rest out))))
             (write-char #\) out)))
    (handler-case
        (multiple-value-bind (lambda-list unknown)
            (sb-introspect:function-lambda-list function-designator)
          (let ((*print-pretty* nil)
                (*print-length* 20)
                (*print-level* 4))
            ;; Code compiled with (debug 0) keeps no lambda list: NIL, unknown.
            (cond (unknown "(...)")
                  (lambda-list (printed-prefix lambda-list (lambda (list out) (write-list list out nil))
                                               *lambda-list-limit*))
                  (t "()"))))
      (serious-condition () "(...)"))))

(defun variable-text (symbol)
  "SYMBOL's value, printed on one line of at most 80 characters
(`printed-line')."
  (with-result-printing ()
    (let ((*print-pretty* nil))
      (printed-line (symbol-value symbol) 80))))

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
