;;;; swank-bootstrap.lisp --- cl-mcp's image-side agent
;;;;
;;;; Loaded into an SBCL image that runs Swank, either the one cl-mcp started
;;;; itself or (in attach mode) the programmer's own.  cl-mcp calls the
;;;; exported entry points through `:emacs-rex' on a fresh Swank worker
;;;; thread.  Each entry point gathers facts and returns them as one plist of
;;;; strings, keywords and integers; the Python side renders the text.
;;;;
;;;; Rules this file keeps:
;;;;  - Nothing a user evaluates may reach Swank's debugger: every condition
;;;;    is caught here, before Swank sees it, so no thread is ever left
;;;;    waiting for an SLDB window.
;;;;  - Every reply fits one Swank frame (16 MiB): output and printed values
;;;;    are capped here, where they are produced.
;;;;  - Loading this file twice is harmless (attach mode reloads it).

(defpackage #:cl-mcp-agent
  (:use #:common-lisp)
  (:export #:evaluate
           #:list-definitions
           #:load-system
           #:prepare-embedded-image
           #:set-connection-nodelay
           #:*agent-version*))

(in-package #:cl-mcp-agent)

(defparameter *agent-version* "0.1.0"
  "Version of this agent; cl-mcp compares it before reloading the file.")

(defvar *baseline-packages* (list-all-packages)
  "Packages that existed when the agent was first loaded.  Packages created
later belong to the session (see `session-packages').")

;;; ------------------------------------------------------------------
;;; Capped output streams

