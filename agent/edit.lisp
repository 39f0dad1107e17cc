;;;; agent/edit.lisp --- edit-form and read-lisp-file: a file's top-level forms
;;;;
;;;; A model edits a Lisp file one top-level form at a time, found by what
;;;; it defines or by a line, and the new text is read before anything is
;;;; written: a closing parenthesis it forgot is reported at its place, not
;;;; found by the next load somewhere else.  The rest of the file keeps its
;;;; bytes: the edit splices the file's octets, it never prints forms.
;;;;
;;;; Extents come from a scan of the text (`form-end'): standard syntax,
;;;; strings, `|...|', `#\x', comments and reader conditionals; a reader
;;;; macro whose text is balanced in parentheses reads as a token.  Whether
;;;; a text reads is the real reader's answer, in the package of the nearest
;;;; `in-package' above the form and the readtable of the nearest
;;;; `in-readtable' (named-readtables), else Swank's for that package.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (forms.lisp's `%compile-form' compiles an edited form,
;;;; browse.lisp's `call-guarded' keeps the debugger out).

(in-package #:cl-mcp-agent)

;;;; Scanning a text's forms
;;;
;;; The scan runs over every character of a file at each edit: its text is
;;; a (simple-array character), and the scanner says so to the compiler.

(deftype text () '(simple-array character (*)))

(define-condition unbalanced-text (error)
  ((index :initarg :index :reader unbalanced-index)
   (opened :initarg :opened :initform nil :reader unbalanced-opened)
   (what :initarg :what :reader unbalanced-what)
   (closer :initarg :closer :initform nil :reader unbalanced-closer)
   (fix :initarg :fix :reader unbalanced-fix)
   (missing :initform 0 :accessor unbalanced-missing)
   (top :initform nil :accessor unbalanced-top))
  (:report (lambda (condition stream)
             (format stream "~A; ~A" (unbalanced-what condition) (unbalanced-fix condition))))
  (:documentation "A text whose forms do not balance: INDEX is where the
scan stopped, OPENED where the unclosed form (WHAT, closed by CLOSER)
began, FIX the smallest change that makes it read; MISSING counts the
lists left open at the end of the text, TOP is where the top-level form
holding the problem starts."))

(declaim (inline blank-char-p terminating-char-p))

(defun blank-char-p (char)
  "True for whitespace between forms."
  (member char '(#\Space #\Tab #\Newline #\Return #\Page #\Linefeed)))

(defun terminating-char-p (char)
  "True for a character that ends a token in standard syntax."
  (or (blank-char-p char) (find char "()\";'`,")))

(defun block-comment-end (text index)
  "The index after the `|#' that closes the `#|' at INDEX of TEXT (they
nest); signals `unbalanced-text' when none does."
  (declare (type text text) (type fixnum index))
  (let ((depth 0) (length (length text)) (i index))
    (loop
      (when (>= (1+ i) length)
        (error 'unbalanced-text :index length :opened index :what "a #| comment is not closed"
                                :closer "|#" :fix "add |# where the comment ends, or delete the #|"))
      (let ((this (char text i)) (next (char text (1+ i))))
        (cond ((and (char= this #\#) (char= next #\|)) (incf depth) (incf i 2))
              ((and (char= this #\|) (char= next #\#)) (decf depth) (incf i 2)
               (when (zerop depth) (return i)))
              (t (incf i)))))))

(defun skip-blanks (text index)
  "The index of the first character at or after INDEX of TEXT that is not
blank or in a comment (see `block-comment-end')."
  (declare (type text text) (type fixnum index))
  (let ((length (length text)))
    (loop
      (cond ((>= index length) (return length))
            ((blank-char-p (char text index)) (incf index))
            ((char= (char text index) #\;)
             (setf index (or (position #\Newline text :start index) length)))
            ((and (char= (char text index) #\#) (< (1+ index) length)
                  (char= (char text (1+ index)) #\|))
             (setf index (block-comment-end text index)))
            (t (return index))))))

(defun delimited-end (text index closer what)
  "The index after the CLOSER that ends the string or |symbol| opened at
INDEX of TEXT (a backslash escapes the next character)."
  (declare (type text text) (type fixnum index))
  (let ((length (length text)))
    (loop for i from (1+ index)
          do (cond ((>= i length)
                    (error 'unbalanced-text :index length :opened index :what what :closer (string closer)
                                            :fix (format nil "add ~A where it ends" closer)))
                   ((char= (char text i) #\\) (incf i))
                   ((char= (char text i) closer) (return (1+ i)))))))

(defun token-end (text index)
  "The index after the token that starts at INDEX of TEXT."
  (declare (type text text) (type fixnum index))
  (let ((length (length text)) (i index))
    (loop
      (cond ((>= i length) (return length))
            ((char= (char text i) #\\) (incf i 2))
            ((char= (char text i) #\|)
             (setf i (delimited-end text i #\| "a |symbol| is not closed")))
            ((terminating-char-p (char text i)) (return (min i length)))
            (t (incf i))))))

(defun next-form-start (text index after)
  "The start of the form that must follow the prefix AFTER (an index) at
INDEX of TEXT."
  (declare (type text text) (type fixnum index))
  (let ((start (skip-blanks text index)))
    (when (or (>= start (length text)) (char= (char text start) #\)))
      (error 'unbalanced-text :index start :opened after :what "a prefix has no form after it"
                              :fix "add the form it applies to, or delete the prefix"))
    start))

(defun list-end (text index)
  "The index after the `)' that closes the list opened at INDEX of TEXT."
  (declare (type text text) (type fixnum index))
  (let ((i (1+ index)))
    ;; Each list left open at the end counts itself, to say how many ) are missing.
    (handler-bind ((unbalanced-text (lambda (condition)
                                      (when (and (equal (unbalanced-closer condition) ")")
                                                 (>= (unbalanced-index condition) (length text)))
                                        (incf (unbalanced-missing condition))))))
      (loop
        (setf i (skip-blanks text i))
        (cond ((>= i (length text))
               (error 'unbalanced-text :index i :opened index :what "a list is not closed"
                                       :closer ")" :fix "add ) where the list ends (at the end of the text, at the latest)"))
              ((char= (char text i) #\)) (return (1+ i)))
              (t (setf i (form-end text i))))))))

(defun dispatch-end (text index)
  "The index after the form that starts with the `#' at INDEX of TEXT."
  (declare (type text text) (type fixnum index))
  (let ((i (1+ index)) (length (length text)))
    (loop while (and (< i length) (digit-char-p (char text i))) do (incf i))
    (if (>= i length)
        length
        (case (char-downcase (char text i))
          (#\\ (token-end text (min length (+ i 2))))
          (#\( (list-end text i))
          ((#\+ #\-)
           (form-end text (next-form-start text (form-end text (next-form-start text (1+ i) index)) index)))
          ((#\' #\. #\p #\a #\s #\c #\=) (form-end text (next-form-start text (1+ i) index)))
          (t (token-end text (1+ i)))))))

(defun form-end (text index)
  "The index after the form that starts at INDEX of TEXT; signals
`unbalanced-text' when it does not end."
  (declare (type text text) (type fixnum index))
  (let ((char (char text index)))
    (case char
      (#\( (list-end text index))
      (#\) (error 'unbalanced-text :index index :what "a ) closes nothing"
                                   :fix "delete this )"))
      (#\" (delimited-end text index #\" "a string is not closed"))
      ((#\' #\`) (form-end text (next-form-start text (1+ index) index)))
      (#\, (form-end text (next-form-start text (+ index (if (and (< (1+ index) (length text))
                                                                 (find (char text (1+ index)) "@."))
                                                            2 1))
                                           index)))
      (#\# (dispatch-end text index))
      (t (token-end text index)))))

(defun stray-paren-p (condition text)
  "True when CONDITION, an `unbalanced-text' in TEXT, is a ) between
top-level forms: the scan can go on after it."
  (let ((index (unbalanced-index condition)))
    (and (null (unbalanced-opened condition)) (< index (length text))
         (char= (char text index) #\)) (eql index (unbalanced-top condition)))))

(defun form-extents (text &optional on-problem (form-end #'form-end))
  "The (START . END) character offsets of the top-level forms of TEXT, in
order, each found by FORM-END (of TEXT and a form's start: the scanner's
`form-end', or one of `reader-form-end'); signals `unbalanced-text' at the
first that does not end, or with ON-PROBLEM, calls it with the condition
instead and goes on after a stray ) (see `stray-paren-p'), or stops with
the forms found."
  (unless (typep text 'text)
    (setf text (coerce text 'text)))
  (let ((forms '()) (start (skip-blanks text 0)))
    (loop while (< start (length text))
          do (handler-case
                 (let ((end (handler-bind ((unbalanced-text (lambda (condition)
                                                              (setf (unbalanced-top condition) start))))
                              (funcall form-end text start))))
                   (push (cons start end) forms)
                   (setf start (skip-blanks text end)))
               (unbalanced-text (condition)
                 (unless on-problem
                   (error condition))
                 (let ((stray (stray-paren-p condition text)))
                   ;; A stray ) sits after the form it was likely meant to close.
                   (setf (unbalanced-top condition) (if stray (car (first forms)) start))
                   (funcall on-problem condition)
                   (if stray
                       (setf start (skip-blanks text (1+ start)))
                       (return))))))
    (nreverse forms)))

;;;; Reading a file's forms in their package and readtable

(defun text-line-column (text index)
  "The 1-based line and column (in characters) of INDEX of TEXT."
  (let ((start (1+ (or (position #\Newline text :end (min index (length text)) :from-end t) -1))))
    (values (line-at text index) (1+ (- index start)))))

(defstruct (file-form (:constructor make-file-form
                          (start end line end-line package readtable readtable-name syntax)))
  "One top-level form of a file: its character offsets and first and last
lines, the package and readtable it is read in (nil: the package does not
exist), and how its extent was found (`form-syntax')."
  start end line end-line package readtable readtable-name syntax)

(defun form-syntax (named readtable package)
  "How a form read in PACKAGE under the `in-readtable' NAMED (or none),
which names READTABLE (nil: a readtable the image lacks), is delimited:
:reader, by the reader (`reader-form-end') when it is read in a readtable
of its own, whose reader macros the byte scanner cannot know; :unknown when
NAMED is a readtable the image lacks, so that the scanner, which knows only
the standard syntax, has to do; else :standard, by the scanner."
  (cond ((member named '("STANDARD" "COMMON-LISP") :test #'equal) :standard)
        (named (if readtable :reader :unknown))
        ((and package (assoc (package-name package) swank:*readtable-alist* :test #'string=)) :reader)
        (t :standard)))

(defvar *scanned-forms* 0
  "How many forms `reader-form-end' delimited with the scanner, their
readtable's reader macro failing under *READ-SUPPRESS*: bound by the
entry points that say so.")

(defun said-scanned (plist)
  "PLIST, an answer, with :scanned N when it is no error and N forms of
it were delimited by the scanner (`*scanned-forms*')."
  (if (and (eq (getf plist :status) :ok) (plusp *scanned-forms*))
      (append plist (list :scanned *scanned-forms*))
      plist))

(defun reader-form-end (package readtable)
  "A FORM-END for `form-extents' that finds where a top-level form ends as
the reader does, in PACKAGE and READTABLE, with *READ-SUPPRESS* (nothing
interned, no #. evaluated); a form a false #+ or #- skips ends where the
skipped form does, as the scanner finds it.  A form that does not read
signals `unbalanced-text'; one whose reader macro fails otherwise (it
works on the nil that reads return under *READ-SUPPRESS*) is delimited
by the scanner, and counted in `*scanned-forms*'."
  (lambda (text start)
    (with-input-from-string (in text)
      (file-position in start)
      (let ((*package* package) (*readtable* (quiet-readtable readtable)) (*read-eval* nil))
        (handler-case (progn (or (skipped-by-feature-p text start in)
                                 (let ((*read-suppress* t))
                                   (read-preserving-whitespace in)))
                             (file-position in))
          (end-of-file ()
            (error 'unbalanced-text :index (length text) :opened start
                                    :what "a form is not closed (read in its readtable)"
                                    :fix "close it where it ends (at the end of the text, at the latest)"))
          (reader-error (condition)
            (error 'unbalanced-text :index (min (length text) (file-position in)) :opened start
                                    :what (format nil "a form does not read in its readtable: ~A"
                                                  (reader-error-text (condition-message condition)))
                                    :fix "change the text there so that the reader accepts it"))
          (error ()
            (incf *scanned-forms*)
            (form-end text start)))))))

(defun file-forms (text &optional on-problem)
  "The top-level forms of TEXT as `file-form's, each with the package of
the nearest `in-package' above it and the readtable of the nearest
`in-readtable' (else Swank's for that package, as C-c C-c reads), and
delimited as its syntax says (`form-syntax'); ON-PROBLEM as `form-extents'
takes it."
  (let ((package (find-package "COMMON-LISP-USER")) (named nil) (readtable nil)
        (line 1) (counted 0) (forms '()))
    (flet ((line-of (index)
             ;; Lines counted once through the text, from one form to the next.
             (incf line (count #\Newline text :start counted :end index))
             (setf counted index)
             line))
      ;; Each form is delimited in the syntax the forms above it set.
      (form-extents text on-problem
                    (lambda (text start)
                      (let* ((syntax (form-syntax named readtable package))
                             (form-readtable (form-readtable readtable package))
                             (end (funcall (if (eq syntax :reader)
                                               (reader-form-end (or package *package*) form-readtable)
                                               #'form-end)
                                           text start)))
                        (push (make-file-form start end (line-of start) (line-of end) package
                                              form-readtable named syntax)
                              forms)
                        (let ((name (in-package-name text start end)))
                          (when name (setf package (find-package name))))
                        (let ((name (in-readtable-name text start end)))
                          (when name (setf named name readtable (named-readtable name))))
                        end)))
      (nreverse forms))))

(defmacro with-form-reading ((form) &body body)
  "BODY with the reader set as for FORM (a `file-form'): its package and
readtable."
  `(let ((*package* (or (file-form-package ,form) *package*))
         (*readtable* (file-form-readtable ,form)))
     ,@body))

(defun form-head (text form)
  "The first elements of FORM (a `file-form' of TEXT) as the reader reads
them: the operator, the name, and for a method its qualifiers and lambda
list; a form that is not a list is read whole.  Nil when they do not read."
  (handler-case
      (with-form-reading (form)
        (reading-quietly (text :start (file-form-start form) :end (file-form-end form))
        (if (char= (char text (file-form-start form)) #\()
            (with-input-from-string (in text :start (1+ (file-form-start form)) :end (file-form-end form))
              (let ((operator (read-preserving-whitespace in nil in)))
                (if (or (eq operator in) (not (symbolp operator)))
                    (list operator)
                    (let ((name (read-preserving-whitespace in nil in)))
                      (cond ((eq name in) (list operator))
                            ((string-equal (symbol-name operator) "DEFMETHOD")
                             (list* operator name
                                    (loop for item = (read-preserving-whitespace in nil in)
                                          until (eq item in)
                                          collect item
                                          until (listp item))))
                            (t (list operator name)))))))
            (let ((whole (read-from-string text t nil :start (file-form-start form)
                                                      :end (file-form-end form))))
              (if (consp whole) whole (list whole))))))
    (serious-condition () nil)))

(defun printed-readably (object)
  "OBJECT printed as the model would write it in the form's package."
  (let ((*print-pretty* nil) (*print-case* :downcase))
    (safe-print object #'prin1-to-string)))

(defun head-kind-name (head)
  "The kind (the operator's name, downcased) and the name (printed, with a
method's qualifiers and specializers) of a form whose HEAD is as
`form-head' gives it."
  (let ((operator (first head)))
    (if (and (symbolp operator) operator (rest head))
        (values (string-downcase (symbol-name operator))
                (if (and (string-equal (symbol-name operator) "DEFMETHOD") (cddr head))
                    (multiple-value-bind (qualifiers specializers) (method-form-signature (cddr head))
                      (format nil "~A~{ ~A~} ~A" (printed-readably (second head))
                              (mapcar #'printed-readably qualifiers) (printed-readably specializers)))
                    (printed-readably (second head))))
        (values (if (and operator (symbolp operator)) (string-downcase (symbol-name operator)) "form")
                nil))))

;;;; Finding a form

(defun signature-matches-p (arguments signature)
  "True when a method whose ARGUMENTS (after its name: qualifiers, then the
lambda list) are as `form-head' gives them is the one SIGNATURE (its
qualifiers, then at most one list) names: the list is its specializers
(trailing T may be left out), its parameters' names, or its lambda list."
  (multiple-value-bind (qualifiers specializers) (method-form-signature arguments)
    (let ((wanted-qualifiers (loop for item in signature until (listp item) collect item))
          (wanted (find-if #'listp signature))
          (lambda-list (find-if #'listp arguments)))
      (and (equal qualifiers wanted-qualifiers)
           (or (null wanted)
               (equal wanted (let ((end (position t specializers :test-not #'eq :from-end t)))
                               (subseq specializers 0 (if end (1+ end) 0))))
               (equal wanted specializers)
               (equal wanted (mapcar (lambda (p) (if (consp p) (first p) p))
                                     (subseq lambda-list 0 (length specializers))))
               (equal (nth-value 1 (method-form-signature (list wanted))) specializers))))))

(defun names-match-p (name wanted)
  "True when NAME, a form's, is WANTED: EQUAL, or the same string when one
of them is a string, a keyword or an uninterned symbol (a package's or a
system's name: `defpackage #:foo' is `defpackage foo')."
  (or (equal name wanted)
      (and (typep name '(or string symbol)) (typep wanted '(or string symbol))
           (some (lambda (designator)
                   (or (stringp designator) (keywordp designator)
                       (and (symbolp designator) (null (symbol-package designator)))))
                 (list name wanted))
           (string= name wanted))))

(defun target-matches-p (head target)
  "True when the form whose HEAD `form-head' gives is the one TARGET names:
TARGET, read in the form's package, is (DEFINER NAME [QUALIFIER...]
[LIST]); the definer matches by its name in any package, the name as
`names-match-p' says (or the first of a name with options), and a method, when TARGET
gives them, by its qualifiers and LIST (see `signature-matches-p')."
  (destructuring-bind (definer &optional (name nil named) &rest signature) target
    (let ((operator (first head)))
      (and named operator (symbolp operator) (symbolp definer) (rest head)
           (string-equal (symbol-name operator) (symbol-name definer))
           (or (names-match-p (second head) name)
               (and (consp (second head)) (names-match-p (first (second head)) name)))
           (or (null signature) (signature-matches-p (cddr head) signature))))))

(defun read-target (form target)
  "TARGET (a string such as \"defmethod (setf bar) :after (x y)\") read as a
list in the package and readtable of FORM, or nil when it does not read."
  (handler-case (with-form-reading (form)
                  (let ((text (format nil "(~A)" target)))
                    (reading-quietly (text) (read-from-string text))))
    (serious-condition () nil)))

(defun form-summary (text form)
  "(:line L :end-line E :kind K [:name N]) of FORM, a `file-form' of TEXT,
the name printed in the form's package; a form that reads as nothing (#+nil
before it, say) is named by its first line."
  (multiple-value-bind (kind name)
      (keeping-read-symbols ()
        (let ((head (form-head text form)))
          (if head
              (with-form-reading (form) (head-kind-name head))
              (let ((start (file-form-start form)))
                (values "form" (subseq text start (min (file-form-end form) (+ start 60)
                                                       (or (position #\Newline text :start start)
                                                           (length text)))))))))
    (list* :line (file-form-line form)
           :end-line (file-form-end-line form)
           :kind kind
           (and name (list :name name)))))

(defun located-form (text forms target line)
  "The one of FORMS (of TEXT) that TARGET names or that holds LINE, or (a
list) the :status :error plist saying why there is none or more than one."
  (let ((found
          (if target
              (remove-if-not (lambda (form)
                               (keeping-read-symbols ()
                                 (let ((wanted (read-target form target)))
                                   (and wanted (target-matches-p (form-head text form) wanted)))))
                             forms)
              (remove-if-not (lambda (form)
                               (<= (file-form-line form) line (file-form-end-line form)))
                             forms))))
    (cond ((= (length found) 1) (first found))
          ((null found)
           (name-error "CL-MCP:NO-FORM"
                       (if target
                           (format nil "No top-level form defines ~A." target)
                           (format nil "Line ~D is not inside a top-level form." line))))
          (t (append (name-error "CL-MCP:AMBIGUOUS-FORM"
                                 (format nil "~D top-level forms match ~A: give the qualifiers and specializers, or a line.~{~%  line ~D: ~A~@[ ~A~]~}"
                                         (length found) target
                                         (loop for form in found
                                               for summary = (form-summary text form)
                                               append (list (getf summary :line) (getf summary :kind)
                                                            (getf summary :name)))))
                     (list :candidates (mapcar (lambda (form) (form-summary text form)) found)))))))

;;;; Checking a text

(defun unbalanced-plist (condition text)
  "The :status :error plist for CONDITION, an `unbalanced-text' in TEXT:
where the scan stopped, where the unclosed form opened (and its text to
the end of that line), the top-level form it sits in, and the fix."
  (when (> (unbalanced-missing condition) 1)
    (setf (slot-value condition 'fix)
          (format nil "add ~D ) where the lists end (at the end of the text, at the latest; the innermost is the one opened here)"
                  (unbalanced-missing condition))))
  (multiple-value-bind (line column) (text-line-column text (unbalanced-index condition))
    (let* ((opened (unbalanced-opened condition))
           (opening (and opened (subseq text opened (min (length text) (+ opened 40)
                                                         (or (position #\Newline text :start opened)
                                                             (length text)))))))
      (multiple-value-bind (opened-line opened-column) (and opened (text-line-column text opened))
        (list :status :error
              :error (list :type "CL-MCP:UNBALANCED"
                           :message (format nil "~A at line ~D, column ~D~@[ (opened at line ~D~]~@[, column ~D~]~@[: ~A)~]; ~A."
                                            (unbalanced-what condition) line column
                                            (and opened opened-line) opened-column opening
                                            (unbalanced-fix condition)))
              :problem (append (list :line line :column column
                                     :what (unbalanced-what condition) :fix (unbalanced-fix condition))
                               (and (unbalanced-top condition)
                                    (list :form-line (line-at text (unbalanced-top condition))))
                               (and opened (list :opened-line opened-line
                                                 :opened-column opened-column :opening opening))
                               (and (unbalanced-closer condition)
                                    (list :closer (unbalanced-closer condition)))))))))

(defun read-problem (text start end)
  "Nil when the text from START to END of TEXT reads as complete forms with
the reader as it is bound, else (values MESSAGE INDEX), INDEX where the
reader stopped."
  (with-input-from-string (in text :start start :end end)
    (handler-case
        (reading-quietly (text :start start :end end)
          (loop for form = (read in nil in)
                until (eq form in)
                finally (return nil)))
      (error (condition)
        (let ((message (condition-message condition)))
          ;; SBCL's reader errors end with the stream, which says nothing here.
          (values (string-right-trim '(#\Space #\Newline)
                                     (subseq message 0 (search (format nil "~%  Stream: ") message)))
                  (+ start (or (ignore-errors (file-position in)) 0))))))))

(defun new-text-problem (text form)
  "Nil when TEXT reads as complete forms in the package and readtable of
FORM (a `file-form'), delimited as FORM is (`form-syntax'), else the
:status :error plist saying where not."
  (handler-case (when (null (form-extents text nil
                                          (if (eq (file-form-syntax form) :reader)
                                              (reader-form-end (file-form-package form)
                                                               (file-form-readtable form))
                                              #'form-end)))
                  (return-from new-text-problem
                    (name-error "CL-MCP:NO-FORM" "The new text holds no form.")))
    (unbalanced-text (condition) (return-from new-text-problem (unbalanced-plist condition text))))
  (multiple-value-bind (message index) (with-form-reading (form) (read-problem text 0 (length text)))
    (when message
      (multiple-value-bind (line column) (text-line-column text index)
        (list :status :error
              :error (list :type "CL-MCP:READ-ERROR"
                           :message (format nil "The new text does not read at line ~D, column ~D: ~A"
                                            line column message))
              :problem (list :line line :column column :what message
                             :fix "change the text there so that the reader accepts it"))))))

;;;; Writing a file

(defun file-text (octets)
  "The characters of OCTETS as UTF-8, or nil when they are not UTF-8
(the edit splices bytes and must count them exactly)."
  (handler-case (coerce (sb-ext:octets-to-string octets :external-format :utf-8) 'text)
    ;; SBCL's decoder signals on a byte that is not UTF-8.
    (sb-int:character-decoding-error () nil)))

(defun octet-offset (text index)
  "The byte offset in UTF-8 of character INDEX of TEXT."
  (length (sb-ext:string-to-octets text :external-format :utf-8 :end index)))

(defun emacs-lock-owner (path)
  "The owner Emacs wrote into the lock of PATH (`.#NAME' beside it, a
symlink to USER@HOST.PID:BOOT, or a file holding that where symlinks
cannot be made) while one of its buffers has unsaved changes to PATH; nil
when there is none, or when it names a dead process of this machine (an
Emacs that crashed, whose lock Emacs itself ignores)."
  (let* ((lock (concatenate 'string (directory-namestring path) ".#" (file-namestring path)))
         (owner (or (ignore-errors (sb-posix:readlink lock))
                    (ignore-errors
                     (with-open-file (in lock :if-does-not-exist nil)
                       (and in (read-line in nil nil)))))))
    (when owner
      (let* ((at (position #\@ owner))
             (boot (or (position #\: owner :start (or at 0)) (length owner)))
             (dot (position #\. owner :end boot :from-end t))
             (pid (and at dot (> dot at) (parse-integer owner :start (1+ dot) :end boot :junk-allowed t))))
        (unless (and pid (string= (subseq owner (1+ at) dot) (machine-instance))
                     (handler-case (progn (sb-posix:kill pid 0) nil)
                       (sb-posix:syscall-error (error) (= (sb-posix:syscall-errno error) sb-posix:esrch))))
          (subseq owner 0 boot))))))

(defun write-atomically (path original octets then)
  "Replace the file at PATH, whose bytes were ORIGINAL, with OCTETS: a
temporary file in the same directory, synced, given PATH's mode, renamed
over it, THEN called with the rename in one step no interrupt (a cancel,
a deadline) divides.  Nil when written; the :status :error plist when the
file's bytes are no longer ORIGINAL (another editor wrote it), or when an
Emacs buffer holds unsaved changes to it (its save would then ask the
programmer, and `yes' would drop this write)."
  (let ((why (let ((owner (emacs-lock-owner path)))
               (if owner
                   (format nil "~A holds its lock" owner)
                   (unsaved-in-watchers path)))))  ; agent/watch.lisp
    (when why
      (return-from write-atomically
        (error-report "CL-MCP:UNSAVED-IN-EDITOR"
                      "~A has unsaved changes in an Emacs buffer (~A); nothing was ~
                       written: ask the programmer to save or revert that buffer, then edit again."
                      path why))))
  (let* ((stat (sb-posix:stat path))
         (temporary (format nil "~A.cl-mcp-~D" path (sb-posix:getpid)))
         (created nil))
    (unwind-protect
         (progn
           (with-open-file (out temporary :direction :output :element-type '(unsigned-byte 8)
                                          :if-exists :supersede)
             (setf created t)
             (write-sequence octets out)
             (finish-output out)
             (sb-posix:fsync (sb-sys:fd-stream-fd out)))
           (sb-posix:chmod temporary (logand (sb-posix:stat-mode stat) #o7777))
           (if (equalp (file-octets path) original)
               (sb-sys:without-interrupts
                 (sb-posix:rename temporary path)
                 (funcall then)
                 nil)
               (name-error "CL-MCP:FILE-CHANGED"
                           (format nil "~A changed on disk since the form was located; nothing was written: read it again." path))))
      (when (and created (probe-file temporary))
        (delete-file temporary)))))

(defun line-ending (text index)
  "The line ending of the line holding INDEX of TEXT: CRLF or LF."
  (let ((newline (position #\Newline text :start index)))
    (if (and newline (plusp newline) (char= (char text (1- newline)) #\Return))
        (coerce '(#\Return #\Newline) 'string)
        (string #\Newline))))

(defun blank-line-end (text index)
  "The index after the newline that ends the line from INDEX of TEXT, when
only blanks come before it; else nil."
  (let ((newline (position #\Newline text :start index)))
    (and newline (every #'blank-char-p (subseq text index newline)) (1+ newline))))

(defun deleted-span (text start end)
  "The (START . END) of TEXT to delete with the form from START to END: its
lines, when it has them to itself, with one blank line after (or, with
none there, before) it."
  (let* ((line-start (1+ (or (position #\Newline text :end start :from-end t) -1)))
         (own-line (every #'blank-char-p (subseq text line-start start)))
         (after (or (blank-line-end text end)
                    ;; The last form, with no newline after it.
                    (and (every #'blank-char-p (subseq text end)) (length text)))))
    (if (not (and own-line after))
        (cons start end)
        (let ((blank-after (blank-line-end text after))
              (blank-before (and (> line-start 0)
                                 (let ((previous (1+ (or (position #\Newline text :end (1- line-start)
                                                                                   :from-end t)
                                                         -1))))
                                   (and (blank-line-end text previous) previous)))))
          (cond (blank-after (cons line-start blank-after))
                (blank-before (cons blank-before after))
                (t (cons line-start after)))))))

(defun edited-text (text form action new)
  "TEXT with ACTION done at FORM with the text NEW: (values EDITED START
END SPAN INSERTION), START and END the new forms' offsets in EDITED (nil
for :delete), SPAN the (FROM . TO) of TEXT replaced by INSERTION."
  (let* ((start (file-form-start form)) (end (file-form-end form))
         (newline (line-ending text start))
         (blank (concatenate 'string newline newline)))
    (flet ((spliced (from to insertion offset)
             (values (concatenate 'string (subseq text 0 from) insertion (subseq text to))
                     (+ from offset) (+ from offset (length new)) (cons from to) insertion)))
      (ecase action
        (:replace (spliced start end new 0))
        (:insert-before (spliced start start (concatenate 'string new blank) 0))
        (:insert-after (spliced end end (concatenate 'string blank new) (length blank)))
        (:delete (destructuring-bind (from . to) (deleted-span text start end)
                   (values (concatenate 'string (subseq text 0 from) (subseq text to))
                           nil nil (cons from to) "")))))))

(defun form-texts (text forms &key except from to)
  "The text of each of FORMS (of TEXT) but EXCEPT and those that start
from FROM to before TO."
  (loop for form in forms
        unless (or (eq form except)
                   (and from (<= from (file-form-start form)) (< (file-form-start form) to)))
          collect (subseq text (file-form-start form) (file-form-end form))))

(defun kept-edit (old forms form action new)
  "`edited-text' of ACTION at FORM with NEW, and a last value true when NEW
was ended with a newline: a text whose last line ends in a comment would
take the rest of that line, and the form there, with it.  When the forms
around the edit do not read as before even so, the :status :error plist
of `kept-forms-problem' instead."
  (multiple-value-bind (edited start end span insertion) (edited-text old form action new)
    (let ((problem (kept-forms-problem old forms form action edited start end)))
      (if (not problem)
          (values edited start end span insertion nil)
          (let ((ending (line-ending old (file-form-start form))))
            (multiple-value-bind (edited start end span insertion)
                (edited-text old form action (concatenate 'string new ending))
              (if (kept-forms-problem old forms form action edited start end)
                  problem
                  (values edited start (- end (length ending)) span insertion t))))))))

(defun kept-forms-problem (old forms form action edited start end)
  "Nil when EDITED, OLD with ACTION done at FORM, reads to the FORMS of
OLD (FORM gone, unless ACTION inserts) around the new forms from START to
END; else the :status :error plist naming the first form of OLD the
edit would change (a new text whose last line ends in a comment takes
the rest of the line with it)."
  (let ((kept (form-texts old forms :except (and (member action '(:replace :delete)) form)))
        (read (handler-case (form-texts edited (file-forms edited) :from start :to end)
                (unbalanced-text () :unbalanced))))
    (unless (equal kept read)
      (let* ((others (remove form forms))
             (changed (or (and (listp read)
                               (nth (or (mismatch kept read :test #'string=) (length kept)) others))
                          (first others))))
        (name-error "CL-MCP:EDIT-CHANGES-OTHER-FORMS"
                    (format nil "Nothing was written: with this edit~@[ the form at line ~D~] ~
                                 would no longer read as it does now."
                            (and changed (file-form-line changed))))))))

(defparameter *file-call-timeout* 600
  "Seconds an edit or a read of a file may take, at most (a compile that
macroexpands for long, say).")

(defun guarded-plist (thunk)
  "THUNK's plist, or a :status :error plist for any condition that ended
it (a file the image may not write, say): nothing reaches the debugger."
  (destructuring-bind (outcome value) (call-guarded thunk *file-call-timeout*)
    (if (eq outcome :ok) value (list :status :error :error value))))

(defun without-compile (plist)
  "PLIST, an edit's reply, without its pending :compile."
  (loop for (key value) on plist by #'cddr
        unless (eq key :compile) collect key and collect value))

(defun edit-form-of (path &rest arguments &key target line action text compile max-output tag)
  "`%edit-form-of' with every condition that ends it an error plist,
cancellable under TAG (`with-cancellable'): its compile runs the user's
macros.  A cancel that comes once the edit is written undoes nothing: the
reply it answers says the edit was written (:written-before-cancel), and
that its compile, if it had one, was cut short."
  (declare (ignore target line action text compile max-output))
  (let ((*scanned-forms* 0))
    (said-scanned
      (with-cancellable (tag)
        (with-quiet-readtables ()
          ;; The compile runs outside the guard, which muffles warnings:
          ;; as compile-form-of runs it, so that both report the same notes.
          (let* ((plist (guarded-plist (lambda () (apply #'%edit-form-of path :allow-other-keys t arguments))))
                 (pending (getf plist :compile)))
            (if pending
                (append (without-compile plist) (list :compiled (apply #'%compile-form pending)))
                plist)))))))

(defun written-before-cancel (reply)
  "REPLY, an edit written before its call was cancelled, marked so, its
compile (when it had one) reported cut short."
  (let ((pending (getf reply :compile)))
    (append (without-compile reply)
            (list :written-before-cancel t)
            (and pending
                 (destructuring-bind (file text start end package readtable max-output) pending
                   (declare (ignore readtable max-output))
                   (list :compiled
                         (list :status :error :success nil :file file
                               :line (line-at text start) :end-line (line-at text end)
                               :package (package-name package) :defined '() :notes '() :dropped 0
                               :error (list :type "CL-MCP:CANCELLED"
                                            :message "The call was cancelled after the edit was written: its compile did not finish."))))))))

(defun %edit-form-of (path &key target line (action :replace) (text "") (compile t) (max-output 20000))
  "Do ACTION (:replace, :insert-before, :insert-after or :delete) with the
top-level form of the file at PATH that TARGET names (see
`target-matches-p') or that holds LINE, the new forms being TEXT: read
first in the form's package and readtable (nothing is written unless it
reads as complete forms), spliced into the file's bytes (every other byte
kept; an inserted form has one blank line either side; a deleted one
takes one blank line with it), written atomically unless the file changed
meanwhile, then compiled as `compile-form-of' compiles a form when
COMPILE.  Return a plist: :status :ok, :file, :action, :old-line and
:old-end-line (the form located), :line and :end-line (the new forms'),
:ended-line t when a newline was put after the new text (see `kept-edit'),
:compile (`%compile-form''s arguments, for `edit-form-of' to compile
outside its guard) when it is to be compiled; or a :status :error
plist, with :problem (line, column, what, fix) for a text that does not
read and :candidates for an ambiguous TARGET."
  (let ((problem (source-file-problem path)))
    (when problem (return-from %edit-form-of problem)))
  (let* ((file (namestring (truename path)))
         (octets (file-octets file))
         (old (or (file-text octets)
                  (return-from %edit-form-of
                    (name-error "CL-MCP:NOT-UTF-8" (format nil "~A is not UTF-8 text." file)))))
         (forms (handler-case (file-forms old)
                  (unbalanced-text (condition)
                    (return-from %edit-form-of
                      (let ((plist (unbalanced-plist condition old)))
                        (setf (getf (getf plist :error) :message)
                              (format nil "~A does not read as it is: ~A" file
                                      (getf (getf plist :error) :message)))
                        plist)))))
         (form (located-form old forms target line))
         (new (string-trim '(#\Space #\Tab #\Newline #\Return) text)))
    (when (listp form)
      (return-from %edit-form-of form))
    (unless (file-form-package form)
      (return-from %edit-form-of
        (name-error "PACKAGE-ERROR"
                    (format nil "The package of the in-package above line ~D does not exist: load its system first."
                            (file-form-line form)))))
    (unless (eq action :delete)
      (let ((problem (new-text-problem text form)))
        (when problem
          (when (eq (file-form-syntax form) :unknown)
            (setf (getf (getf problem :error) :message)
                  (format nil "~A (The file's readtable ~A is not in the image: the text was ~
                               delimited as standard syntax; load the system that defines it.)"
                          (getf (getf problem :error) :message) (file-form-readtable-name form))))
          (return-from %edit-form-of problem))))
    (multiple-value-bind (edited start end span insertion ended) (kept-edit old forms form action new)
      (when (listp edited)
        (return-from %edit-form-of edited))
      (let* ((from (octet-offset old (car span)))
             (to (+ from (length (sb-ext:string-to-octets old :external-format :utf-8
                                                              :start (car span) :end (cdr span)))))
             (written (concatenate '(vector (unsigned-byte 8))
                                   (subseq octets 0 from)
                                   (sb-ext:string-to-octets insertion :external-format :utf-8)
                                   (subseq octets to)))
             (reply (append (list :status :ok :file file :action action
                                  :old-line (file-form-line form)
                                  :old-end-line (file-form-end-line form))
                            (and ended (list :ended-line t))
                            (and (eq (file-form-syntax form) :unknown)
                                 (list :unknown-readtable (file-form-readtable-name form)))
                            (and start (list :line (line-at edited start) :end-line (line-at edited end)))
                            (and start compile (file-form-package form)
                                 (list :compile (list file edited start end (file-form-package form)
                                                      (file-form-readtable form) max-output)))))
             (refused (write-atomically file octets written
                                        (lambda () (keep-past-cancel (written-before-cancel reply))))))
        (unless refused
          (watch-file-written (truename file)))
        (or refused reply)))))

;;;; Reading a file

(defun form-text-plist (text form)
  "FORM's summary (see `form-summary') with its :text."
  (append (form-summary text form)
          (list :text (subseq text (file-form-start form) (file-form-end form)))))

(defun outline-entry (text form)
  "FORM's summary with the package and readtable it is read in."
  (append (form-summary text form)
          (list :package (if (file-form-package form) (package-name (file-form-package form)) :missing))
          (and (file-form-readtable-name form) (list :readtable (file-form-readtable-name form)))))

(defun checked-forms (text forms)
  "The read errors of FORMS (of TEXT), each (:line L :column C :message M
:form-line FL :kind K [:name N]); a form whose package does not exist is
one too."
  (loop for form in forms
        for (message index) = (if (file-form-package form)
                                  (multiple-value-list
                                   (with-form-reading (form)
                                     (read-problem text (file-form-start form) (file-form-end form))))
                                  (list "its package (from the in-package above it) does not exist"
                                        (file-form-start form)))
        when message
          collect (multiple-value-bind (line column) (text-line-column text index)
                    (let ((summary (form-summary text form)))
                      (list* :line line :column column :message message
                             :form-line (getf summary :line) :kind (getf summary :kind)
                             (and (getf summary :name) (list :name (getf summary :name))))))))

(defparameter *outline-limit* 5000
  "Forms an outline lists, at most: each reply must fit a Swank frame
(16 MB), and the rest is read from a later line.")

(defparameter *form-text-limit* 1000000
  "Characters of a form's text a reply holds, at most.")

(defparameter *problem-limit* 1000
  "Problems a check lists, at most; all are counted.")

(defun read-lisp-file-of (path &rest arguments &key mode target line)
  "`%read-lisp-file-of' with every condition that ends it an error plist,
:unevaluated, the number of `#.' forms it read without evaluating them,
and :scanned (see `said-scanned'), when there were any."
  (declare (ignore mode target line))
  (let ((*unevaluated-read-evals* 0) (*scanned-forms* 0))
    (let ((plist (said-scanned (with-quiet-readtables ()
                                 (guarded-plist (lambda () (apply #'%read-lisp-file-of path arguments)))))))
      (if (and (eq (getf plist :status) :ok) (plusp *unevaluated-read-evals*))
          (append plist (list :unevaluated *unevaluated-read-evals*))
          plist))))

(defun line-count (text)
  "How many lines TEXT has, as wc -l and an editor count them: a last line
ends at its newline, not after it."
  (let ((newlines (count #\Newline text)))
    (if (and (plusp (length text)) (char/= (char text (1- (length text))) #\Newline))
        (1+ newlines)
        newlines)))

(defun outline-plist (file text forms line)
  "The :outline answer: at most `*outline-limit*' of FORMS (of TEXT), from
the first that ends at or after LINE; :total counts them all, :next is the
line of the first form left out after those listed."
  (let* ((from (or (position-if (lambda (form) (>= (file-form-end-line form) (or line 1))) forms)
                   (length forms)))
         (shown (subseq forms from (min (length forms) (+ from *outline-limit*))))
         (after (nth (+ from (length shown)) forms)))
    (append (list :status :ok :file file :mode :outline :lines (line-count text)
                  :total (length forms)
                  :forms (mapcar (lambda (form) (outline-entry text form)) shown))
            (and (plusp from) (list :skipped from))
            (and after (list :next (file-form-line after))))))

(defun check-plist (file text forms unbalanced)
  "The :check answer: the problems of FORMS (of TEXT) and the UNBALANCED
conditions met reading them, in line order, at most `*problem-limit*' of
them; :problem-count counts them all."
  (let ((problems (sort (append (mapcar (lambda (condition)
                                          (let ((plist (unbalanced-plist condition text)))
                                            (append (getf plist :problem)
                                                    (list :message (getf (getf plist :error) :message)))))
                                        unbalanced)
                                (checked-forms text forms))
                        #'< :key (lambda (problem) (getf problem :line)))))
    (list :status :ok :file file :mode :check :forms (length forms)
          :problems (subseq problems 0 (min (length problems) *problem-limit*))
          :problem-count (length problems))))

(defun form-plist (file text form)
  "The :form answer: FORM's summary and its text, at most
`*form-text-limit*' characters of it (:text-length is the whole's)."
  (let* ((plist (form-text-plist text form))
         (whole (getf plist :text)))
    (when (> (length whole) *form-text-limit*)
      (setf (getf plist :text) (subseq whole 0 *form-text-limit*))
      (setf plist (append plist (list :text-length (length whole)))))
    (list* :status :ok :file file :mode :form plist)))

(defun %read-lisp-file-of (path &key (mode :outline) target line)
  "Read the file at PATH without evaluating its forms or interning their
names (see `reading-quietly').  MODE :outline: :forms, each form's
:line, :end-line, :kind, :name, :package and :readtable, from the form
that holds LINE or comes after it (see `outline-plist').  :check: :forms,
their count, and :problems in line order (see `check-plist'; a ) between
forms is one, and the scan goes on; a form left open is one, where the
scan stopped, and the forms before it are read).  :form: the form TARGET
names or that holds LINE, with its :text (see `form-plist').  A :status
:error plist when PATH cannot be read."
  (let ((problem (source-file-problem path)))
    (when problem (return-from %read-lisp-file-of problem)))
  (let* ((file (namestring (truename path)))
         (text (or (file-text (file-octets file))
                   (return-from %read-lisp-file-of
                     (name-error "CL-MCP:NOT-UTF-8" (format nil "~A is not UTF-8 text." file)))))
         (unbalanced '())
         (forms (handler-case (file-forms text (and (eq mode :check)
                                                     (lambda (condition) (push condition unbalanced))))
                  (unbalanced-text (condition)
                    (return-from %read-lisp-file-of (unbalanced-plist condition text))))))
    (ecase mode
      (:outline (outline-plist file text forms line))
      (:check (check-plist file text forms unbalanced))
      (:form (let ((form (located-form text forms target line)))
               (if (listp form) form (form-plist file text form)))))))
