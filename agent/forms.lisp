;;;; agent/forms.lisp --- compile-form: one top-level form of a file, as C-c C-c
;;;;
;;;; SLIME's C-c C-c compiles the top-level form around point, read in the
;;;; buffer's package (the nearest `in-package' above it) and readtable
;;;; (Swank's `*readtable-alist*', which named-readtables fills), through
;;;; `swank:compile-string-for-emacs', which records the buffer, the file and
;;;; the form's position with every definition it makes.  `compile-form-of'
;;;; does the same for a line of a file as it is on disk, so find-definition,
;;;; xref and describe-symbol then place those definitions in the file.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define.

(in-package #:cl-mcp-agent)

(defun skip-lisp-blanks (text index)
  "The index of the first character at or after INDEX of TEXT that is not
blank or in a comment (`;' to the end of the line, or a `#| |#' block, which
nests)."
  (let ((length (length text)))
    (loop
      (cond ((>= index length) (return length))
            ((member (char text index) '(#\Space #\Tab #\Newline #\Return #\Page))
             (incf index))
            ((char= (char text index) #\;)
             (setf index (or (position #\Newline text :start index) length)))
            ((and (char= (char text index) #\#) (< (1+ index) length)
                  (char= (char text (1+ index)) #\|))
             (let ((depth 1))
               (incf index 2)
               (loop while (and (plusp depth) (< index length))
                     do (cond ((and (char= (char text index) #\|) (< (1+ index) length)
                                    (char= (char text (1+ index)) #\#))
                               (decf depth) (incf index 2))
                              ((and (char= (char text index) #\#) (< (1+ index) length)
                                    (char= (char text (1+ index)) #\|))
                               (incf depth) (incf index 2))
                              (t (incf index))))))
            (t (return index))))))

(defun line-at (text index)
  "The 1-based line of character INDEX of TEXT."
  (1+ (count #\Newline text :end (min index (length text)))))

(defun line-index (text line)
  "The index of the first character of LINE (1-based) of TEXT, or nil past
its end."
  (let ((index 0))
    (loop repeat (1- line)
          do (setf index (position #\Newline text :start index))
             (unless index (return-from line-index nil))
             (incf index))
    index))

(defun reader-error-text (message)
  "MESSAGE, the report of an SBCL reader error, without the lines that
place it in the stream read (`Line: …', `Stream: …'): for a form read from
a string, or from Swank's temporary file, the caller places it in the file."
  (let ((cut (loop for (start . nil) on (cons 0 (loop for index = (position #\Newline message)
                                                             then (position #\Newline message :start (1+ index))
                                                           while index collect (1+ index)))
                   when (let ((line (string-left-trim " " (subseq message start))))
                          (or (eql 0 (search "Line: " line)) (eql 0 (search "Stream: " line))))
                     return start)))
    (string-right-trim '(#\Space #\Newline) (subseq message 0 cut))))

(define-condition unreadable-form (error)
  ((line :initarg :line :reader unreadable-form-line)
   (message :initarg :message :reader unreadable-form-message)
   (error-line :initarg :error-line :reader unreadable-form-error-line)
   (error-column :initarg :error-column :reader unreadable-form-error-column))
  (:report (lambda (condition stream)
             (format stream "The form at line ~D does not read: ~A, at line ~D, column ~D of the file"
                     (unreadable-form-line condition) (unreadable-form-message condition)
                     (unreadable-form-error-line condition) (unreadable-form-error-column condition))))
  (:documentation "A top-level form of a file that the reader cannot read:
its first line, and the line and column of the last character the reader
took."))

(defun skipped-by-feature-p (text start in)
  "True, with IN read past it, when a #+ or #- at START of TEXT (IN's
text) has a false feature expression: the reader skips the form after it,
which is no top-level form (under *READ-SUPPRESS* the reader would go on
to the next form, or to the end of the file, as part of this one).  The
feature expression is read in the keyword package."
  (when (and (< (1+ start) (length text)) (char= (char text start) #\#)
             (member (char text (1+ start)) '(#\+ #\-)))
    (file-position in (+ start 2))
    (let ((feature (handler-case (let ((*package* (find-package "KEYWORD")) (*read-suppress* nil))
                                   (read in))
                     (error () in))))
      (if (and (not (eq feature in))
               (eq (not (sb-int:featurep feature)) (char= (char text (1+ start)) #\+)))
          (let ((*read-suppress* t))
            (read in)
            t)
          (progn (file-position in start) nil)))))

(defun top-level-form-bounds (text index)
  "The (START . END) character offsets of the top-level forms of TEXT up to
the one that ends after INDEX, in order; read with *READ-SUPPRESS*, so no
symbol is interned and no #. is evaluated; a form a false #+ or #- skips is
none (see `skipped-by-feature-p').  A form that does not read signals
`unreadable-form' with its first line and where the reader stopped."
  (with-input-from-string (in text)
    (let ((forms '()))
      (loop
        (let ((start (skip-lisp-blanks text (file-position in))))
          (when (>= start (length text))
            (return (nreverse forms)))
          (file-position in start)
          (unless (handler-case (or (skipped-by-feature-p text start in)
                                    (let ((*read-suppress* t))
                                      (read-preserving-whitespace in)
                                      nil))
                    (error (condition)
                      ;; The last character the reader took.
                      (let ((stop (max 0 (1- (min (file-position in) (length text))))))
                        (error 'unreadable-form
                               :line (line-at text start)
                               :message (if (typep condition 'end-of-file)
                                            "the file ends inside it"
                                            (reader-error-text (condition-message condition)))
                               :error-line (line-at text stop)
                               :error-column (- stop (or (position #\Newline text :end stop :from-end t) -1))))))
            (push (cons start (file-position in)) forms)
            (when (> (file-position in) index)
              (return (nreverse forms)))))))))

(defun in-package-name (text start &optional end)
  "The package name an `in-package' form at START of TEXT (ending at END,
when it is known) gives, or nil when the form there is not one."
  (let ((opening (substitute-if #\Space (lambda (char) (member char '(#\Tab #\Newline #\Return #\Page)))
                                (string-downcase (subseq text start (min (length text) (+ start 30)))))))
    (when (some (lambda (prefix) (eql 0 (search prefix opening)))
                '("(in-package " "(cl:in-package " "(common-lisp:in-package "))
      (handler-case
          (let ((*package* (find-package "COMMON-LISP-USER")))
            (let ((form (reading-quietly (text :start start :end end) (read-from-string text t nil :start start :end end))))
              (and (consp form) (consp (rest form)) (string (second form)))))
        (serious-condition () nil)))))

(defun in-readtable-name (text start &optional end)
  "The readtable name an `in-readtable' form at START of TEXT gives, as a
string, or nil; a tab or a newline may follow the operator."
  (let* ((opening (substitute-if #\Space (lambda (char) (member char '(#\Tab #\Newline #\Return #\Page)))
                                 (string-downcase (subseq text start (min (length text) (+ start 40))))))
         (after (search "in-readtable " opening)))
    (when (and after (<= after 19)
               (every (lambda (c) (or (alpha-char-p c) (find c "(:-"))) (subseq opening 0 after)))
      (handler-case
          (let ((*package* (find-package "COMMON-LISP-USER")))
            (let ((form (reading-quietly (text :start start :end end) (read-from-string text t nil :start start :end end))))
              (and (consp form) (consp (rest form)) (symbolp (second form))
                   (symbol-name (second form)))))
        (serious-condition () nil)))))

(defun named-readtable (name)
  "The readtable named-readtables registers under NAME (a symbol's name;
:standard and :common-lisp are the standard one), or nil, as when
named-readtables is not loaded.  Nothing is interned."
  (let ((finder (and (find-package "NAMED-READTABLES")
                     (find-symbol "FIND-READTABLE" "NAMED-READTABLES"))))
    (and finder (fboundp finder)
         (loop for package in (cons (find-package "KEYWORD") (list-all-packages))
               for symbol = (find-symbol name package)
               thereis (and symbol (funcall finder symbol))))))

(defun form-readtable (readtable package)
  "The readtable a form is read in: READTABLE (that of the nearest
`in-readtable' above it) when there is one, else Swank's for PACKAGE, as
SLIME's C-c C-c reads (`swank::guess-buffer-readtable')."
  (or readtable (swank::guess-buffer-readtable (and package (package-name package)))))

(defun form-package (text forms)
  "The package the last of FORMS ((START . END) in TEXT) is read in: that of
the nearest `in-package' form above it, as SLIME finds a buffer's package;
CL-USER when there is none.  A second value names a package that does not
exist; a third is the readtable it is read in (see `form-readtable')."
  (let ((above (reverse (butlast forms))))
    (flet ((readtable (package)
             (form-readtable (loop for (start . end) in above
                                   for name = (in-readtable-name text start end)
                                   when name return (named-readtable name))
                             package)))
      (loop for (start . end) in above
            for name = (in-package-name text start end)
            when name
              do (return-from form-package
                   (let ((package (find-package name)))
                     (values package (and (null package) name) (readtable package)))))
      (let ((package (find-package "COMMON-LISP-USER")))
        (values package nil (readtable package))))))

(defun defined-names (text start end package readtable)
  "What the form from START to END of TEXT defines, as \"TYPE NAME\" strings
(see `definition-forms'): read in PACKAGE and READTABLE, the names printed
as from CL-USER."
  (handler-case
      (let ((form (let ((*package* package) (*readtable* readtable))
                    (read-from-string text t nil :start start :end end)))
            (*package* (find-package "COMMON-LISP-USER")))
        (and (consp form)
             (loop for (type . definition) in (expanded-definition-forms form)
                   collect (format nil "~A ~A" type (defined-name-text (definition-form-name definition))))))
    (serious-condition () '())))

(defun defined-name-text (name)
  "NAME, as `definition-form-name' gives it, printed as find-definition
shows a definition: a method as its name, its qualifiers and its
specializers, (FOO :AFTER (INTEGER))'s as FOO :AFTER (INTEGER)."
  (if (and (consp name) (= (length name) 3) (listp (second name)) (listp (third name))
           (not (eq (first name) 'setf)))
      (format nil "~A~{ ~A~} ~A" (printed-name (first name))
              (mapcar #'printed-name (second name)) (printed-name (third name)))
      (printed-name name)))

(defparameter *definer-expansion-depth* 8
  "How many macroexpansions a form's definers are looked for through.")

(defun expanded-definition-forms (form &optional (depth *definer-expansion-depth*))
  "The defining forms FORM holds (see `definition-forms'), looked for
through the expansion of a macro of its own (hunchentoot's
`define-easy-handler' is a `defun', ironclad's `define-digest-finalizer'
a `defmethod'), and of the forms at top level inside the PROGN and
EVAL-WHEN it expands to: what compile-form just compiled defines."
  (let ((operator (and (consp form) (car form))))
    (cond ((not (and operator (symbolp operator))) '())
          ((member operator '(progn eval-when))
           (loop for inner in (if (eq operator 'progn) (rest form) (cddr form))
                 append (expanded-definition-forms inner depth)))
          ((definition-forms form))
          ((and (plusp depth) (macro-function operator) (not (special-operator-p operator)))
           (let ((expansion (handler-case (macroexpand-1 form) (serious-condition () form))))
             (and (not (eq expansion form))
                  (expanded-definition-forms expansion (1- depth))))))))

(defun buffer-note-in-file (note file text)
  "NOTE, one of Swank's compiler notes for a form compiled from a string,
with its (:buffer NAME) (:offset POSITION OFFSET) place turned into the
place in FILE, whose text is TEXT: POSITION is the form's (1-based, in
characters) and OFFSET counts characters from it; a note's place in a
file counts bytes.  A read error's message loses its place in Swank's
temporary file (`reader-error-text')."
  (when (eq (getf note :severity) :read-error)
    (setf note (list* :message (reader-error-text (getf note :message))
                      (loop for (key value) on note by #'cddr
                            unless (eq key :message) append (list key value)))))
  (let ((location (getf note :location)))
    (if (and (consp location) (eq (first location) :location)
             (eq (first (second location)) :buffer)
             (eq (first (third location)) :offset))
        (destructuring-bind (position offset) (rest (third location))
          (list* :location `(:location (:file ,file)
                                       (:position ,(1+ (length (sb-ext:string-to-octets
                                                                text :external-format :utf-8
                                                                     :end (min (length text)
                                                                               (+ position (or offset 0) -1)))))))
                 (loop for (key value) on note by #'cddr
                       unless (eq key :location) append (list key value))))
        note)))

(defun compile-form-of (path line &key (max-output 20000) (tag nil))
  "Compile the top-level form of the file at PATH (absolute) that holds
LINE, as SLIME's C-c C-c does: read in the package of the nearest
`in-package' above it and its readtable (see `form-package'), through `swank:compile-string-for-emacs', so the
definitions it makes record the file and the form's place.  Return a
plist: :status (:ok, or :error when it did not compile), :success, :line
and :end-line (the form's), :package, :defined (\"TYPE NAME\" strings),
:notes (see `note-plist', placed in the file) and :dropped; or a :status
:error plist when the form cannot be found or read.  Cancellable under TAG
(`with-cancellable'): the compile runs the user's macros."
  (with-cancellable (tag)
    (or (missing-internals-error :compile-form)
        (source-file-problem path)
        (%compile-form-at path line max-output))))

(defun %compile-form-at (path line max-output)
  "`compile-form-of' of the form that holds LINE of the file at PATH, an
existing file."
  (let* ((file (namestring (truename path)))
         (text (with-open-file (in file :external-format (or (swank/backend:guess-external-format file)
                                                             :utf-8))
                 (let* ((buffer (make-string (file-length in)))
                        (end (read-sequence buffer in)))
                   (subseq buffer 0 end))))
         (index (line-index text line)))
    (unless index
      (return-from %compile-form-at
        (name-error "CL-MCP:NO-FORM" (format nil "~A has ~D lines; there is no line ~D."
                                             file (line-at text (length text)) line))))
    (handler-case
        (let* ((forms (top-level-form-bounds text index))
               (form (car (last forms))))
          (unless (and form (<= (line-at text (car form)) line (line-at text (cdr form))))
            (return-from %compile-form-at
              (name-error "CL-MCP:NO-FORM"
                          (format nil "Line ~D of ~A is not inside a top-level form~@[; the next one starts at line ~D~]."
                                  line file (and form (line-at text (car form)))))))
          (multiple-value-bind (package missing readtable) (form-package text forms)
            (if missing
                (name-error "PACKAGE-ERROR"
                            (format nil "The package ~A of the in-package above line ~D does not exist: load its system first."
                                    missing line))
                (%compile-form file text (car form) (cdr form) package readtable max-output))))
      (unreadable-form (condition)
        (name-error "CL-MCP:READ-ERROR" (princ-to-string condition))))))

(defun %compile-form (file text start end package readtable max-output)
  "`compile-form-of' of the form from START to END of TEXT, FILE's text,
read in PACKAGE and READTABLE."
  (note-compiled-form file (1+ start) (line-at text start) (subseq text start end))
  (multiple-value-bind (result failure)
      (call-with-failure (make-capped-output-stream max-output)
                         (lambda ()
                           (let ((swank::*buffer-package* package)
                                 (swank::*buffer-readtable* readtable))
                             ;; The buffer's name is the truename: SLIME's M-.
                             ;; prefers an open buffer of that name, and no
                             ;; Emacs buffer is named like a whole path.
                             (swank:compile-string-for-emacs
                              (subseq text start end) file
                              `((:position ,(1+ start)) (:line ,(line-at text start) 1))
                              file nil))))
    (multiple-value-bind (notes dropped)
        (note-plists (mapcar (lambda (note) (buffer-note-in-file note file text))
                             (and result (swank::compilation-result-notes result))))
      ;; Swank's success is COMPILE-FILE's failure-p, true for a full
      ;; WARNING too; the form was compiled and loaded all the same, and
      ;; only an error fails it, as compile-file's own does.
      (let ((success (and result (not failure) (notany #'failing-severity-p notes) t)))
        (list* :status (if success :ok :error)
               :success success
               :file file
               :line (line-at text start)
               :end-line (line-at text end)
               :package (package-name package)
               :defined (defined-names text start end package readtable)
               :notes notes
               :dropped dropped
               (and failure (list :error failure)))))))
