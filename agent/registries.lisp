;;;; agent/registries.lisp --- evaluations' mailboxes, registries and deadlines
;;;;
;;;; The state an evaluation shares with the requests that follow it: its
;;;; mailbox, the registries of waiting and running evaluations, answering a
;;;; request from inside, deadlines, and what a session creates in a shared
;;;; image.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

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
  "The evaluation whose code runs here, or nil: an evaluate called from
there is nested, and its request belongs to the outer evaluation.")

(defvar *registry-lock* (sb-thread:make-mutex :name "cl-mcp evaluations")
  "Guards the image-wide records: the counter, `*suspended*', `*running*'
and the session record; taken with `with-agent-lock'.")

(defvar *evaluation-counter* 0
  "The number of the last evaluation made in this image.")

(defvar *track-session* nil
  "True in an attached image: remember what cl-mcp's evaluations create,
so that a soft reset removes exactly that.")

(defvar *connections* '()
  "cl-mcp's Swank connections to an attached image.")

(defvar *thread-session* nil
  "In a thread a cl-mcp evaluation started (or one such a thread started),
that evaluation's session (`current-session').")

(defun connection-session (connection)
  "The session of requests that come on CONNECTION: in a shared image, the
connection itself (each attached cl-mcp has its own); nil in an image
cl-mcp owns, which has one session."
  (and *track-session* connection))

(defun current-session ()
  "The cl-mcp session asking now: that of the request this thread serves,
or in a thread an evaluation started, that evaluation's
(`*thread-session*').  A session's evaluations are its own: another's may
be read, never taken on."
  (or (connection-session swank::*emacs-connection*) (and *track-session* *thread-session*)))

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
  ;; Seconds the caller waits before the request is answered "still
  ;; running" and the evaluation goes on in the background (see
  ;; `run-in-background'); nil: the caller waits for the outcome.
  (answer-within nil)
  (background nil)  ; true once it runs in the background
  (started (get-internal-real-time))
  (lock (sb-thread:make-mutex :name "cl-mcp evaluation"))
  (ready (sb-thread:make-waitqueue))
  (command nil)
  (report nil)
  (abandoned 0)  ; reports to drop: their callers gave up waiting (`await-report')
  (stdout nil) (stderr nil)
  (warnings '())
  (readings nil)
  (deadline nil)  ; the running stretch's token in *deadlines*
  (abort-restart nil)
  (condition nil)
  (waiting nil)
  (overflowed nil)
  (tag nil)
  (session (current-session))  ; whose it is
  ;; Held by a caller from its command to its report (`with-suspended'):
  ;; another session's reader must not take or overwrite them.
  (commands (sb-thread:make-mutex :name "cl-mcp evaluation commands"))
  (restarts '())
  (frames '()))

(defun make-evaluation (&rest initargs)
  "A new evaluation from INITARGS, numbered by the image-wide counter."
  (apply #'%make-evaluation
         :id (with-agent-lock (*registry-lock*) (incf *evaluation-counter*))
         initargs))

(defun thread-stop-p (evaluation)
  "True when EVALUATION is a user's thread stopped, at its error or by an
interrupt (agent/threads.lisp, agent/user-threads.lisp), not code cl-mcp
asked to run: such a stop arms no deadline, has a limit of its own, is
never the newest by default, and is let go when cl-mcp detaches."
  (and (member (evaluation-code evaluation) '(:interrupted :thread-error)) t))

(defun own-evaluation-p (evaluation &optional (session (current-session)))
  "True when EVALUATION is SESSION's (by default, the asking session's), or
nobody's (a user's thread of a session that has ended)."
  (let ((owner (evaluation-session evaluation)))
    (or (null owner) (eq owner session))))

(defun live-session (session)
  "SESSION while its connection is open, else nil (nobody's)."
  (and session (member session *connections*) session))

(defun not-own-report (evaluation)
  "The report that EVALUATION is another session's, which this one may not
take on."
  (command-error "CL-MCP:ANOTHER-SESSIONS-EVALUATION"
                 (format nil "Evaluation ~D is another assistant's (another cl-mcp attached to this ~
                              image): it may be read, never restarted, aborted, evaluated in or ~
                              awaited by this one." (evaluation-id evaluation))))

(defun put-slot (evaluation writer value)
  "Store VALUE with WRITER under EVALUATION's lock and wake its waiters."
  (with-agent-lock ((evaluation-lock evaluation))
    (funcall writer value evaluation)
    (sb-thread:condition-broadcast (evaluation-ready evaluation))))

(defun take-slot (evaluation reader writer &optional timeout)
  "Wait until READER's slot is set, clear it with WRITER (unless WRITER is
nil: a look), and return its value; nil if TIMEOUT seconds pass first."
  (let ((deadline (and timeout (+ (get-internal-real-time)
                                  (* timeout internal-time-units-per-second)))))
    (sb-thread:with-mutex ((evaluation-lock evaluation))
      (loop
        (let ((value (funcall reader evaluation)))
          (when value
            (when writer (funcall writer nil evaluation))
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
  "Hand REPORT to the caller waiting on EVALUATION; drop it when that
caller gave up waiting for it (`await-report')."
  (put-slot evaluation (lambda (report evaluation)
                         (if (plusp (evaluation-abandoned evaluation))
                             (decf (evaluation-abandoned evaluation))
                             (setf (evaluation-report evaluation) report)))
            report))

(defun take-report-now (evaluation)
  "EVALUATION's report if one is posted, without waiting; else nil."
  (take-slot evaluation #'evaluation-report #'(setf evaluation-report) 0))

(defparameter *report-grace* 3
  "Seconds past a command's own deadline its caller waits for its report:
less than cl-mcp's grace (DEADLINE_GRACE), so the caller answers first.")

(defun await-report (evaluation seconds)
  "The next report of EVALUATION, waiting at most SECONDS (nil: as long as
its thread lives).  Should its thread end without one (it cannot, short of
being killed), or SECONDS pass (it blocks interrupts, or is inside foreign
code), say so instead; the report that comes after all is dropped."
  (let ((due (and seconds (+ (get-internal-real-time)
                             (* seconds internal-time-units-per-second)))))
    (loop
      (let ((report (take-slot evaluation #'evaluation-report #'(setf evaluation-report) 1)))
        (when report (return report))
        (let ((thread (evaluation-thread evaluation)))
          (when (and thread (not (sb-thread:thread-alive-p thread)))
            (return (or (take-report-now evaluation)
                        (command-error "CL-MCP:ABORTED" "The evaluation's thread ended.")))))
        (when (and due (>= (get-internal-real-time) due))
          (return
            (or (with-agent-lock ((evaluation-lock evaluation))
                  ;; Posted just now, or else dropped when it comes.
                  (or (shiftf (evaluation-report evaluation) nil)
                      (progn (incf (evaluation-abandoned evaluation)) nil)))
                (command-error "CL-MCP:NO-REPORT"
                               (format nil "Evaluation ~D did not answer within ~A: its thread ~
                                            blocks interrupts, or is inside foreign code, and ~
                                            finishes that on its own."
                                       (evaluation-id evaluation) (seconds-text seconds))))))))))

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
oldest waiting evaluation of its kind (`thread-stop-p') is aborted when
there are too many of that kind: failing user threads never push out the
model's evaluations."
  (when (plusp *max-suspended*)
    (let ((evicted '())
          (kind (thread-stop-p evaluation)))
      (with-agent-lock (*registry-lock*)
        (push evaluation *suspended*)
        (let* ((same (remove kind *suspended* :key #'thread-stop-p :test-not #'eq))
               (excess (- (length same) *max-suspended*)))
          (when (plusp excess)
            (setf evicted (last same excess)
                  *suspended* (remove-if (lambda (each) (member each evicted)) *suspended*)))))
      (dolist (old evicted)
        (post-command old (list :abort)))
      t)))

(defun forget-evaluation (evaluation)
  "EVALUATION no longer waits: take it off `*suspended*'."
  (with-agent-lock (*registry-lock*)
    (setf *suspended* (remove evaluation *suspended*))))

(defun find-suspended (id)
  "The waiting evaluation numbered ID (whoever's), or when ID is nil this
session's newest that is not a user thread's stop."
  (with-agent-lock (*registry-lock*)
    (if id
        (find id *suspended* :key #'evaluation-id)
        (find-if (lambda (evaluation)
                   (and (not (thread-stop-p evaluation)) (own-evaluation-p evaluation)))
                 *suspended*))))

(defun no-suspended-report (id)
  "The report that no evaluation ID (or none at all, when ID is nil) waits;
without ID, it names the user threads' stops, which wait only for a call
that names them."
  (command-error "CL-MCP:NO-SUSPENDED-EVALUATION"
                 (if id
                     (format nil "No evaluation ~D is waiting at an error (it finished, ~
                                  was aborted, or its time ran out)." id)
                     (format nil "No evaluation is waiting at an error.~@[ Threads stopped at ~
                                  their errors wait as evaluations ~{~D~^, ~}: name one.~]"
                             (with-agent-lock (*registry-lock*)
                               (loop for evaluation in *suspended*
                                     when (and (thread-stop-p evaluation) (own-evaluation-p evaluation))
                                       collect (evaluation-id evaluation)))))))

(defmacro with-suspended ((evaluation id &key own) &body body)
  "Run BODY, which commands EVALUATION and awaits its report, with
EVALUATION bound to the waiting evaluation ID (the newest when nil) and its
command lock held; without one, return `no-suspended-report' instead, with
OWN, `not-own-report' for another session's, and `busy-report' when
another session's command holds it longer than `*report-grace*'.  The lock
is a plain one: a caller waiting there can still be cancelled."
  (let ((done (gensym "DONE")) (value (gensym "VALUE")))
    `(let ((,evaluation (find-suspended ,id)))
       (cond ((null ,evaluation) (no-suspended-report ,id))
             ((and ,own (not (own-evaluation-p ,evaluation))) (not-own-report ,evaluation))
             (t (let ((,done nil) (,value nil))
                  (sb-thread:with-mutex ((evaluation-commands ,evaluation) :timeout *report-grace*)
                    (setf ,value (progn ,@body) ,done t))
                  (if ,done ,value (busy-report ,evaluation))))))))

(defun busy-report (evaluation)
  "The report that EVALUATION is answering another session's command."
  (command-error "CL-MCP:EVALUATION-BUSY"
                 (format nil "Evaluation ~D is answering another assistant's command; ask again ~
                              in a moment." (evaluation-id evaluation))))

(defvar *running* '()
  "What a caller is waiting on, by its session and the caller's tag,
consed (so that a session's end finds its calls, `abort-all'): an
evaluation, or for other work (`call-cancellable') its thread and catch
tag, consed.")

(defun forget-running (key object)
  "Forget that OBJECT runs under KEY, a session and tag consed (only OBJECT:
a tag may come again)."
  (when (cdr key)
    (with-agent-lock (*registry-lock*)
      (setf *running* (remove-if (lambda (entry)
                                   (and (equal (car entry) key) (eq (cdr entry) object)))
                                 *running*)))))

(defmacro with-running ((tag object) &body body)
  "Run BODY with OBJECT (an evaluation whose report BODY waits for, or the
thread of a load) findable under this session's TAG, for
`cancel-evaluation' and `output-tail'."
  (let ((key-var (gensym "KEY")) (object-var (gensym "OBJECT")))
    `(let ((,key-var (cons (current-session) ,tag)) (,object-var ,object))
       (when (cdr ,key-var)
         (with-agent-lock (*registry-lock*)
           (push (cons ,key-var ,object-var) *running*)))
       (unwind-protect (progn ,@body)
         (forget-running ,key-var ,object-var)))))

(defun find-running (tag &optional (session (current-session)))
  "The evaluation, or for other work its (THREAD . CATCH-TAG), a caller of
SESSION waits on under TAG."
  (with-agent-lock (*registry-lock*)
    (cdr (assoc (cons session tag) *running* :test #'equal))))

(defvar *cancel-point* nil
  "Inside `call-cancellable', the catch tag that a cancel of this call
throws to (`interrupt-running').")

(defun call-cancellable (tag thunk cancelled)
  "Call THUNK in this thread, findable under TAG for `cancel-evaluation',
whose interrupt throws to a catch of this call's own: THUNK's value, or
when it was cancelled the reply it kept past a cancel (`keep-past-cancel'),
else CANCELLED.  The catch tag is made for the call, so that a cancel's
interrupt that lands once the call is over finds no catch to end (not the
next call's, in the same thread).  Every agent call that runs the user's
code and is no evaluation runs it so."
  ;; The catch tag's cdr holds the reply kept past a cancel.
  (let ((done nil) (value nil) (point (list :cancel-point)))
    ;; Findable only inside the catch, so a cancel's throw always lands in it.
    (catch point
      (let ((*cancel-point* point))
        (with-running (tag (cons sb-thread:*current-thread* point))
          (setf value (funcall thunk) done t))))
    (cond (done value)
          ((cdr point))
          (t cancelled))))

(defun keep-past-cancel (reply)
  "Inside `call-cancellable': from now on REPLY is what a cancel of this
call answers, to its caller and to the canceller (`cancel-evaluation'),
for work a cancel cannot undo, such as an edit written.  Set in the step
no interrupt divides from that work."
  (when *cancel-point*
    (setf (cdr *cancel-point*) reply)))

(defun reply-kept-past-cancel (running)
  "The reply RUNNING, what `find-running' found, kept past a cancel, if any."
  (and (consp running) (cdr (cdr running))))

(defmacro with-cancellable ((tag) &body body)
  "BODY, cancellable under TAG (`call-cancellable'): its value, or once
cancelled a CL-MCP:CANCELLED report.  An entry point that runs the user's
code and reports no evaluation of its own takes its :tag so."
  `(call-cancellable ,tag (lambda () ,@body)
                     (command-error "CL-MCP:CANCELLED" "The call was cancelled.")))

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
  (when (evaluation-continuation evaluation)
    (deliver-thread-news))  ; as Swank's pre-reply hook would (user-threads.lisp)
  ;; No interrupt (a deadline, a cancel) may land between taking the
  ;; request and handing its answer to Swank's control thread.
  (sb-sys:without-interrupts
    (let ((id (evaluation-continuation evaluation)))
      (when id
        (forget-running (cons (evaluation-session evaluation) (evaluation-tag evaluation)) evaluation)
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
;;; interrupt goes to `stop-at-error' (agent/evaluate.lisp), which stops
;;; the deadline in turn.

(defvar *deadline-lock* (sb-thread:make-mutex :name "cl-mcp deadlines")
  "Guards `*deadlines*' and the watchdog's state; taken with
`with-agent-lock' but by the watchdog, which nothing interrupts and
which dozes holding it in CONDITION-WAIT.")

(defvar *deadline-set* (sb-thread:make-waitqueue)
  "Notified when a deadline is set while the watchdog dozes.")

(defvar *deadlines* '()
  "(INTERNAL-TIME EVALUATION TOKEN) for each running stretch with a deadline.")

(defvar *watchdog* nil
  "The watchdog thread, once a deadline has started it; a watchdog that is
no longer this one ends (`end-watchdog').")

(defvar *watchdog-dozing* nil
  "True while the watchdog waits on `*deadline-set*'.")

(defvar *running-work* nil
  "In an evaluation's thread, the evaluation whose own work (the user's
forms, or a load's or compilation's work) is running now.  A deadline or
an answer window acts only inside it: once the forms have returned, their
value is the answer, whatever news arrives beside it (`hurry-evaluation').")

(defparameter *watchdog-tick* 0.1
  "Seconds between the watchdog's looks at the deadlines.")

(defparameter *watchdog-linger* 5
  "Seconds without a deadline after which the watchdog dozes.")

(defun stop-deadline (evaluation)
  "Drop the deadline of EVALUATION's stretch, if it has one."
  (let ((token (shiftf (evaluation-deadline evaluation) nil)))
    (when token
      (with-agent-lock (*deadline-lock*)
        (setf *deadlines* (delete token *deadlines* :key #'third))))))

(defun interrupt-at-deadline (evaluation token)
  "Interrupt EVALUATION's thread at its deadline, if the stretch TOKEN
stands for is still running, and its work has not returned
(`*running-work*'), when the interrupt lands.  TOKEN is
(TIMEOUT :timeout) or, at the close of the answer window, (TIMEOUT :answer
WINDOW): the evaluation then answers its request \"still running\" and
goes on in the background (`run-in-background', agent/evaluate.lisp).

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
         (when (and (eq (evaluation-deadline evaluation) token)
                    (eq *running-work* evaluation))
           (if (eq (second token) :answer)
               (run-in-background evaluation token)
               ;; An interruption runs with interrupts disabled; waiting here
               ;; at the error must still hear a cancel, and a continued
               ;; evaluation its next deadline.
               (sb-sys:with-interrupts
                 (with-simple-restart (continue "Continue the evaluation.")
                   (stop-at-error evaluation
                                  (make-condition 'sb-ext:timeout :seconds (first token)))))))))
    (sb-thread:interrupt-thread-error () nil)))

(defun watchdog-loop ()
  "The watchdog thread: interrupt each evaluation whose deadline has come,
and doze while there are none."
  (let ((last-seen (get-internal-real-time)))
    (loop
      (let ((expired '()))
        (sb-thread:with-mutex (*deadline-lock*)
          (unless (eq *watchdog* sb-thread:*current-thread*)
            (return))  ; ended (`end-watchdog')
          (let ((now (get-internal-real-time)))
            (setf *deadlines* (delete-if (lambda (entry)
                                           (when (<= (first entry) now)
                                             (push entry expired)))
                                         *deadlines*))
            (cond ((or *deadlines* expired) (setf last-seen now))
                  ((> (- now last-seen) (* *watchdog-linger* internal-time-units-per-second))
                   (setf *watchdog-dozing* t)
                   (loop until (or *deadlines* (not (eq *watchdog* sb-thread:*current-thread*)))
                         do (sb-thread:condition-wait *deadline-set* *deadline-lock*))
                   (setf *watchdog-dozing* nil
                         last-seen (get-internal-real-time))))))
        (loop for (nil evaluation token) in expired
              do (interrupt-at-deadline evaluation token))
        (sleep *watchdog-tick*)))))

(defun end-watchdog ()
  "End the watchdog thread, if there is one, and wait (up to 2 s) until it
has: it stops at its next look (or wakes from its doze to stop), never
interrupted.  The next deadline starts another."
  (let ((watchdog (with-agent-lock (*deadline-lock*)
                    (sb-thread:condition-broadcast *deadline-set*)
                    (shiftf *watchdog* nil))))
    (when (and watchdog (not (eq watchdog sb-thread:*current-thread*)))
      (sb-thread:join-thread watchdog :default nil :timeout 2))))

(defun schedule-deadline (evaluation token seconds)
  "Make TOKEN EVALUATION's deadline, due SECONDS from now, for the watchdog."
  (let ((due (+ (get-internal-real-time)
                (round (* seconds internal-time-units-per-second)))))
    (setf (evaluation-deadline evaluation) token)
    (with-agent-lock (*deadline-lock*)
      (push (list due evaluation token) *deadlines*)
      (unless (and *watchdog* (sb-thread:thread-alive-p *watchdog*))
        (setf *watchdog* (make-agent-thread #'watchdog-loop "cl-mcp deadline watchdog")))
      (when *watchdog-dozing*
        (sb-thread:condition-notify *deadline-set*)))))

(defun window-first (window timeout)
  "WINDOW, when work given an answer window of WINDOW seconds and a deadline
of TIMEOUT seconds (nil or 0: none) answers \"still running\" at the
window's close: the window closes first.  Else nil: the caller waits for
the outcome.  The one statement of the rule in the image; cl-mcp's own is
`answer_window' in cl_mcp/tools/window.py."
  (and window
       (or (null timeout) (not (plusp timeout)) (< window timeout))
       window))

(defun start-stretch (evaluation timeout)
  "Begin a stretch of running: fresh output capture, readings for timing,
and a deadline TIMEOUT seconds away; or, when the evaluation has a request
to answer within a shorter window (`window-first'), the window's close
first."
  (reset-capture (evaluation-stdout evaluation))
  (reset-capture (evaluation-stderr evaluation))
  (setf (evaluation-warnings evaluation) '()
        (evaluation-timeout evaluation) timeout
        (evaluation-readings evaluation)
        (list (get-internal-real-time) (get-internal-run-time)
              sb-ext:*gc-run-time* (sb-ext:get-bytes-consed)))
  (let ((timeout (and timeout (plusp timeout) timeout))
        (window (and (evaluation-continuation evaluation)
                     (window-first (evaluation-answer-within evaluation) timeout))))
    (cond (window
           (schedule-deadline evaluation (list timeout :answer window) window))
          (timeout
           (schedule-deadline evaluation (list timeout :timeout) timeout)))))

;;;; Evaluations in the background
;;;
;;; An evaluation still running when its answer window closes answers its
;;; request "still running" from inside, as one stopped at an error does,
;;; and runs on in its own thread (`run-in-background').  Its outcome, or
;;; its error, is posted to its mailbox, where `await-evaluation-of' takes
;;; it; until then it is kept here.  At most `*max-background*' run at once.

(defparameter *max-background* 4
  "Evaluations that may run in the background at once; one more is stopped
at the close of its answer window, with an error saying so.")

(defparameter *max-unclaimed* 16
  "Background evaluations kept for `await-evaluation-of' at most, running or
finished: registering one more forgets the oldest finished one (those
still running, at most `*max-background*', are never forgotten).")

(defvar *background* '()
  "Evaluations sent to the background whose outcome nobody has taken yet,
newest first.  One with a report posted has finished (or waits at an error).")

(defun background-running ()
  "The background evaluations still running, newest first."
  (with-agent-lock (*registry-lock*)
    (remove-if #'evaluation-report *background*)))

(defun register-background (evaluation)
  "Record EVALUATION as running in the background, its thread named for it
(in attach mode, that is what the programmer's thread list shows), keeping
`*max-unclaimed*'; return t and the numbers of the outcomes forgotten to
make room (the caller tells cl-mcp, whose record mirrors this one).  Nil,
and nothing recorded, when `*max-background*' run already."
  (with-agent-lock (*registry-lock*)
    (when (< (count-if-not #'evaluation-report *background*) *max-background*)
      (setf (evaluation-background evaluation) t
            (sb-thread:thread-name (evaluation-thread evaluation))
            (format nil "cl-mcp evaluation ~D (background)" (evaluation-id evaluation)))
      (push evaluation *background*)
      (let ((forgotten '()))
        (loop for oldest = (and (> (length *background*) *max-unclaimed*)
                                (find-if #'evaluation-report *background* :from-end t))
              while oldest
              do (setf (evaluation-background oldest) nil
                       *background* (remove oldest *background*))
                 (push (evaluation-id oldest) forgotten))
        (values t forgotten)))))

(defun find-background (id)
  "The background evaluation numbered ID whose outcome is not yet taken."
  (with-agent-lock (*registry-lock*)
    (find id *background* :key #'evaluation-id)))

(defun find-background-tagged (tag &optional (session (current-session)))
  "SESSION's background evaluation whose outcome is not yet taken that went
there from the call tagged TAG."
  (with-agent-lock (*registry-lock*)
    (find-if (lambda (evaluation)
               (and (equal (evaluation-tag evaluation) tag) (own-evaluation-p evaluation session)))
             *background*)))

(defun forget-background (evaluation)
  "EVALUATION's outcome has been taken: stop keeping it.  Continued through
a restart, it is in the foreground again until its next window closes."
  (with-agent-lock (*registry-lock*)
    (setf (evaluation-background evaluation) nil
          *background* (remove evaluation *background*)))
  ;; Callers waiting for its outcome look again, and find it gone.
  (with-agent-lock ((evaluation-lock evaluation))
    (sb-thread:condition-broadcast (evaluation-ready evaluation))))

;;;; What the session creates, in an image it shares (attach mode)
;;;
;;; In the programmer's image, `soft-reset' must remove what cl-mcp's
;;; evaluations created and nothing else, so each evaluation notes the
;;; CL-USER symbols and the packages it creates.

(defstruct (session-record (:constructor make-session-record ()))
  "What one session's evaluations created (see `current-session'), for its
own reset to remove; each attached cl-mcp has its own."
  (symbols '())   ; of CL-USER, first interned by one of its evaluations
  (packages '())  ; created by one of its evaluations
  ;; What its evaluations that loaded a system or a module created, which a
  ;; reset keeps and names: a list of (SYSTEMS SYMBOLS PACKAGES), newest first.
  (kept '())
  ;; Its values of the REPL's variables (agent/history.lisp), a fresh list
  ;; after each change (so that it may be read without a lock).
  (repl-history (make-list 9))
  ;; The number its next evaluation would have had at its last reset: the
  ;; values of its own below it were forgotten (agent/history.lisp).
  (reset-below 1))

(defvar *session-records* (make-hash-table :test #'eq)
  "Each session's `session-record', by session (the key nil in an image
cl-mcp owns); guarded by `*registry-lock*'.")

(defun session-record (&optional (session (current-session)))
  "SESSION's record, made when it has none."
  (with-agent-lock (*registry-lock*)
    (or (gethash session *session-records*)
        (setf (gethash session *session-records*) (make-session-record)))))

(defun forget-session-record (session)
  "SESSION has ended: what it created belongs to the image now."
  (with-agent-lock (*registry-lock*)
    (remhash session *session-records*)))

(defun present-symbols (package)
  "A set (an EQ hash table) of the symbols whose home is PACKAGE."
  (let ((symbols (make-hash-table :test #'eq)))
    (loop for symbol being the present-symbols of package
          when (eq (symbol-package symbol) package)
            do (setf (gethash symbol symbols) t))
    symbols))

(defun loaded-systems ()
  "The names of the modules (`*modules*') and ASDF systems the image calls
loaded."
  (append *modules* (asdf:already-loaded-systems)))

(defun call-tracking-session (thunk)
  "Call THUNK, recording the CL-USER symbols and the packages it creates
(also when it exits non-locally), unless it loaded a system or a module:
what that created is the image's, as ASDF or `*modules*' say (see
`soft-reset')."
  (let* ((user (find-package "COMMON-LISP-USER"))
         (symbols-before (present-symbols user))
         (packages-before (list-all-packages))
         (loaded-before (loaded-systems)))
    (unwind-protect (funcall thunk)
      (let ((symbols (loop for symbol being the present-symbols of user
                           when (and (eq (symbol-package symbol) user)
                                     (not (gethash symbol symbols-before)))
                             collect symbol))
            (packages (set-difference (list-all-packages) packages-before))
            (loaded (set-difference (loaded-systems) loaded-before :test #'string=)))
        ;; An evaluation of a session that has ended (aborted, it unwinds
        ;; now) leaves what it made to the image, as its session did.
        (when (and (or symbols packages)
                   (or (not *track-session*) (live-session (current-session))))
          (let ((record (session-record)))
            (with-agent-lock (*registry-lock*)
              ;; An evaluation that waited at its error while another session
              ;; defined things sees them as new too: they are the other's.
              (loop for other being the hash-values of *session-records*
                    unless (eq other record)
                      do (setf symbols (set-difference symbols (session-record-symbols other))
                               packages (set-difference packages (session-record-packages other))))
              (if loaded
                  (push (list loaded symbols packages) (session-record-kept record))
                  (progn
                    (dolist (symbol symbols)
                      (pushnew symbol (session-record-symbols record)))
                    (dolist (package packages)
                      (pushnew package (session-record-packages record))))))))))))

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
