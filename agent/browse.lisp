;;;; agent/browse.lisp --- apropos, macroexpand and the inspector
;;;;
;;;; Finding names, expanding macros and looking inside objects.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; Entry points: apropos, macroexpand, inspect
;;;
;;; All three go through Swank: `swank::apropos-symbols' finds the symbols
;;; and `swank/backend:describe-symbol-for-emacs' says what each names, as
;;; M-x slime-apropos does; `swank/backend:macroexpand-all' is SBCL's
;;; walker; `swank/backend:emacs-inspect' gives an object's parts as SLIME's
;;; inspector shows them.  The inspector's objects are kept in a table of
;;; this agent's, not in Swank's `*istate*', which belongs to the
;;; connection and would be the programmer's own in an image cl-mcp shares.

(defparameter *apropos-limit* 200
  "Symbols listed by `apropos-of', at most; the total is still counted.")

(defparameter *apropos-type-kinds*
  '(("functions" "function" "generic function")
    ("macros" "macro" "special operator")
    ("variables" "variable" "constant")
    ("classes" "class" "structure" "condition"))
  "The kinds of symbol each TYPE of `apropos-of' keeps.")

(defun symbol-kinds (symbol)
  "What SYMBOL names, as strings (\"function\", \"generic function\",
\"macro\", \"special operator\", \"variable\", \"constant\", \"class\",
\"structure\", \"condition\", \"type\", \"setf expander\"): a function's
kind, then variable, type and setf expander, as Swank orders them; nil when
it names nothing.  The tests are those of Swank's
`describe-symbol-for-emacs' (its SBCL backend), without the documentation
strings it fetches for each kind: over the 14,000 symbols a one-letter
apropos matches, those took half the time."
  (let ((kinds '()))
    (when (fboundp symbol)
      (push (cond ((macro-function symbol) "macro")
                  ((special-operator-p symbol) "special operator")
                  ((typep (fdefinition symbol) 'generic-function) "generic function")
                  (t "function"))
            kinds))
    (when (or (boundp symbol) (nth-value 1 (sb-int:info :variable :kind symbol)))
      (push (if (constantp symbol) "constant" "variable") kinds))
    (when (sb-int:info :type :kind symbol)
      (push (let ((class (find-class symbol nil)))
              (if class (class-kind class) "type"))
            kinds))
    (when (swank/sbcl::setf-expander symbol)
      (push "setf expander" kinds))
    (nreverse kinds)))

(defun external-symbol-p (symbol)
  "True when SYMBOL is external in its home package."
  (let ((home (symbol-package symbol)))
    (and home (eq (nth-value 1 (find-symbol (symbol-name symbol) home)) :external))))

(defun apropos-entry (symbol kinds)
  "The plist `apropos-of' reports for SYMBOL: :name, :package, :external,
:kinds, and :arglist for functions and macros."
  (list* :name (symbol-name symbol)
         :package (let ((home (symbol-package symbol))) (if home (package-name home) ""))
         :external (external-symbol-p symbol)
         :kinds kinds
         (when (and (fboundp symbol) (not (special-operator-p symbol)))
           (list :arglist (lambda-list-text (or (macro-function symbol) (fdefinition symbol)))))))

(defun apropos-before-p (one other)
  "Whether symbol ONE sorts before OTHER in `apropos-first': by name, then
by its package's name (nothing is compared twice, nothing is consed)."
  (let ((name (symbol-name one))
        (other-name (symbol-name other)))
    (cond ((string< name other-name) t)
          ((string/= name other-name) nil)
          (t (string< (let ((home (symbol-package one))) (if home (package-name home) ""))
                      (let ((home (symbol-package other))) (if home (package-name home) "")))))))

