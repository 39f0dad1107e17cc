;;;;; tests/truth/system-files.lisp --- what the oracles that run in a plain
;;;; SBCL (places.lisp, callers.lisp, notes.lisp) share: a library loaded
;;;; from its pristine copy, its source files found in the copy being
;;;; edited, and reading them as compile-file does.

(defpackage #:truth-system-files
  (:use #:cl)
  (:export #:load-quietly #:edited-files #:compile-time-p #:octets-of))
(in-package #:truth-system-files)

(defun source-files (component)
  "Every CL source file under COMPONENT, in the system's order."
  (typecase component
    (asdf:cl-source-file (list component))
    (asdf:parent-component (mapcan #'source-files (asdf:component-children component)))
    (t '())))

(defun load-quietly (pristine system)
  "Load SYSTEM from PRISTINE (pushed on ASDF's central registry, so it is
found before Debian's), its output and warnings dropped."
  (push (pathname pristine) asdf:*central-registry*)
  (let ((*standard-output* (make-broadcast-stream)) (*error-output* (make-broadcast-stream)))
    (handler-bind ((warning #'muffle-warning))
      (asdf:load-system system))))

(defun edited-files (pristine system edited)
  "The namestrings of SYSTEM's source files (loaded from PRISTINE), in
the copy EDITED."
  (mapcar (lambda (component)
            (namestring (merge-pathnames (enough-namestring (asdf:component-pathname component)
                                                            (truename pristine))
                                         (truename edited))))
          (source-files (asdf:find-system system))))

(defun compile-time-p (form)
  "True when FORM changes how the forms after it read, as compile-file
would evaluate it: IN-PACKAGE, IN-READTABLE, an EVAL-WHEN for compile time."
  (and (consp form) (symbolp (car form))
       (or (member (symbol-name (car form)) '("IN-PACKAGE" "IN-READTABLE") :test #'string=)
           (and (eq (car form) 'eval-when) (consp (rest form))
                (intersection (second form) '(:compile-toplevel compile))))))

(defun octets-of (file)
  "FILE's bytes."
  (with-open-file (in file :element-type '(unsigned-byte 8))
    (let ((octets (make-array (file-length in) :element-type '(unsigned-byte 8))))
      (read-sequence octets in)
      octets)))
