;;;; agent/setup.lisp --- setting an image up
;;;;
;;;; Preparing an image cl-mcp owns or shares, and resetting a session.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

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
  "For an error in one of cl-mcp's, Swank's or SBCL's own threads (a user's
thread stops at its error instead, `thread-debugger-hook'): log it to the
image's stderr (cl-mcp's log) and end that thread, instead of waiting for a
debugger nobody will open."
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
the one client, never opens its debugger, user threads' output is kept
and their errors stop them (`watch-user-threads'), a thread an evaluation
starts is known as that evaluation's, and errors in its own threads are
logged.  Return t."
  (setf (fdefinition 'swank::slime-secret) (lambda () secret))
  (setf swank:*global-debugger* nil
        swank::*configure-emacs-indentation* nil
        *debugger-hook* nil)
  (watch-user-threads)
  ;; The threads evaluations start are watched as in a shared image.
  (watch-threads-started-by-cl-mcp)
  (install-mailbox-pruning)
  (pushnew 'note-heap-after-gc sb-ext:*after-gc-hooks*)
  t)

(defvar *attach-lock* (sb-thread:make-mutex :name "cl-mcp attach")
  "Guards `*connections*' and cl-mcp's marks on a shared image while a
connection comes or goes.")

(defun prepare-attached-connection (&key (pid 0) (client ""))
  "Settings for cl-mcp's connection to an image the programmer shares:
remember what the session creates, and stand aside so that Swank keeps
sending the debugger of the programmer's own threads to Emacs (Swank sends
it to the newest connection, which would otherwise be cl-mcp's); put on
the image what `detach-from-image' takes off once cl-mcp's last connection
goes.  PID is cl-mcp's process and CLIENT its host's name, which the
programmer's Emacs shows beside its calls.  Return t."
  (setf *track-session* t)
  (sb-thread:with-mutex (*attach-lock*)
    (let ((ours swank::*emacs-connection*))
      (setf *connections* (cons ours (intersection *connections* swank::*connections*)))
      (setf swank::*connections*
            (append (remove ours swank::*connections*) (list ours))))
    (install-mailbox-pruning)
    (watch-threads-started-by-cl-mcp)
    (unless (sb-int:encapsulated-p 'swank::close-connection% 'cl-mcp-unsent)
      (sb-int:encapsulate 'swank::close-connection% 'cl-mcp-unsent 'close-dropping-unsent))
    (pushnew 'forget-connection swank::*connection-closed-hook*)
    (pushnew 'note-heap-after-gc sb-ext:*after-gc-hooks*)
    (setf *detached* nil))
  (set-connection-nodelay)
  (watch-session-attached swank::*emacs-connection* pid client)  ; agent/watch.lisp
  t)

(defun close-dropping-unsent (close-connection connection &rest arguments)
  "Swank's `close-connection%' (CLOSE-CONNECTION), encapsulated while
cl-mcp is attached: the connection of a cl-mcp that was killed while the
image wrote to it holds output nobody can receive, and Swank's CLOSE of
its socket stream then signals (\"Couldn't write ... Connection reset by
peer\") in the sentinel thread, which stops in the debugger: no connection
closes after it, and cl-mcp's marks never come off.  For cl-mcp's own
connections, the stream is closed with :abort (its unsent output dropped)
and Swank's close is done again; any other connection closes as Swank
closes it."
  (let ((stream (swank::connection.socket-io connection)))
    (cond ((not (member connection *connections*))
           (apply close-connection connection arguments))
          ((block unsendable
             (handler-bind ((stream-error
                              (lambda (condition)
                                (when (eq (stream-error-stream condition) stream)
                                  (return-from unsendable t)))))
               (apply close-connection connection arguments)
               nil))
           (close stream :abort t)
           (apply close-connection connection arguments)))))

;;;; Detaching: the image as it was without cl-mcp
;;;
;;; Swank runs `*connection-closed-hook*' in its sentinel thread for every
;;; connection that ends, however it ends: closed by cl-mcp, or its socket
;;; at end of file because cl-mcp was killed.  When the last of cl-mcp's
;;; goes, what cl-mcp put on the image comes off, and the next
;;; `prepare-attached-connection' puts it back.

(defun detach-from-image ()
  "Leave the image as without cl-mcp (the caller holds `*attach-lock*'):
the threads cl-mcp's evaluations started write to, and stop at their
errors in, what they would have without it (`*detached*'), those waiting
at an error for cl-mcp included; no make-thread or close-connection%
wrapper, no hook of
cl-mcp's before Swank's replies, on its connections or after SBCL's
collections, the test frameworks unwrapped, and no deadline watchdog."
  (setf *detached* t)
  ;; Threads stopped for cl-mcp are let go: at their errors, to the image's
  ;; debugger; interrupted by the threads tool, back to their work.
  (dolist (stop (with-agent-lock (*registry-lock*) (remove-if-not #'thread-stop-p *suspended*)))
    (forget-evaluation stop)
    (post-command stop (list :abort)))
  (unwatch-threads)
  (when (sb-int:encapsulated-p 'swank::close-connection% 'cl-mcp-unsent)
    (sb-int:unencapsulate 'swank::close-connection% 'cl-mcp-unsent))
  (setf swank::*pre-reply-hook* (remove 'prune-swank-mailboxes swank::*pre-reply-hook*)
        swank::*connection-closed-hook* (remove 'forget-connection swank::*connection-closed-hook*)
        sb-ext:*after-gc-hooks* (remove 'note-heap-after-gc sb-ext:*after-gc-hooks*))
  (remove-hooks)
  (end-watchdog))

(defun forget-connection (connection)
  "Swank's `*connection-closed-hook*': CONNECTION has ended, however (closed
by its cl-mcp, or its cl-mcp killed): the work of its session ends with it
(`abort-all'), nobody else's; once no cl-mcp connection is left,
`detach-from-image', which lets the user's threads the session stopped go
to the image's debugger.  It runs in Swank's sentinel, which must never
meet an error."
  (handler-case
      (sb-thread:with-mutex (*attach-lock*)
        (setf *connections* (remove connection *connections*))
        (let ((last (not (intersection *connections* swank::*connections*))))
          (let ((aborted (abort-all connection (not last))))
            (watch-session-left connection aborted))  ; agent/watch.lisp
          (forget-session-record connection)
          (when last
            (detach-from-image))))
    (error (condition)
      (log-note "could not detach from the image: ~A" condition))))

(defun defined-by-a-file-p (package)
  "Whether PACKAGE's `defpackage' was in a file that was loaded (ASDF may
still call that file loaded, as after a load that failed part way)."
  (ignore-errors
   (sb-introspect:definition-source-pathname (sb-introspect:find-definition-source package))))

(defun soft-reset ()
  "Remove what cl-mcp's evaluations created in a shared image (their CL-USER
definitions and their packages) and abort this session's evaluations
waiting at an error or running in the background, and drop the objects the inspect tool keeps for their handles, the
sources of the definitions find-definition keeps, cl-mcp's own values of
the REPL's variables (`*', `+', `/' ...) and the values `value' keeps.
What loading made stays, so that no system or module is left called loaded
without its packages: what an evaluation that loaded one created is recorded
apart (see `call-tracking-session'), and a package defined by a file is kept.
Everything else in the image is left as it was.  Return a plist of names
that says what went and what stayed: :aborted (a count), :removed-symbols,
:removed-packages, :file-packages (kept: defined in a loaded file), and
:loaded-systems, :kept-symbols, :kept-packages (kept: made by evaluations
that loaded those systems or modules)."
  (let ((aborted (abort-all)))
    (forget-inspected)
    (forget-repl-definitions)
    (forget-history)
    (let ((user (find-package "COMMON-LISP-USER"))
          (removed-symbols '()) (removed-packages '()) (file-packages '()))
      (multiple-value-bind (symbols packages kept)
          (let ((record (session-record)))
            (with-agent-lock (*registry-lock*)
              (values (shiftf (session-record-symbols record) '())
                      (shiftf (session-record-packages record) '())
                      (shiftf (session-record-kept record) '()))))
        (dolist (package packages)
          (when (package-name package)
            (if (defined-by-a-file-p package)
                (push (package-name package) file-packages)
                (handler-case (let ((name (package-name package)))
                                (delete-package package)
                                (push name removed-packages))
                  (error (c) (log-note "could not delete package ~A: ~A" (package-name package) c))))))
        (dolist (symbol symbols)
          (when (eq (symbol-package symbol) user)
            (forget-definitions symbol)
            (unintern symbol user)
            (push (symbol-name symbol) removed-symbols)))
        (flet ((kept (key)
                 (remove-duplicates (loop for entry in kept append (funcall key entry))
                                    :test #'equal)))
          (list :aborted aborted
                :removed-symbols removed-symbols
                :removed-packages removed-packages
                :file-packages file-packages
                :loaded-systems (kept #'first)
                :kept-symbols (mapcar #'symbol-name
                                      (remove-if-not (lambda (symbol) (eq (symbol-package symbol) user))
                                                     (kept #'second)))
                :kept-packages (mapcar #'package-name
                                       (remove-if-not #'package-name (kept #'third)))))))))
