;;;; tests/truth/places.lisp --- the places oracle, in a plain SBCL
;;;;
;;;; sbcl --script places.lisp PRISTINE SYSTEM EDITED [FILE...]
;;;;
;;;; Loads SYSTEM from PRISTINE, a copy of its sources that is never edited
;;;; (pushed on ASDF's central registry, so it is found before Debian's),
;;;; so that its packages and readtables exist; then reads each FILE (by
;;;; default every source file of the system, in the copy EDITED) with
;;;; SBCL's own reader, form by form, as the files are on disk now, and
;;;; prints one line per definition it finds:
;;;;
;;;;   FILE TAB LINE TAB TYPE TAB QUERY TAB PACKAGE TAB NAME TAB QUALIFIERS TAB SPECIALIZERS TAB HASH TAB END
;;;;
;;;; LINE is the 1-based line where the defining form starts (its opening
;;;; parenthesis: a true #+ feature before it is skipped, a false one
;;;; skips its form); QUERY the symbol, package-qualified; NAME, QUALIFIERS
;;;; and SPECIALIZERS printed in PACKAGE, the symbol's home, as
;;;; find-definition prints them; HASH a hash of the form's text; END the
;;;; last line of the top-level form that holds it.  And one line per
;;;; top-level form, its first and last lines (the xref oracle's):
;;;;
;;;;   FORM TAB FILE TAB START TAB END
;;;;
;;;; No part of cl-mcp or Swank is loaded.

(require :asdf)
(load (merge-pathnames "system-files.lisp" *load-truename*))

(defpackage #:truth-places (:use #:cl))
(in-package #:truth-places)

(defparameter *types*
  '((defun . "function") (defmacro . "macro") (defgeneric . "generic-function")
    (defmethod . "method") (defclass . "class") (defvar . "variable")
    (defparameter . "variable") (defconstant . "constant") (defstruct . "structure")
    (define-condition . "condition") (deftype . "type")
    (define-compiler-macro . "compiler-macro") (defsetf . "setf-expander")
    (define-setf-expander . "setf-expander"))
  "The defining operators the oracle knows, with find-definition's type word.")

(defun skip-to-form (stream)
  "Move STREAM past blanks, comments and false feature expressions to
where the next form starts; nil at the end of the file."
  (loop
    (let ((char (peek-char t stream nil nil)))
      (cond ((null char) (return nil))
            ((char= char #\;) (read-line stream nil))
            ((char= char #\#)
             (let ((start (file-position stream)))
               (read-char stream)
               (let ((next (read-char stream nil)))
                 (case next
                   (#\| (funcall (get-dispatch-macro-character #\# #\|) stream #\| nil))
                   ((#\+ #\-)
                    (let ((feature (let ((*package* (find-package :keyword))) (read stream))))
                      (unless (eq (not (sb-int:featurep feature)) (char= next #\-))
                        (let ((*read-suppress* t)) (read stream)))))
                   (t (file-position stream start) (return t))))))
            (t (return t))))))

(defun printed (object package)
  "OBJECT printed as find-definition prints names read in PACKAGE."
  (let ((*package* package) (*print-pretty* nil) (*print-case* :upcase)
        (*print-length* 10) (*print-level* 3))
    (prin1-to-string object)))

(defun method-signature (arguments)
  "The qualifiers and specializers of a DEFMETHOD whose name is followed
by ARGUMENTS."
  (let ((lambda-list (find-if #'listp arguments)))
    (values (loop for item in arguments until (listp item) collect item)
            (loop for parameter in lambda-list
                  until (member parameter lambda-list-keywords)
                  collect (let ((specializer (if (consp parameter) (second parameter) t)))
                            ;; (EQL 'X) is recorded as (EQL X)
                            (if (and (consp specializer) (consp (second specializer))
                                     (eq (first (second specializer)) 'quote))
                                (list (first specializer) (second (second specializer)))
                                specializer))))))

(defun definitions (form)
  "The defining forms FORM is or holds (in PROGN and EVAL-WHEN)."
  (when (and (consp form) (symbolp (car form)))
    (case (car form)
      (progn (mapcan #'definitions (rest form)))
      (eval-when (mapcan #'definitions (cddr form)))
      (t (and (assoc (car form) *types*) (consp (rest form)) (list form))))))

(defun definition-name (form)
  "The name FORM defines."
  (let ((name (second form)))
    (if (and (eq (car form) 'defstruct) (consp name)) (first name) name)))

(defun inner-offset (text form)
  "Where inner definition FORM opens in TEXT, a top-level form's text
\(compared without case), or nil when not exactly once."
  (let* ((name (definition-name form))
         (symbol (if (consp name) (second name) name))
         (needle (string-downcase (format nil "(~A " (symbol-name (car form)))))
         (found (loop for at = (search needle text :test #'char-equal)
                        then (search needle text :test #'char-equal :start2 (1+ at))
                      while at
                      when (search (string-downcase (symbol-name symbol))
                                   (string-downcase (subseq text at (min (length text) (+ at 200)))))
                        collect at)))
    (and (= (length found) 1) (first found))))

(defun report (file octets offset form text end)
  "Print FORM's line: see the file's header."
  (let* ((name (definition-name form))
         (symbol (if (consp name) (second name) name))
         (package (symbol-package symbol)))
    (when (and (symbolp symbol) package)
      (multiple-value-bind (qualifiers specializers)
          (if (eq (car form) 'defmethod) (method-signature (cddr form)) (values nil nil))
        (format t "~A~C~D~C~A~C~A~C~A~C~A~C~A~C~A~C~D~C~D~%"
                file #\Tab (1+ (count 10 octets :end offset)) #\Tab
                (cdr (assoc (car form) *types*)) #\Tab
                (printed symbol (find-package :keyword)) #\Tab (package-name package) #\Tab
                (printed name package) #\Tab
                (if qualifiers (printed qualifiers package) "") #\Tab
                (if (eq (car form) 'defmethod) (printed specializers package) "") #\Tab
                (sxhash text) #\Tab (1+ (count 10 octets :end (max 0 (1- end)))))))))

(defun read-file (file)
  "Print every definition of FILE, read form by form as ASDF would."
  (let ((octets (truth-system-files:octets-of file))
        (*package* (find-package :cl-user))
        (*readtable* (copy-readtable nil)))
    (with-open-file (in file :external-format :utf-8)
      (loop while (skip-to-form in)
            do (let* ((start (file-position in))
                      (form (read-preserving-whitespace in nil in))
                      (end (file-position in))
                      (text (sb-ext:octets-to-string octets :start start :end end
                                                            :external-format :utf-8)))
                 (when (eq form in) (return))
                 (when (truth-system-files:compile-time-p form)
                   (eval form))
                 (format t "FORM~C~A~C~D~C~D~%" #\Tab file #\Tab (1+ (count 10 octets :end start))
                         #\Tab (1+ (count 10 octets :end (max 0 (1- end)))))
                 (dolist (inner (definitions form))
                   (let ((at (if (eq inner form) 0 (inner-offset text inner))))
                     (when at
                       (report file octets
                               (+ start (length (sb-ext:string-to-octets (subseq text 0 at)
                                                                         :external-format :utf-8)))
                               inner (if (eq inner form) text (subseq text at)) end)))))))))

(defun main (pristine system edited files)
  (truth-system-files:load-quietly pristine system)
  (dolist (file (or files (truth-system-files:edited-files pristine system edited)))
    (handler-case (read-file file)
      (error (e) (format *error-output* "~A: ~A~%" file e)))))

(destructuring-bind (pristine system edited &rest files) (rest sb-ext:*posix-argv*)
  (main pristine system edited files))
