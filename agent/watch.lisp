;;;; agent/watch.lisp --- the programmer sees, and can stop, cl-mcp's calls
;;;;
;;;; In a shared image, an Emacs that loaded emacs/cl-mcp.el registers its
;;;; own SLIME connection here (`watch-register').  From then on, every
;;;; tool call cl-mcp makes is seen where Swank dispatches it, in the
;;;; control thread of cl-mcp's connection (`swank::*event-hook*'): its
;;;; `:emacs-rex' starts a call, its `:return' ends it.  Each start and end
;;;; becomes a message in a bounded queue, which one sender thread hands,
;;;; a batch at a time, to every registered Emacs as a `:channel-send' of
;;;; `:cl-mcp-watch' (a kind Swank passes through to Emacs; an unknown kind
;;;; would make Swank close that Emacs's connection).  Only a registered Emacs is sent one,
;;;; and nothing on cl-mcp's path waits for it; an Emacs that does not keep
;;;; up has at most `*watch-backlog-limit*' batches waiting in Swank.
;;;;
;;;; The programmer, from Emacs, can stop the running call
;;;; (`watch-stop', through `cancel-evaluation'), and hold the assistant
;;;; (`watch-hold'): while held, a call that would run code or change the
;;;; image is answered with CL-MCP:PAUSED-BY-PROGRAMMER instead of being
;;;; run, one check here for every tool.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define.

(in-package #:cl-mcp-agent)

;;;; What is watched

(defparameter *watched-entry-points*
  '((evaluate "evaluate-lisp" t)
    (invoke-restart-of "invoke-restart" t)
    (eval-in-frame-of "eval-in-frame" t)
    (compile-form-of "compile-form" t)
    (compile-file-of "compile-file" t)
    (edit-form-of "edit-form" t)
    (load-system "load-system" t)
    (run-tests-of "run-tests" t)
    (profile-of "profile" t)
    (macroexpand-of "macroexpand" t)
    (inspect-of "inspect" t)
    (soft-reset "reset-session" t)
    (threads-of "threads" t)
    (await-evaluation-of "await-evaluation" nil)
    (backtrace-of "backtrace" nil)
    (find-definition-of "find-definition" nil)
    (describe-symbol-of "describe-symbol" nil)
    (xref-of "xref" nil)
    (apropos-of "apropos" nil)
    (list-definitions "list-definitions" nil)
    (read-lisp-file-of "read-lisp-file" nil))
  "The agent entry points a tool call starts with: (ENTRY TOOL RUNS-CODE).
RUNS-CODE: held, the call is refused (threads' :list action excepted).
Calls cl-mcp makes for itself (output slices, cancels, settings) are not
shown, and never refused.")

(defparameter *watch-queue-limit* 500
  "Messages waiting for the sender at most; beyond it the oldest are dropped.")

(defparameter *watch-gather-seconds* 0.05
  "How long the sender gathers messages before it sends them, together:
one Swank event for each batch, not each message, keeps a watching Emacs
from competing with the calls for the CPU.")

(defparameter *watch-text-limit* 160
  "Characters of a form or a value a message carries at most.")

(defvar *watchers* '()
  "The Swank connections of the Emacs that registered (`watch-register').")

(defvar *held* nil
  "True while the programmer holds the assistant (`watch-hold').")

(defvar *watch-lock* (sb-thread:make-mutex :name "cl-mcp watch")
  "Guards the queue, the calls in flight and the call counter.")

(defvar *watch-ready* (sb-thread:make-waitqueue :name "cl-mcp watch queue")
  "Signalled when a message is queued.")

(defvar *watch-queue* '() "Messages waiting for the sender, newest first.")

(defvar *watch-queued* 0 "How many messages `*watch-queue*' holds.")

(defvar *watch-dropped* 0 "Messages dropped since the sender last sent one.")

(defparameter *watch-backlog-limit* 4
  "Batches a registered Emacs may have waiting in Swank (sent, not yet
written to it) at most; while it has that many, its messages are dropped,
counted, so that a slow or stopped Emacs keeps no more in the image.")

(defvar *watch-backlogs* (make-hash-table :test #'eq)
  "For each registered Emacs's connection, (WAITING . DROPPED): its batches
sent and not yet written, and the messages dropped since it last got one.")

(defvar *watch-sender* nil "The thread that sends the queued messages.")

(defvar *watch-counter* 0 "The number of the last call watched.")

(defvar *stopped-evaluations* '()
  "The numbers of the background evaluations the programmer stopped, newest
first (at most 50): the await-evaluation that takes one's outcome is
answered as stopped.")

(defvar *watched-calls* (make-hash-table :test #'equal)
  "The calls in flight, under (CONNECTION . REQUEST-ID): a plist with :call,
:tool, :tag, :start, :time, :who, :awaits (the evaluation an
await-evaluation takes) and, once the programmer stopped it, :stopped.")

(defvar *watched-sessions* (make-hash-table :test #'eq)
  "Each attached cl-mcp's connection: how its lines name it, its host's
name and process id (`watch-session-attached'); guarded by `*watch-lock*'.")

(defun unix-time ()
  "Seconds since 1970, as Emacs counts time."
  (- (get-universal-time) 2208988800))  ; (encode-universal-time 0 0 0 1 1 1970 0)

;;;; Reading a request

(defun watch-text (text)
  "TEXT on one line, cut to `*watch-text-limit*' characters (a cut one ends
in an ellipsis)."
  (let ((line (flat-text (string-trim '(#\Space #\Newline #\Tab) text) (1+ *watch-text-limit*))))
    (if (> (length line) *watch-text-limit*)
        (concatenate 'string (subseq line 0 (1- *watch-text-limit*)) "...")
        line)))

(defun request-parts (form)
  "The entry point, arguments and tag (its :tag) of FORM, a call cl-mcp
sent (its reply `fitted-reply''s)."
  (cond ((and (consp form) (eq (first form) 'fitted-reply)) (request-parts (second form)))
        ((consp form)
         (values (first form) (rest form)
                 (loop for (key value) on (rest form) when (eq key :tag) return value)))
        (t (values nil nil nil))))

(defun call-subject (entry arguments)
  "What a call to ENTRY with ARGUMENTS acts on: a plist of :subject (text)
and, for a compilation, :file and :line."
  (let ((first (first arguments)))
    (case entry
      (compile-form-of (list :subject (format nil "~A:~A" first (second arguments))
                             :file first :line (second arguments)))
      (compile-file-of (list :subject first :file first :line 1))
      ((edit-form-of read-lisp-file-of)
       (let ((line (getf (rest arguments) :line))
             (target (getf (rest arguments) :target)))
         (list :subject (watch-text (format nil "~A~@[:~A~]~@[ ~A~]" first line target))
               :file first :line (or line 1))))
      (t (let ((text (find-if #'stringp arguments)))
           (list :subject (cond (text (watch-text text))
                                (first (watch-text (prin1-to-string first)))
                                (t ""))))))))

(defun refused-while-held-p (entry arguments)
  "Whether a call to ENTRY with ARGUMENTS runs code or changes the image,
and so waits while the programmer holds the assistant."
  (let ((known (assoc entry *watched-entry-points*)))
    (and known (third known)
         (not (and (eq entry 'threads-of) (eq (first arguments) :list))))))

(defun held-report (tool)
  "The answer to a call of TOOL while the programmer holds the assistant."
  (command-error "CL-MCP:PAUSED-BY-PROGRAMMER"
                 (format nil "The programmer has paused the assistant from Emacs (M-x ~
                              cl-mcp-hold): ~A, which runs code or changes the image, ~
                              was not run.  Tools that only read still work; wait for ~
                              the programmer to release the hold." tool)))

(defun stopped-report (report)
  "REPORT, the answer to a call the programmer stopped from Emacs, made an
error that says so; its number, output and warnings kept."
  (let ((kept (if (and (consp report) (keywordp (first report))) (copy-list report) '())))
    (dolist (key '(:status :error :restarts :evaluation))
      (remf kept key))
    (list* :status :error
           :error (list :type "CL-MCP:CANCELLED-BY-PROGRAMMER"
                        :message "The programmer stopped this call from Emacs (M-x cl-mcp-stop)."
                        :backtrace nil)
           (or kept (list :stdout "" :stderr "" :warnings '())))))

;;;; Reading an answer

(defun outcome-of (result)
  "RESULT, a `:return''s (:ok VALUE) or (:abort ...), in one line, and the
evaluation number it names (or nil)."
  (let ((value (reply-value (second result))))
    (cond ((not (eq (first result) :ok))
           (values "aborted" nil))
          ((not (and (consp value) (keywordp (first value)) (evenp (length value))))
           (values "ok" nil))
          (t
           (let ((number (or (getf value :evaluation) (getf value :number))))
             (values
              (case (getf value :status)
                (:ok (let ((values (getf value :values)))
                       (if (and (consp values) (stringp (first values)))
                           (watch-text (format nil "~{~A~^, ~}" values))
                           "ok")))
                (:error (let ((error (getf value :error)))
                          (format nil "~A~@[ (waiting at its error)~]"
                                  (or (and (consp error) (getf error :type)) "error")
                                  (getf value :evaluation))))
                (:running "still running")
                (:aborted "aborted")
                (t (string-downcase (princ-to-string (getf value :status)))))
              number))))))

;;;; The queue and its sender

(defun live-watchers ()
  "The registered Emacs still connected, the others forgotten (with
`*watch-lock*' held)."
  (setf *watchers* (intersection *watchers* swank::*connections*))
  (maphash (lambda (connection backlog)
             (declare (ignore backlog))
             (unless (member connection *watchers*)
               (remhash connection *watch-backlogs*)))
           *watch-backlogs*)
  *watchers*)

(defun queue-message (message)
  "Queue MESSAGE (a plist) for every registered Emacs (with `*watch-lock*'
held)."
  (push message *watch-queue*)
  (cond ((zerop *watch-queued*)
         (setf *watch-queued* 1)
         (sb-thread:condition-notify *watch-ready*))
        ((< *watch-queued* *watch-queue-limit*)
         (incf *watch-queued*))
        (t (setf *watch-queue* (butlast *watch-queue*))
           (incf *watch-dropped*))))

(defun watch-send (message)
  "Queue MESSAGE (a plist) for every registered Emacs; never waits."
  (with-agent-lock (*watch-lock*)
    (queue-message message)))

(defun watch-file-written (truename)
  "Tell the registered Emacs that cl-mcp wrote TRUENAME: the companion
reverts the buffers that visit it and have no unsaved changes."
  (when *watchers*  ; read unlocked: a hint, as the event hook is
    (watch-send (list :phase :written :file (namestring truename)))))

(defun send-on-channel (connection payload)
  "Hand PAYLOAD to CONNECTION's control thread, as one `:channel-send' Swank
writes to its Emacs unread (channel 0: emacs/cl-mcp.el's hook takes it)."
  (let ((swank::*emacs-connection* connection)
        (swank::*send-counter* 0))  ; never `maybe-slow-down's wait for Emacs
    (swank::send-to-emacs (list :channel-send 0 payload))))

(defun send-to-watcher (connection messages)
  "Send MESSAGES, a batch, to CONNECTION's Emacs."
  (send-on-channel connection (cons :cl-mcp-watch messages)))

(defparameter *watch-idle-check-seconds* 2
  "How often an idle sender checks that an Emacs still watches.")

(defun watch-sender-loop ()
  "Send the queued messages, oldest first, gathered for
`*watch-gather-seconds*', to every registered Emacs still connected,
forgetting the others.  Once no Emacs watches, take the event hook off
and end (`watch-register' starts again): an image whose watching Emacs
left keeps nothing of the package's."
  (loop
    (let ((messages '()) (dropped 0))
      (sb-thread:with-mutex (*watch-lock*)  ; not deferring interrupts: it waits
        (end-lost-calls)
        (loop until *watch-queue*
              do (unless (sb-thread:condition-wait *watch-ready* *watch-lock*
                                                   :timeout *watch-idle-check-seconds*)
                   ;; A wait that times out returns without the mutex.
                   (sb-thread:grab-mutex *watch-lock*)
                   (end-lost-calls)
                   (unless (or (live-watchers) *watch-queue*)
                     (setf swank::*event-hook* (remove 'watch-event-hook swank::*event-hook*)
                           *watch-sender* nil
                           *held* nil)  ; as `still-held-p': no Emacs could release it
                     (return-from watch-sender-loop)))))
      (sleep *watch-gather-seconds*)
      (with-agent-lock (*watch-lock*)
        (setf messages (reverse *watch-queue*)
              *watch-queue* '()
              *watch-queued* 0
              dropped (shiftf *watch-dropped* 0)))
      (let ((watchers (with-agent-lock (*watch-lock*) (live-watchers))))
        (when (plusp dropped)
          (push (list :phase :dropped :count dropped) messages))
        (dolist (connection watchers)
          (let ((batch (batch-for connection messages)))
            (when batch
              (ignore-errors (send-to-watcher connection batch)))))))))

(defun batch-for (connection messages)
  "MESSAGES as CONNECTION's next batch, after the count of those it was not
sent; nil (and counted) while it has `*watch-backlog-limit*' batches
waiting."
  (with-agent-lock (*watch-lock*)
    (let ((backlog (or (gethash connection *watch-backlogs*)
                       (setf (gethash connection *watch-backlogs*) (cons 0 0)))))
      (cond ((>= (car backlog) *watch-backlog-limit*)
             (incf (cdr backlog) (length messages))
             nil)
            (t
             (incf (car backlog))
             (let ((dropped (shiftf (cdr backlog) 0)))
               (if (plusp dropped)
                   (cons (list :phase :dropped :count dropped) messages)
                   messages)))))))

(defun batch-written (connection)
  "CONNECTION's control thread takes one of its batches to write it."
  (with-agent-lock (*watch-lock*)
    (let ((backlog (gethash connection *watch-backlogs*)))
      (when (and backlog (plusp (car backlog)))
        (decf (car backlog))))))

;;;; Asking the registered Emacs

(defparameter *ask-seconds* 2
  "How long a question waits for the registered Emacs' answers: one that
has not answered by then (stalled, or busy) is not heard.")

(defvar *questions* (make-hash-table)
  "The questions in flight, by number: (WAITING . ANSWERS), how many Emacs
have yet to answer and what those that did said; guarded by `*watch-lock*'.")

(defvar *question-counter* 0 "The number of the last question asked.")

(defun ask-watchers (question)
  "Ask each registered Emacs QUESTION (a plist their companion answers,
with `watch-answer'); their non-nil answers, once all have answered or
`*ask-seconds*' have passed."
  (let* ((watchers (with-agent-lock (*watch-lock*) (copy-list (live-watchers))))
         (number (and watchers
                      (with-agent-lock (*watch-lock*)
                        (setf (gethash (incf *question-counter*) *questions*)
                              (cons (length watchers) '()))
                        *question-counter*))))
    (when number
      (dolist (connection watchers)
        (ignore-errors (send-on-channel connection (list :cl-mcp-ask number question))))
      ;; Answers come in other threads (each Emacs's requests); a poll
      ;; needs no wait that a timeout leaves without its mutex.
      (loop with deadline = (+ (get-internal-real-time) (* *ask-seconds* internal-time-units-per-second))
            until (or (<= (car (with-agent-lock (*watch-lock*) (gethash number *questions*))) 0)
                      (> (get-internal-real-time) deadline))
            do (sleep 0.005))
      (with-agent-lock (*watch-lock*)
        (prog1 (remove nil (cdr (gethash number *questions*)))
          (remhash number *questions*))))))

(defun watch-answer (number answer)
  "A registered Emacs's ANSWER to question NUMBER (`ask-watchers').  Return t."
  (with-agent-lock (*watch-lock*)
    (let ((question (gethash number *questions*)))
      (when question
        (decf (car question))
        (push answer (cdr question)))))
  t)

(defun unsaved-in-watchers (truename)
  "Who holds unsaved changes to the file TRUENAME, by the registered Emacs'
own word (a buffer that visits it is modified), or nil (agent/edit.lisp
calls this)."
  (when *watchers*  ; read unlocked: no Emacs to ask costs nothing
    (let ((answer (find-if (lambda (answer) (getf answer :modified))
                           (ask-watchers (list :unsaved (namestring truename))))))
      (and answer (format nil "its buffer ~A in Emacs ~A says so"
                          (getf answer :buffer) (getf answer :emacs))))))

;;;; Who calls: each attached cl-mcp, named for the programmer

(defun watch-session-attached (connection pid client)
  "CONNECTION is a cl-mcp's (process PID, its host CLIENT, the name the
host gave in MCP's clientInfo, or empty) that has just attached: its calls'
lines name it, and the watchers are told (agent/setup.lisp calls this)."
  (let ((who (format nil "~A:~D" (if (plusp (length client)) (flat-text client 24) "cl-mcp") pid)))
    (with-agent-lock (*watch-lock*)
      (setf (gethash connection *watched-sessions*) who)
      (when *watchers*
        (queue-message (list :phase :attach :who who :time (unix-time)))))))

(defun watch-session-left (connection aborted)
  "CONNECTION, a cl-mcp's, has closed, cleanly or not, and ABORTED of its
evaluations were aborted with it: its calls in flight end, and the
watchers are told (agent/setup.lisp calls this)."
  (with-agent-lock (*watch-lock*)
    (let ((who (gethash connection *watched-sessions*)))
      (remhash connection *watched-sessions*)
      (when (and who *watchers*)
        (end-lost-calls)
        (queue-message (list :phase :leave :who who :aborted aborted :time (unix-time)))))))

;;;; Seeing the calls: Swank's event hook

(defun still-held-p ()
  "Whether the assistant is still held: a hold ends when no Emacs that
could release it is connected any more."
  (or (with-agent-lock (*watch-lock*) (live-watchers))
      (setf *held* nil)))

(defparameter *watched-calls-prune-threshold* 64
  "Calls in flight beyond which those on closed connections are forgotten.")

(defun end-lost-calls ()
  "End the calls in flight whose cl-mcp's connection closed before their
answer (it was killed, or left them), telling the watchers, so that no
line stays running and Stop never picks one (with `*watch-lock*' held)."
  (maphash (lambda (key call)
             (unless (member (car key) swank::*connections*)
               (remhash key *watched-calls*)
               (queue-message (list :phase :end :call (getf call :call) :tool (getf call :tool)
                                    :who (getf call :who) :time (getf call :time)
                                    :outcome "its cl-mcp ended before the answer"
                                    :ms (round (* 1000 (- (get-internal-real-time) (getf call :start)))
                                               internal-time-units-per-second)))))
           *watched-calls*))

(defun forget-lost-calls ()
  "`end-lost-calls', once the calls in flight are many (with `*watch-lock*'
held): the sender ends them anyway when it idles, and Stop first."
  (when (> (hash-table-count *watched-calls*) *watched-calls-prune-threshold*)
    (end-lost-calls)))

(defun watch-request (connection event)
  "EVENT, an `:emacs-rex' from cl-mcp on CONNECTION, starts a tool call:
record it and tell the watchers; held, and running code, turn it into a
call of `held-report'."
  (destructuring-bind (form package thread-id id) (rest event)
    (declare (ignore package thread-id))
    (multiple-value-bind (entry arguments tag) (request-parts form)
      (let ((known (and (symbolp entry) (assoc entry *watched-entry-points*))))
        (when known
          (let ((refused (and *held* (refused-while-held-p entry arguments) (still-held-p)))
                (time (unix-time))
                (number nil) (who nil))
            (when refused
              (setf (second event) (list 'held-report (second known))
                    tag nil))
            (with-agent-lock (*watch-lock*)
              (forget-lost-calls)
              (setf number (incf *watch-counter*)
                    who (gethash connection *watched-sessions*))
              (let ((awaits (and (eq entry 'await-evaluation-of) (first arguments))))
                (setf (gethash (cons connection id) *watched-calls*)
                      (list :call number :tool (second known) :tag tag :awaits awaits
                            :stopped (and awaits (member awaits *stopped-evaluations*) t)
                            :who who :time time :start (get-internal-real-time)))))
            (watch-send (list* :phase :start :call number :tool (second known)
                               :runs-code (and (third known) t) :who who :time time
                               (call-subject entry arguments)))))))))

(defun finished-before-stop-p (result)
  "Whether RESULT, the `:return' of a call the programmer stopped, answers
what the stop came too late to undo: an evaluation gone to the background
(its number is how to stop it now) or an edit already written."
  (let ((value (reply-value (second result))))
    (and (eq (first result) :ok) (consp value) (keywordp (first value))
         (or (eq (getf value :status) :running) (getf value :written-before-cancel)))))

(defun answered-report (result)
  "The report plist RESULT, a `:return''s (:ok VALUE), answers, or nil."
  (let ((value (reply-value (second result))))
    (and (eq (first result) :ok) (consp value) (keywordp (first value)) (evenp (length value))
         value)))

(defun answered-line (call report)
  "The line REPORT, the answer to CALL, places its form at (compile-form's
and edit-form's, where the form is now), or nil."
  (let ((line (getf report :line)))
    (and (member (getf call :tool) '("compile-form" "edit-form") :test #'string=)
         (integerp line)
         line)))

(defun watch-return (connection event)
  "EVENT, a `:return' to cl-mcp on CONNECTION, ends the call it answers:
tell the watchers its outcome, the one a stopped call's answer is
replaced with."
  (destructuring-bind (thread result id) (rest event)
    (declare (ignore thread))
    (let ((stopped nil)
          (call (with-agent-lock (*watch-lock*)
                  (let ((key (cons connection id)))
                    (prog1 (gethash key *watched-calls*)
                      (remhash key *watched-calls*))))))
      (when call
        (setf stopped (and (getf call :stopped)
                           (not (finished-before-stop-p result))))
        (when stopped
          (setf result (list :ok (stopped-report (reply-value (second result))))
                (third event) result))
        (multiple-value-bind (outcome number) (outcome-of result)
          (let ((report (answered-report result)))
            (watch-send (list :phase :end :call (getf call :call) :tool (getf call :tool)
                              :who (getf call :who) :time (getf call :time)
                              :outcome (if stopped "cancelled by the programmer" outcome)
                              :evaluation number
                              :line (answered-line call report)
                              :background (eq (getf report :status) :running)
                              :waiting (and (getf report :evaluation) t)
                              :ms (round (* 1000 (- (get-internal-real-time) (getf call :start)))
                                         internal-time-units-per-second)))))))))

(defun watch-event-hook (connection event)
  "Swank's event hook: watch the tool calls on cl-mcp's connections while an
Emacs watches or the assistant is held, and count the batches a watching
Emacs's control thread takes to write.  Always nil, so that Swank goes on
to dispatch EVENT (which a held call's request was changed in)."
  (when (and (or *watchers* *held*) (consp event))
    (ignore-errors
     (case (first event)
       (:channel-send (when (and (consp (third event)) (eq (first (third event)) :cl-mcp-watch))
                        (batch-written connection)))
       (:emacs-rex (when (member connection *connections*)
                     (watch-request connection event)))
       (:return (when (member connection *connections*)
                  (watch-return connection event))))))
  nil)

;;;; Entry points: what emacs/cl-mcp.el calls

(defun watch-register ()
  "Register the Emacs this request comes from (its SLIME connection) to be
told of every tool call; start watching.  Return (:held HELD)."
  ;; One lock with the sender's end, which takes the hook off.
  (let ((connection swank::*emacs-connection*))
    (with-agent-lock (*watch-lock*)
      (setf *watchers* (adjoin connection (live-watchers)))
      (pushnew 'watch-event-hook swank::*event-hook*)
      (unless (and *watch-sender* (sb-thread:thread-alive-p *watch-sender*))
        (setf *watch-sender* (make-agent-thread #'watch-sender-loop "cl-mcp watch sender"))))
    (list :held (and *held* t))))

(defun watch-unregister ()
  "Tell the Emacs this request comes from of no more calls.  Return t."
  (let ((connection swank::*emacs-connection*))
    (with-agent-lock (*watch-lock*)
      (setf *watchers* (remove connection *watchers*))))
  t)

(defun stop-in-background (&optional number)
  "Stop background evaluation NUMBER (by default the newest) while it runs,
the await-evaluation that takes its outcome answered as stopped; its
number, or nil."
  (let* ((running (background-running))
         (evaluation (if number (find number running :key #'evaluation-id) (first running))))
    (when evaluation
      (let ((number (evaluation-id evaluation)))
        (with-agent-lock (*watch-lock*)
          (push number *stopped-evaluations*)
          (when (nthcdr 50 *stopped-evaluations*)
            (setf *stopped-evaluations* (subseq *stopped-evaluations* 0 50)))
          (maphash (lambda (key call)
                     (when (eql (getf call :awaits) number)
                       (setf (gethash key *watched-calls*) (list* :stopped t call))))
                   *watched-calls*))
        (stop-background evaluation)
        number))))

(defun watch-stop (&optional call evaluation)
  "Stop CALL (a call's number) while it is in flight and runs the user's
code, or EVALUATION (a number) while it runs in the background; with
neither, the newest tool call that runs the user's code, or else the
newest evaluation running in the background: cancelled by the programmer,
its answer says so.  A sentence saying what was stopped, or why nothing
was."
  (let ((key nil) (found nil))
    (unless evaluation
      (with-agent-lock (*watch-lock*)
        (end-lost-calls)
        (maphash (lambda (each-key each)
                   (when (if call
                             (eql (getf each :call) call)
                             (and (getf each :tag)
                                  (or (null found) (> (getf each :call) (getf found :call)))))
                     (setf key each-key found each)))
                 *watched-calls*)
        (when (getf found :tag)
          (setf (gethash key *watched-calls*) (list* :stopped t found)))))
    (cond ((getf found :tag)
           (cancel-evaluation (getf found :tag) (connection-session (car key)))
           (format nil "Stopped call ~D (~A)." (getf found :call) (getf found :tool)))
          (found
           (format nil "Call ~D (~A) runs none of your code: nothing to stop."
                   (getf found :call) (getf found :tool)))
          (call (format nil "Call ~D has ended: nothing to stop." call))
          (t (let ((number (stop-in-background evaluation)))
               (cond (number
                      (format nil "Stopped evaluation ~D, which ran in the background." number))
                     (evaluation
                      (format nil "Evaluation ~D runs no more in the background: nothing to stop."
                              evaluation))
                     (t "No assistant evaluation is running: nothing to stop.")))))))

(defun watch-hold (held)
  "Hold the assistant when HELD, else release it; tell the watchers.
Return (:held HELD)."
  (setf *held* (and held t))
  (watch-send (list :phase :hold :held *held*))
  (list :held *held*))
