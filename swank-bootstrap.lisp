;;;; swank-bootstrap.lisp --- cl-mcp's image-side agent: its entry point
;;;;
;;;; Loaded into an SBCL image that runs Swank, either the one cl-mcp started
;;;; itself or (in attach mode) the programmer's own.  cl-mcp calls the
;;;; exported entry points through `:emacs-rex': in an image cl-mcp owns, on
;;;; the lane (see agent/listeners.lisp), else on a fresh Swank worker
;;;; thread.  Each entry point gathers facts and returns them as one plist
;;;; of strings, keywords and integers; the Python side renders the text.
;;;;
;;;; This file holds what the whole agent shares: the table of SBCL and
;;;; Swank internals it relies on, its package, and the loader of its
;;;; parts (agent/*.lisp, one concern each, in `*agent-parts*' order, as
;;;; SLIME's contribs are organised).  cl-mcp loads this file, then calls
;;;; `load-parts' (an image it owns: each part compiled once into cl-mcp's
;;;; cache) or `load-part-texts' (a shared image: the parts' texts, sent
;;;; over Swank, because that image may not see these files).
;;;;
;;;; Rules the agent keeps:
;;;;  - Nothing a user evaluates may reach Swank's debugger: every condition
;;;;    is caught here, before Swank sees it, so no thread is ever left
;;;;    waiting for an SLDB window.
;;;;  - Every reply fits one Swank frame (16 MiB): output, printed values and
;;;;    warnings are capped here, where they are produced (cl-mcp's
;;;;    --max-output is at most 1,000,000 characters per stream).
;;;;  - Loading it twice is harmless (attach mode reloads it).

