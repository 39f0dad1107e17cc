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
;;;   swank::*pre-reply-hook*         runs `prune-swank-mailboxes' and
;;;                                   `deliver-thread-news'
;;;   swank:swank-debugger-hook       a watched thread's error when no
;;;                                   cl-mcp is attached any more
;;;   swank::*configure-emacs-indentation*   nil in an embedded image
;;;   swank::parse-symbol             a name looked up, never interned
;;;   swank::xref-doit                `xref-of': the who-* cross-references
;;;   swank/sbcl::source-location-for-xref-data, swank/sbcl::sanitize-xrefs
;;;                                   `xref-references': the locations of
;;;                                   `referrers', as the backend's who-calls
;;;                                   makes them
;;;   swank::collect-notes            `compile-file-of': compiler notes, as
;;;                                   C-c C-k gathers them
;;;   swank::make-compiler-note       `load-system': a note, as
;;;                                   `collect-notes' makes it
;;;   swank::compilation-result-notes, compilation-result-faslfile,
;;;   compilation-result-successp     what `collect-notes' returns
;;;   swank::*buffer-package*, swank::*buffer-readtable*
;;;                                   `compile-form-of': the package and
;;;                                   readtable compile-string-for-emacs reads
;;;                                   in, as a buffer's for C-c C-c
;;;   swank::fasl-pathname            where SLIME puts a file's fasl
;;;   swank::apropos-symbols          `apropos-of': the symbols a pattern
;;;                                   matches, as M-x slime-apropos finds them
;;;   swank::make-istate, swank::*istate*   `inspector-content' binds a state
;;;                                   of its own for the contribs that read it
;;;   swank::*inspector-printer-bindings*   the inspector's printer settings
;;;   swank::content-range            the inspector's content, lazy or not,
;;;                                   as a list
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
;;;   swank/source-file-cache::source-cache-entry.text
;;;                                   a file's text as it was compiled, kept
;;;                                   under its pathname and namestring
;;;                                   (`remember-source'), for the line a
;;;                                   moved definition had
;;;
;;; SBCL
;;;   sb-debug::map-backtrace         walks the frames of an error
;;;   sb-debug::frame-call            a frame's function name
;;;   sb-debug::print-frame-call      a frame printed as a call
;;;   sb-di:frame-code-location, frame-debug-fun, do-debug-fun-vars,
;;;   debug-var-symbol, debug-var-validity, debug-var-value
;;;                                   a frame's local variables
;;;   sb-di:eval-in-frame             `eval-in-frame-of'
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
;;;   sb-kernel:dynamic-usage         bytes of heap in use: kept values give
;;;                                   way past half of it after a collection
;;;                                   (`note-heap-after-gc')
;;;   sb-sys:wait-until-fd-usable     the lane's and the listeners' waits
;;;   sb-sys:fd-stream-fd             a socket stream's file descriptor
;;;   asdf/find-component:missing-requires   the system a load missed (not
;;;                                   exported from ASDF itself)
;;;   sb-int:encapsulate, sb-int:encapsulated-p   run-tests' hooks on FiveAM's
;;;                                   RUN and RT's DO-ENTRY (as TRACE wraps);
;;;                                   SB-THREAD:MAKE-THREAD in a shared image
;;;                                   (`watch-threads-started-by-cl-mcp')
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
           #:output-slice
           #:abort-all
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
    "forms"        ; compile-form: one top-level form, as C-c C-c
    "browse"       ; apropos, macroexpand, inspect
    "tests"        ; run-tests: FiveAM's and RT's results, as an evaluation
    "threads"      ; the image's threads: list, backtrace, interrupt, kill
    "user-threads" ; user threads' output kept, their errors stopped at
    "profile"      ; profile: code under SB-SPROF or SB-PROFILE, a report
    "setup")       ; setting an image up, resetting a session
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
  t)

