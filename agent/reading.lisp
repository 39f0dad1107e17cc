;;;; agent/reading.lisp --- reading a file's text that changes nothing
;;;;
;;;; read-lisp-file is read-only, and the image may be the programmer's:
;;;; reading must neither run code nor leave a symbol behind.  The real
;;;; reader is still the one that reads (the file's readtable, its reader
;;;; macros, its packages' nicknames), with two changes:
;;;;  - `#.' reads its form but evaluates nothing (the standard `#.' only:
;;;;    a readtable that defines `#.' itself keeps its own), and the calls
;;;;    that read count each one they passed (`*unevaluated-read-evals*');
;;;;  - every symbol the reader interned is uninterned again at once.  The
;;;;    names a text could intern are known before it is read (each token
;;;;    in the package it names, and in KEYWORD, where #+ and #- read
;;;;    features): those missing before the read and present after it,
;;;;    with nothing defined on them, were the reader's.  The window is one
;;;;    form's read, so a programmer's thread that interns the same new
;;;;    name in that instant is the one case this cannot tell apart.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define.

(in-package #:cl-mcp-agent)

(defvar *unevaluated-read-evals*)
(setf (documentation '*unevaluated-read-evals* 'variable)
      "How many `#.' forms the reads of this call passed without evaluating;
unbound outside the calls that count them.")

(defvar *quiet-readtables* nil
  "An alist (READTABLE . COPY) of this call's readtables whose `#.'
evaluates nothing: a copy is made once per readtable and call, not per form.")

(defparameter *constant-operators*
  '(+ - * / 1+ 1- floor ceiling truncate round mod rem min max abs logior logand logxor
    lognot char-code code-char length list cons vector)
  "Standard functions a `#.' form read for numbering may call: they change
nothing and end quickly on the little numbers such forms hold.")

(defun constant-computation-p (form &optional (depth 0))
  "True when FORM, a `#.' form, only reads bound variables and calls
`*constant-operators*' on such forms: evaluating it runs none of the
image's code (`#.(truncate char-code-limit 3)')."
  (cond ((> depth 8) nil)
        ((symbolp form) (and form (boundp form)))
        ((atom form) t)
        ((eq (first form) 'quote) (and (consp (rest form)) (null (cddr form))))
        (t (and (member (first form) *constant-operators*)
                (listp (rest form)) (null (cdr (last form)))
                (every (lambda (argument) (constant-computation-p argument (1+ depth))) (rest form))))))

(defun quiet-sharp-dot (stream subchar argument)
  "`#.' that reads the form after it and evaluates nothing.  Read for
numbering, a `#.' of bound variables and arithmetic reads as its value,
which the compiler numbered too (`#.*standard-optimize-settings*', an
idiom of many libraries; see `constant-computation-p'), and any other as
a fresh mark: the numbers after it are not known."
  (declare (ignore subchar argument))
  (let ((form (read stream t nil t)))
    (cond (*read-suppress* nil)
          ((eq *unevaluated-read-eval-marks* :none)
           (when (boundp '*unevaluated-read-evals*)
             (incf *unevaluated-read-evals*))
           nil)
          ((constant-computation-p form) (eval form))
          (t (let ((mark (list 'unevaluated)))
               (push mark *unevaluated-read-eval-marks*)
               mark)))))

(defun quiet-readtable (readtable)
  "READTABLE, or when its `#.' is the standard one, a copy of it whose `#.'
evaluates nothing (`quiet-sharp-dot')."
  (if (not (eq (get-dispatch-macro-character #\# #\. readtable)
               (get-dispatch-macro-character #\# #\. (load-time-value (copy-readtable nil) t))))
      readtable
      (or (cdr (assoc readtable *quiet-readtables*))
          (let ((copy (copy-readtable readtable)))
            (set-dispatch-macro-character #\# #\. #'quiet-sharp-dot copy)
            (push (cons readtable copy) *quiet-readtables*)
            copy))))

(defmacro with-quiet-readtables (() &body body)
  "BODY with one copy per readtable for the quiet reads it makes."
  `(let ((*quiet-readtables* '()))
     ,@body))

;;;; The names a text could intern

(defun token-name (token readtable)
  "TOKEN's characters as the reader makes a symbol's name of them: `|...|'
and `\\' escape, the others follow READTABLE's case."
  (let ((case (readtable-case readtable)))
    (with-output-to-string (name)
      (loop with i = 0 and in-bars = nil
            while (< i (length token))
            do (let ((char (char token i)))
                 (cond ((char= char #\|) (setf in-bars (not in-bars)))
                       ((and (char= char #\\) (< (1+ i) (length token)))
                        (incf i) (write-char (char token i) name))
                       (in-bars (write-char char name))
                       (t (write-char (ecase case
                                        (:upcase (char-upcase char))
                                        (:downcase (char-downcase char))
                                        ((:preserve :invert) char))
                                      name))))
               (incf i)))))

(defun inverted-name (name token)
  "NAME as :invert readtable case makes it: a token whose letters are all
of one case has them inverted (escapes aside, which `token-name' kept)."
  (let ((letters (remove-if-not #'alpha-char-p (remove #\| token))))
    (cond ((every #'upper-case-p letters) (string-downcase name))
          ((every #'lower-case-p letters) (string-upcase name))
          (t name))))

(defun token-symbols (token readtable)
  "The (PACKAGE-NAME-OR-NIL . NAME) a TOKEN could be read as: a prefixed
token its package's, an unprefixed one *PACKAGE*'s (nil) and KEYWORD's
(a feature of #+ or #-), a keyword KEYWORD's."
  (let* ((colon (loop with in-bars = nil
                      for i from 0 below (length token)
                      for char = (char token i)
                      do (cond ((char= char #\|) (setf in-bars (not in-bars)))
                               ((char= char #\\) (incf i)))
                      when (and (not in-bars) (char= char #\:)) return i))
         (name-start (and colon (if (and (< (1+ colon) (length token))
                                         (char= (char token (1+ colon)) #\:))
                                    (+ colon 2)
                                    (1+ colon)))))
    (flet ((name (part)
             (let ((name (token-name part readtable)))
               (if (eq (readtable-case readtable) :invert) (inverted-name name part) name))))
      (cond ((null colon) (let ((name (name token))) (list (cons nil name) (cons "KEYWORD" name))))
            ((zerop colon) (list (cons "KEYWORD" (name (subseq token name-start)))))
            (t (list (cons (name (subseq token 0 colon)) (name (subseq token name-start)))))))))

(defun text-tokens (text start end)
  "The tokens of TEXT from START to END: every run of constituent
characters outside strings and comments, `#\\x' characters left out.  More
than the reader's tokens at most (a reader macro's text, say), never fewer."
  (let ((tokens '()) (i start))
    (flet ((terminating-p (char)
             (or (member char '(#\Space #\Tab #\Newline #\Return #\Page))
                 (find char "()\"';`,"))))
      (loop while (< i end)
            do (let ((char (char text i)))
                 (cond ((terminating-p char)
                        (case char
                          (#\; (setf i (or (position #\Newline text :start i :end end) end)))
                          (#\" (loop do (incf i)
                                     while (< i end)
                                     do (case (char text i)
                                          (#\\ (incf i))
                                          (#\" (return))))
                               (incf i))
                          (t (incf i))))
                       ((and (char= char #\#) (< (1+ i) end) (char= (char text (1+ i)) #\|))
                        (let ((depth 0))
                          (loop while (< (1+ i) end)
                                do (let ((this (char text i)) (next (char text (1+ i))))
                                     (cond ((and (char= this #\#) (char= next #\|)) (incf depth) (incf i 2))
                                           ((and (char= this #\|) (char= next #\#)) (decf depth) (incf i 2)
                                            (when (zerop depth) (return)))
                                           (t (incf i))))
                                finally (setf i end))))
                       ((and (char= char #\#) (< (1+ i) end) (char= (char text (1+ i)) #\\))
                        ;; A character: #\x, #\Space, #\( ...
                        (setf i (+ i 3))
                        (loop while (and (< i end) (not (terminating-p (char text i)))) do (incf i)))
                       ((char= char #\#)
                        ;; The dispatch character and its digits; what follows reads on.
                        (incf i)
                        (loop while (and (< i end) (digit-char-p (char text i))) do (incf i))
                        (when (< i end) (incf i)))
                       (t
                        (let ((token-start i) (in-bars nil))
                          (loop while (< i end)
                                do (let ((this (char text i)))
                                     (cond ((char= this #\|) (setf in-bars (not in-bars)))
                                           ((char= this #\\) (incf i))
                                           ((and (not in-bars) (terminating-p this)) (return))))
                                   (incf i))
                          (push (subseq text token-start (min i end)) tokens)))))))
    tokens))

(defun missing-symbols (text start end)
  "The (PACKAGE . NAME) pairs that reading TEXT from START to END in
*PACKAGE* and *READTABLE* could intern and that are not there now."
  (let ((missing '()) (seen (make-hash-table :test 'equal)))
    (dolist (token (text-tokens text start end) missing)
      (loop for (package-name . name) in (token-symbols token *readtable*)
            for package = (if package-name
                              (ignore-errors (find-package package-name))
                              *package*)
            when (and package (not (gethash (cons package name) seen)))
              do (setf (gethash (cons package name) seen) t)
                 (unless (nth-value 1 (find-symbol name package))
                   (push (cons package name) missing))))))

(defun unused-symbol-p (symbol)
  "True when nothing is defined on SYMBOL: as the reader leaves a symbol it
has just made (a keyword is bound to itself)."
  (and (not (fboundp symbol))
       (or (not (boundp symbol)) (and (keywordp symbol) (eq (symbol-value symbol) symbol)))
       (null (symbol-plist symbol))
       (null (find-class symbol nil))))

(defun unintern-read-symbols (missing)
  "Unintern each symbol of MISSING (see `missing-symbols') that the read
made: present now, at home there, and unused."
  (loop for (package . name) in missing
        do (multiple-value-bind (symbol status) (find-symbol name package)
             (when (and status (eq (symbol-package symbol) package) (unused-symbol-p symbol))
               (unintern symbol package)))))

(defvar *read-missing* :outside
  "The `missing-symbols' of the reads of the `keeping-read-symbols' running,
to be uninterned when it ends; :outside when none runs.")

(defun call-keeping-read-symbols (thunk)
  "THUNK's values; the symbols its quiet reads interned are uninterned when
it ends (or when the outermost of these calls does)."
  (if (listp *read-missing*)
      (funcall thunk)
      (let ((*read-missing* '()))
        (unwind-protect (funcall thunk)
          (unintern-read-symbols *read-missing*)))))

(defmacro keeping-read-symbols (() &body body)
  "BODY, during which what `reading-quietly' reads in it stays interned: a
form's name read by one call is still a symbol of its package while BODY
prints it or compares it with a name read by another."
  `(call-keeping-read-symbols (lambda () ,@body)))

(defun call-reading-quietly (text start end thunk)
  "THUNK's values, THUNK reading (some of) TEXT from START to END in
*PACKAGE* and *READTABLE*: with *READ-EVAL* false, `#.' evaluating
nothing (see `quiet-readtable'), and every symbol it interned uninterned
again when the `keeping-read-symbols' around it ends, or at once."
  (keeping-read-symbols ()
    (setf *read-missing* (append (missing-symbols text start end) *read-missing*))
    (let ((*read-eval* nil)
          (*readtable* (quiet-readtable *readtable*)))
      (funcall thunk))))

(defmacro reading-quietly ((text &key (start 0) end) &body body)
  "BODY, which reads TEXT from START to END, as `call-reading-quietly'
runs it."
  (let ((text-var (gensym "TEXT")))
    `(let ((,text-var ,text))
       (call-reading-quietly ,text-var ,start (or ,end (length ,text-var)) (lambda () ,@body)))))
