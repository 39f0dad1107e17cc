;;;; agent/code.lisp --- xref, compile-file and load-system
;;;;
;;;; Cross-references, and compiling a file or loading a system with the
;;;; compiler's notes at their lines.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; Entry points: xref, compile-file
;;;
;;; Both go through Swank: `swank::xref-doit' (the who-* functions of the
;;; backend, on SB-INTROSPECT) and `swank::collect-notes' around the
;;; backend's `swank-compile-file', as SLIME's C-c C-k does.  Their output
;;; and Swank's own warnings go to a capped stream that is dropped, so
;;; nothing reaches the programmer's REPL in an image cl-mcp shares.

(defparameter *xref-relations* '(:calls :references :binds :sets :macroexpands :specializes)
  "The relations `xref-of' asks Swank about.")

(defparameter *reference-limit* 500
  "Referring definitions reported by `xref-of', at most.")

(defparameter *open-parenthesis-octet* (char-code #\()
  "The byte of an open parenthesis in UTF-8.")

(defun form-opening (text start)
  "Where the form at START of TEXT opens: past the #+ and #- feature
expressions before it (a top-level form's bounds hold them), and past
each form a false one skips (a `#-:lispworks' left above two
`#+:lispworks' forms reads the form after them), as find-definition
places a definition.  The agent's forms part, loaded later, gives
`skip-lisp-blanks' and `skipped-by-feature-p'."
  (with-input-from-string (in text)
    (loop while (and (< (1+ start) (length text)) (char= (char text start) #\#)
                     (member (char text (1+ start)) '(#\+ #\-)))
          do (setf start (skip-lisp-blanks
                          text (if (handler-case (skipped-by-feature-p text start in)
                                     (error () nil))
                                   (file-position in)
                                   (nth-value 1 (let ((*package* (find-package "KEYWORD"))
                                                      (*read-suppress* t))
                                                  (read-from-string text t nil :start (+ start 2)))))))))
  start)

(defun top-level-form-start (source offset)
  "The byte offset where the top-level form of SOURCE (a `source-file')
holding byte OFFSET opens, as the reader finds it (see `form-octet-starts'
and `form-opening'), so a docstring line that opens with a parenthesis is
no form's start.  OFFSET between two forms (on a form a false #+ or #-
skips: SBCL's reader, and so Swank's position, starts the next form there)
is the next form's.
When SOURCE does not read: the line at or before OFFSET that starts with an
open parenthesis, by the convention Emacs's beginning-of-defun keeps, or
OFFSET itself when there is none."
  (let ((index (top-level-form-index source offset)))
    (if index
        (utf-8-offset source (form-opening (source-file-string source)
                                           (aref (source-file-forms source) index)))
        (let ((octets (source-file-octets source))
              (newline (char-code #\Newline)))
          (loop for end = (min offset (length octets)) then (1- start)
                for start = (let ((before (and (> end 0)
                                               (position newline octets :end end :from-end t))))
                              (if before (1+ before) 0))
                when (and (< start (length octets))
                          (= (aref octets start) *open-parenthesis-octet*))
                  return start
                when (zerop start)
                  return offset)))))

(defun reference-plist (name dspec location files)
  "A referrer NAME (printed; DSPEC as Swank gives it) at Swank's LOCATION,
the place of the reference inside it, as (:name N :file F :line L :column C
:snippet S :status S [:compiled-line CL] :reference-line RL
:reference-column RC): the place is the top-level form that holds the
reference, in the file as it is now (see `resolved-location').  Without a
source file: (:name N :error MESSAGE)."
  (multiple-value-bind (source offset status compiled-line gone-snippet)
      ;; The snippet is the reference's own, which need not name the
      ;; referrer: the referrer's name is looked for only when it is gone,
      ;; and when that is gone too, the line is the reference's.
      (multiple-value-bind (source offset status compiled-line gone-snippet)
          (resolved-location location files :characters t :reference t)
        (if (and source (string= status "not-found"))
            (multiple-value-bind (named-source named-offset named-status named-line)
                (resolved-location location files :name dspec :characters t :reference t)
              (if (equal named-status "not-found")
                  (values source offset status compiled-line gone-snippet)
                  (values named-source named-offset named-status named-line)))
            (values source offset status compiled-line)))
    (if (null source)
        (list :name name
              :error (if (search "DEFINITION-SOURCE" offset)
                         "no source file (defined without one, e.g. through evaluate-lisp)"
                         offset))
        (let ((reference (place-plist source offset status compiled-line))
              (start (top-level-form-start source offset)))
          (append (list :name name)
                  (place-plist source start status compiled-line gone-snippet)
                  (list :reference-line (getf reference :line)
                        :reference-column (getf reference :column)))))))

;;; Swank's who-calls, who-references, who-binds, who-sets and
;;; who-macroexpands are SB-INTROSPECT's: they decode the packed
;;; cross-reference data of every global function, macro and method in the
;;; image, about 80 ms with alexandria loaded.  SBCL writes a referenced
;;; name into that data by its index in a table of the most common names
;;; or, for any other name, in the clear beside it; so the functions that
;;; refer to an uncommon name are the ones whose data holds it, and only
;;; those need decoding (about 20 ms).  `referrers' is SB-INTROSPECT's
;;; search with that test first; Swank's backend then makes its locations
;;; as for its own who-calls.

(defparameter *packed-relations* '(:calls :references :binds :sets :macroexpands)
  "The relations SBCL keeps in each function's packed cross-reference data.")

(defun referrers-readable-p ()
  "Whether this SBCL and Swank have what `referrers' uses (SBCL 2.2.9's
packed cross-references; Swank's SBCL backend).  Every SBCL internal it
names is written with a double colon, so that an SBCL without one still
reads the agent and gets `swank::xref-doit' instead."
  (and (every #'fboundp '(sb-c::map-simple-funs sb-c::map-packed-xref-data
                          sb-kernel::%simple-fun-xrefs sb-c::transform-p
                          sb-c::transform-type sb-c::vop-info-p sb-c::vop-info-name
                          sb-introspect::find-function-definition-source
                          swank/sbcl::source-location-for-xref-data
                          swank/sbcl::sanitize-xrefs
                          (setf sb-introspect::definition-source-form-number)))
       (boundp 'sb-c::**most-common-xref-names-by-name**)
       ;; `xref-references' calls agent functions: it has cross-references.
       (let ((xrefs (sb-kernel::%simple-fun-xrefs #'xref-references)))
         (and (simple-vector-p xrefs)
              (typep (svref xrefs 0) '(simple-array (unsigned-byte 8) (*)))
              (find 'referrers xrefs :start 1)))))

;;; Swank places a reference by reading its referrer's top-level form in
;;; the text of its source cache, which holds a file without a coding
;;; cookie as Latin-1: a UTF-8 character literal there (`#\¶', two bytes)
;;; is no character, the read fails, and Swank falls back to the form's
;;; opening, the caller's first line (esrap's TRACE-RULE, found by the
;;; truth harness's xref oracle).  The form is then read here from that
;;; text decoded as UTF-8, noting where each list and quoted form starts,
;;; and numbered as the compiler numbers a form's subforms.

(defun noting-readtable (readtable starts)
  "A copy of READTABLE whose lists, quotes, backquotes and #' note in
STARTS, an EQ table, where the form they read starts."
  (let ((copy (copy-readtable readtable)))
    (flet ((noting (function width)
             (lambda (stream &rest arguments)
               (let* ((start (- (file-position stream) width))
                      (form (apply function stream arguments)))
                 (when (consp form)
                   (setf (gethash form starts) start))
                 form))))
      (dolist (char '(#\( #\' #\`))
        (let ((function (get-macro-character char copy)))
          (when function
            (set-macro-character char (noting function 1) nil copy))))
      (let ((function (ignore-errors (get-dispatch-macro-character #\# #\' copy))))
        (when function
          (set-dispatch-macro-character #\# #\' (noting function 2) copy))))
    copy))

(defvar *unevaluated-read-eval-marks* :none
  "While a form is read for the compiler's numbering of its subforms
(`numbered-form-start'), a list of the fresh conses its unevaluated `#.'
forms read as (agent/reading.lisp's `quiet-sharp-dot'); :none otherwise,
when they read as nil.")

(defun numbered-form-start (text start number package readtable)
  "Where the subform the compiler numbers NUMBER (`sb-c::find-source-paths')
of the top-level form at START of TEXT starts, read in PACKAGE and
READTABLE with nothing evaluated or left interned; nil when it does not
read or has no such subform, or when a `#.' before it read as no value
(see `quiet-sharp-dot').  A list's tails share its numbers, and no text
opens them: the form is the one of that number the text opens."
  (let ((starts (make-hash-table :test #'eq))
        (sb-c::*source-paths* (make-hash-table :test #'eq))
        (*unevaluated-read-eval-marks* '()))
    (handler-case
        (let ((form (let ((*package* package) (*readtable* readtable))
                      ;; agent/reading.lisp, loaded later: its function, not its macro.
                      (call-reading-quietly text start (length text)
                                            (lambda ()
                                              (let ((*readtable* (noting-readtable *readtable* starts)))
                                                (read-from-string text t nil :start start)))))))
          (sb-c::find-source-paths form 0)
          (unless (loop for mark in *unevaluated-read-eval-marks*
                        thereis (let ((path (gethash mark sb-c::*source-paths*)))
                                  (or (null path) (<= (second path) number))))
            ;; A string stream read from START counts its positions from there.
            (loop for each being the hash-keys of sb-c::*source-paths* using (hash-value path)
                  when (and (eql (second path) number) (gethash each starts))
                    return (+ start (gethash each starts)))))
      (serious-condition () nil))))

(defun latin-1-compiled-source (pathname files)
  "The text the file at PATHNAME was compiled from (`compiled-source'),
when Swank reads that file as Latin-1 (no coding cookie: its positions
count bytes); else nil.  Found once per file and reply, in FILES."
  (let ((key (list :latin-1 pathname)))
    (multiple-value-bind (source known) (gethash key files)
      (if known
          source
          (setf (gethash key files)
                (let ((path (and (probe-file pathname) (namestring (truename pathname)))))
                  (and path (eq (swank-file-format path) :latin-1) (compiled-source path files))))))))

(defun numbered-reference-location (location source files)
  "LOCATION, Swank's of a reference whose SOURCE (an SB-INTROSPECT
definition source) names the referring form by the compiler's number, put
at that form when Swank could not read it and fell back to its top-level
form's opening (see above); else nil."
  (let* ((pathname (sb-introspect:definition-source-pathname source))
         (number (sb-introspect:definition-source-form-number source))
         (index (first (sb-introspect:definition-source-form-path source)))
         (position (second (assoc :position (rest location))))
         (compiled (and pathname (integerp number) (plusp number) (integerp index) (integerp position)
                        (latin-1-compiled-source pathname files)))
         (starts (and compiled (source-file-forms compiled))))
    (when (and starts (< index (length starts)))
      (let* ((text (source-file-string compiled))
             (start (aref starts index))
             (forms (and (<= (utf-8-offset compiled start) (1- position)
                             (utf-8-offset compiled (form-opening text start)))
                         (ignore-errors (top-level-form-bounds text start))))
             (at (and forms (multiple-value-bind (package missing readtable) (form-package text forms)
                              (declare (ignore missing))
                              (and package (numbered-form-start text start number package readtable))))))
        (when (and at (> at start))
          (let ((octet (utf-8-offset compiled at))
                (*swank-text-format* :latin-1))
            `(:location (:file ,(second (assoc :file (rest location))))
                        (:position ,(1+ octet))
                        (:snippet ,(swank-snippet (source-file-octets compiled) octet)))))))))

(defun xref-location (entry files)
  "Swank's (NAME LOCATION) of ENTRY, a `referrers' (NAME . SOURCE), its
location mended when Swank could not read the referring form, and its
hints holding the referring subform's number (:form-number: see
`named-location')."
  (let ((swank (swank/sbcl::source-location-for-xref-data entry)))
    (if (and (consp (second swank)) (eq (first (second swank)) :location))
        (destructuring-bind (buffer position &optional hints)
            (rest (or (ignore-errors (numbered-reference-location (second swank) (cdr entry) files))
                      (second swank)))
          (let ((number (sb-introspect:definition-source-form-number (cdr entry))))
            (list (first swank)
                  (list :location buffer position
                        (if (integerp number) (list* :form-number number hints) hints)))))
        swank)))

(defun referrer-name (referrer fun)
  "The name SB-INTROSPECT gives REFERRER, whose code is FUN: an SBCL built
with cross-references for its internals also lists its transforms, as
the function name with the argument types, and its VOPs."
  (cond ((sb-c::transform-p referrer)
         (let ((type (sb-c::transform-type referrer))
               (name (sb-kernel:%fun-name fun)))
           (append (if (consp name) name (list name))
                   (and (sb-kernel:fun-type-p type)
                        (list (second (sb-kernel:type-specifier type)))))))
        ((sb-c::vop-info-p referrer)
         (list 'sb-c:define-vop (sb-c::vop-info-name referrer)))
        (t referrer)))

(defun referrers (relation name)
  "The global functions, macros and methods whose code stands in RELATION
to NAME, as SB-INTROSPECT's who-* functions list them: (NAME-OF-REFERRER
. DEFINITION-SOURCE), the source's form number that of the reference."
  (let ((common (nth-value 1 (gethash name sb-c::**most-common-xref-names-by-name**)))
        (found '()))
    (sb-c::map-simple-funs
     (lambda (referrer fun)
       (let ((xrefs (sb-kernel::%simple-fun-xrefs fun)))
         (when (and xrefs (or common (find name xrefs :start 1 :test #'equal)))
           (sb-c::map-packed-xref-data
            (lambda (kind xref-name form-number)
              (when (and (eq kind relation) (equal xref-name name))
                (let ((source (sb-introspect::find-function-definition-source fun)))
                  (setf (sb-introspect::definition-source-form-number source) form-number)
                  (push (cons (referrer-name referrer fun) source) found))))
            xrefs)))))
    found))

(defun specializing-methods (symbol)
  "Each method specialized directly on the class SYMBOL names, as (NAME
LOCATION METHOD), NAME its generic function's: Swank's who-specializes
names a method by its generic function alone and keeps one method of
each, so AREA's primary and :AROUND methods on CIRCLE were one line."
  (let ((class (find-class symbol nil)))
    (and class
         (loop for method in (sb-mop:specializer-direct-methods class)
               for function = (sb-mop:method-generic-function method)
               when function
                 collect (list (sb-mop:generic-function-name function)
                               (swank/backend:find-source-location method)
                               method)))))

(defun xref-references (relation symbol)
  "Swank's cross-references of RELATION to SYMBOL: (NAME LOCATION) lists,
as `swank::xref-doit' returns them; for :specializes, (NAME LOCATION
METHOD) lists (see `specializing-methods')."
  (cond ((eq relation :specializes) (specializing-methods symbol))
        ((and (member relation *packed-relations*) (referrers-readable-p))
         (let ((files (make-hash-table :test 'equal)))
           (swank/sbcl::sanitize-xrefs
            (mapcar (lambda (entry) (xref-location entry files)) (referrers relation symbol)))))
        (t (swank::xref-doit relation symbol))))

(defun xref-of (text relation &key package)
  "The definitions that stand in RELATION (one of `*xref-relations*') to
the symbol TEXT names, read in PACKAGE: a plist :status :ok, :symbol,
:relation, :references (see `reference-plist'; with a method's
:qualifiers and :specializers for :specializes), and :dropped, the number
of referrers past `*reference-limit*'.  An unknown symbol or package, or a
relation this Swank does not implement, is a :status :error plist."
  (let ((missing (missing-internals-error :xref)))
    (when missing
      (return-from xref-of missing)))
  (with-resolved-symbol text package
    (lambda (symbol)
      (let* ((sink (make-capped-output-stream 0))
             (found (block asking
                      (flet ((fail (condition)
                               (return-from asking
                                 (list :status :error :error (describe-error condition nil)))))
                        (handler-bind ((warning #'muffle-warning))
                          (with-standard-streams (sink sink)
                            (with-debugger-calling (#'fail)
                              (xref-references relation symbol)))))))
             (files (make-hash-table :test 'equal))
             (*package* (or (find-named-package package) (find-package "COMMON-LISP-USER"))))
        (cond
          ((and (consp found) (eq (first found) :status)) found)
          ((not (listp found))
            (name-error "CL-MCP:NOT-IMPLEMENTED"
                        (format nil "Swank does not implement the ~(~A~) cross-reference in this Lisp."
                                relation)))
          (t
            (list :status :ok
                  :symbol (symbol-designator symbol)
                  :relation relation
                  :references (loop for (name location method) in found
                                    repeat *reference-limit*
                                    collect (append
                                             (reference-plist
                                              (safe-print name (lambda (name)
                                                                 (let ((*print-pretty* nil))
                                                                   (prin1-to-string name))))
                                              (if method (list 'defmethod name) name)
                                              location files)
                                             (and method (method-signature-plist method))))
                  :dropped (max 0 (- (length found) *reference-limit*)))))))))

(defparameter *note-severities*
  '((:error . :error) (:read-error . :read-error) (:warning . :warning)
    (:style-warning . :style-warning) (:note . :note)
    (:early-deprecation-warning . :style-warning)
    (:late-deprecation-warning . :warning)
    (:final-deprecation-warning . :warning))
  "Swank's note severities and the ones cl-mcp reports.  Redefinitions
are left out: loading a file again redefines everything in it.")

;; Notes are gathered from Swank's compiler notes (C-c C-k's, C-c C-c's,
;; or those of a system's load) and sized for the model: with :warnings,
;; errors, warnings and style-warnings are listed, grouped by file in line
;; order, and plain compiler notes (mostly optimisation notes: 738 for
;; cl-ppcre) are only counted per file; :all lists them too.  SBCL reports
;; an undefined function once, at its first use; the note names every use
;; the image's cross-references know (see `undefined-uses').

(defparameter *note-limit* 200
  "Compiler notes reported for one compilation, at most.")

(defparameter *note-message-limit* 2000
  "Characters of one compiler note's message kept, at most; a longer one
ends with a line that says how many were cut (`marked-text'), as a
value's does.")

(defparameter *use-limit* 50
  "Places listed for one undefined function, variable or type, at most.")

(defparameter *undefined-kinds* '((:function . :calls) (:variable . :references) (:type))
  "The kinds of undefined names SBCL reports, and the cross-reference
relation that finds their uses (none for a type).")

(defun undefined-reference (condition)
  "(KIND NAME) when CONDITION, one of Swank's compiler conditions, is
SBCL's report of an undefined function, variable or type (\"undefined
function: FOO\", or \"N more uses of undefined function FOO\"): its
format arguments end with the kind and the name."
  (let ((original (swank/backend::original-condition condition))
        (message (swank/backend::message condition)))
    (when (and (typep original 'simple-condition) (stringp message)
               (or (eql 0 (search "undefined " message)) (search " of undefined " message)))
      (let ((arguments (last (simple-condition-format-arguments original) 2)))
        (and (= (length arguments) 2)
             (assoc (first arguments) *undefined-kinds*)
             arguments)))))

(defun call-recording-undefined (table thunk)
  "Call THUNK, recording in TABLE (an EQUAL hash table) each undefined
name the compiler reports, from its note's message to its (KIND NAME)
(see `undefined-reference'); Swank's own handler still makes the note."
  (handler-bind ((swank/backend:compiler-condition
                   (lambda (condition)
                     (let ((reference (undefined-reference condition)))
                       (when reference
                         (setf (gethash (swank/backend::message condition) table) reference))))))
    (funcall thunk)))

(defun note-plist (note files &optional undefined)
  "One of Swank's compiler NOTES as (:severity S :message M :file F :line L
:column C :snippet S), or (:severity S :message M :error WHY) without a
place; with :undefined (KIND NAME) when UNDEFINED (see
`call-recording-undefined') says it reports an undefined name; nil for a
note cl-mcp leaves out (see `*note-severities*')."
  (let ((severity (cdr (assoc (getf note :severity) *note-severities*)))
        (reference (and undefined (gethash (getf note :message) undefined))))
    (when severity
      (append (list :severity severity
                    :message (multiple-value-call #'marked-text
                               (cap-string (getf note :message) *note-message-limit*)))
              (location-plist (getf note :location) files)
              (and reference (list :undefined reference))))))

(defun file-ranks (plists)
  "An EQUAL hash table from each file of PLISTS to its rank: files come in
the order their first note came, the order they were compiled in."
  (let ((ranks (make-hash-table :test 'equal)))
    (dolist (plist plists ranks)
      (let ((file (getf plist :file)))
        (when (and file (not (gethash file ranks)))
          (setf (gethash file ranks) (hash-table-count ranks)))))))

(defun sorted-by-place (plists ranks)
  "PLISTS grouped by file (in the order RANKS gives) and in the order of
their lines in each; those without a place last."
  (flet ((order (plist)
           (if (getf plist :line)
               (list (gethash (getf plist :file) ranks) (getf plist :line) (getf plist :column))
               (list most-positive-fixnum 0 0))))
    (stable-sort (copy-list plists)
                 (lambda (a b)
                   (loop for x in (order a) for y in (order b)
                         unless (= x y) return (< x y))))))

(defun use-plist (plist)
  "A place of PLIST (a note or `reference-plist') as (:file F :line L
:column C), the referrer's :name first when it has one."
  (append (and (getf plist :name) (list :name (getf plist :name)))
          (list :file (getf plist :file)
                :line (or (getf plist :reference-line) (getf plist :line))
                :column (or (getf plist :reference-column) (getf plist :column)))))

(defun undefined-uses (reference group files ranks)
  "The places that use the undefined name of REFERENCE, (KIND NAME): the
places of its notes in GROUP and every use the image's cross-references
know (its callers, for a function, once they are loaded), one a line, in
the order of `sorted-by-place', at most `*use-limit*'."
  (destructuring-bind (kind name) reference
    (let* ((relation (cdr (assoc kind *undefined-kinds*)))
           (found (and relation (symbolp name)
                       (handler-case (xref-references relation name)
                         (serious-condition () '()))))
           ;; The cross-references' places first: they name the referrer.
           (places (append (loop for (referrer location) in found
                                 for plist = (reference-plist (prin1-to-string referrer) referrer location files)
                                 when (getf plist :file) collect plist)
                           (remove nil group :key (lambda (plist) (getf plist :file)))))
           (uses (remove-duplicates (mapcar #'use-plist places)
                                    :test (lambda (a b) (and (equal (getf a :file) (getf b :file))
                                                             (eql (getf a :line) (getf b :line))))
                                    :from-end t)))
      (dolist (use uses)
        (unless (gethash (getf use :file) ranks)
          (setf (gethash (getf use :file) ranks) (hash-table-count ranks))))
      (let ((sorted (sorted-by-place uses ranks)))
        (subseq sorted 0 (min (length sorted) *use-limit*))))))

(defun merged-undefined (plists files ranks)
  "PLISTS with the notes about one undefined name merged into the first of
them, which gains :uses (see `undefined-uses'); the :undefined key gone."
  (let ((groups (make-hash-table :test 'equal)))
    (dolist (plist plists)
      (when (getf plist :undefined)
        (push plist (gethash (getf plist :undefined) groups))))
    (loop for plist in plists
          for reference = (getf plist :undefined)
          for group = (and reference (reverse (gethash reference groups)))
          when (null reference)
            collect plist
          else when (eq plist (first group))
            collect (let ((bare (loop for (key value) on plist by #'cddr
                                      unless (eq key :undefined) append (list key value))))
                      (append bare (list :uses (undefined-uses reference group files ranks)))))))

(defun note-counts (plists)
  "The plain compiler notes among PLISTS counted per file, as (:file F
:count N) plists in the order of their files' first notes (without :file
for notes that have no place)."
  (let ((counts '()))
    (dolist (plist plists (nreverse counts))
      (when (eq (getf plist :severity) :note)
        (let ((entry (find (getf plist :file) counts :key (lambda (entry) (getf entry :file))
                                                     :test #'equal)))
          (if entry
              (incf (getf entry :count))
              (push (append (and (getf plist :file) (list :file (getf plist :file)))
                            (list :count 1))
                    counts)))))))

(defun note-plists (notes &key (keep (constantly t)) (mode :all) undefined)
  "Swank's compiler NOTES as `note-plist's, grouped by file in line order
(see `sorted-by-place'), duplicates, left-out ones and those KEEP is false
of dropped, the notes about one undefined name merged (see
`merged-undefined'; UNDEFINED as `note-plist' takes it).  With MODE
:warnings plain compiler notes are counted, not listed.  Return the
listed ones, at most `*note-limit*'; the number dropped for that limit;
and the counts of plain notes per file (see `note-counts'), nil with MODE
:all."
  (let* ((files (make-hash-table :test 'equal))
         (plists (remove-duplicates
                  (remove-if-not keep (remove nil (mapcar (lambda (note) (note-plist note files undefined))
                                                          notes)))
                  :test #'equal :from-end t))
         (ranks (file-ranks plists))
         (listed (sorted-by-place
                  (merged-undefined (if (eq mode :warnings)
                                        (remove :note plists :key (lambda (plist) (getf plist :severity)))
                                        plists)
                                    files ranks)
                  ranks)))
    (values (subseq listed 0 (min (length listed) *note-limit*))
            (max 0 (- (length listed) *note-limit*))
            (and (eq mode :warnings) (note-counts plists)))))

(defun failing-severity-p (plist)
  "True for a note that means the compilation failed."
  (member (getf plist :severity) '(:error :read-error)))

(defparameter *source-file-limit* (* 16 1024 1024)
  "The most bytes a file the tools read may hold.  They read it whole, and
more than once (octets, text, forms), in the image's heap: the
programmer's, in attach mode, where a 40 MB file once took all of 1 GiB.")

(defun file-bytes (pathname)
  "The size of the file at PATHNAME in bytes, read without reading it."
  (with-open-file (in pathname :element-type '(unsigned-byte 8))
    (file-length in)))

(defun source-file-problem (path)
  "Nil when PATH (a string) names an existing file, by an absolute path, of
at most `*source-file-limit*' bytes; else the :status :error plist saying
why not."
  (let ((pathname (ignore-errors (pathname path))))
    (cond ((not (and pathname (eq (first (pathname-directory pathname)) :absolute)))
           (name-error "CL-MCP:INVALID-PATH"
                       (format nil "The path ~S is not absolute: give the file's absolute path." path)))
          ((not (and (probe-file pathname) (pathname-name (probe-file pathname))))
           (name-error "CL-MCP:FILE-NOT-FOUND" (format nil "No file ~A exists (or it is a directory)." path)))
          (t
           (let ((bytes (file-bytes pathname)))
             (when (> bytes *source-file-limit*)
               (name-error "CL-MCP:FILE-TOO-LARGE"
                           (format nil "~A holds ~:D bytes; the tools read files of at most ~:D bytes ~
                                        (~D MiB), and read none of this one."
                                   path bytes *source-file-limit*
                                   (floor *source-file-limit* (* 1024 1024))))))))))

(defun compile-file-of (path &key (load t) (notes :warnings) (max-output 20000) (tag nil)
                                (answer-within nil))
  "Compile the file at PATH (absolute) as SLIME's C-c C-k does, and load the
fasl when LOAD and the compilation did not fail (warnings do not stop it;
errors do).  Return a plist: :status (:ok; :error when compilation failed
or the load signalled an error; :aborted when cancelled under TAG),
:success, :fasl, :loaded, :notes and :dropped (see `note-plists', NOTES
its mode: :warnings or :all), :note-counts with NOTES :warnings, and
:error (the load's error, or why PATH cannot be compiled).  The
compiler's output goes to a capped stream (MAX-OUTPUT characters) and is
dropped.  Still running after ANSWER-WITHIN seconds, it goes on in the
background (see `call-within-window').  CL-MCP:NOT-IMPLEMENTED when this
image lacks an internal its notes need."
  (or (missing-internals-error :compile-notes)
      (source-file-problem path)
      (call-within-window
       (lambda ()
         (call-cancellable tag (lambda () (%compile-file-of (probe-file path) load notes max-output))
                           (list :status :aborted :success nil :loaded nil :notes '() :dropped 0)))
       answer-within tag)))

(defun call-with-failure (stdout thunk)
  "Call THUNK with the standard streams going to STDOUT and the debugger
kept out: (values ITS-VALUE nil), or (values nil FAILURE) when it
signalled an error, FAILURE as `describe-error' gives it."
  (let ((failure nil))
    (values (block calling
              (flet ((fail (condition)
                       (setf failure (describe-error condition nil))
                       (return-from calling nil)))
                (with-standard-streams (stdout stdout)
                  (with-debugger-calling (#'fail)
                    (funcall thunk)))))
            failure)))

(defun %compile-file-of (pathname load mode max-output)
  "`compile-file-of' of the file at PATHNAME, which exists."
  (let ((stdout (make-capped-output-stream max-output))
        (undefined (make-hash-table :test 'equal))
        (loaded nil))
    (multiple-value-bind (result failure)
        (call-with-failure
         stdout
         (lambda ()
           (let ((*package* (find-package "COMMON-LISP-USER")))
             (call-recording-undefined
              undefined
              (lambda ()
                (swank::collect-notes
                 (lambda ()
                   (multiple-value-bind (fasl warnings-p failure-p)
                       (swank/backend:swank-compile-file
                        pathname (swank::fasl-pathname pathname '()) nil
                        (or (swank/backend:guess-external-format pathname) :default))
                     (declare (ignore warnings-p failure-p))
                     (values t nil fasl)))))))))
      (let* ((raw-notes (and result (swank::compilation-result-notes result)))
             (fasl (and result (swank::compilation-result-faslfile result)))
             (success (and fasl (not failure)
                           (notany (lambda (note) (member (getf note :severity) '(:error :read-error)))
                                   raw-notes)
                           t)))
        (when (and success load)
          ;; As Swank keeps it when it loads what it compiled: the text the
          ;; definitions and frames were compiled from, for after edits.
          (remember-source pathname)
          (multiple-value-bind (load-result load-failure)
              (call-with-failure stdout
                                 (lambda ()
                                   (call-recording-undefined
                                    undefined
                                    (lambda ()
                                      (swank::collect-notes
                                       (lambda ()
                                         (swank/backend:with-compilation-hooks ()
                                           (load fasl))
                                         (values t t nil)))))))
            (setf failure load-failure
                  loaded (and load-result (not failure) t))
            (when load-result
              (setf raw-notes (append raw-notes (swank::compilation-result-notes load-result))))))
        ;; After the load, so that the cross-references know the file's
        ;; uses of an undefined function.
        (multiple-value-bind (notes dropped counts) (note-plists raw-notes :mode mode :undefined undefined)
          (list* :status (if (and success (not failure)) :ok :error)
                 :success success
                 :fasl fasl
                 :loaded loaded
                 :notes notes
                 :dropped dropped
                 (append (and counts (list :note-counts counts))
                         (and failure (list :error failure)))))))))

;;;; Entry point: loading systems

(defun quicklisp-setup-file ()
  "Quicklisp's setup file in the home directory, if it is there."
  (probe-file (merge-pathnames "quicklisp/setup.lisp" (user-homedir-pathname))))

(defun ensure-quicklisp ()
  "True when Quicklisp is loaded, loading it from ~/quicklisp when present."
  (or (find-package "QL")
      (let ((setup (quicklisp-setup-file)))
        (when setup
          (call-loading-libraries (lambda () (load setup)))  ; its packages are a library's
          (find-package "QL")))))

(defun system-version (name)
  "The version of ASDF system NAME, or nil."
  (let ((system (asdf:find-system name nil)))
    (and system (asdf:component-version system))))

(defparameter *redefinition-warning*
  (first (existing-symbols '(("SB-KERNEL" "REDEFINITION-WARNING"))))
  "SBCL's class of warnings about redefining a function or macro.")

(defun redefinition-p (warning)
  "True for a redefinition warning: ASDF compiles a file, then loads it into
the same image, so every macro of a freshly compiled system is 'redefined'."
  (and *redefinition-warning* (typep warning *redefinition-warning*)))

(defun missing-system-p (condition name)
  "True when CONDITION says that system NAME itself cannot be found (not one
of its dependencies)."
  (or (and (typep condition 'asdf:missing-component)
           (not (typep condition 'asdf:missing-dependency))
           (equal (asdf/find-component:missing-requires condition) name))
      (string= (symbol-name (type-of condition)) "SYSTEM-NOT-FOUND")))

(defun system-file-p (plist directory)
  "True when the note PLIST has a place in a file under DIRECTORY (a
namestring ending in /)."
  (let ((file (getf plist :file)))
    (and file directory (eql 0 (search directory file)))))

(defun system-notes (name notes mode undefined)
  "Swank's compiler NOTES as `note-plists' gives them (MODE and UNDEFINED
as it takes them), keeping those in the files of system NAME (under its
source directory), not of its dependencies."
  (let* ((system (ignore-errors (asdf:find-system name nil)))
         (directory (and system (asdf:system-source-directory system)
                         (namestring (truename (asdf:system-source-directory system))))))
    (note-plists notes :keep (lambda (plist) (system-file-p plist directory))
                       :mode mode :undefined undefined)))

(defun %load-system (name quicklisp stdout record-warning record-note)
  "Load NAME with output to STDOUT; return (:ok) or (:error PLIST).
Warnings other than redefinitions go to RECORD-WARNING as (TYPE MESSAGE),
and Swank's compiler notes (as C-c C-k gathers them) to RECORD-NOTE, also
when the load fails."
  (block loading
    (flet ((fail (c)
             (return-from loading
               (list :error
                     (if (missing-system-p c name)
                         (list :type (condition-type-name c)
                               :message (format nil "System ~S not found." name)
                               :backtrace nil)
                         (describe-error c (frame-lines (error-frames) c
                                                        *backtrace-frame-limit*)))))))
      ;; Swank's compilation hooks signal each warning again, to this
      ;; handler, and make it a note only if that returns; the warning then
      ;; comes here a second time, and is muffled (warnings do not stop a
      ;; load: ASDF on SBCL fails a file whose compilation warned).
      (handler-bind ((warning
                       (let ((last nil))
                         (lambda (w)
                           (cond ((eq w last) (muffle-warning w))
                                 (t (setf last w)
                                    (unless (redefinition-p w)
                                      (funcall record-warning
                                               (list (public-type-name w 'warning)
                                                     (condition-message w)))))))))
                     (serious-condition #'fail))
        (with-standard-streams (stdout stdout)
          ;; BREAK and INVOKE-DEBUGGER end the load too.
          (with-debugger-calling (#'fail)
            (handler-bind ((swank/backend:compiler-condition
                             (lambda (c) (funcall record-note (swank::make-compiler-note c)))))
              (swank/backend:with-compilation-hooks ()
                (if quicklisp
                    (funcall (find-symbol "QUICKLOAD" "QL") name :silent t)
                    (asdf:load-system name))))
            (list :ok)))))))

(defun load-system (name &key (notes :warnings) (max-output 20000) (tag nil) (answer-within nil))
  "Load the ASDF system NAME as `load-system-report' does; still running
after ANSWER-WITHIN seconds, the load goes on in the background (see
`call-within-window'); CL-MCP:NOT-IMPLEMENTED when this image lacks an
internal its notes need."
  (or (missing-internals-error :compile-notes)
      (call-within-window (lambda () (load-system-report name notes max-output tag)) answer-within tag)))

(defun remember-source (truename)
  "Keep the text of the file at TRUENAME in Swank's source cache as it is
now.  Swank looks the cache up by the pathname SBCL recorded when it finds
a definition's position, and by its namestring when it reads the snippet:
the one entry goes under both keys, or the two would disagree once the
file is edited.  Nothing without the cache's internals."
  (unless (missing-internals-message :source-cache)
    (let ((cache swank/source-file-cache::*source-file-cache*)
          (namestring (namestring truename)))
      (swank/source-file-cache:source-cache-get truename (file-write-date truename))
      (let ((entry (gethash truename cache)))
        (when entry
          (setf (gethash namestring cache) entry))))))

(defun system-source-files (system &key other-systems)
  "The truenames of the Lisp source files of ASDF SYSTEM that exist, and of
the systems it depends on when OTHER-SYSTEMS."
  ;; Filtered here: required-components' :component-type leaves out the
  ;; files inside a :module (esrap's, bordeaux-threads')
  (loop for component in (asdf:required-components system :other-systems other-systems)
        for file = (and (typep component 'asdf:cl-source-file) (asdf:component-pathname component))
        when (and file (probe-file file))
          collect (truename file)))

(defun remember-system-sources (name)
  "Keep the text of every Lisp file of system NAME, and of the systems it
depends on, in Swank's source cache as it is now that they are loaded (as
Swank's compile-file does for the file it loads): their definitions are
then found by their compiled text after the files are edited, and the
line each had is known (see `resolved-location')."
  (handler-case
      (mapc #'remember-source (system-source-files (asdf:find-system name) :other-systems t))
    (serious-condition (condition)
      (log-note "could not keep the sources of ~A: ~A" name (condition-message condition)))))

(defun load-system-report (name mode max-output tag)
  "Load the ASDF system NAME (a string), through Quicklisp when it is
available.  Return a plist: :status (:ok, :error, or :aborted when
cancelled under TAG), :system, :loader (\"quicklisp\" or \"asdf\"),
:warnings as (TYPE MESSAGE) lists, :notes, :dropped and, with MODE
:warnings, :note-counts (see `note-plists') for the system's own files
that were compiled, and :version or :error.  Compiler chatter goes to a
capped stream (MAX-OUTPUT characters) and is dropped.  Packages the
system creates are libraries, not the session's own definitions."
  (let* ((stdout (make-capped-output-stream max-output))
         (warnings '())
         (notes '())
         (undefined (make-hash-table :test 'equal))
         (quicklisp (ensure-quicklisp))
         (outcome (call-cancellable
                   tag
                   (lambda ()
                     (call-loading-libraries
                      (lambda ()
                        (call-recording-undefined
                         undefined
                         (lambda ()
                           (%load-system name quicklisp stdout
                                         (lambda (w) (push w warnings))
                                         (lambda (note) (push note notes))))))))
                   (list :aborted))))
    (when (eq (first outcome) :ok)
      (remember-system-sources name))
    (multiple-value-bind (notes dropped counts) (system-notes name (nreverse notes) mode undefined)
      (list* :status (first outcome)
             :system name
             :loader (if quicklisp "quicklisp" "asdf")
             :warnings (nreverse warnings)
             :notes notes
             :dropped dropped
             (append (and counts (list :note-counts counts))
                     (case (first outcome)
                       (:ok (list :version (system-version name)))
                       (:error (list :error (second outcome)))))))))
