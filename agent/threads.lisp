;;;; agent/threads.lisp --- threads: list, backtrace, interrupt, kill
;;;;
;;;; The image's threads as SLIME's thread list shows them, with whose
;;;; each is: cl-mcp's, Swank's, SBCL's or the user's.  A user's thread
;;;; can be stopped as at an error (SLIME's slime-thread-debug), where it
;;;; waits as an evaluation does, or ended.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

(defparameter *swank-thread-names*
  '("Swank Sentinel" "reader-thread" "control-thread" "swank-indentation-cache-thread"
    "auto-flush-thread" "repl-thread" "worker")
  "The names Swank gives the threads it makes.")

(defparameter *thread-answer-seconds* 2
  "How long a thread asked for its backtrace, or to stop, has to answer.")

(defparameter *sleeping-syscalls* '(35 230)
  "nanosleep, clock_nanosleep (Linux x86-64 numbers).")

(defparameter *io-syscalls* '(0 7 23 43 45 47 61 232 270 271 281 288)
  "read, poll, select, accept, recvfrom, recvmsg, wait4, epoll_wait,
pselect6, ppoll, epoll_pwait, accept4 (Linux x86-64 numbers).")

(defun thread-id (thread)
  "THREAD's id: its Linux thread id."
  (sb-thread::thread-os-tid thread))

(defun evaluation-of-thread (thread)
  "The evaluation waiting at an error or running in the background in
THREAD, or nil; the second value is true when it waits at an error."
  (with-agent-lock (*registry-lock*)
    (let ((suspended (find thread *suspended* :key #'evaluation-thread)))
      (values (or suspended (find thread *background* :key #'evaluation-thread))
              (and suspended t)))))

(defun owner-by-name (thread)
  "Whose THREAD is by its name alone: :cl-mcp, :swank, :sbcl or :user.
Cheap and lock-free: every write of a user's thread asks it."
  (let ((name (or (sb-thread:thread-name thread) "")))
    (cond ((eql 0 (search "cl-mcp" name)) :cl-mcp)
          ((or (member name *swank-thread-names* :test #'string=)
               (eql 0 (search "Swank " name)))  ; a listener: "Swank 4005"
           :swank)
          ((or (eq thread (sb-thread:main-thread)) (string= name "finalizer")) :sbcl)
          (t :user))))

(defun thread-owner (thread)
  "Whose THREAD is: :cl-mcp, :swank, :sbcl or :user.  A thread running an
evaluation is cl-mcp's, but a user's thread stopped at its error, or by
`interrupt-user-thread', stays the user's."
  (let ((evaluation (evaluation-of-thread thread)))
    (if (and evaluation (not (thread-stop-p evaluation)))
        :cl-mcp
        (owner-by-name thread))))

(defvar *threads-started-by-cl-mcp*
  (make-hash-table :test #'eq :weakness :key :synchronized t)
  "The threads `make-thread-watched' started, in a shared image, each to the
session whose evaluation started it (t for none): the only user threads
there the threads tool may interrupt or kill.")

(defun another-sessions-thread-p (thread)
  "Whether THREAD was started by the evaluations of another cl-mcp session
still attached: that session's to interrupt or kill, not this one's.  A
thread whose session ended is anyone's."
  (let ((session (gethash thread *threads-started-by-cl-mcp*)))
    (and (live-session session) (not (eq session (current-session))))))

(defun hands-off-reason (thread)
  "Why the threads tool may not interrupt or kill THREAD, a user's, nor
read its backtrace (an interrupt too), or
nil: in a shared image, a thread no cl-mcp evaluation started is the
programmer's (stopped in SLDB, an interrupt would leave SLDB without
answers; ended, the programmer's work is lost)."
  (and *track-session*
       (not (gethash thread *threads-started-by-cl-mcp*))
       "the programmer's (not started by cl-mcp's evaluations)"))

(defun task-file-line (thread file)
  "The first line of /proc/self/task/TID/FILE for THREAD, or nil."
  (let ((id (thread-id thread)))
    (and id (with-open-file (in (format nil "/proc/self/task/~D/~A" id file)
                                :if-does-not-exist nil)
              (and in (read-line in nil))))))

(defun kernel-state (thread)
  "What the kernel says THREAD does: :running, :sleeping, :waiting-on-io,
:waiting, or nil when it cannot tell.  Running is said only when three
looks 2 ms apart all see it run: every signal (a stop for the collector,
another thread's interrupt) wakes a waiting thread for a moment, and on a
loaded machine that moment can last milliseconds."
  (loop repeat 3
        for state = (kernel-state-now thread)
        while (eq state :running)
        do (sleep 0.002)
        finally (return state)))

(defun kernel-state-now (thread)
  "What the kernel says THREAD does at this instant (`kernel-state')."
  (let ((stat (ignore-errors (task-file-line thread "stat"))))
    (when stat
      ;; pid (comm) STATE ...: the state follows the last parenthesis.
      (let ((state (char stat (+ 2 (position #\) stat :from-end t)))))
        (if (char= state #\R)
            :running
            (let ((syscall (ignore-errors (parse-integer (task-file-line thread "syscall")
                                                         :junk-allowed t))))
              (cond ((member syscall *sleeping-syscalls*) :sleeping)
                    ((member syscall *io-syscalls*) :waiting-on-io)
                    ((eql syscall 202) :waiting) ; futex: a condition or a lock
                    (t :sleeping))))))))

(defun debugger-of (thread)
  "When THREAD sits in Swank's debugger (SLDB: a programmer's error, say),
a sentence saying at which level and condition; else nil.  Read from the
thread's own bindings of Swank's variables, without interrupting it."
  (flet ((value (symbol)
           (multiple-value-bind (value bound)
               (ignore-errors (sb-thread:symbol-value-in-thread symbol thread nil))
             (and bound value))))
    (let ((level (value 'swank::*sldb-level*)))
      (when (and (integerp level) (plusp level))
        (let ((condition (value 'swank::*swank-debugger-condition*)))
          (format nil "SLDB level ~D~@[ at ~A~]" level
                  (and (typep condition 'condition)
                       (format nil "~A: ~A" (condition-type-name condition)
                               (one-line (condition-message condition) 300)))))))))

(defun thread-entry (thread)
  "THREAD as a plist: :id, :name, :owner, :state, and :evaluation (the
number it waits at an error under), :debugger (`debugger-of') or :lock
(the lock it waits for), and :read-only (why it may not be interrupted or
killed) for a user's thread that is not cl-mcp's to touch."
  (multiple-value-bind (evaluation suspended) (evaluation-of-thread thread)
  (let* ((waiting-for (sb-thread::thread-waiting-for thread))
         (debugger (and (not suspended) (debugger-of thread)))
         (owner (thread-owner thread))
         (entry (list* :id (thread-id thread)
                       :name (or (sb-thread:thread-name thread) "")
                       :owner owner
                       (let ((reason (and (eq owner :user) (hands-off-reason thread))))
                         (and reason (list :read-only reason))))))
    (append entry
            (cond ((not (sb-thread:thread-alive-p thread)) (list :state :finished))
                  (suspended
                   (list :state :stopped-at-error :evaluation (evaluation-id evaluation)))
                  (debugger
                   (list :state :in-debugger :debugger debugger))
                  ((typep waiting-for 'sb-thread:mutex)
                   (list :state :waiting-on-lock
                         :lock (or (sb-thread:mutex-name waiting-for) "a lock")))
                  (t (list :state (or (kernel-state thread) :running))))))))

(defun find-thread (id)
  "The live thread whose id is ID, or nil."
  (find id (sb-thread:list-all-threads) :key #'thread-id))

(defun ask-thread (thread function)
  "Call FUNCTION inside THREAD by an interrupt, with one argument: a
function that tells whether the asker has stopped waiting.  (:ok VALUE)
when it answers within `*thread-answer-seconds*'; else (:late REASON),
REASON a sentence on why.  An interrupt that lands after the asker gave
up does nothing."
  (let ((state (list :asked))
        (answer nil)
        (done (sb-thread:make-semaphore :name "cl-mcp thread answer")))
    (flet ((answer ()
             (when (eq :asked (sb-ext:compare-and-swap (car state) :asked :started))
               (setf answer (funcall function (lambda () (eq (car state) :abandoned))))
               (sb-thread:signal-semaphore done))))
      (handler-case (sb-thread:interrupt-thread thread #'answer)
        (sb-thread:interrupt-thread-error ()
          (return-from ask-thread (list :late "it has ended")))))
    (if (sb-thread:wait-on-semaphore done :timeout *thread-answer-seconds*)
        (list :ok answer)
        (let ((was (sb-ext:compare-and-swap (car state) :asked :abandoned)))
          (setf (car state) :abandoned)
          (list :late (if (eq was :started)
                          (format nil "it took the interrupt, but printing its frames took ~
                                       longer: a PRINT-OBJECT method of something on its stack ~
                                       is slow, or waits; it stops printing after the frame it is at")
                          (not-interruptible-reason thread)))))))

(defun not-interruptible-reason (thread)
  "Why THREAD, alive, has not taken an interrupt: what it runs now."
  (multiple-value-bind (enabled bound)
      (ignore-errors (sb-thread:symbol-value-in-thread 'sb-sys:*interrupts-enabled* thread nil))
    (cond ((not (sb-thread:thread-alive-p thread)) "it has ended")
          ((and bound (not enabled))
           "it runs with interrupts disabled (inside SB-SYS:WITHOUT-INTERRUPTS)")
          (t (format nil "it has not come back to Lisp code, where interrupts are taken ~
                          (foreign code, or a system call SBCL does not break; the kernel ~
                          has it ~(~A~))"
                     (or (kernel-state thread) "in a state it does not tell"))))))

(defun thread-backtrace (thread count)
  "The first COUNT frames of THREAD, printed, or an error plist.  Its entry
is taken before it is asked: answering the interrupt, it runs."
  (let* ((entry (thread-entry thread))
         (answer (ask-thread thread
                             (lambda (abandoned-p)
                               (loop for frame in (error-frames :interrupted t)
                                     repeat count
                                     until (funcall abandoned-p)
                                     collect (frame-line frame))))))
    (if (eq (first answer) :ok)
        (list :status :ok :thread entry :frames (second answer))
        (error-report "CL-MCP:THREAD-DID-NOT-ANSWER"
                      "Thread ~D did not answer within ~A: ~A."
                      (thread-id thread) (seconds-text *thread-answer-seconds*) (second answer)))))

(define-condition thread-interrupted (condition)
  ((thread :initarg :thread :reader interrupted-thread))
  (:report (lambda (condition stream)
             (format stream "Thread ~S was interrupted by cl-mcp; CONTINUE returns it to its work."
                     (sb-thread:thread-name (interrupted-thread condition)))))
  (:documentation "What a thread stopped by the threads tool waits at."))

(defun stop-interrupted (evaluation)
  "Inside the interrupted thread: wait as an evaluation at an error, with
a CONTINUE restart that returns the thread to its work; once it does, or
leaves through its own frames (RETURN-FROM-FRAME, a restart of its own
invoked from eval-in-frame), post that outcome for the call that took it
on.  However it leaves, no deadline stays armed to stop it again."
  (let ((stdout (make-capped-output-stream *inline-output*))
        (stderr (make-capped-output-stream *inline-output*)))
    (setf (evaluation-thread evaluation) sb-thread:*current-thread*
          (evaluation-stdout evaluation) stdout
          (evaluation-stderr evaluation) stderr)
    (start-stretch evaluation nil)
    (let ((given-up nil))
      (unwind-protect
           (restart-case
               (with-standard-streams (stdout stderr)
                 (setf (evaluation-abort-restart evaluation) (find-restart 'continue))
                 (with-debugger-calling ((lambda (c) (stop-at-error evaluation c)))
                   (stop-at-error evaluation (make-condition 'thread-interrupted
                                                             :thread sb-thread:*current-thread*))))
             (continue (&optional asked)
               :report "Return the thread to its work."
               ;; Asked by the agent: the wait's time ran out, or an abort.
               (setf given-up asked)))
        (stop-deadline evaluation)
        (unless given-up
          (post-report evaluation (list :status :ok :number (evaluation-id evaluation)
                                        :values (list "; the thread returned to its work"))))))))

(defun interrupt-user-thread (thread)
  "Stop THREAD as at an error; return the report it waits with."
  (let ((evaluation (make-evaluation :may-wait t :code :interrupted :thread thread)))
    (handler-case (sb-thread:interrupt-thread thread (lambda () (stop-interrupted evaluation)))
      (sb-thread:interrupt-thread-error ()
        (return-from interrupt-user-thread
          (error-report "CL-MCP:NO-SUCH-THREAD" "Thread ~D has ended." (thread-id thread)))))
    (or (take-slot evaluation #'evaluation-report #'(setf evaluation-report)
                   *thread-answer-seconds*)
        (error-report "CL-MCP:THREAD-DID-NOT-ANSWER"
                      "Thread ~D did not stop within ~A: ~A; it will stop when it can."
                      (thread-id thread) (seconds-text *thread-answer-seconds*)
                      (not-interruptible-reason thread)))))

(defun threads-of (action &key thread (count *backtrace-frame-limit*))
  "ACTION on the image's threads: :list gives :threads, a `thread-entry'
each; with THREAD (an id), :backtrace gives its first COUNT frames,
:interrupt stops it as at an error (a user's thread not waiting at an
error already; the report of the error it waits at, numbered), :kill ends
it (a user's thread; in a shared image, one cl-mcp's evaluations started).
CL-MCP:NOT-IMPLEMENTED when this image lacks an internal it needs."
  (let ((missing (missing-internals-error :threads)))
    (when missing
      (return-from threads-of missing)))
  (if (eq action :list)
      ;; A thread that ended since the list was taken has no id left.
      (list :status :ok :threads (sort (loop for thread in (sb-thread:list-all-threads)
                                             when (thread-id thread)
                                               collect (thread-entry thread))
                                       #'< :key (lambda (entry) (or (getf entry :id) 0))))
      (let ((target (and thread (find-thread thread))))
        (cond ((null thread)
               (error-report "CL-MCP:INVALID-ARGUMENTS" "~(~A~) needs a thread id (from list)." action))
              ((null target)
               (error-report "CL-MCP:NO-SUCH-THREAD" "No thread has the id ~D (list shows the live ones)." thread))
              ((and (eq action :backtrace) (not (eq (thread-owner target) :cl-mcp))
                    (hands-off-reason target))
               (error-report "CL-MCP:NOT-CL-MCPS-THREAD"
                             "Thread ~D (~S) is ~A: its backtrace would be taken by interrupting ~
                              it, and its own printers would run inside it, so cl-mcp does not. ~
                              list shows its state and the lock it waits for; SLIME's thread ~
                              list (M-x slime-list-threads) shows its frames to the programmer."
                             thread (sb-thread:thread-name target) (hands-off-reason target)))
              ((eq action :backtrace) (thread-backtrace target count))
              ((not (eq (thread-owner target) :user))
               (error-report "CL-MCP:NOT-A-USER-THREAD"
                             "Thread ~D (~S) is ~A's own: only a user's thread can be ~(~A~)ed."
                             thread (sb-thread:thread-name target)
                             (ecase (thread-owner target) (:cl-mcp "cl-mcp") (:swank "Swank") (:sbcl "SBCL"))
                             (if (eq action :kill) "kill" "interrupt")))
              ((hands-off-reason target)
               (error-report "CL-MCP:NOT-CL-MCPS-THREAD"
                             "Thread ~D (~S) is ~A: it is listed, but only a thread cl-mcp's ~
                              evaluations started can be ~(~A~)ed."
                             thread (sb-thread:thread-name target) (hands-off-reason target)
                             (if (eq action :kill) "kill" "interrupt")))
              ((another-sessions-thread-p target)
               (error-report "CL-MCP:ANOTHER-SESSIONS-THREAD"
                             "Thread ~D (~S) was started by another assistant's evaluation (another ~
                              cl-mcp attached to this image): its backtrace can be read, but only ~
                              that assistant may ~(~A~) it."
                             thread (sb-thread:thread-name target) (if (eq action :kill) "kill" "interrupt")))
              ((and (eq action :interrupt) (nth-value 1 (evaluation-of-thread target)))
               (error-report "CL-MCP:STOPPED-AT-ERROR"
                             "Thread ~D already waits at an error, as evaluation ~D: use ~
                              backtrace, eval-in-frame or invoke-restart on that evaluation, ~
                              or kill the thread."
                             thread (evaluation-id (evaluation-of-thread target))))
              ((eq action :interrupt) (interrupt-user-thread target))
              (t (let ((stopped (evaluation-of-thread target)))
                   ;; Stopped by an interrupt, it waits with interrupts
                   ;; deferred: let it go back to its work first.
                   (when stopped
                     (forget-evaluation stopped)
                     (post-command stopped (list :abort))))
                 ;; A thread let go from its error may have ended already.
                 (handler-case (sb-thread:terminate-thread target)
                   (sb-thread:interrupt-thread-error () nil))
                 (sb-thread:join-thread target :default nil :timeout *thread-answer-seconds*)
                 ;; An ended thread has no Linux id any more: give the one it had.
                 (list :status :ok :thread (list* :id thread (cddr (thread-entry target)))))))))
