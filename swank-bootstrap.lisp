;;;; swank-bootstrap.lisp --- cl-mcp's image-side agent
;;;;
;;;; Loaded into an SBCL image that runs Swank, either the one cl-mcp started
;;;; itself or (in attach mode) the programmer's own.  cl-mcp calls the
;;;; exported entry points through `:emacs-rex': in an image cl-mcp owns, on
;;;; the lane (see `open-lane'), else on a fresh Swank worker thread.  Each
;;;; entry point gathers facts and returns them as one plist of
;;;; strings, keywords and integers; the Python side renders the text.
;;;;
;;;; Rules this file keeps:
;;;;  - Nothing a user evaluates may reach Swank's debugger: every condition
;;;;    is caught here, before Swank sees it, so no thread is ever left
;;;;    waiting for an SLDB window.
;;;;  - Every reply fits one Swank frame (16 MiB): output, printed values and
;;;;    warnings are capped here, where they are produced (cl-mcp's
;;;;    --max-output is at most 1,000,000 characters per stream).
;;;;  - Loading this file twice is harmless (attach mode reloads it).
;;;;
;;;; Sections, each using only what the sections above it define (the few
;;;; calls that go back and forth between the evaluation's parts say so):
;;;;  - SBCL and Swank internals this agent relies on (a table)
;;;;  - Loading, looking up internals, logging
;;;;  - Capped output streams
;;;;  - Printing that never fails
;;;;  - Naming conditions and describing errors
;;;;  - Backtraces
;;;;  - Reading code
;;;;  - Keeping the terminal and the debugger out
;;;;  - Threads the agent makes
;;;;  - Listeners only cl-mcp can take
;;;;  - The lane
;;;;  - Evaluations and their mailboxes
;;;;  - The registries of waiting and running evaluations
;;;;  - Answering a request from inside
;;;;  - Deadlines
;;;;  - What the session creates, in an image it shares (attach mode)
;;;;  - The evaluation's thread
;;;;  - Waiting at an error
;;;;  - Entry points: evaluations
;;;;  - Entry point: the session's definitions
;;;;  - Entry point: loading systems
;;;;  - Development tools: names and places, then each tool's entry points
;;;;  - Entry points: setting an image up

;;;; SBCL and Swank internals this agent relies on
;;;
;;; Checked with SBCL 2.2.9 and Swank 2.27 (Debian cl-swank).  Everything
;;; else is standard Common Lisp or a supported interface: SB-EXT,
;;; SB-THREAD, SB-GRAY, SB-MOP, SB-ALIEN, SB-BSD-SOCKETS, SB-POSIX,
;;; SB-INTROSPECT, SWANK, SWANK/BACKEND, ASDF.  Those marked "by name" are
;;; looked up when the agent loads (`existing-symbols', `find-symbol') and
;;; their feature is left out where a release lacks them.  The others are
;;; written into the code: a release without one fails where it is used (a
;;; reader error for a single colon, an undefined function or variable at
;;; run time for a double one), so check this table on every new SBCL or
;;; Swank.
;;;
;;; Swank (package SWANK; internal)
;;;   swank::*emacs-connection*       the connection of the request being
;;;                                   served: cl-mcp's, the lane's home,
;;;                                   the socket of `set-connection-nodelay'
;;;   swank::*connections*            Swank's connections, newest first: an
;;;                                   attached cl-mcp moves its own last
;;;   swank::*pending-continuations*  ids of the requests this thread has yet
;;;                                   to answer (`cl-mcp-request',
;;;                                   `answer-directly')
;;;   swank::send-to-emacs            `answer-directly' sends a `:return'
;;;   swank::connection.socket-io     a connection's socket stream
;;;   swank::authenticate-client      checks the secret, the first message
;;;   swank::slime-secret             redefined to return the run's secret
;;;   swank::init-log-output          what Swank's own server does before it
;;;   swank::start-sentinel             serves (`serve-cl-mcp')
;;;   swank::make-connection          cl-mcp's connection, served as Swank
;;;   swank::serve-requests             serves any (:spawn)
;;;   swank::make-singlethreaded-connection   the lane's connection
;;;   swank::with-connection          the lane thread's Swank environment
;;;   swank::handle-requests          reads and runs the lane's requests
;;;   swank::*send-counter*           set so that Swank never pings the lane
;;;   swank::*enable-event-history*   bound to nil in the lane thread
;;;   swank::*pre-reply-hook*         runs `prune-swank-mailboxes'
;;;   swank::*configure-emacs-indentation*   nil in an embedded image
;;;   swank::parse-symbol             a name looked up, never interned
;;;   swank::xref-doit                `xref-of': the who-* cross-references
;;;   swank::collect-notes            `compile-file-of': compiler notes, as
;;;                                   C-c C-k gathers them
;;;   swank::compilation-result-notes, compilation-result-faslfile
;;;                                   what `collect-notes' returns
;;;   swank::fasl-pathname            where SLIME puts a file's fasl
;;;   swank::apropos-symbols          `apropos-of': the symbols a pattern
;;;                                   matches, as M-x slime-apropos finds them
;;;   swank::make-istate, swank::*istate*   `inspector-content' binds a state
;;;                                   of its own for the contribs that read it
;;;   swank::*inspector-printer-bindings*   the inspector's printer settings
;;;   swank::content-range            the inspector's content, lazy or not,
;;;                                   as a list
;;;   swank/sbcl::*mailboxes*, *mailbox-lock*, mailbox.thread   (by name)
;;;                                   Swank's per-thread mailboxes, pruned
;;;
;;; SBCL
;;;   sb-debug::map-backtrace         walks the frames of an error
;;;   sb-debug::frame-call            a frame's function name
;;;   sb-debug::print-frame-call      a frame printed as a call
;;;   sb-di:frame-code-location, frame-debug-fun, do-debug-fun-vars,
;;;   debug-var-symbol, debug-var-validity, debug-var-value
;;;                                   a frame's local variables
;;;   sb-di:eval-in-frame             `eval-in-frame-of'
;;;   sb-kernel::control-stack-exhausted   (by name) a stack overflow, after
;;;                                   which the thread is parked
;;;   sb-kernel:redefinition-warning  (by name) dropped from a load's warnings
;;;   sb-kernel::%signal, sb-kernel:internal-error,
;;;   sb-impl::run-expired-timers, sb-impl::run-expired-timer (not in 2.2.9),
;;;   sb-thread::run-interruption, sb-sys:invoke-interruption,
;;;   sb-unix::sigalrm-handler, sb-unix::run-handler
;;;                                   (by name) how a condition was
;;;                                   signalled: cut from backtraces
;;;   sb-int:simple-eval-in-lexenv, sb-impl::simple-eval-progn-body,
;;;   sb-impl::%simple-eval, sb-impl::eval-in-lexenv
;;;                                   (by name) the evaluator: hidden in
;;;                                   backtraces
;;;   sb-pcl::condition-class         tells conditions from other classes
;;;   sb-unix::clock-gettime          CLOCK_MONOTONIC (clock id 1), to time
;;;                                   the lane's idle poll
;;;   sb-unix::unblock-deferrable-signals   (by name) lets a new thread hear
;;;                                   interrupts (`make-agent-thread')
;;;   sb-unix:unix-getpid             the lane socket's name
;;;   sb-sys:*exit-in-progress*       (by name) SB-EXT:EXIT has begun
;;;   sb-sys:without-interrupts, with-interrupts
;;;                                   `answer-directly', `interrupt-at-deadline'
;;;   sb-sys:wait-until-fd-usable     the lane's and the listeners' waits
;;;   sb-sys:fd-stream-fd             a socket stream's file descriptor
;;;   asdf/find-component:missing-requires   the system a load missed (not
;;;                                   exported from ASDF itself)
;;;
;;; Foreign calls and constants (Linux, x86-64)
;;;   setsockopt(fd, IPPROTO_TCP = 6, TCP_NODELAY = 1, &1, 4)
;;;                                   `set-connection-nodelay'
;;;   getsockopt(fd, SOL_SOCKET = 1, SO_PEERCRED = 17, &ucred, &12)
;;;                                   `unix-peer-uid': struct ucred is three
;;;                                   32-bit words, pid uid gid
;;;   /proc/net/tcp                   `tcp-peer-uid': local and remote
;;;                                   address in fields 2 and 3, uid in
;;;                                   field 8 (counting from 1)
;;;   abstract Unix-domain sockets    the lane (Linux's abstract namespace)

(defpackage #:cl-mcp-agent
  (:use #:common-lisp)
  (:documentation "cl-mcp's agent in a Lisp image: the entry points cl-mcp
calls through Swank, each returning one plist (or a string, an integer, t).")
  ;; Evaluations, and evaluations that wait at an error.
  (:export #:evaluate
           #:invoke-restart-of
           #:backtrace-of
           #:eval-in-frame-of
           #:cancel-evaluation
           #:output-tail
           #:abort-all
           #:configure)
  ;; The session's definitions and systems.
  (:export #:list-definitions
           #:load-system)
  ;; Development tools: apropos, macroexpansion and the inspector.
  (:export #:apropos-of
           #:macroexpand-of
           #:inspect-of)
  ;; Development tools: cross-references and compiling a file.
  (:export #:xref-of
           #:compile-file-of)
  ;; Development tools: finding and describing a name's definitions.
  (:export #:find-definition-of
           #:describe-symbol-of)
  ;; Setting an image up: one cl-mcp owns (embedded), or one it shares
  ;; with the programmer (attached).
  (:export #:serve-cl-mcp
           #:set-connection-nodelay
           #:open-lane
           #:prepare-embedded-image
           #:prepare-attached-connection
           #:soft-reset))

(in-package #:cl-mcp-agent)

;;;; Loading, looking up internals, logging

(defvar *loaded-digest* nil
  "The SHA-256 of the agent source loaded into a shared image, set by
cl-mcp after loading it, so that attaching again does not reload it.")

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

;;;; Naming conditions and describing errors

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

(defun detail-class-name-p (name)
  "True for the names of classes that are details of an implementation:
this agent's, and SBCL's internal (unexported) ones."
  (let ((package (symbol-package name)))
    (or (eq package (find-package "CL-MCP-AGENT"))
        (and (internal-package-p package)
             (not (eq (nth-value 1 (find-symbol (symbol-name name) package)) :external))))))

(defun condition-type-name (condition)
  "The condition's class name, package-qualified outside CL.  For a class
that is an implementation detail (SB-KERNEL::RETRY-UNDEFINED-FUNCTION), its
nearest superclass that is not (UNDEFINED-FUNCTION)."
  (symbol-designator
   (or (loop for class in (sb-mop:class-precedence-list (class-of condition))
             for name = (class-name class)
             unless (detail-class-name-p name) return name)
       (type-of condition))))

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
     (format nil "Evaluation exceeded its deadline of ~A and was interrupted."
             (seconds-text timeout)))
    (undefined-function
     (format nil "The function ~A is undefined."
             (function-name-text (cell-error-name condition))))
    (t (condition-message condition))))

(defun describe-error (condition backtrace &key reading timeout)
  "The :error plist for CONDITION."
  (list :type (if reading
                  (reader-error-type condition)
                  (condition-type-name condition))
        :message (error-message condition timeout)
        :backtrace backtrace))

(defun command-error (type message)
  "A report of an error that is no condition of the user's code: TYPE (a
string such as \"CL-MCP:NO-SUCH-FRAME\") and MESSAGE, with no backtrace."
  (list :status :error :error (list :type type :message message :backtrace nil)
        :stdout "" :stderr "" :warnings '()))

(defparameter *warning-limit* 50
  "Warnings reported per stretch; each message is cut to 1,000 characters.")

(defun warning-entries (warnings error)
  "WARNINGS as (TYPE MESSAGE) lists, in the order signalled, leaving out the
compiler's note that a function is undefined when calling it is the ERROR.
At most `*warning-limit*', so that a reply stays within a Swank frame."
  (loop for w in (reverse warnings)
        unless (and (typep error 'undefined-function)
                    (typep w 'simple-condition)
                    (member (cell-error-name error)
                            (simple-condition-format-arguments w) :test #'equal))
          collect (list (public-type-name w 'warning)
                        (cap-string (condition-message w) 1000))
            into entries
        finally (return (subseq entries 0 (min (length entries) *warning-limit*)))))

;;;; Backtraces
;;;
;;; A backtrace shows the frames between the one that signalled and the
;;; evaluation's boundary, `%eval-form', leaving out the condition system,
;;; SBCL's evaluator and this agent.

(defun %eval-form (form)
  "Evaluate FORM.  A named frame that marks where a backtrace ends (debug 3
keeps the frame: no tail call)."
  (declare (optimize (debug 3)))
  (eval form))
(declaim (notinline %eval-form))

(defparameter *backtrace-frame-limit* 20
  "Frames shown for an error.")

(defparameter *frame-line-limit* 300
  "Characters shown per backtrace frame.")

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
  "The name of FRAME's function, or nil when SBCL cannot tell."
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

(defun agent-name-p (name)
  "True when the function NAME (a symbol, or a list such as (FLET F :IN G)
or (:METHOD M (CLASS))) mentions a symbol of this agent."
  (let ((agent (find-package "CL-MCP-AGENT")))
    (labels ((walk (x)
               (typecase x
                 (symbol (eq (symbol-package x) agent))
                 (cons (or (walk (car x)) (walk (cdr x)))))))
      (walk name))))

(defun internal-frame-p (name)
  "True for frames the user never wrote: the evaluator and its wrapper,
this agent's own functions, and frames SBCL cannot name."
  (or (member name *evaluator-frames* :test #'equal)
      (equal name '(lambda ()))
      (and (stringp name) (string/= name "undefined function"))
      (agent-name-p name)))

(defparameter *frame-walk-limit* 200
  "Frames examined for one error.")

(defun error-frames ()
  "The frames between the point a condition was signalled and the
evaluation boundary, user-relevant ones only, as frame objects.  Called
from inside the handler, before anything unwinds, so the frames stay valid
while the evaluation waits there."
  (let ((frames '()))
    (block walk
      (sb-debug::map-backtrace
       (lambda (frame)
         (let ((name (frame-name frame)))
           (when (eq name '%eval-form) (return-from walk))
           (push (cons name frame) frames)))
       :count *frame-walk-limit*))
    (setf frames (nreverse frames))
    ;; Drop the signalling machinery (and this agent's handler) above the
    ;; frame that signalled.
    (let ((last (position-if (lambda (entry)
                               (or (member (car entry) *signalling-frames* :test #'equal)
                                   (agent-name-p (car entry))))
                             frames :end (min 40 (length frames)) :from-end t)))
      (when last (setf frames (nthcdr (1+ last) frames))))
    (loop for (name . frame) in frames
          unless (internal-frame-p name) collect frame)))

(defun undefined-function-line (frame condition)
  "SBCL shows a call to an undefined function as a frame named
\"undefined function\"; show the name that was called instead."
  (let ((line (frame-line frame))
        (name (function-name-text (cell-error-name condition))))
    (concatenate 'string "(" name
                 (subseq line (length "(\"undefined function\"")))))

(defun frame-lines (frames condition count)
  "The first COUNT of FRAMES as one-line strings."
  (loop for frame in frames
        repeat count
        collect (if (and (typep condition 'undefined-function)
                         (equal (frame-name frame) "undefined function"))
                    (undefined-function-line frame condition)
                    (frame-line frame))))

(defun frame-locals (frame)
  "FRAME's local variables as (NAME VALUE) strings, where the compiler kept
them."
  (let ((location (sb-di:frame-code-location frame))
        (locals '()))
    (handler-case
        (sb-di:do-debug-fun-vars (var (sb-di:frame-debug-fun frame))
          (when (and (sb-di:debug-var-symbol var)
                     (eq (sb-di:debug-var-validity var location) :valid))
            (push (list (symbol-designator (sb-di:debug-var-symbol var))
                        (one-line (with-result-printing ()
                                    (let ((*print-pretty* nil))
                                      (safe-print (sb-di:debug-var-value var frame)
                                                  #'prin1-to-string)))
                                  200))
                  locals)))
      (serious-condition () nil))
    (nreverse locals)))

;;;; Reading code

(defun find-package-designator (name)
  "The package named NAME (exactly, or upcased), or nil."
  (or (find-package name) (find-package (string-upcase name))))

(define-condition incomplete-form (end-of-file)
  ()
  (:report "Incomplete form: the code ends before the form is complete (a missing \")\" or an unterminated string?).")
  (:documentation "The code ended inside a form."))

(defun read-next-form (stream eof)
  "Read one form from STREAM, or EOF at its end.  An incomplete form
signals `incomplete-form' rather than a bare END-OF-FILE on a string
stream."
  (handler-case (read stream nil eof)
    (end-of-file () (error 'incomplete-form :stream stream))))

(defun read-all-forms (code)
  "The forms of CODE as one PROGN (read with the evaluation's *PACKAGE*)."
  (let ((stream (make-string-input-stream code))
        (eof (make-symbol "EOF")))
    (cons 'progn (loop for form = (read-next-form stream eof)
                       until (eq form eof)
                       collect form))))

;;;; Keeping the terminal and the debugger out
;;;
;;; Nobody is at a terminal to answer a read, and nobody will ever answer a
;;; debugger: the code cl-mcp runs gets input streams that fail at once, and
;;; a hook that hands any entry into the debugger to the agent.

(define-condition no-input (end-of-file)
  ()
  (:report "No input: cl-mcp evaluates without a terminal, so *STANDARD-INPUT*, *QUERY-IO* and *DEBUG-IO* are empty.")
  (:documentation "A read from a `no-input-stream'."))

(defclass no-input-stream (sb-gray:fundamental-character-input-stream
                           sb-gray:fundamental-character-output-stream)
  ()
  (:documentation "A stream that fails at once, with a reason, when read
from, instead of waiting for input that can never come; what is written to
it goes nowhere."))

(defmethod sb-gray:stream-read-char ((stream no-input-stream))
  "Fail: there is no input."
  (error 'no-input :stream stream))

(defmethod sb-gray:stream-read-line ((stream no-input-stream))
  "Fail: there is no input."
  (error 'no-input :stream stream))

(defmethod sb-gray:stream-listen ((stream no-input-stream))
  "No input is ready, nor ever will be."
  nil)

(defmethod sb-gray:stream-read-char-no-hang ((stream no-input-stream))
  "No character is ready."
  nil)

(defmethod sb-gray:stream-unread-char ((stream no-input-stream) char)
  "Nothing was read, so nothing goes back."
  (declare (ignore char))
  nil)

(defmethod sb-gray:stream-clear-input ((stream no-input-stream))
  "There is no input to clear."
  nil)

(defmethod sb-gray:stream-write-char ((stream no-input-stream) char)
  "Drop CHAR."
  char)

(defmethod sb-gray:stream-write-string ((stream no-input-stream) string
                                        &optional start end)
  "Drop STRING."
  (declare (ignore start end))
  string)

(defmethod sb-gray:stream-line-column ((stream no-input-stream))
  "The column is unknown."
  nil)

(defmethod sb-gray:stream-finish-output ((stream no-input-stream))
  "Nothing is buffered."
  nil)

(defmethod sb-gray:stream-force-output ((stream no-input-stream))
  "Nothing is buffered."
  nil)

(defmethod sb-gray:stream-clear-output ((stream no-input-stream))
  "Nothing is buffered."
  nil)

(defmacro with-standard-streams ((output error-output) &body body)
  "Run BODY with the standard output streams bound to OUTPUT and
ERROR-OUTPUT (trace output going with the error output), and every input
stream failing at once: nobody is at a terminal to answer.  What is written
to *DEBUG-IO* or *QUERY-IO* goes nowhere."
  (let ((no-input (gensym "NO-INPUT")))
    `(let* ((,no-input (make-instance 'no-input-stream))
            (*standard-output* ,output)
            (*error-output* ,error-output)
            (*trace-output* *error-output*)
            (*terminal-io* (make-two-way-stream ,no-input *standard-output*))
            (*standard-input* ,no-input)
            (*debug-io* ,no-input)
            (*query-io* ,no-input))
       ,@body)))

(defun debugger-hook-calling (function)
  "A value for SB-EXT:*INVOKE-DEBUGGER-HOOK* that hands the condition to
FUNCTION.  BREAK and direct calls of INVOKE-DEBUGGER bypass handlers (and
BREAK binds *DEBUGGER-HOOK* to nil); only this hook sees them."
  (lambda (condition hook)
    (declare (ignore hook))
    (funcall function condition)))

(defmacro with-debugger-calling ((function) &body body)
  "Run BODY with any entry into the debugger handed to FUNCTION instead."
  `(let ((sb-ext:*invoke-debugger-hook* (debugger-hook-calling ,function))
         (*debugger-hook* nil))
     ,@body))

;;;; Threads the agent makes

(defparameter *unblock-deferrable-signals*
  (let ((name (first (existing-symbols '(("SB-UNIX" "UNBLOCK-DEFERRABLE-SIGNALS"))))))
    (and name (fboundp name) name))
  "SBCL's function that unblocks the signals carrying interrupts, when this
SBCL has it.")

(defun make-agent-thread (function name &rest arguments)
  "A thread running FUNCTION on ARGUMENTS that can be interrupted (for its
deadline, a cancel, or SB-EXT:EXIT) wherever it was made.  SBCL 2.2.9 gives
a new thread the signal mask of the thread that made it, and inside an
interrupt (a deadline's, where an evaluation waits at its error) the
signals that carry interrupts are blocked: a thread made there would never
hear one."
  (sb-thread:make-thread (lambda ()
                           (when *unblock-deferrable-signals*
                             (funcall *unblock-deferrable-signals*))
                           (apply function arguments))
                         :name name))

;;;; Listeners only cl-mcp can take
;;;
;;; Swank's own server takes the first client that connects and closes its
;;; listener after that one, whoever it was: another local user who
;;; connected first would lock cl-mcp out (or stall it for the 20 s Swank
;;; waits for a secret).  The listeners of an image cl-mcp owns, Swank's and
;;; the lane's, instead accept until a connection presents the secret.  A
;;; connection from another user is closed at once, unread: the kernel says
;;; whose it is (SO_PEERCRED for a Unix-domain socket; for loopback TCP the
;;; owner of the peer's socket in /proc/net/tcp).  One from this user shows
;;; its secret in a thread of its own, so one that connects and stays
;;; silent delays nobody.  The first that knows the secret is served, and
;;; the listener closes.

(defparameter *accept-poll-seconds* 0.05
  "How often the accepting thread looks whether a connection was served.")

(defun make-binary-stream (socket)
  "The stream Swank reads and writes on an accepted SOCKET (bytes, as from
`swank/backend:accept-connection' with no external format)."
  (sb-bsd-sockets:socket-make-stream socket :input t :output t
                                            :element-type '(unsigned-byte 8)
                                            :buffering :full :serve-events nil))

(defun unix-peer-uid (socket)
  "The user id of the process at the other end of the Unix-domain SOCKET
(getsockopt SOL_SOCKET SO_PEERCRED, Linux), or nil."
  (sb-alien:with-alien ((credentials (array (sb-alien:unsigned 32) 3))  ; pid uid gid
                        (size (sb-alien:unsigned 32) 12))
    (and (zerop (sb-alien:alien-funcall
                 (sb-alien:extern-alien "getsockopt"
                                        (function sb-alien:int sb-alien:int sb-alien:int sb-alien:int
                                                  sb-alien:system-area-pointer
                                                  sb-alien:system-area-pointer))
                 (sb-bsd-sockets:socket-file-descriptor socket)
                 1 17                   ; SOL_SOCKET, SO_PEERCRED
                 (sb-alien:alien-sap (sb-alien:addr credentials))
                 (sb-alien:alien-sap (sb-alien:addr size))))
         (sb-alien:deref credentials 1))))

(defun hex-port (address)
  "The port of a /proc/net/tcp address such as \"0100007F:1F90\"."
  (parse-integer address :start (1+ (position #\: address)) :radix 16))

(defun split-fields (line)
  "The fields of LINE between runs of spaces."
  (loop with start = 0
        for begin = (position #\Space line :start start :test-not #'char=)
        while begin
        collect (let ((end (or (position #\Space line :start begin) (length line))))
                  (prog1 (subseq line begin end) (setf start end)))))

(defun tcp-peer-uid (socket)
  "The user id that owns the other end of the loopback TCP connection
SOCKET, read from /proc/net/tcp (Linux), or nil."
  (let ((own-port (nth-value 1 (sb-bsd-sockets:socket-name socket)))
        (peer-port (nth-value 1 (sb-bsd-sockets:socket-peername socket))))
    (with-open-file (table "/proc/net/tcp")
      (read-line table nil)             ; the header
      (loop for line = (read-line table nil)
            while line
            do (let ((fields (split-fields line)))
                 ;; sl local rem st queues timer retransmits uid ...
                 (when (and (= (hex-port (second fields)) peer-port)
                            (= (hex-port (third fields)) own-port))
                   (return (parse-integer (nth 7 fields)))))))))

(defun serve-if-authentic (stream served lock serve what)
  "Call SERVE with STREAM if its first message is the secret and no other
connection was served first; else close it."
  (if (and (handler-case (progn (swank::authenticate-client stream) t)
             (error () nil))
           (sb-thread:with-mutex (lock)
             (unless (car served) (setf (car served) t))))
      (funcall serve stream)
      (progn (log-note "a connection to ~A did not know the secret" what)
             (close stream :abort t))))

(defun accept-cl-mcp (listener peer-uid serve &key seconds (what "Swank"))
  "Accept connections on LISTENER until one presents Swank's secret; call
SERVE with its stream, in the thread that checked the secret, and close
LISTENER.  PEER-UID tells whose an accepted socket is: another user's is
closed at once.  With SECONDS, give up after that long."
  (let ((fd (sb-bsd-sockets:socket-file-descriptor listener))
        (served (list nil))
        (lock (sb-thread:make-mutex :name "cl-mcp accept"))
        (until (and seconds (+ (get-internal-real-time)
                               (round (* seconds internal-time-units-per-second))))))
    (unwind-protect
         (loop until (sb-thread:with-mutex (lock) (car served))
               do (let ((left (and until (/ (- until (get-internal-real-time))
                                            internal-time-units-per-second))))
                    (when (and left (<= left 0))
                      (log-note "nobody who knew the secret connected to ~A" what)
                      (return))
                    (when (sb-sys:wait-until-fd-usable
                           fd :input (if left (min left *accept-poll-seconds*) *accept-poll-seconds*))
                      (let ((socket (sb-bsd-sockets:socket-accept listener)))
                        (cond ((null socket))
                              ((eql (handler-case (funcall peer-uid socket) (error () nil))
                                    (sb-posix:getuid))
                               (make-agent-thread #'serve-if-authentic (format nil "cl-mcp ~A" what)
                                                  (make-binary-stream socket) served lock serve what))
                              (t
                               (log-note "refused a connection to ~A from another user" what)
                               (sb-bsd-sockets:socket-close socket)))))))
      (swank/backend:close-socket listener))))

(defun serve-cl-mcp ()
  "Listen on a free loopback port for cl-mcp's Swank connection, served as
Swank serves any client (:spawn), and return the port, an integer.  The
listener closes once cl-mcp has connected (see `accept-cl-mcp')."
  (let ((listener (swank/backend:create-socket "127.0.0.1" 0 :backlog 16)))
    (swank::init-log-output)
    (swank::start-sentinel)
    (make-agent-thread #'accept-cl-mcp "cl-mcp accept" listener #'tcp-peer-uid
                       (lambda (stream)
                         (swank::serve-requests (swank::make-connection nil stream :spawn))))
    (swank/backend:local-port listener)))

(defun set-connection-nodelay ()
  "Set TCP_NODELAY on Swank's end of the current connection (Swank does not),
so that a reply written in several frames is not held back by delayed ACKs.
Return setsockopt's result: 0, or -1 when it failed."
  (sb-alien:with-alien ((one sb-alien:int 1))
    (sb-alien:alien-funcall
     (sb-alien:extern-alien "setsockopt"
                            (function sb-alien:int sb-alien:int sb-alien:int
                                      sb-alien:int (* t) sb-alien:unsigned))
     (sb-sys:fd-stream-fd (swank::connection.socket-io swank::*emacs-connection*))
     6 1 (sb-alien:addr one) 4)))   ; IPPROTO_TCP, TCP_NODELAY

;;;; The lane
;;;
;;; A faster road into an image cl-mcp owns.  A request on Swank's
;;; connection crosses three threads each way: Swank's reader, its control
;;; thread and a new worker thread per request (about 150 µs a round trip
;;; on a 2-core VM, nearly all of it threads waking each other).  The lane
;;; is a second Swank connection, single-threaded, served by one thread that
;;; reads a request, runs it and writes the reply itself (about 35 µs).
;;; Swank's own single-threaded serving will not do: its SBCL backend waits
;;; for input by sleeping 0.1 s between looks.  Here the thread blocks on
;;; the socket, and Swank's `handle-requests' does the rest.
;;;
;;; A request that will not come back to the lane soon (its evaluation waits
;;; at an error, is parked, or its thread is being ended) has answered from
;;; inside (`answer-directly'); its thread then hands the lane to a fresh
;;; thread and moves itself to the connection cl-mcp opened the lane from,
;;; so that whatever it still sends (Swank's late `:return', a debugger)
;;; goes there like any worker's, never interleaved with the lane's replies.

(defstruct (lane (:constructor make-lane (connection home)))
  "The lane: its connection, the connection it was opened from, and a token
naming the one thread that serves it."
  connection   ; the lane's single-threaded Swank connection
  home         ; the Swank connection the lane was opened from
  (owner nil)) ; a fresh token per serving thread: only its holder serves

(defvar *lane* nil "The lane, once cl-mcp has connected it.")

(defparameter *lane-accept-seconds* 10
  "How long `open-lane' listens for cl-mcp to connect.")

;;; The polling policy has one definition, cl-mcp's idle_poll.py, which
;;; `configure' brings here; until then the lane does not poll.

(defparameter *lane-idle-poll-microseconds* 0
  "How long the lane looks for the next request before its thread sleeps;
set by `configure' (0 where cl-mcp has one CPU).")

(defparameter *lane-poll-stolen-microseconds* nil
  "A yield that took this long handed the CPU to other work for a time
slice; set by `configure'.")

(defparameter *lane-poll-back-off-microseconds* nil
  "How long the lane does not poll after such a yield; set by `configure'.")

(defvar *lane-quiet-until* 0
  "No polling before this `monotonic-microseconds' time.")

(defun monotonic-microseconds ()
  "Linux's CLOCK_MONOTONIC (clock 1), in microseconds; Linux only, like the
lane's abstract socket.  Not `get-internal-real-time': SBCL reads the coarse
clock there, which moves in whole scheduler ticks (4 ms here), far too
coarse to time a poll."
  (multiple-value-bind (seconds nanoseconds) (sb-unix::clock-gettime 1)
    (+ (* seconds 1000000) (floor nanoseconds 1000))))

(defun input-soon-p (stream)
  "True when STREAM has input now or within `*lane-idle-poll-microseconds*'.
A thread that sleeps lets its CPU go idle, and waking an idle CPU again
costs more than a quick request takes (≈25 µs on the VMs measured, see
cl-mcp's docs/performance.md); a client that sends its next request as soon
as it has the answer finds the thread awake.  It yields between looks, so a
process sharing this CPU still runs, and it costs at most that long of CPU
per request.  When other work keeps the CPUs busy, a yield hands the CPU to
it for a whole time slice, where a sleeping thread would have been woken at
once: a yield that comes back that late stops the polling for a while."
  (or (listen stream)
      (let ((now (monotonic-microseconds)))
        (when (>= now *lane-quiet-until*)
          (loop with until = (+ now *lane-idle-poll-microseconds*)
                while (< now until)
                do (sb-thread:thread-yield)
                   (let ((yielded now))
                     (setf now (monotonic-microseconds))
                     (when (>= (- now yielded) *lane-poll-stolen-microseconds*)
                       (setf *lane-quiet-until* (+ now *lane-poll-back-off-microseconds*))
                       (return (listen stream))))
                thereis (listen stream))))))

(defun serve-lane (lane token)
  "Serve LANE's requests one at a time, for as long as TOKEN owns it."
  (let* ((connection (lane-connection lane))
         (stream (swank::connection.socket-io connection))
         (fd (sb-sys:fd-stream-fd stream)))
    (swank::with-connection (connection)
      ;; Swank pings after every 100 messages it sends and waits for the
      ;; pong in 0.1 s sleeps; the lane's client reads every reply at once.
      (setf swank::*send-counter* most-negative-fixnum)
      ;; Swank prints every event it handles into a ring of the last 40, for
      ;; debugging Swank: on the lane, each request and reply printed a
      ;; second time, and up to 40 printed results (each up to --max-output
      ;; characters) kept alive.
      (let ((swank::*enable-event-history* nil))
        (loop while (eq (lane-owner lane) token)
              do (unless (input-soon-p stream)
                   (sb-sys:wait-until-fd-usable fd :input))
                 (swank::handle-requests connection t))))))

(defun serve-new-lane (stream home)
  "Serve the lane cl-mcp connected on STREAM, in this thread."
  (let ((lane (make-lane (swank::make-singlethreaded-connection
                          :socket nil :socket-io stream :communication-style nil)
                         home))
        (token (list :owner)))
    (setf (lane-owner lane) token
          *lane* lane)
    (setf (sb-thread:thread-name sb-thread:*current-thread*) "cl-mcp lane")
    (serve-lane lane token)))

(defun open-lane ()
  "Listen on a fresh abstract Unix-domain socket (Linux's, which leaves no
file behind) for cl-mcp's connection (see `accept-cl-mcp': this user's,
with Swank's secret, within `*lane-accept-seconds*'), and serve it as the
lane, polling between requests as `configure' said; return the socket's
name, a string.  The name is no protection: every local user can read it
in /proc/net/unix.  A round trip through a Unix-domain socket skips the TCP
stack: about 10 µs less than loopback TCP here."
  (let ((listener (make-instance 'sb-bsd-sockets:local-abstract-socket :type :stream))
        (name (format nil "cl-mcp-lane-~D-~36R" (sb-unix:unix-getpid)
                      (random (expt 36 12) (make-random-state t))))
        (home swank::*emacs-connection*))
    (handler-bind ((error (lambda (condition)
                            (declare (ignore condition))
                            (sb-bsd-sockets:socket-close listener))))
      (sb-bsd-sockets:socket-bind listener name)
      (sb-bsd-sockets:socket-listen listener 16))
    (make-agent-thread #'accept-cl-mcp "cl-mcp lane accept" listener #'unix-peer-uid
                       (lambda (stream) (serve-new-lane stream home))
                       :seconds *lane-accept-seconds* :what "the lane")
    name))

(defun leave-lane ()
  "If this thread serves the lane, hand the lane to a fresh thread and move
this one to the lane's home connection: it will not be back soon."
  (let ((lane *lane*))
    (when (and lane (eq swank::*emacs-connection* (lane-connection lane)))
      (let ((token (list :owner)))
        (setf (lane-owner lane) token
              ;; The nearest binding is `serve-lane's own.
              swank::*emacs-connection* (lane-home lane))
        (make-agent-thread #'serve-lane "cl-mcp lane" lane token)))))

;;;; Evaluations and their mailboxes
;;;
;;; An evaluation runs in the thread that read the request that asked for
;;; it (the lane's, or a Swank worker), and usually just returns its report.
;;; When it stops at an error it answers that request itself (a `:return'
;;; sent from inside, see `answer-directly') and then waits there, its
;;; restarts intact, for commands that later requests bring through the
;;; evaluation's mailbox: invoke a restart, list frames, evaluate in a
;;; frame, abort.  Running in that thread saves handing every evaluation to
;;; a thread of its own and back (two thread wake-ups a call).  A waiting
;;; evaluation costs its thread and nothing else; at most `*max-suspended*'
;;; wait at once, each for at most `*suspend-seconds*'.

(defparameter *max-suspended* 8
  "Evaluations that may wait at an error at once; the oldest is aborted to
make room for a new one.")

(defparameter *suspend-seconds* 600
  "How long an evaluation waits at an error for its next command before it
aborts itself.")

(defvar *inside-evaluation* nil
  "True in the code an evaluation runs: an evaluate called from there is
nested, and its request belongs to the outer evaluation.")

(defvar *registry-lock* (sb-thread:make-mutex :name "cl-mcp evaluations")
  "Guards the image-wide records: the counter, `*suspended*', `*running*'
and the session record.")

(defvar *evaluation-counter* 0
  "The number of the last evaluation made in this image.")

(defstruct (evaluation (:constructor %make-evaluation))
  "One evaluation and the two mailboxes between its thread and its callers."
  (id 0 :type fixnum)
  code package capture-time max-output
  (timeout nil)
  (thread nil)
  ;; The id of the Swank request this evaluation has yet to answer, while
  ;; it may answer it from inside (see `answer-directly').  Only such an
  ;; evaluation may wait at an error: nobody else would hear of it.
  (continuation nil)
  (may-wait nil)
  (lock (sb-thread:make-mutex :name "cl-mcp evaluation"))
  (ready (sb-thread:make-waitqueue))
  (command nil)
  (report nil)
  (stdout nil) (stderr nil)
  (warnings '())
  (readings nil)
  (deadline nil)  ; the running stretch's token in *deadlines*
  (abort-restart nil)
  (condition nil)
  (waiting nil)
  (overflowed nil)
  (tag nil)
  (restarts '())
  (frames '()))

(defun make-evaluation (&rest initargs)
  "A new evaluation from INITARGS, numbered by the image-wide counter."
  (apply #'%make-evaluation
         :id (sb-thread:with-mutex (*registry-lock*) (incf *evaluation-counter*))
         initargs))

(defun put-slot (evaluation writer value)
  "Store VALUE with WRITER under EVALUATION's lock and wake its waiters."
  (sb-thread:with-mutex ((evaluation-lock evaluation))
    (funcall writer value evaluation)
    (sb-thread:condition-broadcast (evaluation-ready evaluation))))

(defun take-slot (evaluation reader writer &optional timeout)
  "Wait until READER's slot is set, clear it, and return its value; nil if
TIMEOUT seconds pass first."
  (let ((deadline (and timeout (+ (get-internal-real-time)
                                  (* timeout internal-time-units-per-second)))))
    (sb-thread:with-mutex ((evaluation-lock evaluation))
      (loop
        (let ((value (funcall reader evaluation)))
          (when value
            (funcall writer nil evaluation)
            (return value)))
        (let ((left (and deadline (/ (- deadline (get-internal-real-time))
                                     internal-time-units-per-second))))
          (when (and left (<= left 0)) (return nil))
          (unless (sb-thread:condition-wait (evaluation-ready evaluation)
                                            (evaluation-lock evaluation)
                                            :timeout left)
            ;; A wait that times out returns without the mutex (SBCL's
            ;; CONDITION-WAIT): take it back before looking again.
            (sb-thread:grab-mutex (evaluation-lock evaluation))))))))

(defun post-report (evaluation report)
  "Hand REPORT to the caller waiting on EVALUATION."
  (put-slot evaluation #'(setf evaluation-report) report))

(defun take-report-now (evaluation)
  "EVALUATION's report if one is posted, without waiting; else nil."
  (take-slot evaluation #'evaluation-report #'(setf evaluation-report) 0))

(defun await-report (evaluation)
  "The next report of EVALUATION.  Should its thread end without one (it
cannot, short of being killed), say so instead of waiting forever."
  (loop
    (let ((report (take-slot evaluation #'evaluation-report #'(setf evaluation-report) 1)))
      (when report (return report))
      (let ((thread (evaluation-thread evaluation)))
        (when (and thread (not (sb-thread:thread-alive-p thread)))
          (return (or (take-slot evaluation #'evaluation-report #'(setf evaluation-report) 0)
                      (command-error "CL-MCP:ABORTED" "The evaluation's thread ended."))))))))

(defun post-command (evaluation command)
  "Hand COMMAND to EVALUATION's thread, waiting at its error."
  (put-slot evaluation #'(setf evaluation-command) command))

(defun await-command (evaluation timeout)
  "The next command for EVALUATION, or nil after TIMEOUT seconds."
  (take-slot evaluation #'evaluation-command #'(setf evaluation-command) timeout))

;;;; The registries of waiting and running evaluations

(defvar *suspended* '() "Evaluations waiting at an error, newest first.")

(defun register-suspended (evaluation)
  "Record EVALUATION as waiting; true unless waiting is switched off.  The
oldest waiting evaluation is aborted when there are too many."
  (when (plusp *max-suspended*)
    (let ((evicted '()))
      (sb-thread:with-mutex (*registry-lock*)
        (push evaluation *suspended*)
        (loop while (> (length *suspended*) *max-suspended*)
              do (push (car (last *suspended*)) evicted)
                 (setf *suspended* (butlast *suspended*))))
      (dolist (old evicted)
        (post-command old (list :abort)))
      t)))

(defun forget-evaluation (evaluation)
  "EVALUATION no longer waits: take it off `*suspended*'."
  (sb-thread:with-mutex (*registry-lock*)
    (setf *suspended* (remove evaluation *suspended*))))

(defun find-suspended (id)
  "The waiting evaluation numbered ID, or the newest when ID is nil."
  (sb-thread:with-mutex (*registry-lock*)
    (if id
        (find id *suspended* :key #'evaluation-id)
        (first *suspended*))))

(defun no-suspended-report (id)
  "The report that no evaluation ID (or none at all, when ID is nil) waits."
  (command-error "CL-MCP:NO-SUSPENDED-EVALUATION"
                 (if id
                     (format nil "No evaluation ~D is waiting at an error (it finished, ~
                                  was aborted, or its time ran out)." id)
                     "No evaluation is waiting at an error.")))

(defmacro with-suspended ((evaluation id) &body body)
  "Run BODY with EVALUATION bound to the waiting evaluation ID (the newest
when nil); without one, return `no-suspended-report' instead."
  `(let ((,evaluation (find-suspended ,id)))
     (if ,evaluation
         (progn ,@body)
         (no-suspended-report ,id))))

(defvar *running* '()
  "Evaluations a caller is waiting on, by the caller's tag.")

(defun forget-running (tag object)
  "Forget that OBJECT runs under TAG (only OBJECT: another session attached
to the same image may use the same tag)."
  (when tag
    (sb-thread:with-mutex (*registry-lock*)
      (setf *running* (remove-if (lambda (entry)
                                   (and (equal (car entry) tag) (eq (cdr entry) object)))
                                 *running*)))))

(defmacro with-running ((tag object) &body body)
  "Run BODY with OBJECT (an evaluation whose report BODY waits for, or the
thread of a load) findable under TAG, for `cancel-evaluation' and
`output-tail'."
  (let ((tag-var (gensym "TAG")) (object-var (gensym "OBJECT")))
    `(let ((,tag-var ,tag) (,object-var ,object))
       (when ,tag-var
         (sb-thread:with-mutex (*registry-lock*)
           (push (cons ,tag-var ,object-var) *running*)))
       (unwind-protect (progn ,@body)
         (forget-running ,tag-var ,object-var)))))

(defun find-running (tag)
  "The evaluation, or for a load the thread, a caller waits on under TAG."
  (sb-thread:with-mutex (*registry-lock*)
    (cdr (assoc tag *running* :test #'equal))))

;;;; Answering a request from inside
;;;
;;; When the evaluation's thread will not return to its Swank request in time
;;; (it waits at an error, is parked, or is being ended), it sends that
;;; request's `:return' itself.  Swank's own `:return' for the same request
;;; follows when the thread finally unwinds, and cl-mcp ignores it: the
;;; request is no longer pending.

(defun answer-directly (evaluation report)
  "Answer EVALUATION's Swank request with REPORT now, from inside; true if
there was a request left to answer."
  ;; No interrupt (a deadline, a cancel) may land between taking the
  ;; request and handing its answer to Swank's control thread.
  (sb-sys:without-interrupts
    (let ((id (evaluation-continuation evaluation)))
      (when id
        (forget-running (evaluation-tag evaluation) evaluation)
        (setf swank::*pending-continuations* (remove id swank::*pending-continuations*))
        (swank::send-to-emacs (list :return sb-thread:*current-thread* (list :ok report) id))
        (setf (evaluation-continuation evaluation) nil)
        (leave-lane)
        t))))

(defun deliver-report (evaluation report)
  "REPORT to whoever waits for it: EVALUATION's own request, while it is
unanswered, or else the caller of a command."
  (or (answer-directly evaluation report)
      (post-report evaluation report)))

;;;; Deadlines
;;;
;;; One watchdog thread interrupts an evaluation whose stretch of running
;;; outlasts its timeout; the deadline is dropped while the evaluation waits
;;; at an error, and set again for each stretch.  Why not an SBCL timer per
;;; stretch: scheduling and cancelling one from a fresh Swank worker thread
;;; cost ~40 µs a call, a fifth of a whole round trip.  The watchdog looks
;;; every `*watchdog-tick*' seconds, so deadlines are that precise.  It
;;; dozes on a condition variable once no deadline has been seen for
;;; `*watchdog-linger*' seconds, so a burst of calls wakes it once.  Its
;;; interrupt goes to `stop-at-error' (below), which stops the deadline in
;;; turn.

(defvar *deadline-lock* (sb-thread:make-mutex :name "cl-mcp deadlines")
  "Guards `*deadlines*' and the watchdog's state.")

(defvar *deadline-set* (sb-thread:make-waitqueue)
  "Notified when a deadline is set while the watchdog dozes.")

(defvar *deadlines* '()
  "(INTERNAL-TIME EVALUATION TOKEN) for each running stretch with a deadline.")

(defvar *watchdog* nil
  "The watchdog thread, once a deadline has started it.")

(defvar *watchdog-dozing* nil
  "True while the watchdog waits on `*deadline-set*'.")

(defparameter *watchdog-tick* 0.1
  "Seconds between the watchdog's looks at the deadlines.")

(defparameter *watchdog-linger* 5
  "Seconds without a deadline after which the watchdog dozes.")

(defun stop-deadline (evaluation)
  "Drop the deadline of EVALUATION's stretch, if it has one."
  (let ((token (shiftf (evaluation-deadline evaluation) nil)))
    (when token
      (sb-thread:with-mutex (*deadline-lock*)
        (setf *deadlines* (delete token *deadlines* :key #'third))))))

(defun interrupt-at-deadline (evaluation token)
  "Stop EVALUATION's thread at its deadline, if the stretch TOKEN stands for
is still running when the interrupt lands.

The SB-EXT:TIMEOUT is not signalled: a handler in the user's code (a retry
loop that catches SERIOUS-CONDITION or CONDITION) would take it and run on.
It goes straight to `stop-at-error', which reports it and either waits there,
with a CONTINUE restart that carries on, or aborts: a throw, which no handler
can stop and which runs every UNWIND-PROTECT cleanup on its way out.  Only
code that blocks interrupts (WITHOUT-INTERRUPTS) never hears it."
  (handler-case
      (sb-thread:interrupt-thread
       (evaluation-thread evaluation)
       (lambda ()
         (when (eq (evaluation-deadline evaluation) token)
           ;; An interruption runs with interrupts disabled; waiting here at
           ;; the error must still hear a cancel, and a continued evaluation
           ;; its next deadline.
           (sb-sys:with-interrupts
             (with-simple-restart (continue "Continue the evaluation.")
               (stop-at-error evaluation
                              (make-condition 'sb-ext:timeout :seconds (first token))))))))
    (sb-thread:interrupt-thread-error () nil)))

(defun watchdog-loop ()
  "The watchdog thread: interrupt each evaluation whose deadline has come,
and doze while there are none."
  (let ((last-seen (get-internal-real-time)))
    (loop
      (let ((expired '()))
        (sb-thread:with-mutex (*deadline-lock*)
          (let ((now (get-internal-real-time)))
            (setf *deadlines* (delete-if (lambda (entry)
                                           (when (<= (first entry) now)
                                             (push entry expired)))
                                         *deadlines*))
            (cond ((or *deadlines* expired) (setf last-seen now))
                  ((> (- now last-seen) (* *watchdog-linger* internal-time-units-per-second))
                   (setf *watchdog-dozing* t)
                   (loop until *deadlines*
                         do (sb-thread:condition-wait *deadline-set* *deadline-lock*))
                   (setf *watchdog-dozing* nil
                         last-seen (get-internal-real-time))))))
        (loop for (nil evaluation token) in expired
              do (interrupt-at-deadline evaluation token))
        (sleep *watchdog-tick*)))))

(defun start-stretch (evaluation timeout)
  "Begin a stretch of running: fresh output capture, readings for timing,
and a deadline TIMEOUT seconds away."
  (reset-capture (evaluation-stdout evaluation))
  (reset-capture (evaluation-stderr evaluation))
  (setf (evaluation-warnings evaluation) '()
        (evaluation-timeout evaluation) timeout
        (evaluation-readings evaluation)
        (list (get-internal-real-time) (get-internal-run-time)
              sb-ext:*gc-run-time* (sb-ext:get-bytes-consed)))
  (when (and timeout (plusp timeout))
    (let ((token (list timeout))
          (due (+ (get-internal-real-time)
                  (round (* timeout internal-time-units-per-second)))))
      (setf (evaluation-deadline evaluation) token)
      (sb-thread:with-mutex (*deadline-lock*)
        (push (list due evaluation token) *deadlines*)
        (unless (and *watchdog* (sb-thread:thread-alive-p *watchdog*))
          (setf *watchdog* (make-agent-thread #'watchdog-loop "cl-mcp deadline watchdog")))
        (when *watchdog-dozing*
          (sb-thread:condition-notify *deadline-set*))))))

;;;; What the session creates, in an image it shares (attach mode)
;;;
;;; In the programmer's image, `soft-reset' must remove what cl-mcp's
;;; evaluations created and nothing else, so each evaluation notes the
;;; CL-USER symbols and the packages it creates.

(defvar *track-session* nil
  "True in an attached image: remember what cl-mcp's evaluations create,
so that a soft reset removes exactly that.")

(defvar *connections* '()
  "cl-mcp's Swank connections to an attached image.")

(defvar *session-symbols* '()
  "Symbols of CL-USER first interned by a cl-mcp evaluation.")

(defvar *session-created-packages* '()
  "Packages created by a cl-mcp evaluation.")

(defun present-symbols (package)
  "A set (an EQ hash table) of the symbols whose home is PACKAGE."
  (let ((symbols (make-hash-table :test #'eq)))
    (do-symbols (symbol package)
      (when (eq (symbol-package symbol) package)
        (setf (gethash symbol symbols) t)))
    symbols))

(defun call-tracking-session (thunk)
  "Call THUNK, recording the CL-USER symbols and the packages it creates
(also when it exits non-locally)."
  (let* ((user (find-package "COMMON-LISP-USER"))
         (symbols-before (present-symbols user))
         (packages-before (list-all-packages)))
    (unwind-protect (funcall thunk)
      (sb-thread:with-mutex (*registry-lock*)
        (do-symbols (symbol user)
          (when (and (eq (symbol-package symbol) user)
                     (not (gethash symbol symbols-before)))
            (pushnew symbol *session-symbols*)))
        (dolist (package (set-difference (list-all-packages) packages-before))
          (pushnew package *session-created-packages*))))))

(defun forget-definitions (symbol)
  "Remove the function, macro, variable and class SYMBOL names (a constant
stays: it cannot be unbound)."
  (handler-case
      (progn
        (when (fboundp symbol) (fmakunbound symbol))
        (when (fboundp `(setf ,symbol)) (fmakunbound `(setf ,symbol)))
        (when (and (boundp symbol) (not (constantp symbol))) (makunbound symbol))
        (when (find-class symbol nil) (setf (find-class symbol) nil)))
    (error (c) (log-note "could not remove ~S: ~A" symbol c))))

;;;; The evaluation's thread
;;;
;;; Read and evaluate the code, and report how it went.  An error sends the
;;; thread to `stop-at-error' (next section), which reports it and may keep
;;; the thread waiting there.

(defun timing-since (real run gc bytes)
  "The (REAL-MS RUN-MS GC-MS BYTES) elapsed since the given readings."
  (flet ((ms (ticks) (round (* 1000 ticks) internal-time-units-per-second)))
    (list (ms (- (get-internal-real-time) real))
          (ms (- (get-internal-run-time) run))
          (ms (- sb-ext:*gc-run-time* gc))
          (- (sb-ext:get-bytes-consed) bytes))))

(defun stretch-report (evaluation status &rest more)
  "The plist describing the stretch that just ended.  Empty output, no
warnings and an unchanged package are left out: the reply is printed and
read on every call."
  (let* ((stdout (evaluation-stdout evaluation))
         (stderr (evaluation-stderr evaluation))
         (warnings (warning-entries (evaluation-warnings evaluation)
                                    (evaluation-condition evaluation)))
         (report (list* :status status :package (package-name *package*) more)))
    (flet ((add (key value) (setf report (list* key value report))))
      (when (plusp (kept stdout)) (add :stdout (stream-text stdout)))
      (when (plusp (dropped stdout)) (add :stdout-dropped (dropped stdout)))
      (when (plusp (kept stderr)) (add :stderr (stream-text stderr)))
      (when (plusp (dropped stderr)) (add :stderr-dropped (dropped stderr)))
      (when warnings (add :warnings warnings))
      (unless (eq *package* (evaluation-package evaluation)) (add :package-changed t))
      (when (evaluation-capture-time evaluation)
        (add :timing (apply #'timing-since (evaluation-readings evaluation)))))
    report))

(defun image-exiting-p ()
  "True once SB-EXT:EXIT has begun to shut the image down."
  (let ((flag (find-symbol "*EXIT-IN-PROGRESS*" "SB-SYS")))
    (and flag (boundp flag) (symbol-value flag) t)))

(defparameter *control-stack-exhausted*
  (first (existing-symbols '(("SB-KERNEL" "CONTROL-STACK-EXHAUSTED"))))
  "SBCL's condition class for a control stack overflow.")

(defun control-stack-exhausted-p (condition)
  "True when CONDITION is a control stack overflow."
  (and *control-stack-exhausted* (typep condition *control-stack-exhausted*)))

(defun park-thread ()
  "Keep this thread alive, idle, for the rest of the image's life.

Why: SBCL 2.2.9 reuses the memory of an exited thread for the next one.
After a stack overflow the guard page's bookkeeping in that memory is
stale, and the next thread to overflow there kills the whole image
(\"control_stack_guard_page_protected not NIL\").  A thread that never
exits is never reused; it costs its stack and nothing else."
  (setf (sb-thread:thread-name sb-thread:*current-thread*)
        "cl-mcp evaluation (parked after a stack overflow)")
  (loop (sleep 3600)))

(defun %read-and-evaluate (evaluation)
  "The loop of `read-and-evaluate'."
  (let ((stream (make-string-input-stream (evaluation-code evaluation)))
        (eof (make-symbol "EOF"))
        (values '()))
    (loop
      (let* ((start (file-position stream))
             (form (handler-case (read-next-form stream eof)
                     (serious-condition (c)
                       (return (list :reader-error (describe-error c nil :reading t)))))))
        (when (eq form eof)
          (return (list :ok values)))
        (setf values (multiple-value-list (%eval-form form)))
        ;; A definition's source is kept for find-definition (see
        ;; `note-repl-definitions', in the development tools' section).
        (when (consp form)
          (note-repl-definitions form evaluation (evaluation-code evaluation)
                                 start (file-position stream)))))))

(defun read-and-evaluate (evaluation)
  "Read the forms of the code one after another and evaluate each; return
(:ok VALUES-OF-THE-LAST) or (:reader-error ERROR-PLIST)."
  (if *track-session*
      (call-tracking-session (lambda () (%read-and-evaluate evaluation)))
      (%read-and-evaluate evaluation)))

(defun %run-evaluation (evaluation)
  "Evaluate EVALUATION's code with its output captured, its ABORT restart
set up and every error sent to `stop-at-error'; post the report of a run
that ends without waiting at an error."
  (setf (evaluation-stdout evaluation) (make-capped-output-stream (evaluation-max-output evaluation))
        (evaluation-stderr evaluation) (make-capped-output-stream (evaluation-max-output evaluation)))
  (let ((*package* (evaluation-package evaluation))
        ;; Printing a circular structure must end: without this, PRINT of a
        ;; circular list fills the heap in the pretty printer's buffer.
        (*print-circle* t))
    (with-standard-streams ((evaluation-stdout evaluation) (evaluation-stderr evaluation))
      (let ((outcome
              (catch evaluation
                (restart-bind ((abort (lambda (&optional reported)
                                        (throw evaluation (list :aborted reported)))
                                 :report-function
                                 (lambda (stream) (write-string "Abort this evaluation." stream))))
                  (setf (evaluation-abort-restart evaluation) (find-restart 'abort))
                  (flet ((stop (condition) (stop-at-error evaluation condition)))
                    (handler-bind ((warning
                                     (lambda (w)
                                       (push w (evaluation-warnings evaluation))
                                       (muffle-warning w)))
                                   (serious-condition #'stop))
                      (with-debugger-calling (#'stop)
                        (start-stretch evaluation (evaluation-timeout evaluation))
                        ;; The deadline ends while the handlers still stand, so
                        ;; an interrupt that lands as the code finishes is
                        ;; either a timeout like any other or nothing.
                        (unwind-protect (let ((*inside-evaluation* t))
                                          (read-and-evaluate evaluation))
                          (stop-deadline evaluation)))))))))
        (stop-deadline evaluation)
        (forget-evaluation evaluation)
        (setf (evaluation-abort-restart evaluation) nil)
        (destructuring-bind (status &optional detail) outcome
          (ecase status
            (:ok (post-report evaluation
                              (stretch-report evaluation :ok
                                              :values (print-values detail (evaluation-max-output evaluation)))))
            (:reader-error (post-report evaluation (stretch-report evaluation :error :error detail)))
            (:aborted
             (unless detail
               (post-report evaluation
                            (stretch-report evaluation :aborted
                                            :error (list :type "CL-MCP:ABORTED"
                                                         :message "The evaluation was aborted."
                                                         :backtrace nil)))))))))))

(defun run-evaluation (evaluation)
  "The body of an evaluation's thread: read and evaluate the code, and post
the final report (unless it was posted already, at an error).  Whatever
happens, the caller hears back: a failure of this agent itself is reported
as CL-MCP:INTERNAL-ERROR rather than leaving the caller waiting."
  (let ((done nil))
    (unwind-protect
         (handler-case
             (progn (%run-evaluation evaluation)
                    (setf done t))
           (serious-condition (c)
             (post-report evaluation (command-error "CL-MCP:INTERNAL-ERROR"
                                                    (condition-message c)))
             (setf done t)))
      (forget-evaluation evaluation)
      (stop-deadline evaluation)
      (unless done
        (post-report evaluation
                     (if (image-exiting-p)
                         (command-error "CL-MCP:IMAGE-EXITING"
                                        "The image is exiting (SB-EXT:EXIT was called).")
                         (command-error "CL-MCP:ABORTED" "The evaluation's thread was ended."))))
      (when (and (evaluation-continuation evaluation)
                 (or (not done) (evaluation-overflowed evaluation)))
        ;; This thread is being ended, or is about to park: it will not
        ;; return to its request.
        (answer-directly evaluation (take-report-now evaluation)))
      ;; A caller that could not be answered from inside (not cl-mcp) must
      ;; get its reply the normal way, so its thread cannot be parked.
      (when (and (evaluation-overflowed evaluation) (evaluation-may-wait evaluation))
        (park-thread)))))

;;;; Waiting at an error
;;;
;;; `stop-at-error' runs inside the handler, where the condition was
;;; signalled, before anything unwinds; an evaluation that may wait then
;;; stays in `command-loop', carrying out the commands that come through
;;; its mailbox, until one of them leaves the error.

(defun evaluation-restarts-for (evaluation condition)
  "The restarts for CONDITION from the user's code up to this evaluation's
own ABORT; the thread's restarts beyond it are not the user's business."
  (let* ((restarts (compute-restarts condition))
         (ours (position (evaluation-abort-restart evaluation) restarts)))
    (if ours (subseq restarts 0 (1+ ours)) restarts)))

(defun restart-entries (restarts)
  "RESTARTS as (NAME DESCRIPTION) lists."
  (loop for restart in restarts
        collect (list (let ((name (restart-name restart)))
                        (if name (symbol-name name) "(unnamed)"))
                      (one-line (safe-print restart #'princ-to-string) 200))))

(defun find-restart-designator (evaluation designator)
  "The restart DESIGNATOR names: an index into the listed restarts, or a
restart name (case-insensitive)."
  (let ((restarts (evaluation-restarts evaluation)))
    (etypecase designator
      (integer (nth designator restarts))
      (string (find-if (lambda (r)
                         (and (restart-name r)
                              (string-equal (symbol-name (restart-name r)) designator)))
                       restarts)))))

(defun evaluate-value-codes (codes)
  "The values of the forms in CODES, or nil and an error report."
  (handler-case
      (values (loop for code in codes
                    collect (eval (let ((*read-eval* t)) (read-from-string code))))
              nil)
    (serious-condition (c)
      (values nil (command-error (condition-type-name c)
                                 (format nil "Could not compute a restart value: ~A"
                                         (condition-message c)))))))

(defun resume (evaluation designator value-codes timeout)
  "Invoke the restart DESIGNATOR with the values of VALUE-CODES (strings of
Lisp code, evaluated here).  A failure is reported and the evaluation keeps
waiting."
  (let ((restart (find-restart-designator evaluation designator)))
    (unless restart
      (return-from resume
        (post-report evaluation (command-error "CL-MCP:NO-SUCH-RESTART"
                                               (format nil "No restart ~S is available; ~
                                                            the evaluation still waits."
                                                       designator)))))
    (multiple-value-bind (values failure) (evaluate-value-codes value-codes)
      (when failure
        (return-from resume (post-report evaluation failure)))
      (let ((condition (evaluation-condition evaluation)))
        (forget-evaluation evaluation)
        (setf (evaluation-condition evaluation) nil
              (evaluation-waiting evaluation) nil)
        (start-stretch evaluation timeout)
        (flet ((keep-waiting (message)
                 (stop-deadline evaluation)
                 (setf (evaluation-condition evaluation) condition
                       (evaluation-waiting evaluation) t)
                 (register-suspended evaluation)
                 (post-report evaluation (command-error "CL-MCP:RESTART-FAILED" message))))
          ;; A restart that transfers control never comes back here.  One
          ;; that refuses the values does so before control leaves.
          (handler-case (apply #'invoke-restart restart values)
            (program-error (c)
              (return-from resume
                (keep-waiting (format nil "Restart ~A did not accept ~D value~:P (~A); ~
                                           the evaluation still waits."
                                      (restart-name restart) (length values)
                                      (condition-message c))))))
          (keep-waiting (format nil "Restart ~A returned without leaving the error; ~
                                     the evaluation still waits."
                                (restart-name restart))))))))

(defun frames-report (evaluation &optional (count *backtrace-frame-limit*))
  "Frames of the waiting evaluation with their local variables."
  (list :status :ok
        :frames (loop for frame in (evaluation-frames evaluation)
                      for line in (frame-lines (evaluation-frames evaluation)
                                               (evaluation-condition evaluation)
                                               count)
                      collect (list line (frame-locals frame)))))

(defun call-with-deadline-throw (timeout thunk record-warning)
  "Call THUNK; return (:ok VALUES), (:error CONDITION) or (:timeout).  Used
for work done while an evaluation waits at an error, where no condition may
be left to the debugger and the deadline unwinds instead of signalling."
  (catch 'deadline-passed
    (let* ((live t)   ; the timer's interrupt may land after the unschedule
           (timer (and timeout (plusp timeout)
                       (sb-ext:make-timer (lambda ()
                                            (when live (throw 'deadline-passed (list :timeout))))
                                          :name "cl-mcp frame deadline"
                                          :thread sb-thread:*current-thread*))))
      (when timer (sb-ext:schedule-timer timer timeout))
      (unwind-protect
           (block call
             (flet ((fail (condition) (return-from call (list :error condition))))
               (handler-bind ((warning (lambda (w)
                                         (funcall record-warning w)
                                         (muffle-warning w)))
                              (serious-condition #'fail))
                 (with-debugger-calling (#'fail)
                   (list :ok (multiple-value-list (funcall thunk)))))))
        (setf live nil)
        (when timer (sb-ext:unschedule-timer timer))))))

(defun frame-eval-report (evaluation index code &optional timeout)
  "Evaluate the forms of CODE in frame INDEX of the waiting evaluation, with
that frame's local variables in scope, for at most TIMEOUT seconds."
  (let ((frame (nth index (evaluation-frames evaluation))))
    (unless frame
      (return-from frame-eval-report
        (command-error "CL-MCP:NO-SUCH-FRAME" (format nil "There is no frame ~D." index))))
    (start-stretch evaluation nil)
    (let ((outcome (call-with-deadline-throw
                    timeout
                    (lambda ()
                      (let ((form (handler-case (read-all-forms code)
                                    (serious-condition (c)
                                      (return-from frame-eval-report
                                        (stretch-report evaluation :error
                                                        :error (describe-error c nil :reading t)))))))
                        (sb-di:eval-in-frame frame form)))
                    (lambda (w) (push w (evaluation-warnings evaluation))))))
      (ecase (first outcome)
        (:ok (stretch-report evaluation :ok
                             :values (print-values (second outcome)
                                                   (evaluation-max-output evaluation))))
        (:error (stretch-report evaluation :error :error (describe-error (second outcome) nil)))
        (:timeout (stretch-report evaluation :error
                                  :error (list :type "SB-EXT:TIMEOUT"
                                               :message (format nil "Evaluation in the frame exceeded ~
                                                                     its deadline of ~A; the evaluation ~
                                                                     still waits."
                                                                (seconds-text timeout))
                                               :backtrace nil)))))))

(defun command-loop (evaluation)
  "Wait at the error for commands until one continues or aborts the
evaluation, or until `*suspend-seconds*' pass."
  (setf (evaluation-waiting evaluation) t)
  (loop
    (let ((command (await-command evaluation *suspend-seconds*)))
      ;; SBCL binds its hook to nil while a hook runs, and this loop may run
      ;; inside one (after BREAK): bind it again for the commands.
      (with-debugger-calling ((lambda (condition) (stop-at-error evaluation condition)))
        (unless command
          (forget-evaluation evaluation)
          ;; A caller that found it just before it was forgotten still hears back.
          (when (await-command evaluation 0)
            (post-report evaluation (no-suspended-report (evaluation-id evaluation))))
          (invoke-restart (evaluation-abort-restart evaluation) t))
        (catch 'command-failed
          (destructuring-bind (kind &rest arguments) command
            (ecase kind
              (:restart (apply #'resume evaluation arguments))
              (:backtrace (post-report evaluation (apply #'frames-report evaluation arguments)))
              (:eval-in-frame (post-report evaluation (apply #'frame-eval-report evaluation arguments)))
              (:abort (forget-evaluation evaluation)
                      (invoke-restart (evaluation-abort-restart evaluation) nil)))))))))

(defun stop-at-error (evaluation condition)
  "Called where CONDITION was signalled, before anything unwinds.  Report
the error with its backtrace and restarts; then either wait here for
commands or, when no more evaluations may wait, abort."
  (when (evaluation-waiting evaluation)
    ;; A failure while carrying out a command, in this agent's own code.
    (post-report evaluation (command-error "CL-MCP:INTERNAL-ERROR" (condition-message condition)))
    (throw 'command-failed nil))
  (stop-deadline evaluation)
  (when (control-stack-exhausted-p condition)
    (setf (evaluation-overflowed evaluation) t))
  (let ((frames (error-frames)))
    (setf (evaluation-condition evaluation) condition
          (evaluation-frames evaluation) frames
          (evaluation-restarts evaluation) (evaluation-restarts-for evaluation condition))
    (let* ((waiting (and (evaluation-may-wait evaluation)
                         (register-suspended evaluation)))
           (report (stretch-report
                    evaluation :error
                    :error (describe-error condition
                                           (frame-lines frames condition *backtrace-frame-limit*)
                                           :timeout (evaluation-timeout evaluation))
                    :restarts (restart-entries (evaluation-restarts evaluation))
                    :evaluation (and waiting (evaluation-id evaluation)))))
      (if waiting (deliver-report evaluation report) (post-report evaluation report))
      (if waiting
          (command-loop evaluation)
          (invoke-restart (evaluation-abort-restart evaluation) t)))))

;;;; Entry points: evaluations

(defun cl-mcp-request ()
  "The id of the Swank request this thread serves, when cl-mcp sent it (any
request, in an image cl-mcp owns) and no evaluation in this thread has it
already; else nil, and an error in the evaluation is reported without
waiting, because nobody could send it commands."
  (and (not *inside-evaluation*)
       (or (not *track-session*) (member swank::*emacs-connection* *connections*))
       (first swank::*pending-continuations*)))

(defun evaluate (code &key package (explicit-package nil) (capture-time nil)
                        (timeout nil) (max-output 1000000) (tag nil))
  "Read and evaluate the forms of CODE one after another, in PACKAGE, and
return a plist describing the outcome:

  :status   :ok, :error, or :aborted (through its ABORT restart)
  :values   printed values of the last form (strings)
  :stdout, :stderr   captured output, with :stdout-dropped and
            :stderr-dropped counting characters beyond MAX-OUTPUT
  :warnings list of (TYPE MESSAGE)
  :error    (:type :message :backtrace) when :status is :error
  :restarts (NAME DESCRIPTION) lists, and :evaluation, the number of the
            evaluation now waiting at the error (when it waits)
  :package  name of *package* afterwards, :package-changed whether the
            code changed it (IN-PACKAGE)
  :timing   (REAL-MS RUN-MS GC-MS BYTES) when CAPTURE-TIME

An unknown PACKAGE is an error when EXPLICIT-PACKAGE, and falls back to
CL-USER otherwise (the session's package may have been deleted).  TIMEOUT,
in seconds, interrupts the evaluation with SB-EXT:TIMEOUT.  TAG, any
string or integer, names the evaluation for `cancel-evaluation' and
`output-tail' while the caller waits.  An evaluation that waits at its
error has sent that plist as its request's answer from inside; what this
function returns then, :ANSWERED, reaches nobody."
  (let ((target (find-package-designator package)))
    (when (and (null target) explicit-package)
      (return-from evaluate
        (list :status :error
              :error (list :type "PACKAGE-ERROR"
                           :message (format nil "The package ~S does not exist." package)
                           :backtrace nil)
              :package "COMMON-LISP-USER")))
    (let* ((request (cl-mcp-request))
           (evaluation (make-evaluation :code code
                                        :package (or target (find-package "COMMON-LISP-USER"))
                                        :capture-time capture-time
                                        :timeout timeout
                                        :max-output max-output
                                        :tag tag
                                        :thread sb-thread:*current-thread*
                                        :continuation request
                                        :may-wait (and request t))))
      (with-running (tag evaluation)
        (run-evaluation evaluation)
        (if (and request (null (evaluation-continuation evaluation)))
            ;; Answered from inside already; Swank's reply to this is ignored.
            :answered
            (take-report-now evaluation))))))

(defun invoke-restart-of (id restart &key values (timeout nil) (tag nil))
  "Invoke RESTART (an index into the listed restarts, or a name) of the
waiting evaluation ID (the newest when nil) with the values of VALUES, a
list of code strings.  The evaluation runs on with a deadline of TIMEOUT
seconds, findable under TAG as in `evaluate'; return its next report, a
plist as `evaluate' returns (its outcome, or a new error), or an error
report when no evaluation ID waits or the restart cannot be invoked (the
evaluation then still waits)."
  (with-suspended (evaluation id)
    (setf (evaluation-tag evaluation) tag)
    (with-running (tag evaluation)
      (post-command evaluation (list :restart restart values timeout))
      (await-report evaluation))))

(defun backtrace-of (id &key (count *backtrace-frame-limit*))
  "The first COUNT frames of the waiting evaluation ID (the newest when
nil), as (:evaluation N :status :ok :frames ((LINE ((NAME VALUE) ...))
...)), each frame a printed call with the local variables the compiler
kept, all strings; or an error report when no evaluation ID waits."
  (with-suspended (evaluation id)
    (post-command evaluation (list :backtrace count))
    (list* :evaluation (evaluation-id evaluation) (await-report evaluation))))

(defun eval-in-frame-of (id frame code &key (timeout 30))
  "Evaluate the forms of CODE (a string) in frame number FRAME (counted as
`backtrace-of' lists them) of the waiting evaluation ID (the newest when
nil), with that frame's local variables in scope, for at most TIMEOUT
seconds.  Return a plist as `evaluate' returns; the evaluation keeps
waiting whatever happens."
  (with-suspended (evaluation id)
    (post-command evaluation (list :eval-in-frame frame code timeout))
    (await-report evaluation)))

(defun interrupt-running (running)
  "Ask the thread of RUNNING (an evaluation, or a load's thread) to abandon
its work; true once asked.  An evaluation that has not yet set up its ABORT
restart is asked again later.  The interrupt acts only while that restart
is active, so a thread that has moved on to other work is left alone."
  (handler-case
      (etypecase running
        (evaluation
         (let ((restart (evaluation-abort-restart running)))
           (when restart
             (sb-thread:interrupt-thread (evaluation-thread running)
                                         (lambda ()
                                           (when (find-restart restart)
                                             (invoke-restart restart nil))))
             t)))
        (sb-thread:thread
         (sb-thread:interrupt-thread running
                                     (lambda ()
                                       (ignore-errors (throw 'load-cancelled nil))))
         t))
    ;; The thread finished in the meantime: nothing to cancel.
    (sb-thread:interrupt-thread-error () t)))

(defun cancel-evaluation (tag)
  "Abort the evaluation (or the load) a caller waits on under TAG, and wait
(up to 5 s) until that caller has its answer.  Return t if there was one,
else nil."
  (let ((running (find-running tag)))
    (when running
      (let ((interrupted nil))
        (loop repeat 500
              while (find-running tag)
              do (unless interrupted
                   (setf interrupted (interrupt-running running)))
                 (sleep 0.01)))
      t)))

(defun output-tail (tag)
  "The last non-empty line of output, at most 200 characters, of the
evaluation a caller waits on under TAG; nil when there is none."
  (let ((evaluation (find-running tag)))
    (and (evaluation-p evaluation)
         (evaluation-stdout evaluation)
         (last-line (evaluation-stdout evaluation)))))

(defun abort-all ()
  "Abort every waiting evaluation; return how many there were."
  (let ((all (sb-thread:with-mutex (*registry-lock*) (shiftf *suspended* '()))))
    (dolist (evaluation all)
      (post-command evaluation (list :abort)))
    (length all)))

(defun configure (&key (max-suspended *max-suspended*)
                        (suspend-seconds *suspend-seconds*)
                        (idle-poll-microseconds *lane-idle-poll-microseconds*)
                        (poll-stolen-microseconds *lane-poll-stolen-microseconds*)
                        (poll-back-off-microseconds *lane-poll-back-off-microseconds*))
  "Set the image-wide settings of the session; return t.  MAX-SUSPENDED
evaluations may wait at an error at once, each at most SUSPEND-SECONDS for
its next command.  The lane looks for its next request for
IDLE-POLL-MICROSECONDS before its thread sleeps (0: not at all, where
cl-mcp has one CPU), and stops polling for POLL-BACK-OFF-MICROSECONDS after
a yield that took POLL-STOLEN-MICROSECONDS (see `input-soon-p'): cl-mcp's
own idle-poll policy, sent from its one definition.  A keyword left out
keeps its current value."
  (setf *max-suspended* max-suspended
        *suspend-seconds* suspend-seconds
        *lane-idle-poll-microseconds* idle-poll-microseconds
        *lane-poll-stolen-microseconds* poll-stolen-microseconds
        *lane-poll-back-off-microseconds* poll-back-off-microseconds)
  t)

;;;; Entry point: the session's definitions

(defvar *baseline-packages* (list-all-packages)
  "Packages that existed when the agent was first loaded.  Packages created
later belong to the session (see `session-packages').")

(defun session-packages ()
  "CL-USER and every package created since the agent was loaded."
  (cons (find-package "COMMON-LISP-USER")
        (set-difference (list-all-packages) *baseline-packages*)))

(defun lambda-list-text (function-designator)
  "The lambda list of FUNCTION-DESIGNATOR as a programmer writes it:
parameter names without package prefixes, keywords and default values as
written (strings quoted)."
  (labels ((write-part (part out)
             (typecase part
               (keyword (format out ":~A" (symbol-name part)))
               (symbol (write-string (symbol-name part) out))
               (cons (write-char #\( out)
                     (loop for (item . rest) on part
                           do (write-part item out)
                              (typecase rest
                                (null)
                                (cons (write-char #\Space out))
                                (t (write-string " . " out) (write-part rest out))))
                     (write-char #\) out))
               (t (prin1 part out)))))
    (handler-case
        (let ((lambda-list (sb-introspect:function-lambda-list function-designator))
              (*print-pretty* nil)
              (*print-length* 20)
              (*print-level* 4))
          (if lambda-list
              (with-output-to-string (out) (write-part lambda-list out))
              "()"))
      (serious-condition () "(...)"))))

(defun variable-text (symbol)
  "SYMBOL's value, printed on one line of at most 80 characters."
  (one-line (with-result-printing ()
              (let ((*print-pretty* nil))
                (safe-print (symbol-value symbol) #'prin1-to-string)))
            80))

(defun class-kind (class)
  "\"structure\", \"condition\" or \"class\": what kind of class CLASS is."
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
and name: KIND is :function, :variable, :macro or :class; NAME the symbol
as written from CL-USER; DETAIL the lambda list, the printed value, or the
kind of class."
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

;;;; Entry point: loading systems

(defun quicklisp-setup-file ()
  "Quicklisp's setup file in the home directory, if it is there."
  (probe-file (merge-pathnames "quicklisp/setup.lisp" (user-homedir-pathname))))

(defun ensure-quicklisp ()
  "True when Quicklisp is loaded, loading it from ~/quicklisp when present."
  (or (find-package "QL")
      (let ((setup (quicklisp-setup-file)))
        (when setup
          (load setup)
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

(defun %load-system (name quicklisp stdout record-warning)
  "Load NAME with output to STDOUT; return (:ok) or (:error PLIST).
Warnings other than redefinitions go to RECORD-WARNING as (TYPE MESSAGE)."
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
      (handler-bind ((warning
                       (lambda (w)
                         (unless (redefinition-p w)
                           (funcall record-warning
                                    (list (public-type-name w 'warning) (condition-message w))))
                         (muffle-warning w)))
                     (serious-condition #'fail))
        (with-standard-streams (stdout stdout)
          ;; BREAK and INVOKE-DEBUGGER end the load too.
          (with-debugger-calling (#'fail)
            (if quicklisp
                (funcall (find-symbol "QUICKLOAD" "QL") name :silent t)
                (asdf:load-system name))
            (list :ok)))))))

(defun load-system (name &key (max-output 20000) (tag nil))
  "Load the ASDF system NAME (a string), through Quicklisp when it is
available.  Return a plist: :status (:ok, :error, or :aborted when
cancelled under TAG), :system, :loader (\"quicklisp\" or \"asdf\"),
:warnings as (TYPE MESSAGE) lists, and :version or :error.  Compiler
chatter goes to a capped stream (MAX-OUTPUT characters) and is dropped.
Packages the system creates are libraries, not the session's own
definitions."
  (let* ((stdout (make-capped-output-stream max-output))
         (warnings '())
         (before (list-all-packages))
         (quicklisp (ensure-quicklisp))
         (outcome (with-running (tag sb-thread:*current-thread*)
                    (or (catch 'load-cancelled
                          (%load-system name quicklisp stdout
                                        (lambda (w) (push w warnings))))
                        (list :aborted)))))
    (setf *baseline-packages*
          (union *baseline-packages* (set-difference (list-all-packages) before)))
    (list* :status (first outcome)
           :system name
           :loader (if quicklisp "quicklisp" "asdf")
           :warnings (nreverse warnings)
           (case (first outcome)
             (:ok (list :version (system-version name)))
             (:error (list :error (second outcome)))))))

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
      (declare (ignore name))
      (cond (found (values symbol nil))
            ((and (null home) (find #\: text))
             (values nil (name-error "PACKAGE-ERROR"
                                     (format nil "The package of ~A does not exist." text))))
            (t
             (values nil (name-error "CL-MCP:UNKNOWN-SYMBOL"
                                     (format nil "No symbol ~A is accessible in ~A (nothing was interned)."
                                             text (package-name package)))))))))

(defun with-resolved-symbol (text package-name function)
  "Call FUNCTION with the symbol TEXT names (see `resolve-symbol'), or
return the error plist."
  (multiple-value-bind (symbol failure) (resolve-symbol text package-name)
    (if failure failure (funcall function symbol))))

(defun file-octets (file)
  "The bytes of FILE: Swank's positions count bytes (SBCL's FILE-POSITION),
not characters."
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

(defun location-plist (location &optional files)
  "Swank's LOCATION as (:file F :line L :column C :snippet S), or (:error
MESSAGE) when it has no file and position.  FILES, an equal hash table,
keeps file contents across the locations of one reply."
  (if (not (and (consp location) (eq (first location) :location)))
      (list :error (if (and (consp location) (stringp (second location)))
                       (second location)
                       "no source location"))
      (let ((file (second (assoc :file (rest location))))
            (position (second (assoc :position (rest location)))))
        (if (not (and file (integerp position) (probe-file file)))
            (list :error "no source file for this definition")
            (let* ((path (namestring (truename file)))
                   (octets (if files
                               (or (gethash path files) (setf (gethash path files) (file-octets path)))
                               (file-octets path))))
              (multiple-value-bind (line column snippet) (place-at octets (1- position))
                (list :file path :line line :column column :snippet snippet)))))))

;;; @@ find-definition, describe-symbol (their code follows this line)

;;;; Entry points: find-definition, describe-symbol
;;;
;;; Both go through Swank: `swank/backend:find-definitions' (what M-. uses,
;;; SB-INTROSPECT underneath) gives every definition of a name with its
;;; dspec and place; `swank/backend:describe-symbol-for-emacs' (through
;;; `symbol-kinds' of the apropos section below) says what a name is, and
;;; SB-MOP tells a class's slots and a generic function's methods.  A
;;; definition evaluated through evaluate-lisp has no file, so the agent
;;; keeps the source text of each one (see `note-repl-definitions', called
;;; by `%read-and-evaluate') and find-definition returns it, labelled with
;;; the evaluation's number.  Two helpers of the apropos section below are
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

(defstruct (repl-definition (:constructor make-repl-definition (type name evaluation source sequence)))
  "One definition made through evaluate-lisp: its type word, its name (a
symbol, a (SETF symbol) list, a package's name as a string, or for a
method (NAME QUALIFIERS SPECIALIZERS)), the evaluation's number, and the
source text of the top-level form that made it."
  type name evaluation source sequence)

(defvar *repl-definitions* (make-hash-table :test 'equal)
  "The definitions made through evaluate-lisp, by (TYPE . NAME): a newer
one of the same type and name replaces the older.  `soft-reset' clears it.")

(defvar *repl-definitions-lock* (sb-thread:make-mutex :name "cl-mcp REPL definitions")
  "Guards `*repl-definitions*' and `*repl-definition-sequence*'.")

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

(defun record-repl-definitions (definitions evaluation-id source)
  "Keep SOURCE as the source of each of DEFINITIONS, (TYPE-WORD . FORM)
lists made by evaluation EVALUATION-ID, dropping the oldest kept ones past
`*repl-definition-limit*'."
  (sb-thread:with-mutex (*repl-definitions-lock*)
    (loop for (type . form) in definitions
          for name = (definition-form-name form)
          do (setf (gethash (cons type name) *repl-definitions*)
                   (make-repl-definition type name evaluation-id source
                                         (incf *repl-definition-sequence*))))
    (loop while (> (hash-table-count *repl-definitions*) *repl-definition-limit*)
          do (let ((oldest nil) (oldest-key nil))
               (maphash (lambda (key definition)
                          (when (or (null oldest)
                                    (< (repl-definition-sequence definition)
                                       (repl-definition-sequence oldest)))
                            (setf oldest definition oldest-key key)))
                        *repl-definitions*)
               (remhash oldest-key *repl-definitions*)))))

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
  (sb-thread:with-mutex (*repl-definitions-lock*)
    (clrhash *repl-definitions*)))

(defun printed-name (object)
  "OBJECT (a name, a specializer, a qualifier) printed on one line, read
back in *PACKAGE*."
  (safe-print object (lambda (object)
                       (let ((*print-pretty* nil) (*print-length* 10) (*print-level* 3))
                         (prin1-to-string object)))))

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
  "DEFINITION as (:type :name [:qualifiers :specializers] :evaluation :source)."
  (let ((type (repl-definition-type definition))
        (name (repl-definition-name definition)))
    (list* :type type
           :name (if (string= type "method") (printed-name (first name)) (printed-name name))
           (append (when (string= type "method")
                     (list :qualifiers (mapcar #'printed-name (second name))
                           :specializers (mapcar #'printed-name (third name))))
                   (list :evaluation (repl-definition-evaluation definition)
                         :source (repl-definition-source definition))))))

(defun repl-definition-plists (symbol)
  "The definitions of SYMBOL made through evaluate-lisp, newest first, as
`repl-definition-plist's."
  (let ((found '()))
    (sb-thread:with-mutex (*repl-definitions-lock*)
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
has required parameters."
  (let* ((function (and (fboundp name) (fdefinition name)))
         (required (if (typep function 'generic-function)
                       (loop for parameter in (sb-mop:generic-function-lambda-list function)
                             until (member parameter lambda-list-keywords)
                             count t)
                       (count-if-not #'keywordp rest)))
         (split (max 0 (- (length rest) required))))
    (values (subseq rest 0 split) (subseq rest split))))

(defun swank-definition-plist (dspec location files)
  "One of Swank's definitions, DSPEC at LOCATION, as (:type :name
[:qualifiers :specializers] . PLACE), PLACE as `location-plist' gives it."
  (destructuring-bind (operator name &rest rest) dspec
    (let ((type (dspec-type-word operator))
          (place (location-plist location files)))
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

(defun symbol-definitions-of (symbol)
  "Every definition of SYMBOL: those made through evaluate-lisp (newest
first), then Swank's; one of Swank's without a source file is left out when
evaluate-lisp's source of it is kept.  (values PLISTS DROPPED ERROR-PLIST):
at most `*definition-limit*', the number past it, and the failure of Swank
when it failed."
  (let* ((repl (repl-definition-plists symbol))
         (asked (swank-definitions symbol))
         (files (make-hash-table :test 'equal))
         (swank (when (eq (first asked) :ok)
                  (loop for (dspec location) in (second asked)
                        for plist = (swank-definition-plist dspec location files)
                        unless (and (getf plist :error)
                                    (find plist repl :test #'same-definition-p))
                          collect plist)))
         (all (append repl swank)))
    (values (subseq all 0 (min (length all) *definition-limit*))
            (max 0 (- (length all) *definition-limit*))
            (and (eq (first asked) :error) (second asked)))))

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

(defun documentation-entries (symbol)
  "SYMBOL's documentation strings, as (KIND TEXT) lists: function,
variable, type, compiler-macro, setf, and package (of SYMBOL's name)."
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
            when (stringp text) collect (list kind text)))))

(defun slot-readers (class name)
  "The readers CLASS's own definition of slot NAME has, printed (none for a
structure's slots, whose accessors are not the MOP's)."
  (handler-case
      (let ((direct (find name (sb-mop:class-direct-slots class)
                          :key #'sb-mop:slot-definition-name)))
        (and direct (mapcar #'printed-name (sb-mop:slot-definition-readers direct))))
    (serious-condition () '())))

(defun class-slot-plists (class)
  "The slots of CLASS as (:name N :initargs I :readers R) plists, readers
gathered from the direct slots of every class in its precedence list."
  (handler-case
      (progn
        (unless (sb-mop:class-finalized-p class) (sb-mop:finalize-inheritance class))
        (loop for slot in (sb-mop:class-slots class)
              for name = (sb-mop:slot-definition-name slot)
              collect (list :name (printed-name name)
                            :initargs (mapcar #'printed-name (sb-mop:slot-definition-initargs slot))
                            :readers (loop for super in (sb-mop:class-precedence-list class)
                                           append (slot-readers super name)))))
    (serious-condition () '())))

(defun specializer-name (specializer)
  "A method's SPECIALIZER as its class's name or an (EQL OBJECT) list."
  (typecase specializer
    (sb-mop:eql-specializer `(eql ,(sb-mop:eql-specializer-object specializer)))
    (class (class-name specializer))
    (t specializer)))

(defun method-plists (function)
  "The first `*method-limit*' methods of generic FUNCTION as (:qualifiers
Q :specializers S) plists, and how many there are in all."
  (let ((methods (sb-mop:generic-function-methods function)))
    (values (loop for method in methods
                  repeat *method-limit*
                  collect (list :qualifiers (mapcar #'printed-name (method-qualifiers method))
                                :specializers (mapcar (lambda (s) (printed-name (specializer-name s)))
                                                      (sb-mop:method-specializers method))))
            (length methods))))

(defun describe-symbol-of (text &key package)
  "What the symbol TEXT names, read in PACKAGE (CL-USER when nil): a plist
:status :ok, :symbol, :package (its home), :external, :kinds (as
`symbol-kinds' gives them, and \"package\" when a package has its name),
:arglist, :documentation ((KIND TEXT) ...), :value (a bound variable's,
printed on one line), :class (:superclasses :slots), :methods and
:method-count (of a generic function), :location (the first definition
with a source file) and :description (one sentence).  An unknown symbol or
package is a :status :error plist."
  (with-resolved-symbol text package
    (lambda (symbol)
      (let* ((*package* (or (find-named-package package) (find-package "COMMON-LISP-USER")))
             (kinds (append (symbol-kinds symbol)
                            (and (find-package (symbol-name symbol)) (list "package"))))
             (home (symbol-package symbol))
             (class (find-class symbol nil))
             (function (and (fboundp symbol) (not (special-operator-p symbol))
                            (or (macro-function symbol) (fdefinition symbol))))
             (location (find-if (lambda (plist) (getf plist :file))
                                (nth-value 0 (symbol-definitions-of symbol))))
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
            (add :value (one-line (with-result-printing ()
                                    (let ((*print-pretty* nil))
                                      (safe-print (symbol-value symbol) #'prin1-to-string)))
                                  200)))
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

;;; @@ xref, compile-file (their code follows this line)

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

(defun top-level-form-start (octets offset)
  "The offset of the line at or before OFFSET in OCTETS that starts with an
open parenthesis: the top-level form holding OFFSET, by the convention
Emacs's beginning-of-defun keeps.  OFFSET itself when there is none."
  (let ((newline (char-code #\Newline)))
    (loop for end = (min offset (length octets)) then (1- start)
          for start = (let ((before (and (> end 0)
                                         (position newline octets :end end :from-end t))))
                        (if before (1+ before) 0))
          when (and (< start (length octets))
                    (= (aref octets start) *open-parenthesis-octet*))
            return start
          when (zerop start)
            return offset)))

(defun reference-plist (name location files)
  "A referrer NAME at Swank's LOCATION, the place of the reference inside
it, as (:name N :file F :line L :column C :snippet S :reference-line RL
:reference-column RC): the place is the top-level form that holds the
reference.  Without a source file: (:name N :error MESSAGE)."
  (let ((at (location-plist location files)))
    (if (getf at :error)
        (list :name name
              :error (if (search "DEFINITION-SOURCE" (getf at :error))
                         "no source file (defined without one, e.g. through evaluate-lisp)"
                         (getf at :error)))
        (let* ((file (getf at :file))
               (octets (gethash file files))
               (reference (1- (second (assoc :position (rest location)))))
               (start (top-level-form-start octets reference)))
          (append (list :name name)
                  (location-plist `(:location (:file ,file) (:position ,(1+ start))) files)
                  (list :reference-line (getf at :line)
                        :reference-column (getf at :column)))))))

(defun xref-of (text relation &key package)
  "The definitions that stand in RELATION (one of `*xref-relations*') to
the symbol TEXT names, read in PACKAGE: a plist :status :ok, :symbol,
:relation, :references (see `reference-plist'), and :dropped, the number
of referrers past `*reference-limit*'.  An unknown symbol or package, or a
relation this Swank does not implement, is a :status :error plist."
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
                              (swank::xref-doit relation symbol)))))))
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
                  :references (loop for (name location) in found
                                    repeat *reference-limit*
                                    collect (reference-plist
                                             (safe-print name (lambda (name)
                                                                (let ((*print-pretty* nil))
                                                                  (prin1-to-string name))))
                                             location files))
                  :dropped (max 0 (- (length found) *reference-limit*)))))))))

(defparameter *note-severities*
  '((:error . :error) (:read-error . :read-error) (:warning . :warning)
    (:style-warning . :style-warning) (:note . :note)
    (:early-deprecation-warning . :style-warning)
    (:late-deprecation-warning . :warning)
    (:final-deprecation-warning . :warning))
  "Swank's note severities and the ones cl-mcp reports.  Redefinitions
are left out: loading a file again redefines everything in it.")

(defparameter *note-limit* 200
  "Compiler notes reported for one compilation, at most.")

(defparameter *note-message-limit* 2000
  "Characters of one compiler note's message, at most.")

(defun note-plist (note files)
  "One of Swank's compiler NOTES as (:severity S :message M :file F :line L
:column C :snippet S), or (:severity S :message M :error WHY) without a
place; nil for a note cl-mcp leaves out (see `*note-severities*')."
  (let ((severity (cdr (assoc (getf note :severity) *note-severities*))))
    (when severity
      (list* :severity severity
             :message (cap-string (getf note :message) *note-message-limit*)
             (location-plist (getf note :location) files)))))

(defun note-order (plist)
  "Where a note's place comes in its file, for sorting; notes without a
place come last."
  (if (getf plist :line)
      (+ (* (getf plist :line) 100000) (getf plist :column))
      most-positive-fixnum))

(defun note-plists (notes)
  "Swank's compiler NOTES as `note-plist's in the order of their places,
duplicates and left-out ones dropped, at most `*note-limit*'; the number
dropped for the limit second."
  (let* ((files (make-hash-table :test 'equal))
         (plists (stable-sort
                  (remove-duplicates (remove nil (mapcar (lambda (note) (note-plist note files)) notes))
                                     :test #'equal :from-end t)
                  #'< :key #'note-order)))
    (values (subseq plists 0 (min (length plists) *note-limit*))
            (max 0 (- (length plists) *note-limit*)))))

(defun failing-severity-p (plist)
  "True for a note that means the compilation failed."
  (member (getf plist :severity) '(:error :read-error)))

(defun source-file-problem (path)
  "Nil when PATH (a string) names an existing file by an absolute path,
else the :status :error plist saying why not."
  (let ((pathname (ignore-errors (pathname path))))
    (cond ((not (and pathname (eq (first (pathname-directory pathname)) :absolute)))
           (name-error "CL-MCP:INVALID-PATH"
                       (format nil "The path ~S is not absolute: give the file's absolute path." path)))
          ((not (and (probe-file pathname) (pathname-name (probe-file pathname))))
           (name-error "CL-MCP:FILE-NOT-FOUND" (format nil "No file ~A exists (or it is a directory)." path))))))

(defun compile-file-of (path &key (load t) (max-output 20000))
  "Compile the file at PATH (absolute) as SLIME's C-c C-k does, and load the
fasl when LOAD and the compilation did not fail (warnings do not stop it;
errors do).  Return a plist: :status (:ok, or :error when compilation
failed or the load signalled an error), :success, :fasl, :loaded, :notes
(see `note-plist'), :dropped (notes past `*note-limit*'), and :error (the
load's error, or why PATH cannot be compiled).  The compiler's output goes
to a capped stream (MAX-OUTPUT characters) and is dropped."
  (let ((problem (source-file-problem path)))
    (when problem
      (return-from compile-file-of problem)))
  (let* ((pathname (probe-file path))
         (stdout (make-capped-output-stream max-output))
         (loaded nil)
         (failure nil)
         (result
           (block compiling
             (flet ((fail (condition)
                      (setf failure (describe-error condition nil))
                      (return-from compiling nil)))
               (with-standard-streams (stdout stdout)
                 (with-debugger-calling (#'fail)
                   (let ((*package* (find-package "COMMON-LISP-USER")))
                     (swank::collect-notes
                      (lambda ()
                        (multiple-value-bind (fasl warnings-p failure-p)
                            (swank/backend:swank-compile-file
                             pathname (swank::fasl-pathname pathname '()) nil
                             (or (swank/backend:guess-external-format pathname) :default))
                          (declare (ignore warnings-p failure-p))
                          (values t nil fasl)))))))))))
    (multiple-value-bind (notes dropped) (note-plists (and result (swank::compilation-result-notes result)))
      (let* ((fasl (and result (swank::compilation-result-faslfile result)))
             (success (and fasl (not failure) (notany #'failing-severity-p notes) t)))
        (when (and success load)
          (let ((load-result
                  (block loading
                    (flet ((fail (condition)
                             (setf failure (describe-error condition nil))
                             (return-from loading nil)))
                      (with-standard-streams (stdout stdout)
                        (with-debugger-calling (#'fail)
                          (swank::collect-notes
                           (lambda ()
                             (swank/backend:with-compilation-hooks ()
                               (load fasl))
                             (values t t nil)))))))))
            (setf loaded (and load-result (not failure) t))
            (when load-result
              (multiple-value-bind (more more-dropped)
                  (note-plists (swank::compilation-result-notes load-result))
                (setf notes (append notes more)
                      dropped (+ dropped more-dropped))))))
        (list* :status (if (and success (not failure)) :ok :error)
               :success success
               :fasl fasl
               :loaded loaded
               :notes notes
               :dropped dropped
               (and failure (list :error failure)))))))

;;; @@ apropos, macroexpand, inspect (their code follows this line)

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

(defparameter *apropos-kinds*
  '(:function :generic-function :macro :special-operator :variable :type :setf)
  "The keys of `swank/backend:describe-symbol-for-emacs', in the order
their kinds are listed.")

(defparameter *apropos-type-kinds*
  '(("functions" "function" "generic function")
    ("macros" "macro" "special operator")
    ("variables" "variable" "constant")
    ("classes" "class" "structure" "condition"))
  "The kinds of symbol each TYPE of `apropos-of' keeps.")

(defun symbol-kinds (symbol)
  "What SYMBOL names, as strings (\"function\", \"generic function\",
\"macro\", \"special operator\", \"variable\", \"constant\", \"class\",
\"structure\", \"condition\", \"type\", \"setf expander\"), from Swank's
description of it; nil when it names nothing."
  (let ((description (swank/backend:describe-symbol-for-emacs symbol)))
    (loop for key in *apropos-kinds*
          when (getf description key)
            collect (case key
                      (:generic-function "generic function")
                      (:special-operator "special operator")
                      (:variable (if (constantp symbol) "constant" "variable"))
                      (:type (let ((class (find-class symbol nil)))
                               (if class (class-kind class) "type")))
                      (:setf "setf expander")
                      (t (string-downcase (symbol-name key)))))))

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

(defun apropos-before-p (a b)
  "True when the `apropos-of' entry A, (RANK SYMBOL KINDS), comes before B:
by rank, then by name, then by package name."
  (destructuring-bind (rank-a symbol-a &rest more-a) a
    (declare (ignore more-a))
    (destructuring-bind (rank-b symbol-b &rest more-b) b
      (declare (ignore more-b))
      (flet ((package-text (symbol)
               (let ((home (symbol-package symbol))) (if home (package-name home) ""))))
        (let ((name-a (symbol-name symbol-a)) (name-b (symbol-name symbol-b)))
          (cond ((/= rank-a rank-b) (< rank-a rank-b))
                ((string/= name-a name-b) (and (string< name-a name-b) t))
                (t (and (string< (package-text symbol-a) (package-text symbol-b)) t))))))))

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
  (let ((target (and package (find-named-package package))))
    (when (and package (null target))
      (return-from apropos-of
        (name-error "PACKAGE-ERROR" (format nil "The package ~S does not exist." package))))
    (let* ((wanted (rest (assoc type *apropos-type-kinds* :test #'string-equal)))
           (session (session-packages))
           (seen (make-hash-table :test #'eq))
           (found '()))
      (dolist (symbol (swank::apropos-symbols pattern external-only nil target))
        (unless (gethash symbol seen)
          (setf (gethash symbol seen) t)
          (let ((kinds (symbol-kinds symbol)))
            (when (and kinds (or (null wanted) (intersection kinds wanted :test #'string=)))
              (push (list (+ (if (member (symbol-package symbol) session) 0 2)
                             (if (external-symbol-p symbol) 0 1))
                          symbol kinds)
                    found)))))
      (let ((sorted (sort (coerce found 'vector) #'apropos-before-p)))
        (list :status :ok
              :pattern pattern
              :total (length sorted)
              :symbols (loop for (nil symbol kinds) across sorted
                             repeat *apropos-limit*
                             collect (apropos-entry symbol kinds)))))))

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
  "OBJECT printed on one line of at most 200 characters."
  (with-result-printing ()
    (let ((*print-pretty* nil) (*print-length* 20) (*print-level* 4))
      (one-line (safe-print object #'prin1-to-string) 200))))

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
  "A content LINE as (LABEL VALUE-TEXT OBJECT HAS-VALUE): its last value,
and the text before it as the label (trailing \":\" or \"=\" dropped); a
line without values is all label.  Nil for an empty line."
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
          (list label (segment-text (nth last line)) (second (nth last line)) t)))))

(defun object-parts (object)
  "OBJECT as SLIME's inspector shows it: a description (the text lines
before its first value) and its parts, each (LABEL VALUE-TEXT OBJECT
HAS-VALUE); true third when Swank's content was cut."
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
                         (one-line (safe-print object #'prin1-to-string) 1000)))
            :description description
            :parts (loop for (label text part has-value) in (nthcdr start parts)
                         repeat *inspect-page*
                         collect (list* :label label :value text
                                        (and has-value (list :handle (remember-object part)))))
            :start start
            :total (length parts)
            :cut cut))))

(defun evaluate-for-inspection (code package timeout)
  "The first value of the last form of CODE, read and evaluated in
PACKAGE, as (values OBJECT nil); or (values nil ERROR-PLIST).  Output is
dropped; an error or the TIMEOUT seconds deadline ends it; in an image
cl-mcp shares, what it creates is the session's (see `soft-reset')."
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
          (if *track-session* (call-tracking-session #'run) (run))
        (if (eq status :ok)
            (values result nil)
            (values nil (list :status :error :error result)))))))

(defun inspect-of (&key code handle part (start 0) package (timeout 30))
  "Inspect the value of CODE (read and evaluated in PACKAGE, CL-USER when
nil), or the object inspected earlier under HANDLE, or its PART-th part
(counting from 0, as listed).  Return :status :ok, :handle (the object's),
:class, :printed, :description, :parts from START (at most
`*inspect-page*', each :label, :value and, when it has an object, :handle),
:start, :total and :cut (Swank's content was cut at
`*inspect-content-limit*'); or a :status :error plist."
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
    (inspect-report object (or own-handle (remember-object object)) (max 0 start))))

;;;; Entry points: setting an image up
;;;
;;; Swank's SBCL backend keeps a mailbox for every thread it ever sent a
;;; message to, in a list it never prunes and searches linearly.  Each
;;; `:emacs-rex' on thread T spawns a worker thread with a mailbox, so every
;;; request is slower than the one before (a round trip takes three times
;;; as long after 10,000 requests) and no finished worker is ever garbage.
;;; After each reply, the mailboxes of threads that have ended are dropped:
;;; nothing can be sent to a dead thread, and a mailbox is made afresh for a
;;; thread that needs one.

(defparameter *swank-mailbox-internals*
  (let ((names (existing-symbols '(("SWANK/SBCL" "*MAILBOXES*")
                                   ("SWANK/SBCL" "*MAILBOX-LOCK*")
                                   ("SWANK/SBCL" "MAILBOX.THREAD")))))
    (when (and (= (length names) 3) (boundp (first names)) (boundp (second names))
               (fboundp (third names)))
      names))
  "The list, lock and thread accessor of Swank's mailboxes, when this Swank
has them.")

(defparameter *mailbox-prune-threshold* 16
  "Prune only when the list is this long: a short list costs nothing.")

(defun prune-swank-mailboxes ()
  "Drop the mailboxes of threads that have ended (a Swank pre-reply hook)."
  (destructuring-bind (&optional list-symbol lock-symbol thread-of) *swank-mailbox-internals*
    (when (and list-symbol
               (> (length (symbol-value list-symbol)) *mailbox-prune-threshold*))
      (ignore-errors
       (sb-thread:with-mutex ((symbol-value lock-symbol))
         (setf (symbol-value list-symbol)
               (remove-if-not (lambda (mailbox)
                                (sb-thread:thread-alive-p (funcall thread-of mailbox)))
                              (symbol-value list-symbol))))))))

(defun install-mailbox-pruning ()
  "Have Swank run `prune-swank-mailboxes' after each reply, where this
Swank has the mailboxes to prune."
  (when *swank-mailbox-internals*
    (pushnew 'prune-swank-mailboxes swank::*pre-reply-hook*)))

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
  "Settings for an image cl-mcp owns: Swank demands SECRET (a string) from
the one client, never opens its debugger, and background errors are
logged.  Return t."
  (setf (fdefinition 'swank::slime-secret) (lambda () secret))
  (setf swank:*global-debugger* nil
        swank::*configure-emacs-indentation* nil
        sb-ext:*invoke-debugger-hook* #'log-background-error
        *debugger-hook* nil)
  (install-mailbox-pruning)
  t)

(defun prepare-attached-connection ()
  "Settings for cl-mcp's connection to an image the programmer shares:
remember what the session creates, and stand aside so that Swank keeps
sending the debugger of the programmer's own threads to Emacs (Swank sends
it to the newest connection, which would otherwise be cl-mcp's).  Return t."
  (setf *track-session* t)
  ;; A new session: what earlier ones created belongs to the image now.
  (sb-thread:with-mutex (*registry-lock*)
    (setf *session-symbols* '()
          *session-created-packages* '()))
  (let ((ours swank::*emacs-connection*))
    (setf *connections* (cons ours (intersection *connections* swank::*connections*)))
    (setf swank::*connections*
          (append (remove ours swank::*connections*) (list ours))))
  (set-connection-nodelay)
  (install-mailbox-pruning)
  t)

(defun soft-reset ()
  "Remove what cl-mcp's evaluations created in a shared image (their CL-USER
definitions and their packages) and abort the evaluations waiting at an
error, and drop the objects the inspect tool keeps for their handles and
the sources of the definitions find-definition keeps.
Everything else in the image is left as it was.  Return t."
  (abort-all)
  (forget-inspected)
  (forget-repl-definitions)
  (let ((user (find-package "COMMON-LISP-USER"))
        (symbols (sb-thread:with-mutex (*registry-lock*) (shiftf *session-symbols* '())))
        (packages (sb-thread:with-mutex (*registry-lock*)
                    (shiftf *session-created-packages* '()))))
    (dolist (package packages)
      (when (package-name package)
        (handler-case (delete-package package)
          (error (c) (log-note "could not delete package ~A: ~A" (package-name package) c)))))
    (dolist (symbol symbols)
      (when (eq (symbol-package symbol) user)
        (forget-definitions symbol)
        (unintern symbol user))))
  t)
