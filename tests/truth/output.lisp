;;;; tests/truth/output.lisp --- the output oracle's writers, inside cl-mcp's image
;;;;
;;;; Loaded by tests/truth/output.py.  A writer writes lines to a stream
;;;; and counts what it wrote: each line is TAG SEQUENCE TEXT, so that the
;;;; harness finds a writer's lines wherever they reach the model; the text
;;;; is seeded random, non-ASCII included.  `written' gives each writer's
;;;; count of characters and lines and the MD5 of its UTF-8 text.

(require :sb-md5)

(defpackage #:truth-output
  (:use #:cl)
  (:export #:writer #:written #:done-p))
(in-package #:truth-output)

(defvar *written* (make-hash-table :test 'equal :synchronized t)
  "Each writer's text as it wrote it, by tag.")

(defvar *done* (make-hash-table :test 'equal :synchronized t)
  "The tags of the writers that have ended.")

(defparameter *alphabet*
  (coerce (list* #\Space #\- #\( #\) #\" #\; #\é #\λ #\日 #\本 (code-char #x1F642)
                 (coerce "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" 'list))
          'string)
  "What the lines' text is made of.")

(defun line-text (random width)
  (let ((text (make-string (random (1+ width) random))))
    (dotimes (i (length text) text)
      (setf (char text i) (char *alphabet* (random (length *alphabet*) random))))))

(defun writer (tag lines width seed &key (style :whole))
  "A function of one stream that writes LINES lines of up to WIDTH
characters to it as tag TAG, seeded with SEED, keeping what it wrote, then
notes TAG done.  STYLE :whole writes each line with one WRITE-STRING;
:format with FORMAT's ~A~%, two writes; :chars one WRITE-CHAR a character."
  (lambda (stream)
    (let ((random (sb-ext:seed-random-state seed))
          (kept (make-string-output-stream)))
      (dotimes (i lines)
        (let ((line (format nil "~A ~D ~A~%" tag i (line-text random width))))
          (ecase style
            (:whole (write-string line stream))
            (:format (format stream "~A~%" (subseq line 0 (1- (length line)))))
            (:chars (loop for char across line do (write-char char stream))))
          (write-string line kept)))
      (finish-output stream)
      (setf (gethash tag *written*) (get-output-stream-string kept)
            (gethash tag *done*) t))))

(defun done-p (&rest tags)
  "True when every writer of TAGS has ended."
  (every (lambda (tag) (gethash tag *done*)) tags))

(defun written (&rest tags)
  "One line per writer of TAGS: TAG, then the characters and lines it
wrote, and the MD5 of its text in UTF-8, tab-separated."
  (dolist (tag tags (values))
    (let ((text (gethash tag *written* "")))
      (format t "~A~C~D~C~D~C~(~{~2,'0X~}~)~%" tag #\Tab (length text) #\Tab (count #\Newline text) #\Tab
              (coerce (sb-md5:md5sum-string text :external-format :utf-8) 'list)))))