(defun first-of (entries count before-p)
  "The COUNT first of ENTRIES by BEFORE-P (on their first elements), in
order, in one pass: each entry is compared with the last of those kept so
far, and only one that comes before it is put in its place.  A sort of
the 4,000 external symbols a one-letter pattern matches took 6 ms."
  (let ((kept '()) (size 0) (last nil))
    (dolist (entry entries (nreverse kept))
      (when (or (< size count) (funcall before-p (first entry) (first last)))
        ;; KEPT is in reverse order: its head is the last kept.
        (let ((after '()))
          (loop while (and kept (funcall before-p (first entry) (first (first kept))))
                do (push (pop kept) after))
          (push entry kept)
          (dolist (each after) (push each kept)))
        (if (< size count) (incf size) (pop kept))
        (setf last (first kept))))))

(defun apropos-first (ranks limit)
  "The first LIMIT of the (SYMBOL KINDS) lists in RANKS, a vector of lists
by rank: by rank, then by name, then by package name."
  (let ((chosen '()))
    (loop for rank across ranks
          for room = (- limit (length chosen))
          while (plusp room)
          do (setf chosen (append chosen (first-of rank room #'apropos-before-p))))
    chosen))

(defun apropos-of (pattern &key package external-only (type "all"))
  "The symbols whose names contain PATTERN (case-insensitively, as SLIME's
apropos) and name something of TYPE (\"all\", \"functions\", \"macros\",
\"variables\" or \"classes\"), in PACKAGE only when given (else in every
package but KEYWORD), and only external ones when EXTERNAL-ONLY.  Return
:status :ok, :pattern, :total (how many matched), and :symbols, the first
`*apropos-limit*' of them as `apropos-entry' plists: the session's own
symbols (CL-USER's and those of the packages it created) first, then
external ones, then by name and package.  An unknown PACKAGE is a :status
:error plist."
  (let ((missing (missing-internals-error :apropos)))
    (when missing
      (return-from apropos-of missing)))
  (let ((target (and package (find-named-package package))))
    (when (and package (null target))
      (return-from apropos-of
        (name-error "PACKAGE-ERROR" (format nil "The package ~S does not exist." package))))
    (let* ((wanted (rest (assoc type *apropos-type-kinds* :test #'string-equal)))
           (session (session-packages))
           (symbols (swank::apropos-symbols pattern external-only nil target))
           ;; A symbol present in several packages is met once in each.
           (seen (make-hash-table :test #'eq :size (max 16 (length symbols))))
           (ranks (make-array 4 :initial-element '()))
           (total 0))
      (dolist (symbol symbols)
        (unless (gethash symbol seen)
          (setf (gethash symbol seen) t)
          (let ((kinds (symbol-kinds symbol)))
            (when (and kinds (or (null wanted) (intersection kinds wanted :test #'string=)))
              (incf total)
              (push (list symbol kinds)
                    (aref ranks (+ (if (member (symbol-package symbol) session) 0 2)
                                   (if (external-symbol-p symbol) 0 1))))))))
      (list :status :ok
            :pattern pattern
            :total total
            :symbols (loop for (symbol kinds) in (apropos-first ranks *apropos-limit*)
                           collect (apropos-entry symbol kinds))))))

(defparameter *expansion-limit* 100000
  "Characters of a macroexpansion reported, at most.")

(defun read-one-form (text)
  "The one form TEXT holds, read in *PACKAGE*, as (values FORM nil); or
(values nil ERROR-PLIST) when it does not read, holds no form, or holds
more than one."
  (let ((stream (make-string-input-stream text))
        (eof (make-symbol "EOF")))
    (handler-case
        (let ((form (read-next-form stream eof)))
          (cond ((eq form eof)
                 (values nil (name-error "END-OF-FILE" "There is no form to expand.")))
                ((not (eq (read-next-form stream eof) eof))
                 (values nil (name-error "CL-MCP:MORE-THAN-ONE-FORM"
                                         "Give one form to expand; more followed the first.")))
                (t (values form nil))))
      (serious-condition (c)
        (values nil (list :status :error :error (describe-error c nil :reading t)))))))

(defun call-guarded (thunk timeout)
  "Call THUNK with its output dropped, warnings muffled and the debugger
kept out, for at most TIMEOUT seconds; return (:ok VALUE) with its first
value, or (:error ERROR-PLIST) for a condition that ended it."
  (let ((sink (make-capped-output-stream 0)))
    (block guarded
      (flet ((fail (condition)
               (return-from guarded
                 (list :error (describe-error condition nil :timeout timeout)))))
        (handler-bind ((warning #'muffle-warning)
                       (serious-condition #'fail))
          (with-standard-streams (sink sink)
            (with-debugger-calling (#'fail)
              (sb-ext:with-timeout timeout
                (list :ok (funcall thunk))))))))))

(defun macroexpand-of (text &key package all (timeout 30))
  "Read the one form of TEXT in PACKAGE (CL-USER when nil) and expand it:
once with MACROEXPAND-1, or fully with SBCL's walker when ALL.  Return
:status :ok, :expansion (pretty-printed with *PACKAGE* bound, so symbols
accessible there print unqualified; at most `*expansion-limit*'
characters) and :expanded (MACROEXPAND-1's second value; for ALL, whether
anything changed).  A form that does not read, an unknown package or an
error while expanding (or a TIMEOUT seconds deadline) is a :status :error
plist."
  (let ((target (if package (find-named-package package) (find-package "COMMON-LISP-USER"))))
    (unless target
      (return-from macroexpand-of
        (name-error "PACKAGE-ERROR" (format nil "The package ~S does not exist." package))))
    (let ((*package* target))
      (multiple-value-bind (form failure) (read-one-form text)
        (when failure
          (return-from macroexpand-of failure))
        (destructuring-bind (status result)
            (call-guarded
             (lambda ()
               (multiple-value-bind (expansion expanded)
                   (if all
                       (let ((expansion (swank/backend:macroexpand-all form)))
                         (values expansion (not (equal expansion form))))
                       (macroexpand-1 form))
                 (let ((stream (make-capped-output-stream *expansion-limit*)))
                   (let ((*print-pretty* t)
                         (*print-right-margin* 100)
                         (*print-escape* t)
                         (*print-readably* nil)
                         (*print-circle* nil)
                         (*print-length* nil)
                         (*print-level* nil)
                         (*print-lines* nil))
                     (prin1 expansion stream))
                   (list (if (plusp (dropped stream))
                             (format nil "~A~%… [~D more characters truncated]"
                                     (stream-text stream) (dropped stream))
                             (stream-text stream))
                         (and expanded t)))))
             timeout)
          (if (eq status :error)
              (list :status :error :error result)
              (list :status :ok :expansion (first result) :expanded (second result) :all (and all t))))))))

(defparameter *inspect-handle-limit* 10000
  "Inspected objects kept for their handles: the newest this many.")

(defparameter *inspect-page* 50
  "Parts of an object reported by one `inspect-of'.")

(defparameter *inspect-content-limit* 100000
  "Elements of Swank's inspector content read for one object, at most:
a longer (lazy) content is cut there.")

(defvar *inspect-lock* (sb-thread:make-mutex :name "cl-mcp inspected objects")
  "Guards `*inspected*' and `*next-inspect-handle*'.")

(defvar *inspected* (make-array *inspect-handle-limit* :initial-element nil)
  "The inspected objects, as (HANDLE . OBJECT) at HANDLE modulo its size:
a handle older than the newest `*inspect-handle-limit*' has been
overwritten.")

(defvar *next-inspect-handle* 1
  "The handle the next inspected object gets.")

(defun remember-object (object)
  "A new handle for OBJECT."
  (sb-thread:with-mutex (*inspect-lock*)
    (let ((handle (shiftf *next-inspect-handle* (1+ *next-inspect-handle*))))
      (setf (aref *inspected* (mod handle (length *inspected*))) (cons handle object))
      handle)))

(defun recall-object (handle)
  "The object HANDLE stands for, and true; or nil and nil once it has been
dropped (or never was)."
  (sb-thread:with-mutex (*inspect-lock*)
    (let ((entry (and (integerp handle) (plusp handle)
                      (aref *inspected* (mod handle (length *inspected*))))))
      (if (and entry (eql (car entry) handle))
          (values (cdr entry) t)
          (values nil nil)))))

(defun forget-inspected ()
  "Drop every inspected object and its handle (reset-session)."
  (sb-thread:with-mutex (*inspect-lock*)
    (fill *inspected* nil)))

(defun part-text (object)
  "OBJECT printed on one line of at most 200 characters (`printed-line')."
  (with-result-printing ()
    (let ((*print-pretty* nil) (*print-length* 20) (*print-level* 4))
      (printed-line object 200))))

(defun inspector-content (object)
  "Swank's inspector content for OBJECT (`swank/backend:emacs-inspect'
under the inspector's printer settings), at most
`*inspect-content-limit*' elements of it, and true when it was cut there.
Swank's `*istate*' is bound to a state of our own, for the contribs that
look at it: the connection's inspector is left as it was."
  (let ((swank::*istate* (swank::make-istate :object object))
        (bindings swank::*inspector-printer-bindings*))
    (progv (mapcar #'car bindings) (mapcar #'cdr bindings)
      (let ((range (swank::content-range (swank/backend:emacs-inspect object)
                                         0 (1+ *inspect-content-limit*))))
        (if (> (length range) *inspect-content-limit*)
            (values (subseq range 0 *inspect-content-limit*) t)
            (values range nil))))))

(defun content-lines (content)
  "CONTENT split into lines, each a list of strings and (:value OBJECT
TEXT) entries; actions (buttons) are left out."
  (let ((lines '()) (line '()))
    (flet ((end-line () (push (nreverse line) lines) (setf line '())))
      (dolist (item content)
        (cond ((stringp item)
               (loop for start = 0 then (1+ newline)
                     for newline = (position #\Newline item :start start)
                     do (push (subseq item start newline) line)
                     while newline do (end-line)))
              ((atom item))
              ((eq (first item) :newline) (end-line))
              ((eq (first item) :value)
               (push (list :value (second item) (third item)) line))
              ((eq (first item) :label)
               (push (format nil "~{~A~}" (rest item)) line))
              ((eq (first item) :line)
               (push (princ-to-string (second item)) line)
               (push ": " line)
               (push (list :value (third item) nil) line)
               (end-line))))
      (when line (end-line)))
    (nreverse lines)))

(defun segment-text (segment)
  "A line's segment as text."
  (if (stringp segment)
      segment
      (or (third segment) (part-text (second segment)))))

(defun line-part (line)
  "A content LINE as (LABEL VALUE OBJECT HAS-VALUE): its last value (the
segment, made text by `segment-text' only for the parts shown: a string's
content has 100,000 of them), and the text before it as the label
(trailing \":\" or \"=\" dropped); a line without values is all label, its
VALUE \"\".  Nil for an empty line."
  (let ((last (position-if #'consp line :from-end t))
        (blank '(#\Space #\Tab)))
    (if (null last)
        (let ((text (string-trim blank (format nil "~{~A~}" line))))
          (and (plusp (length text)) (list text "" nil nil)))
        (let ((label (string-right-trim
                      blank
                      (string-right-trim
                       ":="
                       (string-trim blank
                                    (format nil "~{~A~}" (mapcar #'segment-text (subseq line 0 last))))))))
          (list label (nth last line) (second (nth last line)) t)))))

(defun object-parts (object)
  "OBJECT as SLIME's inspector shows it: a description (the text lines
before its first value) and its parts, each (LABEL VALUE OBJECT HAS-VALUE)
as `line-part' makes them; true third when Swank's content was cut."
  (multiple-value-bind (content cut) (inspector-content object)
    (let* ((parts (remove nil (mapcar #'line-part (content-lines content))))
           (first-value (or (position-if #'fourth parts) (length parts))))
      (values (format nil "~{~A~^ ~}" (mapcar #'first (subseq parts 0 first-value)))
              (nthcdr first-value parts)
              cut))))

(defun inspect-report (object handle start)
  "The :status :ok plist of `inspect-of' for OBJECT under HANDLE, its parts
from START."
  (multiple-value-bind (description parts cut) (object-parts object)
    (let ((class-name (class-name (class-of object))))
      (list :status :ok
            :handle handle
            :class (if (symbolp class-name) (symbol-designator class-name) (part-text class-name))
            :printed (with-result-printing ()
                       (let ((*print-pretty* nil))
                         (printed-line object 1000)))
            :description description
            :parts (loop for (label value part has-value) in (nthcdr start parts)
                         repeat *inspect-page*
                         collect (list* :label label :value (segment-text value)
                                        (and has-value (list :handle (remember-object part)))))
            :start start
            :total (length parts)
            :cut cut))))

(defun evaluate-for-inspection (code package timeout)
  "The first value of the last form of CODE, read and evaluated in
PACKAGE, as (values OBJECT nil); or (values nil ERROR-PLIST).  Output is
dropped; an error or the TIMEOUT seconds deadline ends it; in an image
cl-mcp shares, what it creates is the session's (see `soft-reset').  The
REPL's variables are cl-mcp's, as in evaluate-lisp's code; inspecting
does not change them (as SLIME's inspector does not)."
  (let ((*package* package)
        (forms nil))
    (handler-case (setf forms (rest (read-all-forms code)))
      (serious-condition (c)
        (return-from evaluate-for-inspection
          (values nil (list :status :error :error (describe-error c nil :reading t))))))
    (flet ((run ()
             (call-guarded (lambda ()
                             (let ((value nil))
                               (dolist (form forms value)
                                 (setf value (eval form)))))
                           timeout)))
      (destructuring-bind (status result)
          (call-with-repl-variables
           (lambda () (if *track-session* (call-tracking-session #'run) (run))))
        (if (eq status :ok)
            (values result nil)
            (values nil (list :status :error :error result)))))))

(defun inspect-of (&key code handle part (start 0) package (timeout 30) (tag nil))
  "Inspect the value of CODE (read and evaluated in PACKAGE, CL-USER when
nil), or the object inspected earlier under HANDLE, or its PART-th part
(counting from 0, as listed).  Return :status :ok, :handle (the object's),
:class, :printed, :description, :parts from START (at most
`*inspect-page*', each :label, :value and, when it has an object, :handle),
:start, :total and :cut (Swank's content was cut at
`*inspect-content-limit*'); or a :status :error plist.  Cancellable
under TAG (`with-cancellable'): CODE is the user's."
  (with-cancellable (tag)
    (let ((missing (missing-internals-error :inspect)))
      (when missing
        (return-from inspect-of missing)))
    (let ((object nil) (own-handle nil))
      (cond (code
             (let ((target (if package (find-named-package package) (find-package "COMMON-LISP-USER"))))
               (unless target
                 (return-from inspect-of
                   (name-error "PACKAGE-ERROR" (format nil "The package ~S does not exist." package))))
               (multiple-value-bind (value failure) (evaluate-for-inspection code target timeout)
                 (when failure
                   (return-from inspect-of failure))
                 (setf object value))))
            (t
             (multiple-value-bind (value found) (recall-object handle)
               (unless found
                 (return-from inspect-of
                   (name-error "CL-MCP:UNKNOWN-HANDLE"
                               (format nil "No inspected object has handle ~A: handles last until reset-session, for the newest ~:D objects."
                                       handle *inspect-handle-limit*))))
               (setf object value)
               (if part
                   (let ((entry (nth part (nth-value 1 (object-parts object)))))
                     (unless (and entry (fourth entry))
                       (return-from inspect-of
                         (name-error "CL-MCP:NO-SUCH-PART"
                                     (format nil "Object ~A has no part ~A with a value to inspect." handle part))))
                     (setf object (third entry)))
                   (setf own-handle handle)))))
      (inspect-report object (or own-handle (remember-object object)) (max 0 start)))))
