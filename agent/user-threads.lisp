;;;; agent/user-threads.lisp --- what the user's threads print, and their errors
;;;;
;;;; A thread the user's code starts has no evaluation around it: what it
;;;; prints and the error it meets would reach nobody (an image cl-mcp owns
;;;; has no terminal, and a shared image's belong to the programmer's
;;;; Emacs).  Here its output is kept, each line marked with the thread's
;;;; name, and an error no handler takes stops the thread where it
;;;; happened, under an evaluation number, as SLIME's debugger stops any
;;;; thread.  What happened since cl-mcp's last request goes to cl-mcp just
;;;; before its next reply (a `:cl-mcp-threads' message on a Swank
;;;; channel), and cl-mcp tells
;;;; the model in that call's result.
;;;;
;;;; Which threads: in an image cl-mcp owns, every thread that is not
;;;; cl-mcp's, Swank's or SBCL's, through the global output streams and
;;;; debugger hook.  In a shared image, only the threads that cl-mcp's
;;;; evaluations start, and the threads those start: SB-THREAD:MAKE-THREAD
;;;; is wrapped so that such a thread binds the streams and the hook, and
;;;; the programmer's own threads still go to Emacs.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; The news: what user threads did since cl-mcp last heard

(defparameter *news-output-limit* 1000000
  "Characters of each stream of thread output kept between two of
cl-mcp's requests; the oldest are dropped first.")

(defstruct (news-text (:constructor make-news-text ()))
  "One stream of the threads' output: its lines, each begun with the
name of the thread that wrote it."
  (buffer (make-text-buffer))
  (dropped 0))       ; the oldest characters, dropped past the limit

(defstruct (news (:constructor make-news ()))
  "What user threads did since cl-mcp's last request."
  (stdout (make-news-text))
  (stderr (make-news-text))
  (writers '())  ; (LABEL CHARACTERS LINES) lists, the first writer first
  (stops '())    ; a plist for each thread that stopped at an error
  (ends '())     ; a plist for each stopped thread aborted past the limits
  (untold 0))    ; stops and ends past `*news-entry-limit*', only counted

(defparameter *news-entry-limit* 50
  "Stops, and ends, told one by one between two of cl-mcp's requests; the
rest are counted (their errors are still written to the threads' output).")

(defvar *news-lock* (sb-thread:make-mutex :name "cl-mcp thread news")
  "Guards `*news-by-owner*' and `*thread-lines*'; taken by `with-news-lock'.")

(defmacro with-news-lock (&body body)
  "BODY holding `*news-lock*' (`with-agent-lock'): every reply to cl-mcp
takes the news first."
  `(with-agent-lock (*news-lock*) ,@body))

(defvar *news-by-owner* (make-hash-table :test 'eq)
  "The `news' cl-mcp has not heard yet, by whose it is (`news-owner').")

(defun news-owner ()
  "Whose the news of this thread is: in a shared image, the live session
whose evaluation started it (each attached cl-mcp hears of its own
threads); else nil, nobody's, which every session hears (in an image
cl-mcp owns there is one; a thread whose session ended is nobody's)."
  (and *track-session* (live-session (current-session))))

(defstruct (thread-lines (:constructor make-thread-lines ()))
  "A user thread's line on each stream: what it wrote of a line it has not
ended (a text buffer, or nil), and the streams whose next line continues
one cut when cl-mcp took the news."
  (stdout nil)
  (stderr nil)
  (continued '())
  (owner nil))  ; whose news its lines go to (`news-owner', at its first write)

(defvar *thread-lines* (make-hash-table :test 'eq :weakness :key)
  "Each user thread's `thread-lines', guarded by `*news-lock*'.  A line
goes to the news when its thread ends it, whole whatever other threads
write meanwhile; what is unfinished when cl-mcp takes the news goes with
it, ended there, and its rest comes in the next news marked [LABEL]+, so
that the thread's text can be read back as it wrote it.")

(defun thread-label (thread)
  "The name that marks THREAD's lines: its name, or its id."
  (or (sb-thread:thread-name thread) (format nil "thread ~D" (thread-id thread))))

(defvar *news-labels* (make-hash-table :test 'eq :weakness :key :synchronized t)
  "Each user thread's `news-label', by thread, made at its first write.")

(defun news-label (thread)
  "The name that marks THREAD's lines in the news: its `thread-label',
with its id when another live thread had its name at its first write
(lparallel names every worker of a kernel alike): a line that continues
one cut before must say whose it is."
  (or (gethash thread *news-labels*)
      (setf (gethash thread *news-labels*)
            (let ((name (sb-thread:thread-name thread)))
              (if (and name (find-if (lambda (other)
                                       (and (not (eq other thread))
                                            (equal (sb-thread:thread-name other) name)))
                                     (sb-thread:list-all-threads)))
                  (format nil "~A (thread ~D)" name (thread-id thread))
                  (thread-label thread))))))

(defun owners-news (owner)
  "The news being gathered for OWNER (the caller holds `*news-lock*')."
  (or (gethash owner *news-by-owner*) (setf (gethash owner *news-by-owner*) (make-news))))

(defun keep-news-text (text string start end)
  "Append STRING from START to END to TEXT, dropping its oldest characters
past `*news-output-limit*' (a quarter of the limit at a time, so that a
steady flood moves the buffer once per quarter)."
  (let* ((limit *news-output-limit*)
         (skipped (max 0 (- end start limit)))
         (start (+ start skipped))
         (buffer (news-text-buffer text))
         (fill (fill-pointer buffer))
         (excess (- (+ fill (- end start)) limit)))
    (incf (news-text-dropped text) skipped)
    (when (plusp excess)
      (let ((drop (min fill (max excess (floor limit 4)))))
        (replace buffer buffer :start2 drop)
        (setf (fill-pointer buffer) (- fill drop))
        (incf (news-text-dropped text) drop)))
    (setf (news-text-buffer text) (append-text (news-text-buffer text) string start end))))

(defun add-thread-text (text thread string start end &key continued)
  "Append STRING from START to END, whole lines but for the last, to TEXT
as THREAD's, each line begun with [LABEL] (its first with [LABEL]+ when
it CONTINUED the thread's line cut in the news before).  Return how many
lines it began."
  (let ((label (news-label thread))
        (lines 0))
    (loop with position = start
          while (< position end)
          do (let ((prefix (format nil "[~A]~:[~;+~] " label (and continued (zerop lines)))))
               (incf lines)
               ;; An empty line gets the name alone.
               (keep-news-text text prefix 0 (if (char= (char string position) #\Newline)
                                                 (1- (length prefix))
                                                 (length prefix))))
             (let ((stop (1+ (or (position #\Newline string :start position :end end) (1- end)))))
               (keep-news-text text string position stop)
               (setf position stop)))
    lines))

(defun add-lines (kind thread string start end)
  "Keep what THREAD wrote to its KIND stream (:stdout or :stderr), STRING
from START to END, in the news, and count it for THREAD (the caller holds
`*news-lock*')."
  (let* ((state (gethash thread *thread-lines*))
         (news (owners-news (thread-lines-owner state)))
         (lines (add-thread-text (if (eq kind :stdout) (news-stdout news) (news-stderr news))
                                 thread string start end
                                 :continued (and state (member kind (thread-lines-continued state)))))
         (writers (news-writers news))
         ;; Past the limit, new writers share one entry: a server that
         ;; names a thread per connection must not grow the news.
         (label (let ((own (news-label thread)))
                  (if (or (< (length writers) *news-entry-limit*)
                          (assoc own writers :test #'string=))
                      own
                      "(other threads)")))
         (entry (assoc label writers :test #'string=)))
    (when state
      (setf (thread-lines-continued state) (remove kind (thread-lines-continued state))))
    (if entry
        (progn (incf (second entry) (- end start))
               (incf (third entry) lines))
        (setf (news-writers news)
              (append writers (list (list label (- end start) lines)))))))

(defun unfinished-line (state kind)
  "STATE's unfinished line on KIND's stream, or nil."
  (if (eq kind :stdout) (thread-lines-stdout state) (thread-lines-stderr state)))

(defun (setf unfinished-line) (text state kind)
  "Make TEXT (or nil) STATE's unfinished line on KIND's stream."
  (if (eq kind :stdout) (setf (thread-lines-stdout state) text) (setf (thread-lines-stderr state) text)))

(defun cut-unfinished-lines (thread state)
  "Keep THREAD's unfinished lines (its STATE's) in the news, each ended by
a newline it did not write: its next characters continue them (the
caller holds `*news-lock*')."
  (dolist (kind '(:stdout :stderr))
    (let ((text (unfinished-line state kind)))
      (when text
        (setf (unfinished-line state kind) nil)
        (add-lines kind thread text 0 (length text))
        (keep-news-text (let ((news (owners-news (thread-lines-owner state))))
                          (if (eq kind :stdout) (news-stdout news) (news-stderr news)))
                        (string #\Newline) 0 1)
        (push kind (thread-lines-continued state))))))

(defun record-output (kind thread string start end)
  "Keep what THREAD wrote to its KIND stream (:stdout or :stderr): the
lines it ends in the news, the rest as its unfinished line."
  (when (< start end)
    (with-news-lock
      (let* ((state (or (gethash thread *thread-lines*)
                        (let ((state (make-thread-lines)))
                          (setf (thread-lines-owner state) (news-owner)
                                (gethash thread *thread-lines*) state))))
             (unfinished (unfinished-line state kind))
             (newline (position #\Newline string :start start :end end :from-end t)))
        (when newline
          (if unfinished
              (let ((text (append-text unfinished string start (1+ newline))))
                (setf (unfinished-line state kind) nil)
                (add-lines kind thread text 0 (length text)))
              (add-lines kind thread string start (1+ newline)))
          (setf start (1+ newline)))
        (when (< start end)
          (setf (unfinished-line state kind)
                (append-text (or (unfinished-line state kind) (make-text-buffer)) string start end)))))))

(defun line-column (kind thread)
  "How far into its line THREAD is on its KIND stream: nil (unknown) when
its line was cut in the news before."
  (with-news-lock
    (let ((state (gethash thread *thread-lines*)))
      (cond ((null state) 0)
            ((unfinished-line state kind) (fill-pointer (unfinished-line state kind)))
            ((member kind (thread-lines-continued state)) nil)
            (t 0)))))

(defun stop-text (entry)
  "The lines that keep a stopped thread's error: its condition, then its
backtrace."
  (format nil "stopped at ~A: ~A~@[ (evaluation ~D)~]~%~{  ~A~%~}"
          (getf entry :type) (one-line (getf entry :message) 2000)
          (getf entry :evaluation) (getf entry :backtrace)))

(defun record-stop (thread entry)
  "THREAD stopped at an error, which ENTRY describes: keep the error with
its backtrace among THREAD's error output, and tell cl-mcp."
  (let ((text (stop-text entry)))
    (with-news-lock
      (let* ((state (gethash thread *thread-lines*))
             (news (owners-news (if state (thread-lines-owner state) (news-owner)))))
        ;; What it wrote before comes first, its error on a line of its own.
        (when state
          (cut-unfinished-lines thread state)
          (setf (thread-lines-continued state) (remove :stderr (thread-lines-continued state))))
        (add-thread-text (news-stderr news) thread text 0 (length text))
        (if (< (length (news-stops news)) *news-entry-limit*)
            (setf (news-stops news) (append (news-stops news) (list (without-backtrace entry))))
            (incf (news-untold news)))))))

(defun without-backtrace (entry)
  "ENTRY without its :backtrace, which the thread's output keeps."
  (loop for (key value) on entry by #'cddr
        unless (eq key :backtrace) append (list key value)))

(defun record-end (entry reason)
  "The stopped thread ENTRY describes was aborted for REASON: tell cl-mcp."
  (with-news-lock
    (let ((news (owners-news (news-owner))))
      (if (< (length (news-ends news)) *news-entry-limit*)
          (setf (news-ends news)
                (append (news-ends news) (list (list* :reason reason (without-backtrace entry)))))
          (incf (news-untold news))))))

(defun takers-owners (owner)
  "Whose news OWNER's session hears: its own, nobody's, and that of each
session that has ended (its threads are nobody's now)."
  (let ((owners (adjoin nil (list owner))))
    (loop for other being the hash-keys of *news-by-owner*
          unless (live-session other) do (pushnew other owners))
    owners))

(defun take-news ()
  "The news this session hears (`takers-owners') as plists for cl-mcp,
once, one for each owner that has some: :number (under which the output
is kept, when there is output), :stdout and :stderr (with
:stdout-dropped, :stderr-dropped), :writers, :stops, :ends, :untold."
  (let ((taken (with-news-lock
                 (let ((owners (takers-owners (news-owner))))
                   (maphash (lambda (thread state)
                              (when (member (thread-lines-owner state) owners)
                                (cond ((or (thread-lines-stdout state) (thread-lines-stderr state))
                                       (cut-unfinished-lines thread state))
                                      ((null (thread-lines-continued state))
                                       (remhash thread *thread-lines*)))))
                            *thread-lines*)
                   (loop for owner in owners
                         for news = (gethash owner *news-by-owner*)
                         when news collect news
                           and do (remhash owner *news-by-owner*))))))
    (mapcar #'news-report taken)))

(defun news-report (news)
  "NEWS as the plist `take-news' sends."
  (let ((stdout (news-stdout news))
        (stderr (news-stderr news))
        (report (list :writers (news-writers news)
                      :stops (news-stops news)
                      :ends (news-ends news)
                      :untold (news-untold news))))
    (flet ((add (key value) (setf report (list* key value report))))
      (dolist (stream (list (list :stdout :stdout-dropped stdout)
                            (list :stderr :stderr-dropped stderr)))
        (destructuring-bind (key dropped-key text) stream
          (when (plusp (fill-pointer (news-text-buffer text)))
            (add key (coerce (news-text-buffer text) 'simple-string)))
          (when (plusp (news-text-dropped text))
            (add dropped-key (news-text-dropped text)))))
      (when (or (getf report :stdout) (getf report :stderr))
        (add :number (with-agent-lock (*registry-lock*) (incf *evaluation-counter*)))))
    report))

(defparameter *news-channel* 0
  "The channel number the news goes on.")

(defun cl-mcp-connection-p ()
  "True when the request being answered came on one of cl-mcp's
connections (in an image cl-mcp owns, they all do)."
  (or (not *track-session*) (member swank::*emacs-connection* *connections*)))

(defun deliver-thread-news ()
  "Send cl-mcp the news, just before the reply to one of its requests (a
Swank pre-reply hook; `answer-directly' calls it too)."
  ;; Both counts read unlocked: a hint, taken again under the lock.
  (when (and (or (plusp (hash-table-count *news-by-owner*)) (plusp (hash-table-count *thread-lines*)))
             (cl-mcp-connection-p))
    ;; Run before the reply is sent: an error here must not turn the
    ;; request it precedes into an abort.
    (handler-case
        (dolist (news (take-news))
          ;; Swank passes on only the events it knows: a message on a channel
          ;; is one (cl-mcp opens no channel; the number is cl-mcp's own).
          (swank::send-to-emacs (list :channel-send *news-channel* (list :cl-mcp-threads news))))
      (error (condition)
        (log-note "thread news not sent: ~A" condition)))))

;;;; The streams user threads write to

(defvar *detached* nil
  "True in a shared image once the last cl-mcp connection has gone (see
`detach-from-image'): the threads watched before then write, and stop at
their errors, as they would have without cl-mcp.")

(defclass thread-output-stream (sb-gray:fundamental-character-output-stream)
  ((kind :initarg :kind :reader kind
         :documentation ":stdout or :stderr: which news text it adds to.")
   (fallback :initarg :fallback :reader fallback
             :documentation "Where the writes of other threads go.")
   (own-variable :initarg :own-variable :reader own-variable
                 :documentation "The stream variable it stands for: its global
value is where a user's thread writes once cl-mcp has detached."))
  (:documentation "What a user's thread writes is kept in the news; what
cl-mcp's, Swank's or SBCL's own threads write goes on to FALLBACK, as
before (in an image cl-mcp owns, its log)."))

(defun passed-on (stream)
  "Where the current thread's write to STREAM goes, or nil when the news
keeps it: another thread's goes to the fallback, and once cl-mcp has
detached, a user's thread's goes to the stream it would have had without
cl-mcp (the global value of the variable STREAM stands for)."
  (cond ((not (eq (owner-by-name sb-thread:*current-thread*) :user)) (fallback stream))
        (*detached*
         (let ((own (sb-ext:symbol-global-value (own-variable stream))))
           (if (eq own stream) (fallback stream) own)))))

(defmethod sb-gray:stream-write-string ((stream thread-output-stream) string
                                        &optional (start 0) end)
  "Keep a user thread's STRING; pass another's on."
  (let ((destination (passed-on stream)))
    (if destination
        (write-string string destination :start start :end end)
        (record-output (kind stream) sb-thread:*current-thread* string start
                       (or end (length string))))
    string))

(defmethod sb-gray:stream-write-char ((stream thread-output-stream) char)
  "Keep a user thread's CHAR; pass another's on."
  (let ((destination (passed-on stream)))
    (if destination
        (write-char char destination)
        (record-output (kind stream) sb-thread:*current-thread* (string char) 0 1))
    char))

(defmethod sb-gray:stream-line-column ((stream thread-output-stream))
  "How far into its line the current thread is (`line-column'); once
cl-mcp has detached, a user's thread's column is its stream's."
  (if (and *detached* (eq (owner-by-name sb-thread:*current-thread*) :user))
      (sb-kernel:charpos (passed-on stream))
      (line-column (kind stream) sb-thread:*current-thread*)))

(defmethod sb-gray:stream-finish-output ((stream thread-output-stream))
  "Output passed on goes out now."
  (let ((destination (passed-on stream)))
    (when destination (finish-output destination)))
  nil)

(defmethod sb-gray:stream-force-output ((stream thread-output-stream))
  "Output passed on goes out soon."
  (let ((destination (passed-on stream)))
    (when destination (force-output destination)))
  nil)

(defvar *thread-stdout* nil
  "The `thread-output-stream' user threads' standard output goes to.")

(defvar *thread-stderr* nil
  "The `thread-output-stream' user threads' error output goes to (and
their trace output, in an image cl-mcp owns).")

(defvar *thread-trace* nil
  "The `thread-output-stream' the trace output of the threads watched in a
shared image goes to.")

(defun make-thread-streams ()
  "Make `*thread-stdout*', `*thread-stderr*' and `*thread-trace*', passing
other threads' writes on to the global output streams of now; once."
  (unless *thread-trace*
    (flet ((make (kind variable)
             (make-instance 'thread-output-stream :kind kind :own-variable variable
                                                  :fallback (sb-ext:symbol-global-value variable))))
      (setf *thread-stdout* (make :stdout '*standard-output*)
            *thread-stderr* (make :stderr '*error-output*)
            *thread-trace* (make :stderr '*trace-output*)))))

;;;; A user thread stopped at its error

(defun thread-restarts (restarts)
  "RESTARTS up to the thread's own ABORT (the last one), which ends it."
  (let ((thread-abort (position 'abort restarts :key #'restart-name :from-end t)))
    (if thread-abort (subseq restarts 0 (1+ thread-abort)) restarts)))

(defun end-thread (restarts)
  "Abort this thread through its own ABORT restart, the last of RESTARTS."
  (let ((thread-abort (find 'abort restarts :key #'restart-name :from-end t)))
    (if thread-abort
        (invoke-restart thread-abort)
        (sb-thread:abort-thread))))

(defvar *started-by-cl-mcp* nil
  "True in a thread a cl-mcp evaluation started (or one such a thread
started).")

(defun hurry-evaluation (evaluation)
  "While EVALUATION's caller still waits for it, answer \"still running\"
now, as at an answer window's close (`run-in-background', with the news of
the stop), its deadline left where it was; true when it is told to.  The
stretch's deadline token is swapped for an answer window that closes now,
so that it still lands only in that stretch."
  (let* ((token (evaluation-deadline evaluation))
         (began (or (first (evaluation-readings evaluation)) (evaluation-started evaluation)))
         (hurried (and token
                       (or (eq (second token) :answer) (evaluation-continuation evaluation))
                       (list (first token) :answer
                             (/ (- (get-internal-real-time) began) internal-time-units-per-second)))))
    (when (and hurried
               (eq token (sb-ext:compare-and-swap (evaluation-deadline evaluation) token hurried)))
      (interrupt-at-deadline evaluation hurried)
      t)))

(defun hurry-waiting-callers ()
  "A user's thread has just stopped at its error, which SLIME would show at
once: every call of cl-mcp's whose caller still waits within its answer
window (an evaluation, or a load's, compile's or test run's work) answers
\"still running\" now, with the news of the stop, whatever it waits on: the
thread it started, a socket to a server in this image, a lock (see
`hurry-evaluation').  Only the calls of the thread's own session (in a
shared image, another cl-mcp's calls are theirs), and only while the
background has room for them (a call answered \"still running\" goes on
there).  True when one was told to."
  (let ((hurried nil)
        (session (current-session)))
    (dolist (evaluation (with-agent-lock (*deadline-lock*)
                          (remove-duplicates (mapcar #'second *deadlines*)))
                        hurried)
      (when (and (own-evaluation-p evaluation session)
                 (< (length (background-running)) *max-background*)
                 (hurry-evaluation evaluation))
        (setf hurried t)))))

(defun push-thread-news ()
  "Send cl-mcp the news now, on the connection of the thread's session (in
an image cl-mcp owns, its one connection), rather than with the reply to
its next request: a thread has just stopped at its error and no caller
waited to be told (`hurry-waiting-callers'), and cl-mcp logs it at once.
Only on a connection Swank serves with threads of its own, whose control
thread writes what any thread sends."
  (let ((connection (if *track-session*
                        (find (current-session) swank::*connections*)
                        (first swank::*connections*))))
    (when (typep connection 'swank::multithreaded-connection)
      ;; As Swank's with-connection binds them, but for its streams and
      ;; debugger, which are not this thread's to take: a count of one send
      ;; never asks Swank's client for a pong.
      (let ((swank::*emacs-connection* connection)
            (swank::*pending-slime-interrupts* '())
            (swank::*send-counter* 0))
        (deliver-thread-news)))))

(defun stop-user-thread (condition)
  "In a user's thread, at an error no handler took: wait there under an
evaluation number, as an evaluation waits at its error, and tell cl-mcp.
A restart the model invokes takes the thread on from its error; its ABORT
(listed in place of the thread's own) ends the thread and answers that it
was aborted; past `*max-suspended*' or `*suspend-seconds*' the thread is
aborted, its error and backtrace kept in the news; once cl-mcp has
detached, its error goes to the image's own debugger hooks instead."
  (let* ((thread sb-thread:*current-thread*)
         (own-restarts (thread-restarts (compute-restarts condition)))
         (frames (error-frames))
         ;; A thread whose session has ended is nobody's: any session may take it on.
         (evaluation (make-evaluation :may-wait t :code :thread-error :thread thread
                                      :session (live-session (current-session))))
         (entry nil)
         (left nil))
    (setf (evaluation-stdout evaluation) (make-capped-output-stream *inline-output*)
          (evaluation-stderr evaluation) (make-capped-output-stream *inline-output*)
          (evaluation-condition evaluation) condition
          (evaluation-frames evaluation) frames)
    (unwind-protect
         (restart-case
             (let ((restarts (append (if (and own-restarts (eq (restart-name (car (last own-restarts))) 'abort))
                                         (butlast own-restarts)
                                         own-restarts)
                                     (list (find-restart 'abort))))
                   (waiting (register-suspended evaluation)))
               (setf (evaluation-restarts evaluation) restarts
                     entry (list :thread (thread-label thread) :id (thread-id thread)
                                 :evaluation (and waiting (evaluation-id evaluation))
                                 :type (condition-type-name condition)
                                 :message (condition-message condition)
                                 :restarts (restart-entries restarts)
                                 :backtrace (frame-lines frames condition *backtrace-frame-limit*)))
               (record-stop thread entry)
               (when waiting
                 (unless (hurry-waiting-callers)
                   (push-thread-news)))
               (if waiting
                   (with-standard-streams ((evaluation-stdout evaluation) (evaluation-stderr evaluation))
                     (setf (evaluation-abort-restart evaluation) (find-restart 'give-up))
                     (with-debugger-calling ((lambda (c) (stop-at-error evaluation c)))
                       (command-loop evaluation)))
                   (setf left :no-waiting)))
           (give-up (&optional timed-out)
             :report "Stop waiting at the error."
             (setf left (if timed-out :timed-out :aborted)))
           (abort ()
             :report "Abort the thread: it ends."
             (setf left :ended)))
      (stop-deadline evaluation)
      (forget-evaluation evaluation)
      (case left
        ;; A restart the model invoked took the thread on: its caller hears.
        ((nil) (post-report evaluation
                            (list :status :ok :number (evaluation-id evaluation)
                                  :values (list (format nil "; thread ~S left its error and runs on"
                                                        (thread-label thread))))))
        (:ended (post-report evaluation
                             (list :status :aborted :number (evaluation-id evaluation))))))
    (cond ((eq left :ended))  ; the model that aborted it hears it from its call
          ;; cl-mcp has gone: the error goes where it would have without it.
          (*detached* (call-global-debugger-hooks condition))
          (t (record-end entry left)))
    (end-thread own-restarts)))

(defun thread-debugger-hook (condition hook)
  "SB-EXT:*INVOKE-DEBUGGER-HOOK* for the threads watched here: a user's
thread stops at its error (`stop-user-thread'), unless the user bound a
debugger hook of their own, which then has it; in a shared image cl-mcp
has detached from, the image's own hooks have it, as before cl-mcp came.
Errors in cl-mcp's or Swank's threads are logged (`log-background-error')."
  (cond ((not (eq (owner-by-name sb-thread:*current-thread*) :user))
         (log-background-error condition hook))
        (*debugger-hook* nil)  ; the user's own: SBCL calls it next
        (*detached* (call-global-debugger-hooks condition))
        (t (stop-user-thread condition))))

(defun call-global-debugger-hooks (condition)
  "Have CONDITION go where it would without cl-mcp's hook bound in this
thread: the image's global SB-EXT:*INVOKE-DEBUGGER-HOOK*, then its global
`*debugger-hook*' (Swank's debugger, with SLIME); when neither takes it,
SBCL's own debugger does, as INVOKE-DEBUGGER goes on."
  (let ((invoke (sb-ext:symbol-global-value 'sb-ext:*invoke-debugger-hook*))
        (debugger (sb-ext:symbol-global-value '*debugger-hook*)))
    (when (and invoke (not (eq invoke #'thread-debugger-hook)))
      (let ((sb-ext:*invoke-debugger-hook* nil))
        (funcall invoke condition invoke)))
    (when debugger
      (let ((*debugger-hook* nil))
        (funcall debugger condition debugger)))))

;;;; Watching threads

(defun call-watched (function arguments session)
  "Call FUNCTION on ARGUMENTS with output kept and errors stopped as a
user's thread's are here, in a thread an evaluation of SESSION started."
  (let ((*standard-output* *thread-stdout*)
        (*error-output* *thread-stderr*)
        (*trace-output* *thread-trace*)
        (sb-ext:*invoke-debugger-hook* #'thread-debugger-hook)
        (*debugger-hook* nil)
        (*started-by-cl-mcp* t)
        (*thread-session* session))
    (apply function arguments)))

(defun make-thread-watched (make-thread function &rest options)
  "SB-THREAD:MAKE-THREAD, wrapped: a thread started from a cl-mcp
evaluation, or from a thread one started, runs FUNCTION through
`call-watched'; every other thread is made as before."
  (let ((session (if *inside-evaluation*
                     (evaluation-session *inside-evaluation*)
                     *thread-session*)))
    (if (and (or *inside-evaluation* *started-by-cl-mcp*) (not *making-agent-thread*))
        (let ((thread (apply make-thread (lambda (&rest arguments)
                                           (call-watched function arguments session))
                             options)))
          (setf (gethash thread *threads-started-by-cl-mcp*) (or session t))
          thread)
        (apply make-thread function options))))

(defun watch-user-threads ()
  "In an image cl-mcp owns: every user thread's output is kept and its
errors stop it, through the global streams and debugger hook."
  (make-thread-streams)
  (setf (sb-ext:symbol-global-value '*standard-output*) *thread-stdout*
        (sb-ext:symbol-global-value '*error-output*) *thread-stderr*
        (sb-ext:symbol-global-value '*trace-output*) *thread-stderr*
        (sb-ext:symbol-global-value 'sb-ext:*invoke-debugger-hook*) #'thread-debugger-hook)
  (pushnew 'deliver-thread-news swank::*pre-reply-hook*))

(defun watch-threads-started-by-cl-mcp ()
  "The threads cl-mcp's evaluations start are watched (in a shared image,
only those), and know the evaluation that started them, by wrapping
SB-THREAD:MAKE-THREAD as TRACE wraps a function; once."
  (make-thread-streams)
  (unless (sb-int:encapsulated-p 'sb-thread:make-thread 'watched)
    (sb-ext:without-package-locks
      ;; By name: an agent loaded again (a new version) takes over.
      (sb-int:encapsulate 'sb-thread:make-thread 'watched 'make-thread-watched)))
  (pushnew 'deliver-thread-news swank::*pre-reply-hook*))

(defun unwatch-threads ()
  "In a shared image cl-mcp detaches from: SB-THREAD:MAKE-THREAD as it was,
no news delivered, and the news nobody will read dropped."
  (sb-ext:without-package-locks
    (sb-int:unencapsulate 'sb-thread:make-thread 'watched))
  (setf swank::*pre-reply-hook* (remove 'deliver-thread-news swank::*pre-reply-hook*))
  (with-news-lock (clrhash *news-by-owner*) (clrhash *thread-lines*)))
