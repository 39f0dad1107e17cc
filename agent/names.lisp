;;;; agent/names.lisp --- names and places; find-definition and describe-symbol
;;;;
;;;; What the development tools share (looking names up, turning Swank's
;;;; locations into lines), then the two tools that answer "what is this
;;;; name, and where".
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; Development tools: names and places
;;;
;;; What the development tools share.  A name arrives as a string, either
;;; package-qualified ("alexandria:flatten") or read in a package (the
;;; session's current one by default); it is looked up, never interned, and
;;; an unknown symbol or package is an error that says so.  A place is
;;; where a definition or a compiler note is: Swank's `(:location (:file F)
;;; (:position P) ...)', whose P counts bytes from 1, turned into an
;;; absolute file, a 1-based line and column, and the first lines of the
;;; form there.

(defparameter *snippet-lines* 4
  "Lines of a definition's source shown with its place.")

(defparameter *snippet-characters* 400
  "Characters of a definition's source shown with its place, at most.")

(defun name-error (type message)
  "The :status :error plist of a name or package that cannot be used."
  (list :status :error :error (list :type type :message message :backtrace nil)))

(defun error-report (type control &rest arguments)
  "The :status :error plist of TYPE, its message made by FORMAT from
CONTROL and ARGUMENTS."
  (name-error type (apply #'format nil control arguments)))

(defun find-named-package (package-name)
  "The package PACKAGE-NAME names (exactly, or upcased), or nil."
  (and package-name (find-package-designator package-name)))

(defun resolve-symbol (text package-name)
  "The existing symbol TEXT names, read in PACKAGE-NAME (CL-USER when nil
or gone), as (values SYMBOL nil); or (values nil ERROR-PLIST) when TEXT
names no existing symbol or an unknown package.  Nothing is interned."
  (let ((package (if package-name
                     (find-named-package package-name)
                     (find-package "COMMON-LISP-USER"))))
    (unless package
      (return-from resolve-symbol
        (values nil (name-error "PACKAGE-ERROR"
                                (format nil "The package ~S does not exist." package-name)))))
    (multiple-value-bind (symbol found name home) (swank::parse-symbol (string-trim " " text) package)
      (cond (found (values symbol nil))
            ((and (null home) (find #\: text))
             (values nil (name-error "PACKAGE-ERROR"
                                     (format nil "The package of ~A does not exist." text))))
            ((not (find #\: text))
             (values nil (name-error "CL-MCP:UNKNOWN-SYMBOL"
                                     (format nil "No symbol ~A is accessible in ~A (nothing was interned)."
                                             text (package-name package)))))
            ;; Qualified: the package asked is the one to name.
            ((eq (nth-value 1 (find-symbol name home)) :internal)
             (values nil (name-error "CL-MCP:UNKNOWN-SYMBOL"
                                     (format nil "~A is not external in ~A: it is an internal symbol there, ~
                                                  written ~A::~A."
                                             text (package-name home) (package-name home) name))))
            (t
             (values nil (name-error "CL-MCP:UNKNOWN-SYMBOL"
                                     (format nil "No symbol named ~A exists in ~A (nothing was interned)."
                                             name (package-name home)))))))))

(defun with-resolved-symbol (text package-name function)
  "Call FUNCTION with the symbol TEXT names (see `resolve-symbol'), or
return the error plist."
  (multiple-value-bind (symbol failure) (resolve-symbol text package-name)
    (if failure failure (funcall function symbol))))

(defun file-octets (file)
  "The bytes of FILE: compiler notes count bytes (SBCL's FILE-POSITION on a
file stream), definitions count characters (see `source-offset')."
  (with-open-file (in file :element-type '(unsigned-byte 8))
    (let ((octets (make-array (file-length in) :element-type '(unsigned-byte 8))))
      (subseq octets 0 (read-sequence octets in)))))

(defun utf-8-text (octets start end)
  "The characters OCTETS hold from START to END."
  (sb-ext:octets-to-string octets :external-format '(:utf-8 :replacement #\?)
                                  :start start :end end))

(defun place-at (octets offset)
  "The 1-based line and column of the byte at OFFSET (from 0) of a file's
OCTETS, and the first `*snippet-lines*' lines from there (at most
`*snippet-characters*' characters): the defining form."
  (let* ((offset (max 0 (min offset (length octets))))
         (newline (char-code #\Newline))
         (line (1+ (count newline octets :end offset)))
         (line-start (let ((before (position newline octets :end offset :from-end t)))
                       (if before (1+ before) 0)))
         (end offset))
    (loop repeat *snippet-lines*
          for next = (position newline octets :start (min end (length octets)))
          do (setf end (if next (1+ next) (length octets)))
          while next)
    (let ((snippet (utf-8-text octets offset end)))
      (values line
              (1+ (length (utf-8-text octets line-start offset)))
              (string-right-trim '(#\Newline #\Space)
                                 (subseq snippet 0 (min (length snippet) *snippet-characters*)))))))

(defstruct (source-file (:constructor make-source-file (path octets)))
  "A file as it is now, read once for one reply: its bytes, and what is
derived from them on first use."
  path octets (%lowered nil) (%text nil) (%forms :unknown) (%ends nil)
  (%octet-starts nil) (%octet-ends nil) (%line-bags nil))

(defun file-source (path files)
  "The `source-file' at PATH, kept in FILES (an equal hash table) across
the places of one reply."
  (or (gethash path files) (setf (gethash path files) (make-source-file path (file-octets path)))))

(defun source-file-lowered (source)
  "SOURCE's bytes with ASCII letters in lower case, for finding names."
  (or (source-file-%lowered source)
      (setf (source-file-%lowered source) (lowered-octets (source-file-octets source)))))

(defun source-file-forms (source)
  "The character offsets where SOURCE's top-level forms start, as a
vector (see `top-level-form-bounds' of agent/forms.lisp, loaded later), or
nil when one does not read."
  (when (eq (source-file-%forms source) :unknown)
    (let ((bounds (handler-case (top-level-form-bounds (source-file-string source)
                                                       most-positive-fixnum)
                    (serious-condition () nil))))
      (setf (source-file-%forms source) (and bounds (map 'vector #'car bounds))
            (source-file-%ends source) (and bounds (map 'vector #'cdr bounds)))))
  (source-file-%forms source))

(defun source-file-ends (source)
  "The character offsets where SOURCE's top-level forms end, as a vector in
the order of `source-file-forms', or nil when one does not read."
  (source-file-forms source)
  (source-file-%ends source))

(defun source-file-string (source)
  "SOURCE's text."
  (or (source-file-%text source)
      (let ((octets (source-file-octets source)))
        (setf (source-file-%text source) (utf-8-text octets 0 (length octets))))))

;;;; Places that stay true after edits
;;;
;;; A definition's place is recorded when it is compiled, and the file may
;;; have been edited since.  Swank gives the recorded position and a
;;; snippet: the form's first characters as compiled (when Swank's source
;;; cache holds that text) or as the file is now.  `resolve-offset' checks
;;; the snippet against the file as it is now and, as SLIME does
;;; (slime-isearch), looks for it near the recorded position when it is not
;;; there; failing that, for a definition of the name (SLIME's
;;; :function-name search).  The place says which it found: "unchanged",
;;; "found-after-edit" (with the line it had), or "not-found" (the line it
;;; had).
;;; Everything is compared as bytes, so no regular expression can backtrack
;;; over a long file.

(deftype octets () '(simple-array (unsigned-byte 8) (*)))

(defparameter +def-octets+ (coerce (map 'list #'char-code "(def") 'octets)
  "The bytes every defining form opens with.")

(defun octet-blank-p (octet)
  (member octet '(32 9 10 13 12)))

(defun skip-blanks-and-comments (octets start)
  "The first byte at or after START that is neither blank nor in a line
comment: where Swank's snippet starts (its read-snippet skips them)."
  (let ((index start) (length (length octets)))
    (loop
      (cond ((>= index length) (return length))
            ((octet-blank-p (aref octets index)) (incf index))
            ((= (aref octets index) #.(char-code #\;))
             (setf index (or (position 10 octets :start index) length)))
            (t (return index))))))

(defun line-start (octets offset)
  "The offset of the first byte of the line holding OFFSET."
  (let ((before (position 10 octets :end offset :from-end t)))
    (if before (1+ before) 0)))

(defun common-prefix-length (needle octets start)
  "How many leading bytes of NEEDLE OCTETS holds at START."
  (let ((mismatch (mismatch needle octets :start2 start)))
    (if mismatch (min mismatch (- (length octets) start)) (length needle))))

(defun occurrences (needle octets)
  "Every offset where NEEDLE (not empty) starts in OCTETS, found by a scan
for its first byte."
  (declare (type octets needle octets))
  (let ((first (aref needle 0)) (last (- (length octets) (length needle))))
    (loop for start = (position first octets) then (position first octets :start (1+ start))
          while (and start (<= start last))
          unless (mismatch needle octets :start2 start :end2 (+ start (length needle)))
            collect start)))

(defun nearest (positions origin)
  "The one of POSITIONS nearest ORIGIN, or nil."
  (loop with best = nil
        for position in positions
        when (or (null best) (< (abs (- position origin)) (abs (- best origin))))
          do (setf best position)
        finally (return best)))

(defun snippet-offset (snippet octets origin &optional within)
  "Where SNIPPET (bytes) is in OCTETS, as SLIME's isearch finds it: the
longest match of its start, at least its first line (a definition's
opening line, which edits inside the form leave alone), nearest ORIGIN;
nil when its first line is nowhere.  WITHIN, a predicate or nil, says
which offsets may be it."
  (let* ((opening (subseq snippet 0 (let ((newline (position 10 snippet)))
                                      ;; a whole line: not a prefix of a longer name's
                                      (if newline (1+ newline) (length snippet)))))
         (candidates (and (plusp (length opening))
                          (remove-if-not (or within (constantly t)) (occurrences opening octets))))
         (lengths (mapcar (lambda (candidate) (common-prefix-length snippet octets candidate))
                          candidates))
         (best (reduce #'max lengths :initial-value 0)))
    (nearest (loop for candidate in candidates for length in lengths
                   when (= length best) collect candidate)
             origin)))

(defun symbol-octet-p (octet)
  "True for a byte that can be part of a symbol's name as written."
  (not (or (octet-blank-p octet) (member octet '#.(map 'list #'char-code "()'\";`")))))

(defun lowered-octets (octets)
  "OCTETS with ASCII letters in lower case, for comparing names."
  (map 'octets (lambda (octet) (if (<= 65 octet 90) (+ octet 32) octet)) octets))

(defstruct (sought (:constructor make-sought (name operators setf &optional specializers)))
  "What a definition is looked for by when its snippet is not in the file
any more: its symbol's NAME, the defining OPERATORS it is written with
\(lower-case strings; nil for any `(def...'), SETF, true for a (SETF
NAME) definition, and for a method its qualifiers and SPECIALIZERS as
`written-specializers' gives them (nil for any)."
  name operators setf specializers)

(defun skip-token (text index)
  "The index in TEXT past the token (a symbol, a number) at INDEX."
  (or (position-if (lambda (char) (or (member char '(#\Space #\Tab #\Newline #\Return #\( #\) #\;))))
                   text :start index)
      (length text)))

(defun skip-blank-text (text index)
  "The index in TEXT of the first character at or after INDEX that is not blank."
  (or (position-if-not (lambda (char) (member char '(#\Space #\Tab #\Newline #\Return #\Page)))
                       text :start index)
      (length text)))

(defun bare-name (token)
  "TOKEN, a symbol as written, without its package prefix."
  (subseq token (1+ (or (position #\: token :from-end t) -1))))

(defun qualifier-word (token)
  "A method qualifier as written (TOKEN, in lower case), as
`dspec-specializer-words' names it: a keyword with its colon, any other
symbol without its package."
  (if (char= (char token 0) #\:) token (bare-name token)))

(defun written-specializers (text index)
  "The qualifiers and specializers of the DEFMETHOD whose name ends at INDEX
of TEXT (in lower case), as written: (QUALIFIERS . SPECIALIZERS), each
qualifier a `qualifier-word', each specializer a class's name without its
package, \"t\" for an unspecialized parameter, an `eql-word' for an (EQL
...) one; nil when its lambda list does not parse so simply."
  (let ((i (skip-blank-text text index)) (n (length text)) (specializers '()) (qualifiers '()))
    (when (and (< i n) (char= (char text i) #\))) ; the end of (SETF NAME)
      (setf i (skip-blank-text text (1+ i))))
    (loop while (and (< i n) (char/= (char text i) #\()) ; qualifiers
          do (let ((end (skip-token text i)))
               (when (> end i) (push (qualifier-word (subseq text i end)) qualifiers))
               (setf i (skip-blank-text text end))))
    (when (< i n)
      (setf i (1+ i))
      (loop
        (setf i (skip-blank-text text i))
        (cond ((or (>= i n) (char= (char text i) #\;)) (return nil))
              ((member (char text i) '(#\) #\&)) (return (cons (reverse qualifiers) (reverse specializers))))
              ((char= (char text i) #\()
               (let ((at (skip-blank-text text (skip-token text (skip-blank-text text (1+ i))))))
                 (cond ((>= at n) (return nil))
                       ((char= (char text at) #\()
                        (let ((close (position #\) text :start at)))
                          (push (eql-word (written-eql-object
                                           (and close (< (+ at 4) close) (subseq text (+ at 4) close))))
                                specializers)
                          (setf at (skip-blank-text text (1+ (or close (1- n)))))))
                       (t (let ((end (skip-token text at)))
                            (push (bare-name (subseq text at end)) specializers)
                            (setf at (skip-blank-text text end)))))
                 (unless (and (< at n) (char= (char text at) #\))) (return nil))
                 (setf i (1+ at))))
              (t (push "t" specializers)
                 (setf i (skip-token text i))))))))

(defun eql-word (object)
  "An (EQL X) specializer as `written-specializers' names it: \"(eql X)\",
OBJECT (X's text in lower case, a symbol's without its package), or
\"(eql\" for any when OBJECT is nil: X's value is not in the text."
  (if object (format nil "(eql ~A)" object) "(eql"))

(defun written-eql-object (written)
  "The object of an (EQL X) specializer WRITTEN so (X's text, in lower
case) for `eql-word': a quoted symbol's name, a keyword, a number or a
string as written; nil for a form or a variable, whose value the text
does not show."
  (let ((text (and written (string-trim '(#\Space #\Tab #\Newline) written))))
    (cond ((or (null text) (zerop (length text)) (find-if (lambda (char) (find char "(#`,|")) text)) nil)
          ((char= (char text 0) #\') (bare-name (subseq text 1)))
          ((or (char= (char text 0) #\:) (char= (char text 0) #\") (digit-char-p (char text 0))) text))))

(defun specializer-words-match-p (sought written)
  "True when SOUGHT and WRITTEN, (QUALIFIERS . SPECIALIZERS) as
`written-specializers' gives them, name the same method: \"(eql\" matches
any (EQL X) specializer."
  (and (consp written)
       (equal (car sought) (car written))
       (= (length (cdr sought)) (length (cdr written)))
       (every (lambda (one other)
                (or (string= one other)
                    (and (or (string= one "(eql") (string= other "(eql"))
                         (eql 0 (search "(eql" one)) (eql 0 (search "(eql" other)))))
              (cdr sought) (cdr written))))

(defparameter *dspec-operators*
  '((defun "defun") (defmacro "defmacro") (defgeneric "defgeneric") (defmethod "defmethod")
    (defvar "defvar" "defparameter") (defparameter "defparameter" "defvar")
    (defconstant "defconstant") (defclass "defclass") (define-condition "define-condition")
    (defstruct "defstruct") (deftype "deftype") (define-compiler-macro "define-compiler-macro")
    (defsetf "defsetf" "define-setf-expander") (define-setf-expander "define-setf-expander" "defsetf"))
  "The operators a definition Swank's dspec names so is written with: a
`defmacro regs-b' is no place of a `deftype regs', a `defun' none of a
`define-condition' of the same name.")

(defun defining-opening-p (lowered name-start sought)
  "True when the line of LOWERED (a file's bytes in lower case) holding
NAME-START opens a definition there of what SOUGHT describes: `(OPERATOR
', then only blanks, open parentheses and, for a (SETF NAME) definition,
`setf'; OPERATOR one of SOUGHT's, or any `def...' but
`define-compiler-macro' (SLIME's :function-name search) when it has none."
  (let* ((open (skip-blanks-and-comments lowered (line-start lowered name-start)))
         (word-end (position-if-not #'symbol-octet-p lowered :start (min (1+ open) name-start)
                                                            :end name-start)))
    (and (< (+ open 4) name-start)
         (not (mismatch +def-octets+ lowered :start2 open :end2 (+ open 4)))
         word-end
         (let ((operator (map 'string #'code-char (subseq lowered (1+ open) word-end))))
           (if (sought-operators sought)
               (member operator (sought-operators sought) :test #'string=)
               ;; A compiler macro is the place of its own dspec only, never of a function's name.
               (string/= operator "define-compiler-macro")))
         (let* ((between (map 'string #'code-char (subseq lowered word-end name-start)))
                (rest (remove-setf between)))
           (and (eq (sought-setf sought) (not (string= rest between)))
                (every (lambda (char) (member char '(#\Space #\Tab #\Newline #\()))
                       rest))))))

(defun remove-setf (text)
  "TEXT without its first `setf'."
  (let ((at (search "setf" text)))
    (if at (concatenate 'string (subseq text 0 at) (subseq text (+ at 4))) text)))

(defun definition-offset (sought lowered origin &optional within)
  "Where a definition SOUGHT describes (see `defining-opening-p'; its name
compared without case) opens in LOWERED, a file's bytes in lower case,
nearest ORIGIN: `(defun NAME', `(defmethod (setf NAME)'...; nil when there
is none.  WITHIN, a predicate or nil, says which offsets may be it."
  (let ((needle (lowered-octets (sb-ext:string-to-octets (sought-name sought) :external-format :utf-8))))
    (and (plusp (length needle))
         (nearest (loop for start in (occurrences needle lowered)
                        for end = (+ start (length needle))
                        when (and (or (= end (length lowered)) (not (symbol-octet-p (aref lowered end))))
                                  (plusp start)
                                  (or (not (symbol-octet-p (aref lowered (1- start))))
                                      (= (aref lowered (1- start)) #.(char-code #\:)))
                                  (defining-opening-p lowered start sought)
                                  (or (null (sought-specializers sought))
                                      (specializer-words-match-p (sought-specializers sought)
                                             (written-specializers
                                              (map 'string #'code-char
                                                   (subseq lowered end (min (length lowered) (+ end 2000))))
                                              0))))
                          collect (skip-blanks-and-comments lowered (line-start lowered start)) into found
                        finally (return (remove-if-not (or within (constantly t)) found)))
                  origin))))

(defparameter +method-option-octets+ (coerce (map 'list #'char-code "(:method") 'octets)
  "How a DEFGENERIC's method option opens, in lower case.")

(defun method-option-offset (sought lowered origin &optional within)
  "Where the DEFGENERIC opens, nearest ORIGIN in LOWERED (a file's bytes in
lower case), whose `(:method' option is the method SOUGHT describes: SBCL
places such a method at its DEFGENERIC; nil when there is none."
  (let ((generic (make-sought (sought-name sought) '("defgeneric") (sought-setf sought))))
    (nearest (loop for start in (occurrences +method-option-octets+ lowered)
                   for opening = (definition-offset generic lowered start within)
                   when (and opening (< opening start)
                             ;; The option is inside that DEFGENERIC: no top-level form opens between.
                             (null (search #.(coerce (list 10 (char-code #\()) 'octets) lowered
                                           :start2 opening :end2 start))
                             (specializer-words-match-p
                              (sought-specializers sought)
                              (written-specializers
                               (map 'string #'code-char
                                    (subseq lowered (+ start 8) (min (length lowered) (+ start 2000))))
                               0)))
                     collect opening)
             origin)))

(defparameter +constructor-option-octets+ (coerce (map 'list #'char-code "(:constructor ") 'octets)
  "How a DEFSTRUCT's constructor option opens, in lower case.")

(defun constructor-option-offset (source sought origin &optional within)
  "Where the top-level form (a DEFSTRUCT) opens, nearest byte ORIGIN of
SOURCE, whose `(:constructor NAME' option names the function SOUGHT
describes; nil when there is none."
  (let* ((lowered (source-file-lowered source))
         (needle (concatenate 'octets +constructor-option-octets+
                              (lowered-octets (sb-ext:string-to-octets (sought-name sought) :external-format :utf-8)))))
    (and (null (sought-specializers sought)) (not (sought-setf sought))
         (nearest (loop for start in (occurrences needle lowered)
                        for end = (+ start (length needle))
                        when (or (= end (length lowered)) (not (symbol-octet-p (aref lowered end))))
                          ;; `top-level-form-start' is agent/code.lisp's, loaded later.
                          collect (top-level-form-start source start) into found
                        finally (return (remove-if-not (or within (constantly t)) found)))
                  origin))))

(defun opening-line-names-p (lowered offset sought)
  "True when the line of LOWERED (a file's bytes in lower case) at OFFSET
mentions SOUGHT's name, as a whole symbol (not a prefix of a longer one)."
  (let ((needle (lowered-octets (sb-ext:string-to-octets (sought-name sought) :external-format :utf-8)))
        (end (or (position 10 lowered :start offset) (length lowered))))
    (loop for at = (search needle lowered :start2 offset :end2 end)
            then (search needle lowered :start2 (1+ at) :end2 end)
          while at
          thereis (let ((after (+ at (length needle))))
                    (and (or (= after (length lowered)) (not (symbol-octet-p (aref lowered after))))
                         (or (= at 0) (not (symbol-octet-p (aref lowered (1- at))))
                             (= (aref lowered (1- at)) #.(char-code #\:))))))))

(defun whole-at-p (needle octets at)
  "True when NEEDLE's bytes start at AT of OCTETS (a file cut short may end
inside it); never at the end of the file, whose empty tail matches
nothing."
  (and (< at (length octets))
       (= (common-prefix-length needle octets at) (min (length needle) (- (length octets) at)))))

(defun resolve-offset (source recorded snippet name &optional within)
  "Where the form recorded at byte RECORDED of the file whose `source-file'
is SOURCE is now, and what was found: (values OFFSET STATUS), STATUS
\"unchanged\" (SNIPPET, a string or nil, is whole at RECORDED),
\"found-after-edit\", or \"not-found\" (OFFSET is then RECORDED).  NAME, a `sought' or
nil (see `location-name'), is the definition's: a snippet found on a line that does not name it,
while a definition of the name is elsewhere, was read from the edited file
rather than the compiled one (Swank's source cache did not hold that).
WITHIN, a predicate or nil, says where SNIPPET, moved, or NAME's
definition may be now; never where SBCL's reader would not read it
(`read-by-sbcl-p')."
  (let* ((octets (source-file-octets source))
         (recorded (max 0 (min recorded (length octets))))
         (at (skip-blanks-and-comments octets recorded))
         (needle (and snippet (plusp (length (string-trim " " snippet)))
                      (swank-octets snippet)))
         (within (lambda (candidate)
                   (and (read-by-sbcl-p source candidate) (or (null within) (funcall within candidate)))))
         (found (and needle (if (whole-at-p needle octets at)
                                at
                                (snippet-offset needle octets recorded within)))))
    (flet ((place (offset) (values offset (if (and (= offset at) (whole-at-p needle octets at))
                                              "unchanged"
                                              "found-after-edit")))
           (named () (and name (definition-offset name (source-file-lowered source) recorded within))))
      (cond ((and found (or (null name) (opening-line-names-p (source-file-lowered source) found name)))
             (place found))
            ((named) (place (named)))
            (found (place found))
            ((and (null needle) (< at (length octets))) (values at "unchanged"))
            (t (values recorded "not-found"))))))

(defvar *swank-text-format* :utf-8
  "The external format of the text a place's characters and snippet count
in (see `swank-file-format'): bound by `resolved-location'.")

(defun swank-file-format (path)
  "The external format Swank reads the file at PATH in (its source cache, a
definition's position and snippet): its Emacs coding cookie's, else
Latin-1, whose characters are the file's bytes."
  (or (ignore-errors (swank/backend:guess-external-format path)) :latin-1))

(defun swank-octets (string)
  "STRING, read by Swank, as the bytes of its file (see `*swank-text-format*')."
  (sb-ext:string-to-octets string :external-format *swank-text-format*))

(defun utf-8-offset (source characters)
  "The byte offset of character CHARACTERS (from 0) of SOURCE's text read as UTF-8."
  (let ((octets (source-file-octets source)))
    (if (every (lambda (octet) (< octet 128)) octets)
        characters
        (let ((text (source-file-string source)))
          (length (sb-ext:string-to-octets text :external-format :utf-8
                                                :end (min characters (length text))))))))

(defun swank-counts-bytes-p ()
  "True when `*swank-text-format*' has a byte per character (Latin-1)."
  (= 1 (length (sb-ext:string-to-octets (string (code-char 255)) :external-format *swank-text-format*))))

(defun swank-snippet (octets start)
  "The first characters of OCTETS from START, as Swank reads them (in
`*swank-text-format*'), as long as one of Swank's snippets."
  (handler-case (sb-ext:octets-to-string octets :external-format *swank-text-format*
                                                :start start :end (min (length octets) (+ start 256)))
    (error () nil)))

(defun character-to-octet-offset (source characters)
  "The byte offset of character CHARACTERS (from 0) in SOURCE: Swank counts
a definition's position in characters of the text it read, in
`*swank-text-format*' (Latin-1's are bytes)."
  (if (swank-counts-bytes-p) characters (utf-8-offset source characters)))

(defun compiled-text (path)
  "The text PATH (a pathname or namestring) was compiled from, as Swank's
source cache holds it, or nil."
  (let ((entry (and (not (missing-internals-message :source-cache))
                    (gethash path swank/source-file-cache::*source-file-cache*))))
    (and entry (swank/source-file-cache::source-cache-entry.text entry))))

(defun compiled-source (path files)
  "The text PATH was compiled from, as Swank's source cache holds it, as a
`source-file' kept in FILES beside the files as they are now; or nil."
  (let ((key (list :compiled path)))
    (multiple-value-bind (source known) (gethash key files)
      (if known
          source
          (setf (gethash key files)
                (let ((text (compiled-text path)))
                  (and text (make-source-file path (sb-ext:string-to-octets
                                                    text :external-format (swank-file-format path))))))))))

(defun form-octet-starts (source)
  "The byte offsets where SOURCE's top-level forms start (see
`source-file-forms'), a vector, empty when one does not read."
  (or (source-file-%octet-starts source)
      (setf (source-file-%octet-starts source)
            (map 'vector (lambda (start) (utf-8-offset source start)) (source-file-forms source)))))

(defun form-octet-ends (source)
  "The byte offsets where SOURCE's top-level forms end (see
`source-file-ends'), a vector, empty when one does not read."
  (or (source-file-%octet-ends source)
      (setf (source-file-%octet-ends source)
            (map 'vector (lambda (end) (utf-8-offset source end)) (source-file-ends source)))))

(defun read-by-sbcl-p (source offset)
  "True when byte OFFSET of SOURCE (a `source-file') is in a form SBCL's
reader reads: inside a top-level form, past the forms its false #+ or #-
skip (flexi-streams keeps a #+:lispworks twin of a method, word for word,
and an edit may leave a #-:lispworks above it); true when the file does
not read.  `form-opening' is agent/code.lisp's, loaded later."
  (let* ((starts (form-octet-starts source))
         (before (position offset starts :test #'>= :from-end t)))
    (or (zerop (length starts))
        (and before
             (< offset (aref (form-octet-ends source) before))
             (>= offset (utf-8-offset source (form-opening (source-file-string source)
                                                           (aref (source-file-forms source) before))))))))

(defun top-level-form-index (source offset)
  "The index (in the order of `form-octet-starts') of the top-level form of
SOURCE (a `source-file') holding byte OFFSET; OFFSET between two forms (on
a form a false #+ or #- skips: SBCL's reader, and so Swank's position,
starts the next form there) is the next form's, and past the last form the
last one's.  Nil when SOURCE does not read."
  (let* ((starts (form-octet-starts source))
         (before (position offset starts :test #'>= :from-end t)))
    (if (and (< (or before -1) (1- (length starts)))
             (or (null before) (>= offset (aref (form-octet-ends source) before))))
        (1+ (or before -1))
        before)))

(defstruct (line-bag (:constructor make-line-bag ()))
  "The lines that hold code of a top-level form (blank and comment lines
left out, since an edit around code may add or take those), each a byte
vector without its blanks at either end: how many there are, and how many
times each is there."
  (size 0) (counts (make-hash-table :test 'equalp)))

(defun code-line-bag (octets start end)
  "The `line-bag' of the lines of OCTETS from byte START to END."
  (let ((bag (make-line-bag)))
    (loop for from = start then (1+ newline)
          for newline = (or (position 10 octets :start from :end end) end)
          for first = (position-if-not #'octet-blank-p octets :start from :end newline)
          when (and first (/= (aref octets first) #.(char-code #\;)))
            do (incf (line-bag-size bag))
               (incf (gethash (subseq octets first (1+ (position-if-not #'octet-blank-p octets :start first
                                                                                         :end newline :from-end t)))
                              (line-bag-counts bag) 0))
          until (>= newline end))
    bag))

(defun form-line-bags (source)
  "The `line-bag' of each of SOURCE's top-level forms, a vector in the
order of `form-octet-starts'."
  (or (source-file-%line-bags source)
      (setf (source-file-%line-bags source)
            (map 'vector (lambda (start end) (code-line-bag (source-file-octets source) start end))
                 (form-octet-starts source) (form-octet-ends source)))))

(defun shared-lines (a b)
  "How many of the lines of `line-bag' A `line-bag' B holds too."
  (loop for line being the hash-keys of (line-bag-counts a) using (hash-value count)
        sum (min count (gethash line (line-bag-counts b) 0))))

(defun likeness (a b)
  "How alike two `line-bag's are, from 0 to 1: twice their shared lines
over all their lines."
  (let ((size (+ (line-bag-size a) (line-bag-size b))))
    (if (zerop size) 0 (/ (* 2 (shared-lines a b)) size))))

(defun definer-head (source index)
  "The operator and the name, lowered, that top-level form INDEX of SOURCE
opens with, when its operator's name begins with def and its name is a
token; else nil."
  (let* ((text (source-file-string source))
         (start (form-opening text (aref (source-file-forms source) index))))
    (flet ((token (from)
             (let* ((begin (position-if-not (lambda (c) (member c '(#\Space #\Tab #\Newline #\Return)))
                                            text :start (min from (length text))))
                    (end (and begin (position-if (lambda (c) (member c '(#\Space #\Tab #\Newline #\Return #\( #\))))
                                                 text :start begin))))
               (and end (> end begin) (values (string-downcase (subseq text begin end)) end)))))
      (when (and (< start (length text)) (char= (char text start) #\())
        (multiple-value-bind (operator after) (token (1+ start))
          (when (and operator (> (length operator) 3) (string= "def" operator :end2 3))
            (let ((name (token after)))
              (and name (list operator name)))))))))

(defun same-form-p (then then-offset source offset)
  "True when the top-level form of SOURCE (a `source-file') holding byte
OFFSET is the form of THEN (the text it was compiled from) holding byte
THEN-OFFSET (see `top-level-form-index'), edited: it holds at least half
of that form's code lines (lines added, taken or changed), no other form
of THEN is more like it, and a definer's form still defines the name it
did (a `defun' renamed defines another function: the reference's caller
is no longer in the file).  Another form that makes a like call is not
it, even one written much like it (a method beside its twin: cl-ppcre's
greedy and non-greedy matchers).  True when either does not read."
  (let ((then-index (top-level-form-index then then-offset))
        (index (top-level-form-index source offset)))
    (or (null then-index) (null index)
        (let* ((was (aref (form-line-bags then) then-index))
               (is (aref (form-line-bags source) index))
               (likeness (likeness was is))
               (was-head (ignore-errors (definer-head then then-index)))
               (is-head (ignore-errors (definer-head source index))))
          (and (>= (* 2 (shared-lines was is)) (line-bag-size was))
               (loop for other across (form-line-bags then)
                     never (> (likeness other is) likeness))
               (not (and was-head is-head (string= (first was-head) (first is-head))
                         (string/= (second was-head) (second is-head)))))))))

(defun same-form-offset (now compiled here)
  "The byte offset in COMPILED (a `source-file') as far into the top-level
form of the same number as byte HERE is in NOW; nil when either does not
read or COMPILED has fewer forms."
  (let* ((starts (form-octet-starts now))
         (index (and (plusp (length starts)) (position here starts :test #'>= :from-end t)))
         (then (form-octet-starts compiled)))
    (when (and index (< index (length then)))
      (+ (aref then index) (- here (aref starts index))))))

(defun compiled-place (path characters snippet name now files)
  "Where the form Swank places at character CHARACTERS (from 0) of PATH,
with SNIPPET, was in the text it was compiled from, as Swank's source cache
holds it: (values LINE SNIPPET), the line where the form started there
(Swank's position can be inside it: see `resolve-offset') and its first
lines; nil when that text is unknown.  Swank counts the position in that
text when the definition recorded its file's date (a function, a method),
and in NOW, the file as it is now, when it did not (a class, a condition):
by its top-level form's number, whose form the compiled text then has at
the same number.  SNIPPET and the one returned are in `*swank-text-format*';
the third value is the form's byte offset in that text (see `compiled-source')."
  (let ((compiled (compiled-source path files)))
    (when (and compiled snippet)
      (let* ((needle (swank-octets snippet))
             (octets (source-file-octets compiled))
             (recorded (character-to-octet-offset compiled characters))
             (here (character-to-octet-offset now characters))
             (start (cond ((whole-at-p needle octets (skip-blanks-and-comments octets recorded))
                           recorded)
                          ((whole-at-p needle (source-file-octets now)
                                       (skip-blanks-and-comments (source-file-octets now) here))
                           (same-form-offset now compiled here)))))
        (when start
          (let ((form (resolve-offset compiled start
                                      (if (eql start recorded)
                                          snippet
                                          (swank-snippet octets (skip-blanks-and-comments octets start)))
                                      name)))
            (values (place-at octets form) (swank-snippet octets form) form)))))))

(defvar *compiled-forms* (make-hash-table :test 'equal)
  "What compile-form compiled, by (FILE . POSITION), POSITION the 1-based
character of the file where the form started: (LINE . TEXT), its first
line and its text.  A definition it made is placed at (:offset POSITION
START) of (:buffer-and-file B FILE), START in TEXT; Swank's source cache
holds the file as some earlier load read it, not as it was then.")

(defparameter *compiled-form-limit* 1000
  "Forms kept in `*compiled-forms*', at most: past it, the table starts again.")

(defun note-compiled-form (file position line text)
  "Called by compile-form before it compiles TEXT, the form at character
POSITION (1-based) and LINE of FILE: see `*compiled-forms*'."
  (sb-ext:with-locked-hash-table (*compiled-forms*)
    (when (>= (hash-table-count *compiled-forms*) *compiled-form-limit*)
      (clrhash *compiled-forms*))
    (setf (gethash (cons file position) *compiled-forms*) (cons line text))))

(defun compiled-buffer-line (file position start snippet name)
  "The line where the form of a definition at (:offset POSITION START) of
FILE started when compile-form compiled it (see `*compiled-forms*'), or
nil when compile-form did not compile it (C-c C-c in Emacs, say)."
  (destructuring-bind (&optional line . text)
      (sb-ext:with-locked-hash-table (*compiled-forms*)
        (gethash (cons file position) *compiled-forms*))
    (when line
      (let ((source (make-source-file file (sb-ext:string-to-octets text :external-format :utf-8))))
        (+ line -1 (values (place-at (source-file-octets source)
                                     (resolve-offset source (character-to-octet-offset source start)
                                                     snippet name))))))))

(defun location-name (name)
  "What to look for (a `sought') when a definition of NAME moved: NAME is
a symbol, (SETF symbol), or a dspec, (DEFUN NAME), (DEFMETHOD NAME ...),
whose operator says how it is written (see `*dspec-operators*'); nil when
there is nothing to look for."
  (typecase name
    (null nil)
    (symbol (make-sought (symbol-name name) nil nil))
    (string (make-sought name nil nil))
    (cons (cond ((and (eq (first name) 'setf) (consp (rest name)) (symbolp (second name)))
                 (make-sought (symbol-name (second name)) nil t))
                ((and (symbolp (first name)) (consp (rest name)))
                 (let ((inner (location-name (second name))))
                   (and inner (make-sought (sought-name inner)
                                           (rest (assoc (first name) *dspec-operators*))
                                           (sought-setf inner)
                                           (and (eq (first name) 'defmethod)
                                                (dspec-specializer-words (second name) (cddr name)))))))
                (t (location-name (first name)))))
    (t nil)))

(defun dspec-specializer-words (name rest)
  "The qualifiers and specializers in REST of a method's dspec (DEFMETHOD
NAME . REST) as `written-specializers' gives them from its text: a
primary method is no place of its :after one."
  (multiple-value-bind (qualifiers specializers) (dspec-method-signature name rest)
    (cons (mapcar (lambda (qualifier)
                    (cond ((keywordp qualifier) (format nil ":~(~A~)" (symbol-name qualifier)))
                          ((symbolp qualifier) (string-downcase (symbol-name qualifier)))
                          (t (string-downcase (princ-to-string qualifier)))))
                  qualifiers)
          (mapcar (lambda (specializer)
                    (if (consp specializer)
                        (let ((object (second specializer)))
                          (eql-word (typecase object
                                      (keyword (format nil ":~(~A~)" (symbol-name object)))
                                      (symbol (string-downcase (symbol-name object)))
                                      ((or number string) (string-downcase (prin1-to-string object))))))
                        (string-downcase (symbol-name specializer))))
                  specializers))))

(defun buffer-place-message (buffer snippet)
  "Why a place in an Emacs BUFFER has no file, with the first line of its
SNIPPET: a definition compiled from a buffer without a file, or a frame of
code compiled from any buffer (Swank places those in the buffer only)."
  (format nil "compiled from the Emacs buffer ~A; Swank gives no file for it~@[; it begins: ~A~]"
          buffer (and snippet (subseq snippet 0 (or (position #\Newline snippet)
                                                     (min (length snippet) 200))))))

(defun resolved-location (location files &key name characters reference)
  "Where Swank's LOCATION is in its file as it is now (see
`resolve-offset'; NAME, a definition's name, helps find it after edits):
(values SOURCE OFFSET STATUS COMPILED-LINE GONE-SNIPPET), SOURCE a
`source-file' and OFFSET in bytes, GONE-SNIPPET for a place not found
\(`gone-snippet'); or (values nil WHY) when it has no file.  Understands
(:file F) with (:position P), whose P counts characters when CHARACTERS (a
definition's) and bytes otherwise (a compiler note's), and
(:buffer-and-file B F) with (:offset START OFFSET) (C-c C-c in a buffer
visiting F); (:buffer B) has no file.  FILES, an equal hash table, keeps
each file read once per reply.
With REFERENCE, LOCATION is a reference's, in a referrer's top-level form:
moved, it is looked for only in a form now that is that form edited (see
`same-form-p'), since a like call in another form is another referrer's;
and between two forms, where Swank places it when it cannot read the
form (SBCL's reader started it there, before a form a false #+ or #-
skips), it is at the next form's opening, then and now."
  (if (not (and (consp location) (eq (first location) :location)))
      (values nil (if (and (consp location) (stringp (second location)))
                      (second location)
                      "no source location"))
      (destructuring-bind (buffer position &optional hints) (rest location)
        (let ((snippet (second (member :snippet hints)))
              (file nil) (offset nil))
          (case (first buffer)
            (:file (setf file (second buffer)
                         offset (and (eq (first position) :position) (integerp (second position))
                                     (1- (second position)))))
            (:buffer-and-file (setf file (third buffer)
                                    offset (and (eq (first position) :offset)
                                                (+ (1- (second position)) (third position)))
                                    characters t))
            (:buffer (return-from resolved-location
                       (values nil (buffer-place-message (second buffer) snippet)))))
          (if (not (and file offset (probe-file file)))
              (values nil "no source file for this definition")
              (let* ((*swank-text-format* (if (and characters (eq (first buffer) :file))
                                              (swank-file-format file)
                                              :utf-8))
                     (source (file-source (namestring (truename file)) files))
                     (recorded (if characters (character-to-octet-offset source offset) offset))
                     (name (location-name name)))
                (when (and characters (eq (first buffer) :file)
                           (null (compiled-source file files)) (edited-since-its-fasl-p source files))
                  (return-from resolved-location
                    (named-location source recorded name
                                    (and reference (second (member :form-number hints))))))
                (multiple-value-bind (compiled compiled-snippet compiled-offset)
                    (cond ((not characters) nil)
                          ((eq (first buffer) :buffer-and-file)
                           (compiled-buffer-line file (second position) (third position) snippet name))
                          (t (compiled-place file offset snippet name source files)))
                  (let ((then (and reference compiled-offset (compiled-source file files))))
                    (when then
                      ;; `top-level-form-start' is agent/code.lisp's, loaded later.
                      (setf compiled (place-at (source-file-octets then)
                                               (max compiled-offset
                                                    (top-level-form-start then compiled-offset)))))
                    (multiple-value-bind (found status)
                        (resolve-offset source recorded (or compiled-snippet snippet) name
                                        (and then
                                             (lambda (candidate)
                                               (same-form-p then compiled-offset source candidate))))
                      (when (and reference (string/= status "not-found"))
                        (setf found (max found (top-level-form-start source found))))
                      (let ((line (place-at (source-file-octets source) found)))
                        (cond ((string= status "not-found"))
                              ;; Where it was compiled, whatever changed around it
                              ((eql compiled line) (setf status "unchanged"))
                              (compiled (setf status "found-after-edit")))
                        (values source found status
                                (unless (string= status "unchanged")
                                  (or compiled (place-at (source-file-octets source) recorded)))
                                (and (string= status "not-found")
                                     (gone-snippet (compiled-source file files)
                                                   (if (and then compiled-offset)
                                                       (top-level-form-start then compiled-offset)
                                                       compiled-offset))))))))))))))

(defun gone-snippet (compiled offset)
  "What a place that is not found in the file shows of its form: its first
lines in COMPILED, the text it was compiled from, at byte OFFSET; \"\"
when that is unknown (the text now holds another form there)."
  (if (and compiled offset)
      (nth-value 2 (place-at (source-file-octets compiled) offset))
      ""))

(defun edited-since-its-fasl-p (source files)
  "True when SOURCE's file was written after (or in the second of) the
newest fasl compiled from it (where ASDF's output translations put it, or beside it); kept in
FILES.  Code loaded from such a fasl without cl-mcp (an evaluation's
asdf:load-system, a programmer's image) leaves Swank no text of the file
as compiled: its positions and snippets are then the file's as it is now."
  (let ((key (list :edited (source-file-path source))))
    (multiple-value-bind (edited known) (gethash key files)
      (if known
          edited
          (setf (gethash key files)
                (let* ((path (source-file-path source))
                       (written (ignore-errors (file-write-date path)))
                       (compiled (loop for fasl in (list (ignore-errors (uiop:compile-file-pathname* path))
                                                         (ignore-errors (compile-file-pathname path)))
                                       for date = (and fasl (ignore-errors (file-write-date fasl)))
                                       when date collect date)))
                  ;; Dates are whole seconds: an edit in the second the fasl was
                  ;; written may follow it, and a file found so is only asked by name.
                  (and written compiled (>= written (reduce #'max compiled)))))))))

(defun named-location (source recorded name &optional form-number)
  "`resolved-location' of a definition whose file was edited since it was
compiled, where its text as compiled is unknown (`edited-since-its-fasl-p'):
found by NAME, a `sought' or nil, nearest byte RECORDED, \"found-after-edit\"
with no compiled line; else \"not-found\" at RECORDED.  Never \"unchanged\":
Swank's snippet, read from the edited file, matches it wherever it points.
A reference's FORM-NUMBER, the compiler's number of the referring subform,
puts it at that subform of the definition's top-level form as read now."
  (let* ((lowered (source-file-lowered source))
         (within (lambda (candidate) (read-by-sbcl-p source candidate)))
         (at (skip-blanks-and-comments (source-file-octets source) recorded))
         (found (and name
                     (or (definition-offset name lowered recorded within)
                         ;; Written with a definer of its own (a macro of the library's)
                         (definition-offset (make-sought (sought-name name) nil (sought-setf name)
                                                         (sought-specializers name))
                                            lowered recorded within)
                         (and (sought-specializers name)
                              (method-option-offset name lowered recorded within))
                         (constructor-option-offset source name recorded within)
                         ;; A method's line names its generic function, and so its twins
                         (and (null (sought-specializers name)) (< at (length lowered))
                              (opening-line-names-p lowered at name) at)))))
    (if found
        (values source
                (or (and form-number
                         ;; `top-level-form-start' is agent/code.lisp's, loaded later.
                         (numbered-subform-offset source (top-level-form-start source found) form-number))
                    found)
                "found-after-edit" nil)
        (values source recorded "not-found" nil ""))))

(defun numbered-subform-offset (source form-start number)
  "The byte offset in SOURCE of the subform the compiler numbers NUMBER of
the top-level form at byte FORM-START, read as the file is now; nil when it
does not read so (`numbered-form-start', agent/code.lisp's)."
  (let* ((text (source-file-string source))
         (start (count-if-not (lambda (octet) (= (logand octet #xC0) #x80)) (source-file-octets source)
                              :end form-start))
         (forms (ignore-errors (top-level-form-bounds text start)))
         (at (and forms (multiple-value-bind (package missing readtable) (form-package text forms)
                          (declare (ignore missing))
                          (and package (numbered-form-start text start number package readtable))))))
    (and at (> at start) (utf-8-offset source at))))

(defun place-plist (source offset status compiled-line &optional gone-snippet)
  "(:file F :line L :column C :snippet S :status STATUS [:compiled-line N])
of byte OFFSET in SOURCE; the snippet GONE-SNIPPET when it is given (a
place not found: the form as compiled, none when that is \"\")."
  (multiple-value-bind (line column snippet) (place-at (source-file-octets source) offset)
    (append (list :file (source-file-path source) :line line :column column)
            (let ((shown (or gone-snippet snippet)))
              (and (plusp (length shown)) (list :snippet shown)))
            (list :status status)
            (and compiled-line (list :compiled-line compiled-line)))))

(defun location-plist (location files &key name characters)
  "Swank's LOCATION as `place-plist' gives it, in its file as it is now
(see `resolved-location'), or (:error WHY)."
  (multiple-value-bind (source offset status compiled-line gone-snippet)
      (resolved-location location files :name name :characters characters)
    (if source
        (place-plist source offset status compiled-line gone-snippet)
        (list :error offset))))


;;;; Entry points: find-definition, describe-symbol
;;;
;;; Both go through Swank: `swank/backend:find-definitions' (what M-. uses,
;;; SB-INTROSPECT underneath) gives every definition of a name with its
;;; dspec and place; `swank/backend:describe-symbol-for-emacs' (through
;;; `symbol-kinds' of agent/browse.lisp) says what a name is, and
;;; SB-MOP tells a class's slots and a generic function's methods.  A
;;; definition evaluated through evaluate-lisp has no file, so the agent
;;; keeps the source text of each one (see `note-repl-definitions', called
;;; by `%read-and-evaluate') and find-definition returns it, labelled with
;;; the evaluation's number.  Two helpers of agent/browse.lisp are
;;; called from here: `symbol-kinds' and `call-guarded'.

(defparameter *definition-type-words*
  '((defvar . "variable") (defparameter . "variable") (defconstant . "constant")
    (deftype . "type") (define-symbol-macro . "symbol-macro") (defmacro . "macro")
    (define-compiler-macro . "compiler-macro") (defun . "function")
    (defgeneric . "generic-function") (defmethod . "method")
    (define-setf-expander . "setf-expander") (defsetf . "setf-expander")
    (defstruct . "structure") (define-condition . "condition") (defclass . "class")
    (define-method-combination . "method-combination") (defpackage . "package"))
  "Defining operators, as Swank's dspecs name them and as a form evaluated
through evaluate-lisp starts, and the type word each definition is given.")

(defparameter *repl-definition-limit* 1000
  "Definitions made through evaluate-lisp whose source is kept, at most; the
oldest is dropped first.")

(defparameter *repl-source-limit* 20000
  "Characters of one such definition's source kept, at most.")

(defparameter *definition-limit* 200
  "Definitions reported by `find-definition-of', at most (PRINT-OBJECT has
hundreds of methods).")

(defparameter *method-limit* 100
  "Methods of a generic function listed by `describe-symbol-of', at most.")

(defstruct (repl-definition (:constructor make-repl-definition
                                (type name evaluation source sequence witness)))
  "One definition made through evaluate-lisp: its type word, its name (a
symbol, a (SETF symbol) list, a package's name as a string, or for a
method (NAME QUALIFIERS SPECIALIZERS)), the evaluation's number, the
source text of the top-level form that made it, and a weak pointer to
what it made (see `definition-witness'), or nil."
  type name evaluation source sequence witness)

(defvar *repl-definitions* (make-hash-table :test 'equal)
  "The definitions made through evaluate-lisp, by (TYPE . NAME): a newer
one of the same type and name replaces the older.  `soft-reset' clears it.")

(defvar *repl-definitions-lock* (sb-thread:make-mutex :name "cl-mcp REPL definitions")
  "Guards `*repl-definitions*' and `*repl-definition-sequence*'; taken with
`with-agent-lock'.")

(defvar *repl-definition-sequence* 0
  "The number of the last definition recorded: newer ones sort first.")

(defun method-form-signature (arguments)
  "The qualifiers and the specializers of a DEFMETHOD form whose name is
followed by ARGUMENTS, as two lists (a specializer is a class name, or an
(EQL FORM) list, T for an unspecialized parameter)."
  (let* ((qualifiers (loop for item in arguments until (listp item) collect item))
         (lambda-list (find-if #'listp arguments)))
    (values qualifiers
            (loop for parameter in lambda-list
                  until (member parameter lambda-list-keywords)
                  collect (if (consp parameter) (second parameter) t)))))

(defun definition-forms (form)
  "The defining forms FORM is, or holds at top level inside PROGN and
EVAL-WHEN, each as (TYPE-WORD . FORM)."
  (let ((operator (car form)))
    (cond ((not (symbolp operator)) '())
          ((eq operator 'progn)
           (loop for inner in (rest form) when (consp inner) append (definition-forms inner)))
          ((eq operator 'eval-when)
           (loop for inner in (cddr form) when (consp inner) append (definition-forms inner)))
          (t (let ((entry (assoc operator *definition-type-words* :test #'eq)))
               (and entry (consp (rest form)) (list (cons (cdr entry) form))))))))

(defun definition-form-name (form)
  "The name a defining FORM defines, as `repl-definition' keeps it."
  (let ((name (second form)))
    (case (first form)
      (defstruct (if (consp name) (first name) name))
      (defpackage (string name))
      (defmethod (multiple-value-bind (qualifiers specializers) (method-form-signature (cddr form))
                   (list name qualifiers specializers)))
      (t name))))

(defun form-source (code start end)
  "The text of CODE from START to END, without the blank lines and line
comments in front of the form, at most `*repl-source-limit*' characters."
  (let ((begin start))
    (loop
      (let ((first (position-if-not (lambda (c) (member c '(#\Space #\Tab #\Newline #\Return #\Page)))
                                    code :start begin :end end)))
        (cond ((null first) (return))
              ((char= (char code first) #\;)
               (setf begin (or (position #\Newline code :start first :end end) end)))
              (t (setf begin first) (return)))))
    (multiple-value-bind (source dropped)
        (cap-string (string-right-trim '(#\Space #\Tab #\Newline #\Return #\Page) (subseq code begin end))
                    *repl-source-limit*)
      (if (plusp dropped)
          (format nil "~A~%… [~D more characters not kept]" source dropped)
          source))))

(defun specializer-matches-p (specializer written)
  "True when a method's SPECIALIZER is the class WRITTEN (a symbol) names;
an (EQL FORM) as written is never compared."
  (and (symbolp written) (typep specializer 'class)
       (eq (class-name specializer) written)))

(defun definition-witness (type name)
  "What the definition of TYPE (a type word) and NAME (as `repl-definition'
keeps it) made, as the image holds it now: the function of a function or
a macro, the compiler macro's function, the method object of a method.
Any later definition of the name, from a file or a form, makes a new
object, so the definition is live while this one is still the image's.
Nil for other types (see `repl-definition-replaced-p')."
  (handler-case
      (cond ((string= type "function") (and (fboundp name) (fdefinition name)))
            ((string= type "macro") (macro-function name))
            ((string= type "compiler-macro") (compiler-macro-function name))
            ((string= type "method")
             (destructuring-bind (function-name qualifiers specializers) name
               (let ((function (and (fboundp function-name) (fdefinition function-name))))
                 (and (typep function 'generic-function)
                      (find-if (lambda (method)
                                 (and (equal (method-qualifiers method) qualifiers)
                                      (= (length (sb-mop:method-specializers method)) (length specializers))
                                      (every #'specializer-matches-p
                                             (sb-mop:method-specializers method) specializers)))
                               (sb-mop:generic-function-methods function)))))))
    (serious-condition () nil)))

(defun record-repl-definitions (definitions evaluation-id source)
  "Keep SOURCE as the source of each of DEFINITIONS, (TYPE-WORD . FORM)
lists made by evaluation EVALUATION-ID, with what each made (see
`definition-witness'), dropping the oldest kept ones past
`*repl-definition-limit*'."
  (let ((made (loop for (type . form) in definitions
                    for name = (definition-form-name form)
                    for witness = (definition-witness type name)
                    collect (list type name (and witness (sb-ext:make-weak-pointer witness))))))
    (with-agent-lock (*repl-definitions-lock*)
      (loop for (type name witness) in made
            do (setf (gethash (cons type name) *repl-definitions*)
                     (make-repl-definition type name evaluation-id source
                                           (incf *repl-definition-sequence*) witness)))
      (loop while (> (hash-table-count *repl-definitions*) *repl-definition-limit*)
            do (let ((oldest nil) (oldest-key nil))
                 (maphash (lambda (key definition)
                            (when (or (null oldest)
                                      (< (repl-definition-sequence definition)
                                         (repl-definition-sequence oldest)))
                              (setf oldest definition oldest-key key)))
                          *repl-definitions*)
                 (remhash oldest-key *repl-definitions*))))))

(defun note-repl-definitions (form evaluation code start end)
  "Called by `%read-and-evaluate' after it evaluated FORM, a cons read from
CODE between START and END: when FORM defines something, keep its source
for find-definition.  Costs an ASSOC for a form that defines nothing; a
failure here is logged and never reaches the evaluation."
  (when (or (assoc (car form) *definition-type-words* :test #'eq)
            (member (car form) '(progn eval-when) :test #'eq))
    (handler-case
        (let ((definitions (definition-forms form)))
          (when definitions
            (record-repl-definitions definitions (evaluation-id evaluation)
                                     (form-source code start end))))
      (serious-condition (c) (log-note "could not record a definition: ~A" (condition-message c))))))

(defun forget-repl-definitions ()
  "Forget the sources of every definition made through evaluate-lisp (a
reset of the session)."
  (with-agent-lock (*repl-definitions-lock*)
    (clrhash *repl-definitions*)))

(defparameter *name-limit* 1000
  "Characters of a printed name kept, at most: an (EQL OBJECT) specializer
can hold any object.")

(defun printed-name (object)
  "OBJECT (a name, a specializer, a qualifier) printed on one line, read
back in *PACKAGE*; at most `*name-limit*' characters, then \"…\"."
  (let ((*print-pretty* nil) (*print-length* 10) (*print-level* 3))
    (safe-print object (lambda (object) (printed-prefix object #'prin1 *name-limit*)))))

(defun names-symbol-p (name symbol)
  "True when a definition's NAME (as `repl-definition' keeps it) is one of
SYMBOL: the symbol itself, (SETF SYMBOL), a method of it, or a package of
SYMBOL's name."
  (typecase name
    (symbol (eq name symbol))
    (string (string= name (symbol-name symbol)))
    (cons (if (eq (first name) 'setf)
              (eq (second name) symbol)
              (names-symbol-p (first name) symbol)))))

(defun repl-definition-plist (definition)
  "DEFINITION as (:type :name [:qualifiers :specializers] :evaluation
:source), with :witness-replaced t when the image no longer holds what it
made (see `definition-witness')."
  (let ((type (repl-definition-type definition))
        (name (repl-definition-name definition))
        (witness (repl-definition-witness definition)))
    (list* :type type
           :name (if (string= type "method") (printed-name (first name)) (printed-name name))
           (append (when (string= type "method")
                     (list :qualifiers (mapcar #'printed-name (second name))
                           :specializers (mapcar #'printed-name (third name))))
                   (list :evaluation (repl-definition-evaluation definition)
                         :source (repl-definition-source definition))
                   (when (and witness
                              (not (eq (sb-ext:weak-pointer-value witness)
                                       (definition-witness type name))))
                     (list :witness-replaced t))))))

(defun repl-definition-plists (symbol)
  "The definitions of SYMBOL made through evaluate-lisp, newest first, as
`repl-definition-plist's."
  (let ((found '()))
    (with-agent-lock (*repl-definitions-lock*)
      (maphash (lambda (key definition)
                 (declare (ignore key))
                 (when (names-symbol-p (repl-definition-name definition) symbol)
                   (push definition found)))
               *repl-definitions*))
    (mapcar #'repl-definition-plist
            (sort found #'> :key #'repl-definition-sequence))))

(defun dspec-type-word (operator)
  "The type word of a dspec's OPERATOR (DEFUN, DEFMETHOD...): see
`*definition-type-words*'; other operators by their own name, less DEF."
  (or (cdr (assoc operator *definition-type-words* :test #'eq))
      (let ((name (string-downcase (string operator))))
        (string-left-trim "-" (if (and (> (length name) 3) (string= name "def" :end1 3))
                                  (subseq name 3)
                                  name)))))

(defun dspec-method-signature (name rest)
  "The qualifiers and specializers in REST of a method's dspec (DEFMETHOD
NAME . REST): the specializers are as many as the generic function NAME
has required parameters.  A cross-reference's dspec, a method function's
name, holds them in one list, last: (DEFMETHOD NAME :AFTER (CLASS))."
  (let ((last (car (last rest))))
    (when (and (consp last) (not (eq (first last) 'eql)))
      (return-from dspec-method-signature (values (butlast rest) last))))
  (let* ((function (and (fboundp name) (fdefinition name)))
         (required (if (typep function 'generic-function)
                       (loop for parameter in (sb-mop:generic-function-lambda-list function)
                             until (member parameter lambda-list-keywords)
                             count t)
                       (count-if-not #'keywordp rest)))
         (split (max 0 (- (length rest) required))))
    (values (subseq rest 0 split) (subseq rest split))))

(defun definition-source-of (dspec)
  "The SB-INTROSPECT definition source Swank made DSPEC, (OPERATOR NAME
...), from (see Swank's find-definitions), or nil."
  (let ((name (second dspec)))
    (loop for type in swank/sbcl::*definition-types* by #'cddr
          do (dolist (source (ignore-errors (sb-introspect:find-definition-sources-by-name name type)))
               (when (equal (ignore-errors (swank/sbcl::make-dspec type name source)) dspec)
                 (return-from definition-source-of source))))))

(defun compiled-text-location (dspec files)
  "A location of DSPEC's top-level form in the text its file was compiled
from (Swank's source cache), or nil: for a definition Swank could not
place, because it counts the form by its number in the file as it is now
\(a class's, a variable's), which has fewer forms since it was cut short
or forms were deleted.  The snippet is the compiled text's, so the
definition is then looked for in the file as it is now as any other."
  (let* ((source (definition-source-of dspec))
         (pathname (and source (sb-introspect:definition-source-pathname source)))
         (path (and pathname (probe-file pathname) (namestring (truename pathname))))
         (form (first (and source (sb-introspect:definition-source-form-path source))))
         (compiled (and path form (compiled-source path files)))
         (starts (and compiled (source-file-forms compiled))))
    (when (and starts (< form (length starts)))
      (let* ((*swank-text-format* (swank-file-format path))
             (octet (utf-8-offset compiled (aref starts form))))
        `(:location (:file ,path) (:position ,(1+ (if (swank-counts-bytes-p) octet (aref starts form))))
                    (:snippet ,(swank-snippet (source-file-octets compiled) octet)))))))

(defun swank-definition-plist (dspec location files)
  "One of Swank's definitions, DSPEC at LOCATION, as (:type :name
[:qualifiers :specializers] . PLACE), PLACE as `location-plist' gives it;
one Swank could not place is placed from its compiled text (see
`compiled-text-location')."
  (destructuring-bind (operator name &rest rest) dspec
    (let ((type (dspec-type-word operator))
          (place (location-plist (or (and (eq (first location) :error)
                                          (ignore-errors (compiled-text-location dspec files)))
                                     location)
                                 files :name dspec :characters t)))
      (when (getf place :error)
        (setf place (list :error (if (search "DEFINITION-SOURCE" (getf place :error))
                                     "no source file (defined without one, e.g. by an evaluation)"
                                     (getf place :error)))))
      (list* :type type
             :name (printed-name name)
             (append (when (string= type "method")
                       (multiple-value-bind (qualifiers specializers) (dspec-method-signature name rest)
                         (list :qualifiers (mapcar #'printed-name qualifiers)
                               :specializers (mapcar #'printed-name specializers))))
                     place)))))

(defun swank-definitions (symbol)
  "Swank's definitions of SYMBOL and of (SETF SYMBOL), as (DSPEC LOCATION)
lists; its output is dropped, and a failure is an (:error PLIST) list."
  (call-guarded (lambda ()
                  (append (swank/backend:find-definitions symbol)
                          (when (fboundp `(setf ,symbol))
                            (swank/backend:find-definitions `(setf ,symbol)))))
                30))

(defun same-definition-p (a b)
  "True when definition plists A and B are of the same type and name (and
signature, for methods)."
  (loop for key in '(:type :name :qualifiers :specializers)
        always (equal (getf a key) (getf b key))))

(defun repl-definition-replaced-p (plist swank)
  "True when the definition made through evaluate-lisp that PLIST (a
`repl-definition-plist') describes is no longer the image's: what it made
was replaced (a function, macro, compiler macro or method: see
`definition-witness'), or Swank finds the same definition (type, name,
signature) in a file among SWANK, its definition plists.  Evaluate-lisp
records no file, so a definition Swank places in one came later, from a
file or a form: for a variable, class, type or package that is its
recorded source location."
  (or (getf plist :witness-replaced)
      (find-if (lambda (other) (and (getf other :file) (same-definition-p plist other)))
               swank)))

(defun symbol-definitions-of (symbol)
  "Every definition of SYMBOL, the live ones first: those made through
evaluate-lisp that are still the image's (newest first), then Swank's,
then those made through evaluate-lisp and replaced since (marked
:replaced t; see `repl-definition-replaced-p').  One of Swank's without a
source file is left out when evaluate-lisp's source of it is kept.
(values PLISTS DROPPED ERROR-PLIST): at most `*definition-limit*', the
number past it, and the failure of Swank when it failed."
  (let* ((repl (repl-definition-plists symbol))
         (asked (swank-definitions symbol))
         (files (make-hash-table :test 'equal))
         (swank (when (eq (first asked) :ok)
                  (loop for (dspec location) in (second asked)
                        for plist = (swank-definition-plist dspec location files)
                        unless (and (getf plist :error)
                                    (find plist repl :test #'same-definition-p))
                          collect plist)))
         (live '()) (replaced '()))
    (dolist (plist repl)
      (if (repl-definition-replaced-p plist swank)
          (push (append (list :replaced t) (remove-witness-mark plist)) replaced)
          (push (remove-witness-mark plist) live)))
    (let ((all (append (nreverse live) swank (nreverse replaced))))
      (values (subseq all 0 (min (length all) *definition-limit*))
              (max 0 (- (length all) *definition-limit*))
              (and (eq (first asked) :error) (second asked))))))

(defun remove-witness-mark (plist)
  "PLIST without :witness-replaced, which only `symbol-definitions-of' reads."
  (let ((copy (copy-list plist)))
    (remf copy :witness-replaced)
    copy))

(defun find-definition-of (text &key package)
  "Every definition of the symbol TEXT names, read in PACKAGE (CL-USER when
nil): a plist :status :ok, :symbol, :definitions, each (:type T :name N
[:qualifiers Q :specializers S] :file F :line L :column C :snippet S), or
with :evaluation N :source S for a definition made through evaluate-lisp,
or with :error WHY when it has no place; and :dropped, the number past
`*definition-limit*'.  An unknown symbol or package, or a failure of
Swank, is a :status :error plist."
  (with-resolved-symbol text package
    (lambda (symbol)
      (let ((*package* (or (find-named-package package) (find-package "COMMON-LISP-USER"))))
        (multiple-value-bind (definitions dropped failure) (symbol-definitions-of symbol)
          (if failure
              (list :status :error :error failure)
              (list :status :ok
                    :symbol (symbol-designator symbol)
                    :definitions definitions
                    :dropped dropped)))))))

(defparameter *documentation-limit* 100000
  "Characters of one documentation string reported, at most.")

(defun documentation-entries (symbol)
  "SYMBOL's documentation strings, as (KIND TEXT) lists: function,
variable, type, compiler-macro, setf, and package (of SYMBOL's name); each
at most `*documentation-limit*' characters, then a line that says how many
were cut."
  (flet ((doc (object kind) (handler-case (documentation object kind)
                              (serious-condition () nil))))
    (let ((package (find-package (symbol-name symbol))))
      (loop for (kind object doc-type) in `(("function" ,symbol function)
                                            ("variable" ,symbol variable)
                                            ("type" ,symbol type)
                                            ("compiler-macro" ,symbol compiler-macro)
                                            ("setf" ,symbol setf)
                                            ("package" ,package t))
            for text = (and object (doc object doc-type))
            when (stringp text)
              collect (list kind (multiple-value-call #'marked-text
                                   (cap-string text *documentation-limit*)))))))

(defun direct-slot-functions (class name reader)
  "The functions READER (`sb-mop:slot-definition-readers' or -writers) gives
for CLASS's own definition of slot NAME (none for a structure's slots,
whose accessors are not the MOP's)."
  (handler-case
      (let ((direct (find name (sb-mop:class-direct-slots class)
                          :key #'sb-mop:slot-definition-name)))
        (and direct (funcall reader direct)))
    (serious-condition () '())))

(defun inherited-slot-functions (class name reader)
  "`direct-slot-functions' of slot NAME in every class of CLASS's precedence list."
  (loop for super in (sb-mop:class-precedence-list class)
        append (direct-slot-functions super name reader)))

(defun slot-plist (class slot)
  "(:name N :initargs I :readers R :writers W :accessors A [:type T]
[:initform F] [:allocation L]) of CLASS's effective SLOT: its readers and
writers gathered from the direct slots of every class in CLASS's
precedence list, a reader whose (setf reader) is a writer an accessor;
its type, initform and allocation only when they are not the defaults."
  (let* ((name (sb-mop:slot-definition-name slot))
         (readers (inherited-slot-functions class name #'sb-mop:slot-definition-readers))
         (writers (inherited-slot-functions class name #'sb-mop:slot-definition-writers))
         (accessors (remove-if-not (lambda (reader) (member `(setf ,reader) writers :test #'equal)) readers)))
    (append (list :name (printed-name name)
                  :initargs (mapcar #'printed-name (sb-mop:slot-definition-initargs slot))
                  :readers (mapcar #'printed-name (remove-if (lambda (reader) (member reader accessors)) readers))
                  :writers (mapcar #'printed-name
                                   (remove-if (lambda (writer) (and (consp writer) (member (second writer) accessors)))
                                              writers))
                  :accessors (mapcar #'printed-name accessors))
            (let ((type (sb-mop:slot-definition-type slot)))
              (unless (eq type t) (list :type (printed-name type))))
            (when (sb-mop:slot-definition-initfunction slot)
              (list :initform (printed-name (sb-mop:slot-definition-initform slot))))
            (let ((allocation (sb-mop:slot-definition-allocation slot)))
              (unless (eq allocation :instance) (list :allocation (printed-name allocation)))))))

(defun class-slot-plists (class)
  "The slots of CLASS as `slot-plist's."
  (handler-case
      (progn
        (unless (sb-mop:class-finalized-p class) (sb-mop:finalize-inheritance class))
        (mapcar (lambda (slot) (slot-plist class slot)) (sb-mop:class-slots class)))
    (serious-condition () '())))

(defun specializer-name (specializer)
  "A method's SPECIALIZER as its class's name or an (EQL OBJECT) list."
  (typecase specializer
    (sb-mop:eql-specializer `(eql ,(sb-mop:eql-specializer-object specializer)))
    (class (class-name specializer))
    (t specializer)))

(defun method-signature-plist (method)
  "METHOD's (:qualifiers Q :specializers S), printed."
  (list :qualifiers (mapcar #'printed-name (method-qualifiers method))
        :specializers (mapcar (lambda (s) (printed-name (specializer-name s)))
                              (sb-mop:method-specializers method))))

(defun method-plists (function)
  "The first `*method-limit*' methods of generic FUNCTION as
`method-signature-plist's, and how many there are in all."
  (let ((methods (sb-mop:generic-function-methods function)))
    (values (loop for method in methods
                  repeat *method-limit*
                  collect (method-signature-plist method))
            (length methods))))

(defparameter *primary-definition-types*
  '("function" "generic-function" "macro" "class" "structure" "condition" "variable"
    "constant" "type" "symbol-macro" "setf-expander" "method-combination" "package")
  "The type words of definitions of a name itself: not of one of its
methods, its compiler macro or a DECLAIM about it.")

(defun primary-definition (definitions)
  "The first of DEFINITIONS (as `symbol-definitions-of' orders them, the
live ones first) that defines the name itself and is still the image's,
with a source file or made through evaluate-lisp; so find-definition's
first such entry is describe-symbol's location."
  (find-if (lambda (plist)
             (and (member (getf plist :type) *primary-definition-types* :test #'string=)
                  (not (getf plist :replaced))
                  (or (getf plist :file) (getf plist :evaluation))))
           definitions))

(defun describe-symbol-of (text &key package)
  "What the symbol TEXT names, read in PACKAGE (CL-USER when nil): a plist
:status :ok, :symbol, :package (its home), :external, :kinds (as
`symbol-kinds' gives them, and \"package\" when a package has its name),
:arglist, :documentation ((KIND TEXT) ...), :value (a bound variable's,
printed on one line), :class (:superclasses :slots), :methods and
:method-count (of a generic function), :location (see
`primary-definition') and :description (one sentence).  An unknown symbol or
package is a :status :error plist."
  (let ((missing (missing-internals-error :describe-symbol)))
    (when missing
      (return-from describe-symbol-of missing)))
  (with-resolved-symbol text package
    (lambda (symbol)
      (let* ((*package* (or (find-named-package package) (find-package "COMMON-LISP-USER")))
             (kinds (append (symbol-kinds symbol)
                            (and (find-package (symbol-name symbol)) (list "package"))))
             (home (symbol-package symbol))
             (class (find-class symbol nil))
             (function (and (fboundp symbol) (not (special-operator-p symbol))
                            (or (macro-function symbol) (fdefinition symbol))))
             (location (primary-definition (nth-value 0 (symbol-definitions-of symbol))))
             (result (list :status :ok
                           :symbol (symbol-designator symbol)
                           :package (if home (package-name home) "")
                           :external (external-symbol-p symbol)
                           :kinds kinds
                           :documentation (documentation-entries symbol)
                           :description
                           (format nil "~A ~:[names nothing~;names ~:*~{~A~^, ~}~]."
                                   (symbol-designator symbol)
                                   (mapcar (lambda (kind) (format nil "a~:[~;n~] ~A"
                                                                  (find (char kind 0) "aeiou") kind))
                                           kinds)))))
        (flet ((add (key value) (setf result (append result (list key value)))))
          (when function (add :arglist (lambda-list-text function)))
          (when (and (boundp symbol) (not (keywordp symbol)))
            (add :value (with-result-printing ()
                          (let ((*print-pretty* nil))
                            (printed-line (symbol-value symbol) 200)))))
          (when class
            (add :class (list :superclasses (mapcar (lambda (super) (printed-name (class-name super)))
                                                    (handler-case (sb-mop:class-direct-superclasses class)
                                                      (serious-condition () '())))
                              :slots (class-slot-plists class))))
          (when (typep function 'generic-function)
            (multiple-value-bind (methods count) (method-plists function)
              (add :methods methods)
              (add :method-count count)))
          (when location
            (add :location location)))
        result))))

