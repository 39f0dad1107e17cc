;;;; tests/truth/callers.lisp --- the xref oracle, in a plain SBCL
;;;;
;;;; sbcl --script callers.lisp PRISTINE SYSTEM EDITED CALLEES
;;;;
;;;; Loads SYSTEM from PRISTINE (as places.lisp does) and asks SBCL's own
;;;; cross-reference data, `sb-introspect:who-calls', for the callers of
;;;; each symbol CALLEES (a file, one package-qualified name a line) names.
;;;; SBCL records each call at its caller's top-level form (its number in
;;;; the file) and a form number inside it.  Both texts are read here with
;;;; SBCL's reader, each cons's start noted, and the form numbered as the
;;;; compiler numbers it (`sb-c::find-source-paths'), so that each call is
;;;; placed in the text it was compiled from, and in the file as it is now
;;;; in EDITED: its top-level form is the one that reads to the same form
;;;; (comments and blank lines aside), its call the form of the same number.
;;;; One line per recorded call:
;;;;
;;;;   CALL TAB CALLEE TAB FILE TAB COMPILED-LINE TAB COMPILED-FORM-LINE TAB FORM-LINE TAB LINE
;;;;
;;;; FILE is in EDITED; COMPILED-LINE the call's line in PRISTINE, and
;;;; COMPILED-FORM-LINE the first line of its top-level form there; FORM-LINE
;;;; and LINE the first line of its top-level form and the call's line now,
;;;; or - and - when no top-level form of the file reads as it did (the
;;;; caller was deleted, renamed or cut off).
;;;;
;;;; No part of cl-mcp or Swank is loaded.

(require :asdf)
(require :sb-introspect)
(load (merge-pathnames "system-files.lisp" *load-truename*))

(defpackage #:truth-callers (:use #:cl))
(in-package #:truth-callers)

(defstruct top
  "One top-level form as read: the form, its first byte, where each cons
it holds starts (by EQ), and its printed self, which names it across edits."
  form start starts key)

(defvar *starts* nil "Where each cons read so far starts, while a form is read.")

(defun noting (function width)
  "A reader macro function that calls FUNCTION and notes where the cons it
returns started, WIDTH bytes before the stream's position when called."
  (lambda (stream &rest arguments)
    (let* ((start (- (file-position stream) width))
           (form (apply function stream arguments)))
      (when (consp form)
        (setf (gethash form *starts*) start))
      form)))

(defun noting-readtable ()
  "A copy of the readtable now, whose list, quote, backquote and #' note
where their forms start."
  (let ((readtable (copy-readtable *readtable*)))
    (dolist (char '(#\( #\' #\`))
      (let ((function (get-macro-character char readtable)))
        (when function
          (set-macro-character char (noting function 1) nil readtable))))
    (let ((function (ignore-errors (get-dispatch-macro-character #\# #\' readtable))))
      (when function
        (set-dispatch-macro-character #\# #\' (noting function 2) readtable)))
    readtable))

(defun printed-key (form)
  (let ((*package* (find-package :keyword)) (*print-pretty* nil) (*print-circle* t)
        (*print-readably* nil) (*print-length* nil) (*print-level* nil))
    (prin1-to-string form)))

(defun read-tops (file)
  "FILE's top-level forms, in order, as compile-file reads them."
  (let ((*package* (find-package :cl-user))
        (*readtable* (copy-readtable nil))
        (tops '()))
    (with-open-file (in file :external-format :utf-8)
      (loop
        ;; Gensyms a reader macro makes (iterate's #L) are named alike in
        ;; both texts, so that a form reads the same before and after edits.
        (let* ((*starts* (make-hash-table :test #'eq))
               (form (let ((*readtable* (noting-readtable)) (*gensym-counter* 0)) (read in nil in))))
          (when (eq form in) (return))
          (when (truth-system-files:compile-time-p form)
            (eval form))
          (push (make-top :form form :start (gethash form *starts*) :starts *starts*
                          :key (printed-key form))
                tops))))
    (coerce (nreverse tops) 'vector)))

(defun numbered-form (top number)
  "Where the subform of TOP the compiler numbers NUMBER starts: the form
of that number the text opens (a list's tails share numbers, and no text
opens them), else the nearest form around it whose start is noted."
  (let ((sb-c::*source-paths* (make-hash-table :test #'eq))
        (form (top-form top))
        (path nil))
    (sb-c::find-source-paths form 0)
    (maphash (lambda (each each-path)
               (when (eql (second each-path) number)
                 (let ((noted (gethash each (top-starts top))))
                   (when noted
                     (return-from numbered-form noted))
                   (setf path (or path (cddr each-path))))))
             sb-c::*source-paths*)
    ;; PATH: the indices from the top-level form down, innermost first.
    (let ((start (top-start top)) (at form))
      (dolist (index (rest (reverse path)) start)
        (setf at (and (listp at) (nth index at)))
        (let ((noted (and (consp at) (gethash at (top-starts top)))))
          (when noted (setf start noted)))))))

(defun line-of (octets offset)
  (1+ (count 10 octets :end (min offset (length octets)))))

(defun counterpart (tops-now tops index)
  "The top-level form of TOPS-NOW that reads as form INDEX of TOPS did:
the same printed form, the same how many-th of its kind; or nil."
  (let* ((key (top-key (aref tops index)))
         (ordinal (count key (subseq tops 0 index) :key #'top-key :test #'string=)))
    (loop for top across tops-now
          when (string= (top-key top) key)
            do (if (zerop ordinal) (return top) (decf ordinal)))))

(defun main (pristine system edited callees-file)
  (truth-system-files:load-quietly pristine system)
  (let ((pristine-root (namestring (truename pristine)))
        (edited-root (namestring (truename edited)))
        (read-files (make-hash-table :test #'equal)))
    (flet ((file-data (file)
             (or (gethash file read-files)
                 (setf (gethash file read-files)
                       (handler-case (list (read-tops file) (truth-system-files:octets-of file))
                         (error (e) (format *error-output* "~A: ~A~%" file e) nil))))))
      (with-open-file (in callees-file)
        (loop for query = (read-line in nil) while query
              do (let ((callee (ignore-errors (let ((*package* (find-package :keyword)))
                                                (read-from-string query)))))
                   (dolist (entry (and callee (ignore-errors (sb-introspect:who-calls callee))))
                     (let* ((source (cdr entry))
                            (pathname (sb-introspect:definition-source-pathname source))
                            (compiled (and pathname (namestring pathname))))
                       (when (and compiled (eql 0 (search pristine-root compiled)))
                         (let* ((now (concatenate 'string edited-root (subseq compiled (length pristine-root))))
                                (before (file-data compiled))
                                (after (and (probe-file now) (file-data now)))
                                (index (first (sb-introspect:definition-source-form-path source)))
                                (number (sb-introspect:definition-source-form-number source)))
                           (when (and before index number (< index (length (first before))))
                             (let* ((top (aref (first before) index))
                                    (again (and after (counterpart (first after) (first before) index))))
                               (format t "CALL~C~A~C~A~C~D~C~D~C~A~C~A~%" #\Tab query #\Tab now #\Tab
                                       (line-of (second before) (numbered-form top number)) #\Tab
                                       (line-of (second before) (top-start top)) #\Tab
                                       (if again (line-of (second after) (top-start again)) "-") #\Tab
                                       (if again (line-of (second after) (numbered-form again number)) "-"))))))))))))))

(destructuring-bind (pristine system edited callees) (rest sb-ext:*posix-argv*)
  (main pristine system edited callees))
