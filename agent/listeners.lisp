;;;; agent/listeners.lisp --- listeners only cl-mcp can take, and the lane
;;;;
;;;; The sockets of an image cl-mcp owns (embedded mode only).
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

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

;;; The poll's length and back-off are cl-mcp's idle_poll.py's, which
;;; `configure' brings here; until then the lane does not poll.  So is its
;;; rule of sleeping at once after long waits: an assistant's requests come
;;; seconds apart, and a poll after each reply spun to its end for nothing
;;; (≈0.3 ms of the image's CPU per call).

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

(defparameter *lane-long-waits-limit* 2
  "After this many waits in a row that each outlasted the poll, the lane
sleeps at once until a wait ends within the poll again (idle_poll.py's
LONG_WAITS).")

(defvar *lane-long-waits* 0
  "The lane's last waits in a row that outlasted its poll, at most
`*lane-long-waits-limit*'.")

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
      ;; second time, and up to 40 printed results (each up to 1,000,000
      ;; characters of each stream and of the values) kept alive.
      (let ((swank::*enable-event-history* nil))
        (loop while (eq (lane-owner lane) token)
              do (wait-for-request stream fd)
                 (swank::handle-requests connection t))))))

(defun wait-for-request (stream fd)
  "Wait until STREAM (on FD) has input: poll first (`input-soon-p') unless
the last `*lane-long-waits-limit*' waits each outlasted the poll, then sleep."
  (let ((started (monotonic-microseconds)))
    (unless (if (< *lane-long-waits* *lane-long-waits-limit*)
                (input-soon-p stream)
                (listen stream))
      (sb-sys:wait-until-fd-usable fd :input))
    (setf *lane-long-waits*
          (if (> (- (monotonic-microseconds) started) *lane-idle-poll-microseconds*)
              (min (1+ *lane-long-waits*) *lane-long-waits-limit*)
              0))))

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
