;;;; tests/truth/notes.lisp --- the compiler notes oracle, in a plain SBCL
;;;;
;;;; sbcl --script notes.lisp PRISTINE SYSTEM EDITED
;;;;
;;;; Loads SYSTEM from PRISTINE (never edited; pushed on ASDF's central
;;;; registry), then compiles each of its source files, in the copy EDITED,
;;;; with COMPILE-FILE, and prints one line per condition the compiler
;;;; signals with a place in that file:
;;;;
;;;;   NOTE TAB FILE TAB SEVERITY TAB FORM TAB AFTER TAB MESSAGE
;;;;
;;;; SEVERITY is as Swank names it (error, read-error, warning,
;;;; style-warning, note); FORM the 0-based number of the top-level form
;;;; SBCL was compiling (the root of its original source path); AFTER the
;;;; 1-based line of the file position SBCL records for that form (where
;;;; reading it began: the end of the form before); MESSAGE the condition
;;;; printed, its whitespace runs made one space.  Redefinitions are left
;;;; out, as cl-mcp leaves them out, and so are conditions without a
;;;; place (SBCL's summary of undefined names).
;;;;
;;;; No part of cl-mcp or Swank is loaded.

(require :asdf)
(require :sb-posix)
(load (merge-pathnames "system-files.lisp" *load-truename*))

(defpackage #:truth-notes (:use #:cl))
(in-package #:truth-notes)

(defun severity (condition)
  "CONDITION's severity, in the order Swank's SBCL backend tells them."
  (typecase condition
    (sb-ext:compiler-note "note")
    (sb-c:compiler-error "error")
    (reader-error "read-error")
    (error "error")
    (style-warning "style-warning")
    (t "warning")))

(defun one-line (text)
  "TEXT with each run of whitespace one space, trimmed."
  (let ((words '()) (word '()))
    (flet ((end-word ()
             (when word (push (coerce (nreverse word) 'string) words) (setf word '()))))
      (loop for char across text
            do (if (member char '(#\Space #\Tab #\Newline #\Return #\Page))
                   (end-word)
                   (push char word)))
      (end-word))
    (format nil "~{~A~^ ~}" (nreverse words))))

(defun line-at (octets position)
  (1+ (count 10 octets :end (min position (length octets)))))

(defun report (file octets condition out)
  "Print CONDITION's line, when it has a place in FILE."
  (let ((context (sb-c::find-error-context nil)))
    (when (and context
               (sb-c::compiler-error-context-original-source-path context)
               (sb-c::compiler-error-context-file-position context)
               (not (typep condition 'sb-kernel:redefinition-warning)))
      (format out "NOTE~C~A~C~A~C~D~C~D~C~A~%" #\Tab file #\Tab (severity condition) #\Tab
              (car (last (sb-c::compiler-error-context-original-source-path context))) #\Tab
              (line-at octets (sb-c::compiler-error-context-file-position context)) #\Tab
              (one-line (let ((*print-pretty* t) (sb-int:*print-condition-references* nil))
                          (princ-to-string condition)))))))

(defun compile-noting (file out)
  "Compile FILE, printing each condition's line to OUT."
  (let ((octets (truth-system-files:octets-of file)))
    (handler-bind ((sb-ext:compiler-note (lambda (c) (report file octets c out) (muffle-warning c)))
                   (warning (lambda (c) (report file octets c out) (muffle-warning c))))
      (let ((*standard-output* (make-broadcast-stream)) (*error-output* (make-broadcast-stream))
            (fasl (format nil "/tmp/truth-notes-~D.fasl" (sb-posix:getpid))))
        (unwind-protect (compile-file file :output-file fasl)
          (when (probe-file fasl) (delete-file fasl)))))))

(defun main (pristine system edited)
  (truth-system-files:load-quietly pristine system)
  (dolist (file (truth-system-files:edited-files pristine system edited))
    (handler-case (compile-noting file *standard-output*)
      (error (e) (format *error-output* "~A: ~A~%" file e)))))

(destructuring-bind (pristine system edited) (rest sb-ext:*posix-argv*)
  (main pristine system edited))