;;;; SBCL and Swank internals this agent relies on
;;;
;;; Checked with SBCL 2.2.9 and Swank 2.27 (Debian cl-swank).  Everything
;;; else is standard Common Lisp or a supported interface: SB-EXT,
;;; SB-THREAD, SB-GRAY, SB-MOP, SB-ALIEN, SB-BSD-SOCKETS, SB-POSIX, SB-PROFILE,
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
;;;                                   and `deliver-thread-news' a
;;;                                   `:cl-mcp-threads' event
;;;                                   (and `send-to-watcher' a registered
;;;                                   Emacs its `:cl-mcp-watch' messages)
;;;   swank::*event-hook*             `watch-event-hook' sees cl-mcp's
;;;                                   requests and answers (agent/watch.lisp)
;;;   swank::connection.socket-io     a connection's socket stream
;;;   swank::close-connection%        wrapped while attached, so that a
;;;                                   killed cl-mcp's unsent output never
;;;                                   stops the sentinel (`close-dropping-unsent')
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
;;;                                   (nor a watching Emacs)
;;;   swank::*enable-event-history*   bound to nil in the lane thread
;;;   swank::*pre-reply-hook*         runs `prune-swank-mailboxes' and
;;;                                   `deliver-thread-news'
;;;   swank::*connection-closed-hook* runs `forget-connection', which
;;;                                   detaches when cl-mcp's last goes
;;;   swank::*configure-emacs-indentation*   nil in an embedded image
;;;   swank::parse-symbol             a name looked up, never interned
;;;   swank::xref-doit                `xref-of': the who-* cross-references
;;;   swank/sbcl::source-location-for-xref-data, swank/sbcl::sanitize-xrefs
;;;                                   `xref-references': the locations of
;;;                                   `referrers', as the backend's who-calls
;;;                                   makes them
;;;   swank/backend::original-condition   the condition behind a compiler
;;;                                   note (`undefined-reference')
;;;   swank::collect-notes            `compile-file-of': compiler notes, as
;;;                                   C-c C-k gathers them
;;;   swank::make-compiler-note       `load-system': a note, as
;;;                                   `collect-notes' makes it
;;;   swank::compilation-result-notes, what `collect-notes' and
;;;   compilation-result-faslfile       compile-string-for-emacs return
;;;   swank::*buffer-package*, swank::*buffer-readtable*
;;;                                   `compile-form-of': the package and
;;;                                   readtable compile-string-for-emacs reads
;;;                                   in, as a buffer's for C-c C-c
;;;   swank::guess-buffer-readtable   `form-readtable': the readtable of a
;;;                                   package, as C-c C-c reads a buffer's
;;;   swank::fasl-pathname            where SLIME puts a file's fasl
;;;   swank::apropos-symbols          `apropos-of': the symbols a pattern
;;;                                   matches, as M-x slime-apropos finds them
;;;   swank::make-istate, swank::*istate*   `inspector-content' binds a state
;;;                                   of its own for the contribs that read it
;;;   swank::*inspector-printer-bindings*   the inspector's printer settings
;;;   swank::content-range            the inspector's content, lazy or not,
;;;                                   as a list
;;;   swank/sbcl::*definition-types*, swank/sbcl::make-dspec
;;;                                   `definition-source-of': the source of a
;;;                                   definition Swank could not place
;;;   swank/sbcl::setf-expander       `symbol-kinds': whether a symbol has a
;;;                                   setf expander, as Swank's
;;;                                   describe-symbol-for-emacs asks
;;;   swank/sbcl::*sldb-stack-top*    the frame Swank's backend counts frames
;;;                                   from (sldb binds it): a waiting
;;;                                   evaluation binds it for restart-frame
;;;                                   and return-from-frame
;;;   swank/sbcl::*mailboxes*, *mailbox-lock*, mailbox.thread   (by name)
;;;                                   Swank's per-thread mailboxes, pruned
;;;   swank/source-file-cache::*source-file-cache*,
;;;   swank/source-file-cache::source-cache-entry.text, .date
;;;                                   a file's text as it was compiled, kept
;;;                                   under its pathname and namestring
;;;                                   (`remember-source'), for the line a
;;;                                   moved definition had; an edit's
;;;                                   entries removed (`refresh-source')
;;;   named-readtables:find-readtable (by name) `in-readtable''s readtable
;;;
;;; SBCL
;;;   sb-debug::map-backtrace         walks the frames of an error (:from
;;;                                   :current-frame)
;;;   sb-debug::frame-call            a frame's function name
;;;   sb-debug::print-frame-call      a frame printed as a call
;;;   sb-di:frame-code-location, frame-debug-fun, do-debug-fun-vars,
;;;   debug-var-symbol, debug-var-validity, debug-var-value
;;;                                   a frame's local variables
;;;   sb-di:eval-in-frame             `eval-in-frame-of'
;;;   sb-di:debug-fun-lambda-list     a restarted frame's parameters, which
;;;                                   SBCL rebuilds its call from
;;;                                   (`rebuilt-call-warning')
;;;   sb-c::map-simple-funs, sb-c::map-packed-xref-data,
;;;   sb-kernel::%simple-fun-xrefs, sb-c::**most-common-xref-names-by-name**,
;;;   sb-c::transform-p, transform-type, vop-info-p, vop-info-name,
;;;   sb-introspect::find-function-definition-source,
;;;   sb-introspect::definition-source-form-number
;;;                                   `referrers': SB-INTROSPECT's who-*
;;;                                   search with a quick test first; checked
;;;                                   when used (`referrers-readable-p'), and
;;;                                   without them `swank::xref-doit' serves
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
;;;   sb-thread::run                  (by name) where SBCL starts a thread: a
;;;                                   backtrace ends above it
;;;   sb-int:info :variable :kind, sb-int:info :type :kind
;;;                                   `symbol-kinds': a proclaimed variable,
;;;                                   a defined type
;;;   sb-pcl::condition-class         tells conditions from other classes
;;;   sb-unix::clock-gettime          CLOCK_MONOTONIC (clock id 1), to time
;;;                                   the lane's idle poll
;;;   sb-unix::unblock-deferrable-signals   (by name) lets a new thread hear
;;;                                   interrupts (`make-agent-thread')
;;;   sb-unix:unix-getpid             the lane socket's name
;;;   sb-sys:*exit-in-progress*       (by name) SB-EXT:EXIT has begun
;;;   sb-sys:without-interrupts, with-interrupts
;;;                                   `answer-directly', `interrupt-at-deadline'
;;;   sb-kernel:%fun-name             a FiveAM test function's name, which says
;;;                                   the file it was made in (run-tests' places)
;;;   sb-kernel:dynamic-usage         bytes of heap in use: kept values give
;;;                                   way past half of it (`crowded-now-p')
;;;   sb-ext:*after-gc-hooks*         `note-heap-after-gc', while attached
;;;   sb-sys:wait-until-fd-usable     the lane's and the listeners' waits
;;;   sb-sys:fd-stream-fd             a socket stream's file descriptor
;;;   asdf/find-component:missing-requires   the system a load missed (not
;;;                                   exported from ASDF itself)
;;;   sb-thread:thread-os-tid         a thread's Linux id (`thread-id'; exported,
;;;                                   not documented)
;;;   sb-thread::thread-waiting-for   the lock a thread waits for
;;;   sb-sprof::*profiling*, sb-sprof::*samples*,
;;;   sb-sprof::samples-trace-count   (by name) whether SB-SPROF profiles or
;;;                                   holds samples (`sprof-taken'); checked
;;;                                   when SB-SPROF is loaded
;;;   SB-SPROF's flat report, SB-PROFILE's report   their text is read: the
;;;                                   table's heading is checked first
;;;                                   (`*sprof-heading*', `*profile-heading*')
;;;   ALLOC-TRAMP, LIST-ALLOC-TRAMP   the allocation trampolines' names in an
;;;                                   alloc report (`trampoline-share')
;;;   sb-int:encapsulate, sb-int:encapsulated-p, sb-int:unencapsulate
;;;                                   run-tests' hooks on FiveAM's
;;;                                   RUN and RT's DO-ENTRY (as TRACE wraps);
;;;                                   SB-THREAD:MAKE-THREAD
;;;                                   (`watch-threads-started-by-cl-mcp');
;;;                                   taken off by `detach-from-image'
;;;   sb-kernel:charpos               a stream's column, for a watched
;;;                                   thread's fresh-line once detached
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
;;;   syscall numbers of Linux x86-64 `kernel-state': a thread's state from
;;;                                   /proc/self/task/TID/syscall
;;;
;;; Those `*checked-internals*' names are looked up when the agent loads
;;; (`check-internals'): a missing one makes the tool that needs it answer
;;; CL-MCP:NOT-IMPLEMENTED naming it, and the others work on.

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
           #:output-slice
           #:configure)
  ;; Evaluations that run on in the background past their answer window.
  (:export #:await-evaluation-of
           #:forget-outcome)
  ;; The values of earlier evaluations, for the user's code.
  (:export #:value)
  ;; The session's definitions and systems.
  (:export #:list-definitions
           #:load-system)
  ;; Development tools: apropos, macroexpansion and the inspector.
  (:export #:apropos-of
           #:macroexpand-of
           #:inspect-of)
  ;; Development tools: cross-references and compiling a file.
  (:export #:xref-of
           #:compile-file-of
           #:compile-form-of)
  ;; Development tools: editing and reading a file's top-level forms.
  (:export #:edit-form-of
           #:read-lisp-file-of)
  ;; Development tools: finding and describing a name's definitions.
  (:export #:find-definition-of
           #:describe-symbol-of)
  ;; Development tools: the image's threads, and profiling.
  (:export #:threads-of
           #:profile-of)
  ;; Development tools: running a project's tests.
  (:export #:run-tests-of)
  ;; Setting an image up: one cl-mcp owns (embedded), or one it shares
  ;; with the programmer (attached).
  (:export #:serve-cl-mcp
           #:set-connection-nodelay
           #:open-lane
           #:prepare-embedded-image
           #:prepare-attached-connection
           #:soft-reset))

(in-package #:cl-mcp-agent)

;;;; Checking the internals when the agent loads

(defparameter *checked-internals*
  '((:threads :function "SB-THREAD" "THREAD-OS-TID")
    (:threads :function "SB-THREAD" "THREAD-WAITING-FOR")
    (:threads :feature "KEYWORD" "LINUX")
    (:threads :feature "KEYWORD" "X86-64")
    (:compile-notes :function "SWANK/BACKEND" "ORIGINAL-CONDITION")
    (:compile-notes :function "SWANK" "COLLECT-NOTES")
    (:compile-notes :function "SWANK" "MAKE-COMPILER-NOTE")
    (:compile-notes :function "SWANK" "FASL-PATHNAME")
    (:compile-notes :function "SWANK" "COMPILATION-RESULT-NOTES")
    (:compile-notes :function "SWANK" "COMPILATION-RESULT-FASLFILE")
    (:compile-form :special "SWANK" "*BUFFER-PACKAGE*")
    (:compile-form :special "SWANK" "*BUFFER-READTABLE*")
    (:compile-form :function "SWANK" "COMPILATION-RESULT-NOTES")
    (:xref :function "SWANK" "XREF-DOIT")
    (:xref :function "SWANK/SBCL" "SOURCE-LOCATION-FOR-XREF-DATA")
    (:xref :function "SWANK/SBCL" "SANITIZE-XREFS")
    (:apropos :function "SWANK" "APROPOS-SYMBOLS")
    (:inspect :function "SWANK" "MAKE-ISTATE")
    (:inspect :special "SWANK" "*ISTATE*")
    (:inspect :variable "SWANK" "*INSPECTOR-PRINTER-BINDINGS*")
    (:inspect :function "SWANK" "CONTENT-RANGE")
    (:describe-symbol :function "SWANK/SBCL" "SETF-EXPANDER")
    (:frame-commands :special "SWANK/SBCL" "*SLDB-STACK-TOP*")
    (:source-cache :variable "SWANK/SOURCE-FILE-CACHE" "*SOURCE-FILE-CACHE*")
    (:source-cache :function "SWANK/SOURCE-FILE-CACHE" "SOURCE-CACHE-ENTRY.DATE")
    (:source-cache :function "SWANK/SOURCE-FILE-CACHE" "SOURCE-CACHE-ENTRY.TEXT"))
  "Internals of the table above, each (USE KIND PACKAGE NAME): USE names
what needs it (a tool: :threads, :xref, :compile-form, :apropos,
:inspect, :describe-symbol; :compile-notes compile-file and
load-system; :frame-commands invoke-restart's RESTART-FRAME and
RETURN-FROM-FRAME; :source-cache the compiled text of a file, without
which places are found in the file as it is now); KIND is :function
(fbound), :variable (bound), :special (proclaimed special: the agent
binds it, and a binding of an undeclared one would be lexical, silently)
or :feature (NAME in *FEATURES*).")

(defvar *missing-internals* '()
  "The entries of `*checked-internals*' this image lacks, as
`check-internals' found them when the agent loaded.")

(defun internal-present-p (kind package-name name)
  "Whether the internal NAME of PACKAGE-NAME is there as KIND needs it."
  (let ((symbol (and (find-package package-name) (find-symbol name package-name))))
    (and symbol
         (ecase kind
           (:function (fboundp symbol))
           (:variable (boundp symbol))
           (:special (eq (sb-int:info :variable :kind symbol) :special))
           (:feature (member symbol *features*))))))

(defun check-internals ()
  "Look up each of `*checked-internals*', keeping the missing ones in
`*missing-internals*'."
  (setf *missing-internals*
        (remove-if (lambda (entry) (apply #'internal-present-p (rest entry)))
                   *checked-internals*)))

(defun missing-internals-message (use)
  "Why USE (a use in `*checked-internals*') cannot work in this image, a
sentence naming what it lacks; nil when nothing is missing."
  (let ((missing (remove use *missing-internals* :key #'first :test-not #'eq)))
    (when missing
      (format nil "This image lacks ~{~A~^, ~}, which cl-mcp relies on here (it was checked ~
                   with SBCL 2.2.9 and Swank 2.27 on Linux x86-64): not implemented in this image."
              (loop for (nil kind package name) in missing
                    collect (if (eq kind :feature)
                                (format nil ":~A in *FEATURES*" name)
                                (format nil "~A::~A" package name)))))))

(defun missing-internals-error (use)
  "The CL-MCP:NOT-IMPLEMENTED :status :error plist of USE when this image
lacks one of its internals (`missing-internals-message'), or nil."
  (let ((message (missing-internals-message use)))
    (and message
         (list :status :error
               :error (list :type "CL-MCP:NOT-IMPLEMENTED" :message message :backtrace nil)))))

;;;; Loading the parts

(defvar *loaded-digest* nil
  "The SHA-256 of the agent's files loaded into a shared image, set by
cl-mcp after loading them, so that attaching again does not reload them.")

(defparameter *agent-parts*
  '("output"       ; logging, capped output streams, printing that never fails
    "conditions"   ; naming conditions, backtraces, reading code
    "guards"       ; keeping the terminal and the debugger out; threads
    "listeners"    ; listeners only cl-mcp can take; the lane (embedded)
    "registries"   ; evaluations' mailboxes, registries, deadlines
    "history"      ; the REPL's variables, the values kept
    "evaluate"     ; the evaluation's thread, waiting at an error
    "definitions"  ; the session's definitions
    "names"        ; names and places; find-definition, describe-symbol
    "code"         ; xref, compile-file, load-system
    "reading"      ; reading a file's text that runs and interns nothing
    "forms"        ; compile-form: one top-level form, as C-c C-c
    "browse"       ; apropos, macroexpand, inspect
    "edit"         ; edit-form, read-lisp-file: a file's top-level forms
    "tests"        ; run-tests: FiveAM's and RT's results, as an evaluation
    "threads"      ; the image's threads: list, backtrace, interrupt, kill
    "user-threads" ; user threads' output kept, their errors stopped at
    "profile"      ; profile: code under SB-SPROF or SB-PROFILE, a report
    "setup"        ; setting an image up, resetting a session
    "watch")       ; the programmer's Emacs sees, stops and holds the calls
  "The agent's parts (agent/NAME.lisp), in loading order: each uses only
what the parts before it define.")

(defun compiled-part (source stem)
  "SOURCE compiled once per SBCL version to STEM-VERSION.fasl, whose name
is returned.  It is compiled to a name of its own and renamed, so two
images starting at once never load a half-written file, and made writable
by its owner only, whatever the umask, or cl-mcp would refuse it next time."
  (let* ((fasl (format nil "~A-~A.fasl" stem (lisp-implementation-version)))
         (temp (format nil "~A.~D.tmp" fasl (sb-posix:getpid))))
    (unless (probe-file fasl)
      (compile-file source :output-file temp)
      (sb-posix:chmod temp #o600)
      (rename-file temp fasl))
    fasl))

(defun load-parts (directory fasl-stem)
  "Load the agent's parts from DIRECTORY, each compiled once to
FASL-STEM-PART-VERSION.fasl (FASL-STEM names a file in a directory that
cl-mcp made and checked).  One compilation unit, so that the calls that
go back and forth between parts are not warned about."
  (with-compilation-unit ()
    (dolist (part *agent-parts*)
      (load (compiled-part (merge-pathnames (make-pathname :name part :type "lisp")
                                            directory)
                           (format nil "~A-~A" fasl-stem part)))))
  (check-internals)
  t)

(defun load-part-texts (texts)
  "Load the agent's parts from TEXTS, a list of (PART TEXT) string pairs
holding every part, in `*agent-parts*' order whatever the order of TEXTS."
  (with-compilation-unit ()
    (dolist (part *agent-parts*)
      (let ((text (second (assoc part texts :test #'string=))))
        (unless text
          (error "cl-mcp sent no text for the agent's part ~A" part))
        (load (make-string-input-stream text)))))
  (check-internals)
  t)

