;;;; agent/output.lisp --- logging, capped output streams and printing that never fails
;;;;
;;;; Every stream a user's code writes to is capped where it is produced, and
;;;; printing a value never fails (a broken print-object is reported, not
;;;; signalled), so every reply fits one Swank frame.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; Looking up internals, logging

(defun existing-symbols (specs)
  "The symbols named by SPECS, (PACKAGE NAME) string pairs, that exist in
this SBCL; internal names come and go between releases."
  (loop for (package name) in specs
        for symbol = (and (find-package package) (find-symbol name package))
        when symbol collect symbol))

(defun log-note (control &rest arguments)
  "A line on the image's own error output (cl-mcp's log, in an embedded
image)."
  (ignore-errors
   (format *error-output* "~&;; cl-mcp: ~?~%" control arguments)
   (finish-output *error-output*)))

;;;; Capped output streams

(defun make-text-buffer ()
  "An empty adjustable string with a fill pointer."
  (make-array 256 :element-type 'character :adjustable t :fill-pointer 0))

(defclass capped-output-stream (sb-gray:fundamental-character-output-stream)
  ((buffer :initform (make-text-buffer) :accessor buffer
           :documentation "The kept characters: an adjustable string with a
fill pointer, so that its end can be read while output is still coming.")
   (limit :initarg :limit :reader limit
          :documentation "Characters kept; the rest are only counted.")
   (dropped :initform 0 :accessor dropped
            :documentation "Characters written past the limit.")
   (column :initform 0 :accessor column
           :documentation "The column the next character goes to."))
  (:documentation "A character output stream that keeps the first LIMIT
characters written to it and counts the rest, so that a runaway printer
cannot exhaust the image's memory or overflow a Swank frame."))

(defun make-capped-output-stream (limit)
  "Return a `capped-output-stream' keeping at most LIMIT characters."
  (make-instance 'capped-output-stream :limit limit))

(defun kept (stream)
  "How many characters STREAM has kept."
  (fill-pointer (buffer stream)))

(defun append-text (buffer string start end)
  "Append STRING from START to END to BUFFER, growing it by doubling."
  (let* ((fill (fill-pointer buffer))
         (new-fill (+ fill (- end start))))
    (when (> new-fill (array-dimension buffer 0))
      (setf buffer (adjust-array buffer (max new-fill (* 2 (array-dimension buffer 0))))))
    (setf (fill-pointer buffer) new-fill)
    (replace buffer string :start1 fill :start2 start :end2 end)
    buffer))

(defmethod sb-gray:stream-write-string ((stream capped-output-stream) string
                                        &optional (start 0) end)
  "Keep what fits under the limit, count the rest, and track the column."
  (let* ((end (or end (length string)))
         (count (- end start))
         (taken (min count (max 0 (- (limit stream) (kept stream)))))
         (newline (position #\Newline string :start start :end end :from-end t)))
    (when (plusp taken)
      (setf (buffer stream) (append-text (buffer stream) string start (+ start taken))))
    (incf (dropped stream) (- count taken))
    (setf (column stream) (if newline
                              (- end newline 1)
                              (+ (column stream) count)))
    string))

(defmethod sb-gray:stream-write-char ((stream capped-output-stream) char)
  "Keep CHAR if it fits under the limit, else count it; track the column."
  (if (< (kept stream) (limit stream))
      (vector-push-extend char (buffer stream) (max 256 (kept stream)))
      (incf (dropped stream)))
  (setf (column stream) (if (char= char #\Newline) 0 (1+ (column stream))))
  char)

(defmethod sb-gray:stream-line-column ((stream capped-output-stream))
  "The column, for FRESH-LINE and the pretty printer."
  (column stream))

(defmethod sb-gray:stream-start-line-p ((stream capped-output-stream))
  "True at the start of a line."
  (zerop (column stream)))

(defmethod sb-gray:stream-finish-output ((stream capped-output-stream))
  "Nothing to do: the text is kept in memory."
  nil)

(defmethod sb-gray:stream-force-output ((stream capped-output-stream))
  "Nothing to do: the text is kept in memory."
  nil)

(defun reset-capture (stream)
  "Forget what STREAM kept and counted: a new stretch of output begins."
  (setf (buffer stream) (make-text-buffer)
        (dropped stream) 0))

(defun stream-text (stream)
  "The characters kept by STREAM, as a simple string."
  (coerce (buffer stream) 'simple-string))

(defun last-line (stream &optional (limit 200))
  "The last non-empty line STREAM kept, at most LIMIT characters; read from
another thread while output is still coming, so it only reads."
  (let* ((buffer (buffer stream))
         (end (fill-pointer buffer)))
    (loop while (and (plusp end) (char= (char buffer (1- end)) #\Newline))
          do (decf end))
    (let ((start (let ((newline (position #\Newline buffer :end end :from-end t)))
                   (if newline (1+ newline) 0))))
      (subseq buffer (max start (- end limit)) end))))

;;;; Printing that never fails

(defmacro with-result-printing (() &body body)
  "Run BODY with the printer settings of the evaluate-lisp contract."
  `(let ((*print-length* 100)
         (*print-level* 10)
         (*print-circle* t)
         (*print-pretty* t)
         (*print-readably* nil)
         (*print-right-margin* 100))
     ,@body))

(defun safe-print (object printer)
  "Call PRINTER on OBJECT for a string; a failure to print becomes a marker
instead of an error of the whole call."
  (handler-case (funcall printer object)
    (serious-condition (c)
      (format nil "#<error printing object of type ~A: ~A>"
              (ignore-errors (prin1-to-string (type-of object)))
              (or (ignore-errors (princ-to-string c)) (type-of c))))))

(defun cap-string (string limit)
  "STRING cut to LIMIT characters, with the number cut as a second value."
  (if (<= (length string) limit)
      (values string 0)
      (values (subseq string 0 limit) (- (length string) limit))))

(defun one-line (text limit)
  "TEXT on one line of at most LIMIT characters."
  (let ((flat (substitute #\Space #\Newline text)))
    (if (> (length flat) limit)
        (concatenate 'string (subseq flat 0 (max 0 (- limit 3))) "...")
        flat)))

(defun condition-message (condition)
  "The report of CONDITION, or a marker when the report itself fails."
  (safe-print condition #'princ-to-string))

(defun symbol-designator (symbol)
  "SYMBOL's name, unqualified for symbols of CL and CL-USER and qualified
otherwise (SB-EXT:TIMEOUT, although CL-USER uses SB-EXT)."
  (let ((*package* (if (member (symbol-package symbol)
                               (list (find-package "COMMON-LISP")
                                     (find-package "COMMON-LISP-USER")))
                       (find-package "COMMON-LISP-USER")
                       (find-package "KEYWORD"))))
    (prin1-to-string symbol)))

(defun function-name-text (name)
  "A function name (a symbol or (SETF symbol)) as written from CL-USER."
  (let ((*package* (find-package "COMMON-LISP-USER")))
    (prin1-to-string name)))

(defun seconds-text (seconds)
  "SECONDS in words: \"2 seconds\", \"0.500 seconds\"."
  (if (and seconds (= seconds (round seconds)))
      (format nil "~D second~:P" (round seconds))
      (format nil "~,3F seconds" seconds)))

(defun print-values (values limit)
  "VALUES printed under the contract's printer settings, their total length
kept under LIMIT."
  (with-result-printing ()
    (loop for value in values
          for text = (safe-print value #'prin1-to-string)
          for room = (max 0 (- limit used))
          sum (length text) into used
          collect (multiple-value-bind (kept cut) (cap-string text room)
                    (if (plusp cut)
                        (format nil "~A~%… [~D more characters truncated]" kept cut)
                        kept)))))