(defclass capped-output-stream (sb-gray:fundamental-character-output-stream)
  ((buffer :initform (make-string-output-stream) :reader buffer)
   (limit :initarg :limit :reader limit
          :documentation "Characters kept; the rest are only counted.")
   (kept :initform 0 :accessor kept)
   (dropped :initform 0 :accessor dropped)
   (column :initform 0 :accessor column))
  (:documentation "A character output stream that keeps the first LIMIT
characters written to it and counts the rest, so that a runaway printer
cannot exhaust the image's memory or overflow a Swank frame."))

(defun make-capped-output-stream (limit)
  "Return a `capped-output-stream' keeping at most LIMIT characters."
  (make-instance 'capped-output-stream :limit limit))

(defmethod sb-gray:stream-write-string ((stream capped-output-stream) string
                                        &optional (start 0) end)
  (let* ((end (or end (length string)))
         (count (- end start))
         (room (max 0 (- (limit stream) (kept stream))))
         (taken (min count room))
         (newline (position #\Newline string :start start :end end :from-end t)))
    (when (plusp taken)
      (write-string string (buffer stream) :start start :end (+ start taken))
      (incf (kept stream) taken))
    (incf (dropped stream) (- count taken))
    (setf (column stream) (if newline
                              (- end newline 1)
                              (+ (column stream) count)))
    string))

(defmethod sb-gray:stream-write-char ((stream capped-output-stream) char)
  (if (< (kept stream) (limit stream))
      (progn (write-char char (buffer stream))
             (incf (kept stream)))
      (incf (dropped stream)))
  (setf (column stream) (if (char= char #\Newline) 0 (1+ (column stream))))
  char)

(defmethod sb-gray:stream-line-column ((stream capped-output-stream))
  (column stream))

(defmethod sb-gray:stream-start-line-p ((stream capped-output-stream))
  (zerop (column stream)))

(defmethod sb-gray:stream-finish-output ((stream capped-output-stream)) nil)
(defmethod sb-gray:stream-force-output ((stream capped-output-stream)) nil)

(defun stream-text (stream)
  "The characters kept by STREAM, as a string."
  (get-output-stream-string (buffer stream)))

;;; ------------------------------------------------------------------
;;; Printing that never fails

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

(defun internal-package-p (package)
  "True for SBCL's own packages and this agent's, whose condition classes
are details of how a condition was signalled."
  (and package
       (let ((name (package-name package)))
         (or (string= name "CL-MCP-AGENT")
             (and (> (length name) 3) (string= "SB-" name :end2 3))))))

(defun public-type-name (condition &optional (kind 'condition))
  "A type name for CONDITION that a user can act on: its own class, or for
internal classes the nearest superclass of type KIND from outside SBCL (so
SB-INT:SIMPLE-STYLE-WARNING shows as STYLE-WARNING)."
  (let ((class (class-of condition)))
    (symbol-designator
     (or (loop for super in (sb-mop:class-precedence-list class)
               for name = (class-name super)
               when (and (not (internal-package-p (symbol-package name)))
                         (subtypep name kind))
                 return name)
         (class-name class)))))

(defun condition-type-name (condition)
  "The condition's own class name, package-qualified outside CL, except for
this agent's own conditions, which stand for their standard parent."
  (if (eq (symbol-package (type-of condition)) (find-package "CL-MCP-AGENT"))
      (public-type-name condition 'serious-condition)
      (symbol-designator (type-of condition))))

;;; ------------------------------------------------------------------
;;; Backtraces

(defparameter *backtrace-frame-limit* 20
  "Frames shown for an error.")

(defparameter *frame-line-limit* 300
  "Characters shown per backtrace frame.")

(defun existing-symbols (specs)
  "The symbols named by SPECS, (PACKAGE NAME) string pairs, that exist in
this SBCL; internal names come and go between releases."
  (loop for (package name) in specs
        for symbol = (and (find-package package) (find-symbol name package))
        when symbol collect symbol))

(defparameter *signalling-frames*
  (existing-symbols
   '(("COMMON-LISP" "INVOKE-DEBUGGER") ("SB-KERNEL" "%SIGNAL") ("SB-KERNEL" "INTERNAL-ERROR")
     ("SB-IMPL" "RUN-EXPIRED-TIMER") ("SB-IMPL" "RUN-EXPIRED-TIMERS")
     ("SB-THREAD" "RUN-INTERRUPTION") ("SB-SYS" "INVOKE-INTERRUPTION")
     ("SB-UNIX" "SIGALRM-HANDLER") ("SB-UNIX" "RUN-HANDLER")))
  "Functions of the condition system and the timer machinery.  Frames up to
the last of these near the top of the stack are how the condition was
signalled, not where.")

(defparameter *evaluator-frames*
  (existing-symbols
   '(("SB-INT" "SIMPLE-EVAL-IN-LEXENV") ("SB-IMPL" "SIMPLE-EVAL-PROGN-BODY")
     ("SB-IMPL" "%SIMPLE-EVAL") ("SB-IMPL" "EVAL-IN-LEXENV")))
  "SBCL's evaluator: present in every backtrace, never informative.")

(defun frame-name (frame)
  (ignore-errors (sb-debug::frame-call frame)))

(defun frame-line (frame)
  "FRAME printed as (FUNCTION ARGS...) on one bounded line."
  (let ((text (handler-case
                  (with-output-to-string (out)
                    (let ((*print-length* 10) (*print-level* 3)
                          (*print-pretty* nil) (*print-circle* t)
                          (*print-readably* nil)
                          (*package* (find-package "COMMON-LISP-USER")))
                      (sb-debug::print-frame-call frame out)))
                (serious-condition () "#<unprintable frame>"))))
    (if (> (length text) *frame-line-limit*)
        (concatenate 'string (subseq text 0 *frame-line-limit*) " ...")
        text)))

(defun internal-frame-p (name)
  "True for frames the user never wrote: the evaluator and its wrapper."
  (or (member name *evaluator-frames* :test #'equal)
      (equal name '(lambda ()))))

(defun capture-backtrace (condition)
  "Up to `*backtrace-frame-limit*' frames between the point CONDITION was
signalled and the evaluation boundary, as strings.  Called from inside the
handler, before anything unwinds."
  (let ((frames '()))
    (block walk
      (sb-debug::map-backtrace
       (lambda (frame)
         (let ((name (frame-name frame)))
           (when (eq name '%eval-form) (return-from walk))
           (push (cons name frame) frames)))
       :count 200))
    (setf frames (nreverse frames))
    ;; Drop the signalling machinery above the frame that signalled.
    (let ((last (position-if (lambda (entry)
                               (or (member (car entry) *signalling-frames*
                                           :test #'equal)
                                   (and (consp (car entry))
                                        (member '%evaluate-with-handlers (car entry)))))
                             frames :end (min 25 (length frames)) :from-end t)))
      (when last (setf frames (nthcdr (1+ last) frames))))
    (loop for (name . frame) in frames
          for index from 0
          unless (internal-frame-p name)
            collect (if (and (equal name "undefined function")
                             (typep condition 'undefined-function))
                        (undefined-function-line frame condition)
                        (frame-line frame))
              into lines
          finally (return (subseq lines 0 (min (length lines)
                                               *backtrace-frame-limit*))))))

(defun undefined-function-line (frame condition)
  "SBCL shows a call to an undefined function as a frame named
\"undefined function\"; show the name that was called instead."
  (let ((line (frame-line frame))
        (name (function-name-text (cell-error-name condition))))
    (concatenate 'string "(" name
                 (subseq line (length "(\"undefined function\"")))))

;;; ------------------------------------------------------------------
;;; Evaluation

(defvar *timing* nil)

(defun %eval-form (form)
  "Evaluate FORM.  A named frame that marks where a backtrace ends (debug 3
keeps the frame: no tail call)."
  (declare (optimize (debug 3)))
  (eval form))
(declaim (notinline %eval-form))

(defun find-package-designator (name)
  "The package named NAME (exactly, or upcased), or nil."
  (or (find-package name) (find-package (string-upcase name))))

(define-condition incomplete-form (end-of-file)
  ()
  (:report "Incomplete form: the code ends before the form is complete (a missing \")\" or an unterminated string?)."))

(defun read-next-form (stream eof)
  "Read one form from STREAM, or EOF at its end.  An incomplete form
signals `incomplete-form' rather than a bare END-OF-FILE on a string
stream."
  (handler-case (read stream nil eof)
    (end-of-file () (error 'incomplete-form :stream stream))))

(define-condition no-input (end-of-file)
  ()
  (:report "No input: cl-mcp evaluates without a terminal, so *STANDARD-INPUT*, *QUERY-IO* and *DEBUG-IO* are empty."))

(defclass no-input-stream (sb-gray:fundamental-character-input-stream
                           sb-gray:fundamental-character-output-stream)
  ()
  (:documentation "A stream that fails at once, with a reason, when read
from, instead of waiting for input that can never come; what is written to
it goes nowhere."))

(defmethod sb-gray:stream-read-char ((stream no-input-stream))
  (error 'no-input :stream stream))

(defmethod sb-gray:stream-read-line ((stream no-input-stream))
  (error 'no-input :stream stream))

(defmethod sb-gray:stream-listen ((stream no-input-stream)) nil)
(defmethod sb-gray:stream-read-char-no-hang ((stream no-input-stream)) nil)
(defmethod sb-gray:stream-unread-char ((stream no-input-stream) char)
  (declare (ignore char))
  nil)
(defmethod sb-gray:stream-clear-input ((stream no-input-stream)) nil)
(defmethod sb-gray:stream-write-char ((stream no-input-stream) char) char)
(defmethod sb-gray:stream-write-string ((stream no-input-stream) string
                                        &optional start end)
  (declare (ignore start end))
  string)
(defmethod sb-gray:stream-line-column ((stream no-input-stream)) nil)
(defmethod sb-gray:stream-finish-output ((stream no-input-stream)) nil)
(defmethod sb-gray:stream-force-output ((stream no-input-stream)) nil)
(defmethod sb-gray:stream-clear-output ((stream no-input-stream)) nil)

(defun make-null-io ()
  "A stream that reads nothing and writes nowhere, for *DEBUG-IO* and
*QUERY-IO*: there is no one at a terminal to answer."
  (make-instance 'no-input-stream))

(defun reader-error-type (condition)
  "Reader problems are reported by their standard type."
  (cond ((typep condition 'end-of-file) "END-OF-FILE")
        ((typep condition 'reader-error) "READER-ERROR")
        (t (condition-type-name condition))))

(defun error-message (condition timeout)
  "The text that explains CONDITION.  A few of SBCL's reports are replaced
by plainer ones that say what happened to the evaluation."
  (typecase condition
    (sb-ext:timeout
     (format nil "Evaluation exceeded its deadline of ~A and was interrupted. ~
                  The session is still usable."
             (seconds-text timeout)))
    (undefined-function
     (format nil "The function ~A is undefined."
             (function-name-text (cell-error-name condition))))
    (t (condition-message condition))))

(defun function-name-text (name)
  "A function name (a symbol or (SETF symbol)) as written from CL-USER."
  (let ((*package* (find-package "COMMON-LISP-USER")))
    (prin1-to-string name)))

(defun seconds-text (seconds)
  (if (and seconds (= seconds (round seconds)))
      (format nil "~D second~:P" (round seconds))
      (format nil "~,3F seconds" seconds)))

(defun describe-error (condition backtrace &key reading timeout)
  "The :error plist for CONDITION."
  (list :type (if reading
                  (reader-error-type condition)
                  (condition-type-name condition))
        :message (error-message condition timeout)
        :backtrace backtrace))

(defun timing-since (real run gc bytes)
  "The (REAL-MS RUN-MS GC-MS BYTES) elapsed since the given readings."
  (flet ((ms (ticks) (round (* 1000 ticks) internal-time-units-per-second)))
    (list (ms (- (get-internal-real-time) real))
          (ms (- (get-internal-run-time) run))
          (ms (- sb-ext:*gc-run-time* gc))
          (- (sb-ext:get-bytes-consed) bytes))))

(defun evaluate (code &key package (explicit-package nil) (capture-time nil)
                        (timeout nil) (max-output 1000000))
  "Read and evaluate the forms of CODE one after another, in PACKAGE, and
return a plist describing the outcome:

  :status   :ok or :error
  :values   printed values of the last form (strings)
  :stdout, :stderr   captured output, with :stdout-dropped and
            :stderr-dropped counting characters beyond MAX-OUTPUT
  :warnings list of (TYPE MESSAGE)
  :error    (:type :message :backtrace) when :status is :error
  :package  name of *package* afterwards, :package-changed whether the
            code changed it (IN-PACKAGE)
  :timing   (REAL-MS RUN-MS GC-MS BYTES) when CAPTURE-TIME

An unknown PACKAGE is an error when EXPLICIT-PACKAGE, and falls back to
CL-USER otherwise (the session's package may have been deleted).  TIMEOUT,
in seconds, interrupts the evaluation with SB-EXT:TIMEOUT."
  (let* ((target (find-package-designator package))
         (stdout (make-capped-output-stream max-output))
         (stderr (make-capped-output-stream max-output))
         (warnings '())
         (outcome nil))
    (when (and (null target) explicit-package)
      (return-from evaluate
        (list :status :error
              :error (list :type "PACKAGE-ERROR"
                           :message (format nil "The package ~S does not exist." package)
                           :backtrace nil)
              :package "COMMON-LISP-USER")))
    (let* ((start (or target (find-package "COMMON-LISP-USER")))
           (*package* start)
           (*standard-output* stdout)
           (*error-output* stderr)
           (*trace-output* stderr)
           (*terminal-io* (make-two-way-stream (make-instance 'no-input-stream) stdout))
           (*standard-input* (make-instance 'no-input-stream))
           (*debug-io* (make-null-io))
           (*query-io* (make-null-io))
           (real (get-internal-real-time))
           (run (get-internal-run-time))
           (gc sb-ext:*gc-run-time*)
           (bytes (sb-ext:get-bytes-consed)))
      (setf outcome (%evaluate-with-handlers code timeout
                                             (lambda (w) (push w warnings))))
      (let ((result (list :status (first outcome)
                          :stdout (stream-text stdout)
                          :stdout-dropped (dropped stdout)
                          :stderr (stream-text stderr)
                          :stderr-dropped (dropped stderr)
                          :warnings (warning-entries warnings (third outcome))
                          :package (package-name *package*)
                          :package-changed (not (eq *package* start)))))
        (when capture-time
          (setf result (list* :timing (timing-since real run gc bytes) result)))
        (ecase (first outcome)
          (:ok (list* :values (print-values (second outcome) max-output) result))
          (:error (list* :error (second outcome) result)))))))

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
                        (format nil "~A... [~D more characters truncated]" kept cut)
                        kept)))))

(defun %evaluate-with-handlers (code timeout record-warning)
  "Evaluate the forms of CODE.  Return (:ok VALUES) or (:error PLIST CONDITION).
Warnings are muffled and passed to RECORD-WARNING."
  (let ((stream (make-string-input-stream code))
        (eof (make-symbol "EOF"))
        (values '())
        (reading nil))
    (block evaluation
      (flet ((fail (condition)
               (return-from evaluation
                 (list :error
                       (describe-error condition
                                       (unless reading (capture-backtrace condition))
                                       :reading reading
                                       :timeout timeout)
                       condition))))
        (handler-bind ((warning
                         (lambda (w)
                           (funcall record-warning w)
                           (muffle-warning w)))
                       (serious-condition #'fail))
          ;; INVOKE-DEBUGGER (from BREAK, or a handler that declines) must
          ;; not reach Swank's debugger either.
          (let ((sb-ext:*invoke-debugger-hook*
                  (lambda (condition hook)
                    (declare (ignore hook))
                    (fail condition)))
                (*debugger-hook* nil))
            (sb-ext:with-timeout timeout
              (loop
                (setf reading t)
                (let ((form (read-next-form stream eof)))
                  (setf reading nil)
                  (when (eq form eof) (return))
                  (setf values (multiple-value-list (%eval-form form))))))
            (list :ok values)))))))

(defun warning-entries (warnings error)
  "WARNINGS as (TYPE MESSAGE) lists, in the order signalled, leaving out the
compiler's note that a function is undefined when calling it is the ERROR."
  (loop for w in (reverse warnings)
        unless (and (typep error 'undefined-function)
                    (typep w 'simple-condition)
                    (member (cell-error-name error)
                            (simple-condition-format-arguments w) :test #'equal))
          collect (list (public-type-name w 'warning) (condition-message w))))

;;; ------------------------------------------------------------------
;;; Definitions of the session

(defun session-packages ()
  "CL-USER and every package created since the agent was loaded."
  (cons (find-package "COMMON-LISP-USER")
        (set-difference (list-all-packages) *baseline-packages*)))

(defun lambda-list-text (function-designator)
  (let ((*package* (find-package "COMMON-LISP-USER"))
        (*print-pretty* nil))
    (handler-case (format nil "~:A"
                          (sb-introspect:function-lambda-list function-designator))
      (serious-condition () "(...)"))))

(defun one-line (text limit)
  "TEXT on one line of at most LIMIT characters."
  (let ((flat (substitute #\Space #\Newline text)))
    (if (> (length flat) limit)
        (concatenate 'string (subseq flat 0 (max 0 (- limit 3))) "...")
        flat)))

(defun variable-text (symbol)
  (one-line (with-result-printing ()
              (let ((*print-pretty* nil))
                (safe-print (symbol-value symbol) #'prin1-to-string)))
            80))

(defun class-kind (class)
  (typecase class
    (structure-class "structure")
    (sb-pcl::condition-class "condition")
    (t "class")))

(defun symbol-definitions (symbol kinds)
  "The definitions SYMBOL names, as (KIND NAME DETAIL) lists."
  (let ((name (symbol-designator symbol))
        (found '()))
    (when (and (member :functions kinds) (fboundp symbol)
               (not (macro-function symbol)) (not (special-operator-p symbol)))
      (push (list :function name (lambda-list-text (fdefinition symbol))) found))
    (when (and (member :variables kinds) (boundp symbol) (not (keywordp symbol)))
      (push (list :variable name (variable-text symbol)) found))
    (when (and (member :macros kinds) (macro-function symbol))
      (push (list :macro name (lambda-list-text (macro-function symbol))) found))
    (when (member :classes kinds)
      (let ((class (find-class symbol nil)))
        (when class
          (push (list :class name (class-kind class)) found))))
    found))

(defun list-definitions (&key (type "all"))
  "The session's definitions of TYPE (\"all\", \"functions\", \"variables\",
\"macros\" or \"classes\") as a list of (KIND NAME DETAIL), sorted by kind
and name."
  (let ((kinds (if (string= type "all")
                   '(:functions :variables :macros :classes)
                   (list (intern (string-upcase type) :keyword))))
        (definitions '()))
    (dolist (package (session-packages))
      (do-symbols (symbol package)
        (when (eq (symbol-package symbol) package)
          (setf definitions
                (nconc (symbol-definitions symbol kinds) definitions)))))
    (sort (remove-duplicates definitions :test #'equal)
          (lambda (a b)
            (or (string< (symbol-name (first a)) (symbol-name (first b)))
                (and (eq (first a) (first b))
                     (string< (second a) (second b))))))))

;;; ------------------------------------------------------------------
;;; Systems

(defun quicklisp-setup-file ()
  (probe-file (merge-pathnames "quicklisp/setup.lisp" (user-homedir-pathname))))

(defun ensure-quicklisp ()
  "True when Quicklisp is loaded, loading it from ~/quicklisp when present."
  (or (find-package "QL")
      (let ((setup (quicklisp-setup-file)))
        (when setup
          (load setup)
          (find-package "QL")))))

(defun system-version (name)
  (let ((system (asdf:find-system name nil)))
    (and system (asdf:component-version system))))

(defparameter *redefinition-warning*
  (first (existing-symbols '(("SB-KERNEL" "REDEFINITION-WARNING"))))
  "SBCL's class of warnings about redefining a function or macro.")

(defun redefinition-p (warning)
  "True for a redefinition warning: ASDF compiles a file, then loads it into
the same image, so every macro of a freshly compiled system is 'redefined'."
  (and *redefinition-warning* (typep warning *redefinition-warning*)))

(defun load-system (name &key (max-output 20000))
  "Load the ASDF system NAME, through Quicklisp when it is available.
Return a plist: :status, :system, :version, :loader, :warnings, :output
(compiler chatter, capped at MAX-OUTPUT) or :error."
  (let* ((stdout (make-capped-output-stream max-output))
         (warnings '())
         (quicklisp (ensure-quicklisp))
         (outcome
           (block loading
             (handler-bind ((warning
                              (lambda (w)
                                (unless (redefinition-p w)
                                  (push (list (public-type-name w 'warning)
                                              (condition-message w))
                                        warnings))
                                (muffle-warning w)))
                            (serious-condition
                              (lambda (c)
                                (return-from loading
                                  (list :error
                                        (if (missing-system-p c name)
                                            (list :type (condition-type-name c)
                                                  :message (format nil "System ~S not found." name)
                                                  :backtrace nil)
                                            (describe-error c (capture-backtrace c))))))))
               (let ((*standard-output* stdout)
                     (*error-output* stdout)
                     (*trace-output* stdout)
                     (*standard-input* (make-string-input-stream ""))
                     (*query-io* (make-null-io))
                     (*debug-io* (make-null-io))
                     (sb-ext:*invoke-debugger-hook* nil))
                 (if quicklisp
                     (funcall (find-symbol "QUICKLOAD" "QL") name :silent t)
                     (asdf:load-system name))
                 (list :ok))))))
    (list* :status (first outcome)
           :system name
           :loader (if quicklisp "quicklisp" "asdf")
           :warnings (nreverse warnings)
           :output (stream-text stdout)
           (if (eq (first outcome) :ok)
               (list :version (system-version name))
               (list :error (second outcome))))))

(defun missing-system-p (condition name)
  "True when CONDITION says that system NAME itself cannot be found (not one
of its dependencies)."
  (or (and (typep condition 'asdf:missing-component)
           (not (typep condition 'asdf:missing-dependency))
           (equal (asdf/find-component:missing-requires condition) name))
      (string= (symbol-name (type-of condition)) "SYSTEM-NOT-FOUND")))

;;; ------------------------------------------------------------------
;;; Image set-up

(defun set-connection-nodelay ()
  "Set TCP_NODELAY on Swank's end of the current connection, so that a reply
written in several frames is not held back by delayed ACKs."
  (let ((fd (sb-sys:fd-stream-fd
             (swank::connection.socket-io swank::*emacs-connection*))))
    (sb-alien:with-alien ((one sb-alien:int 1))
      (sb-alien:alien-funcall
       (sb-alien:extern-alien "setsockopt"
                              (function sb-alien:int sb-alien:int sb-alien:int
                                        sb-alien:int (* t) sb-alien:unsigned))
       fd 6 1 (sb-alien:addr one) 4))))   ; IPPROTO_TCP, TCP_NODELAY

(defun log-background-error (condition hook)
  "The global debugger hook of an embedded image: an error in a thread the
user started is logged to the image's stderr (cl-mcp's log) and ends that
thread, instead of waiting for a debugger nobody will open."
  (declare (ignore hook))
  (ignore-errors
   (format *error-output* "~&;; cl-mcp: unhandled ~A in thread ~A: ~A~%"
           (type-of condition) (sb-thread:thread-name sb-thread:*current-thread*)
           (condition-message condition))
   (finish-output *error-output*))
  (if (sb-thread:main-thread-p)
      (sb-ext:exit :code 70 :abort t)
      (sb-thread:abort-thread :allow-exit t)))

(defun prepare-embedded-image (secret)
  "Settings for an image cl-mcp owns: Swank demands SECRET from the one
client, never opens its debugger, and background errors are logged."
  (setf (fdefinition 'swank::slime-secret) (lambda () secret))
  (setf swank:*global-debugger* nil
        swank::*configure-emacs-indentation* nil
        sb-ext:*invoke-debugger-hook* #'log-background-error
        *debugger-hook* nil)
  t)
