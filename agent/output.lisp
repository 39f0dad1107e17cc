;;;; agent/output.lisp --- logging, capped output streams and printing that never fails
;;;;
;;;; Every stream a user's code writes to is capped where it is produced, and
;;;; printing a value never fails (a broken print-object is reported, not
;;;; signalled), so every reply fits one Swank frame.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

;;;; Looking up internals, logging

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
  "An empty adjustable string with a fill pointer, of no size until written
to (`append-text' then gives it room for 256 characters or more): most
evaluations write nothing, and each makes five (made with that room, they
were 7 KB of every call's 10 KB consed)."
  (make-array 0 :element-type 'character :adjustable t :fill-pointer 0))

(defclass capped-output-stream (sb-gray:fundamental-character-output-stream)
  ((buffer :initform (make-text-buffer) :accessor buffer
           :documentation "The kept characters: an adjustable string with a
fill pointer, so that its end can be read while output is still coming.")
   (limit :initarg :limit :reader limit
          :documentation "Characters kept; the rest are only counted.")
   (dropped :initform 0 :accessor dropped
            :documentation "Characters written past the limit.")
   (column :initform 0 :accessor column
           :documentation "The column the next character goes to.")
   (ended :initform nil :accessor ended
          :documentation "Nil while its evaluation runs; then :stdout or
:stderr, the threads' news text that what is written to it afterwards
goes to (`end-capture').")
   (lock :initform (sb-thread:make-mutex :name "cl-mcp captured output") :reader lock
         :documentation "Held by each write: threads the evaluation runs (an
lparallel PMAP's workers) write to it at once, and a write that grows the
buffer while another fills it lost the other's characters.  Taken with
interrupts deferred (`with-stream-lock'), so that no thread waits at a stop
holding it."))
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
  "Append STRING from START to END to BUFFER, growing it by doubling (from
256 characters at least)."
  (let* ((fill (fill-pointer buffer))
         (new-fill (+ fill (- end start))))
    (when (> new-fill (array-dimension buffer 0))
      (setf buffer (adjust-array buffer (max new-fill 256 (* 2 (array-dimension buffer 0))))))
    (setf (fill-pointer buffer) new-fill)
    (replace buffer string :start1 fill :start2 start :end2 end)
    buffer))

(defmacro with-stream-lock ((stream) &body body)
  "BODY holding STREAM's lock with interrupts deferred: an evaluation whose
deadline came inside a write would wait at its stop holding the lock, and
every other writer with it (as `with-agent-lock', which loads later).  A
write only fills memory: it waits for nothing else."
  `(sb-sys:without-interrupts
     (sb-thread:with-recursive-lock ((lock ,stream)) ,@body)))

(defun end-capture (stream kind)
  "STREAM's evaluation has ended: what a thread that kept it (a thread
pool's worker, bound to the stream of the evaluation that made it) writes
to it from now on goes to the threads' news as KIND (:stdout or :stderr),
as a user's thread's output does (`record-output', agent/user-threads.lisp,
loaded later)."
  (with-stream-lock (stream)
    (setf (ended stream) kind)))

(defmethod sb-gray:stream-write-string :around ((stream capped-output-stream) string
                                                &optional (start 0) end)
  "Once its evaluation has ended, STRING goes to the threads' news."
  (with-stream-lock (stream)
    (if (ended stream)
        (record-output (ended stream) sb-thread:*current-thread* string start (or end (length string)))
        (call-next-method)))
  string)

(defmethod sb-gray:stream-write-char :around ((stream capped-output-stream) char)
  "Once its evaluation has ended, CHAR goes to the threads' news."
  (with-stream-lock (stream)
    (if (ended stream)
        (record-output (ended stream) sb-thread:*current-thread* (string char) 0 1)
        (call-next-method)))
  char)

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
;;;
;;; A value is printed once, into a stream that keeps what fits and stops
;;; the printer a little further on (`print-within'), so that no value is
;;; ever printed whole to be cut afterwards: printing a string of 50,000,000
;;; characters to show 20,000 of them used to cons 450 MB.  Two more
;;; things could grow with the value, and both stay bounded:
;;;  - *print-circle*'s first pass, which looks for shared parts: SBCL runs
;;;    it into a null stream over all that *print-length* and *print-level*
;;;    let through (for a tree of a million conses, a million entries in its
;;;    table); `print-within' runs it instead, into a stream that stops it a
;;;    quarter past where the second pass will stop.  An object it did not
;;;    reach prints without a label, as SBCL allows for;
;;;  - the pretty printer's buffer: SBCL's pretty stream sends its text on
;;;    to the target once it holds more than a line (the right margin), so
;;;    it holds about a line however large the logical block (measured: a
;;;    list of 100 strings of 1,000,000 characters, cut at 20,000, conses
;;;    0.5 MB).
;;; A print-object method that conses on its own is the user's to bound.

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
  "Call PRINTER on OBJECT for a string (with whatever else it returns); a
failure to print becomes a marker instead of an error of the whole call.
The condition's report in the marker is cut to 1,000 characters: it may
print the very object that could not be printed."
  (handler-case (funcall printer object)
    (serious-condition (c)
      (format nil "#<error printing object of type ~A: ~A>"
              (ignore-errors (prin1-to-string (type-of object)))
              (or (ignore-errors (printed-prefix c #'princ 1000)) (type-of c))))))

(defclass bounded-output-stream (capped-output-stream)
  ((stop :initarg :stop :reader stop
         :documentation "Characters written, kept or counted, after which
the writer is stopped.")
   (stopped :initform nil :accessor stopped
            :documentation "True once the writer has been stopped; what is
written afterwards (by an unwind-protect's cleanup) is ignored."))
  (:documentation "A `capped-output-stream' that also stops whoever writes
to it: the first character past STOP throws to the stream itself, its own
catch tag, so that a printer ends there instead of running to its end.  A
throw, not a condition, so that no handler of a print-object method (nor
`safe-print's) can take it for an error."))

(defun written (stream)
  "The characters written to STREAM so far, kept or counted."
  (+ (kept stream) (dropped stream)))

(defun stop-writer (stream)
  "Throw to STREAM's catch tag, the first time only."
  (unless (stopped stream)
    (setf (stopped stream) t)
    (throw stream nil)))

(defmethod sb-gray:stream-write-string :around ((stream bounded-output-stream) string
                                                &optional (start 0) end)
  "Take what comes before the stop; stop at the first character past it."
  (let* ((end (or end (length string)))
         (taken (if (stopped stream)
                    start
                    (min end (+ start (- (stop stream) (written stream)))))))
    (call-next-method stream string start taken)
    (when (< taken end)
      (stop-writer stream))
    string))

(defmethod sb-gray:stream-write-char :around ((stream bounded-output-stream) char)
  "Take CHAR if it comes before the stop, else stop."
  (if (and (not (stopped stream)) (< (written stream) (stop stream)))
      (call-next-method)
      (stop-writer stream))
  char)

(defclass first-pass-stream (bounded-output-stream)
  ((seen :initarg :seen :reader seen
         :documentation "The first pass's table of the objects it has met."))
  (:documentation "The stream *print-circle*'s first pass prints to: it
keeps nothing, and stops the pass after STOP characters or once the pass
has met more than STOP objects.  Characters alone would not do: the first
pass prints nothing for an object it meets again, and the pretty printer
trims a line of such nothings to its indentation, so a wide tree of shared
parts is walked in a few characters."))

(defun met-too-many-p (stream)
  "True when STREAM's first pass has met more objects than its stop."
  (> (hash-table-count (seen stream)) (stop stream)))

(defmethod sb-gray:stream-write-string :around ((stream first-pass-stream) string
                                                &optional (start 0) end)
  "Stop the pass once it has met too many objects."
  (if (met-too-many-p stream)
      (progn (stop-writer stream) string)
      (call-next-method stream string start end)))

(defmethod sb-gray:stream-write-char :around ((stream first-pass-stream) char)
  "Stop the pass once it has met too many objects."
  (if (met-too-many-p stream)
      (progn (stop-writer stream) char)
      (call-next-method)))

(defparameter *circularity-variables*
  (existing-symbols '(("SB-IMPL" "*CIRCULARITY-HASH-TABLE*")
                      ("SB-IMPL" "*CIRCULARITY-COUNTER*")))
  "SBCL's variables for *print-circle*'s two passes: the table of the
objects seen, and the label counter, NIL in the first pass and a number in
the second (see SBCL's OUTPUT-OBJECT).")

(defun circularity-pass-p (object)
  "True when printing OBJECT under *print-circle* begins with a pass that
looks for shared parts.  SBCL makes one for objects that may hold others
(conses, instances, arrays of T); this names more, since one missed would
run SBCL's own pass, which nothing stops."
  (and *print-circle*
       (= (length *circularity-variables*) 2)
       (not (typep object '(or number character symbol string bit-vector)))))

(defparameter *cycle-walk-limit* 100000
  "Objects `cycle-free-p' walks at most before it takes an object for one
that may hold a cycle.")

(defun cycle-free-p (object)
  "True when OBJECT holds no cycle the printer could follow (through
conses, arrays of T and structures' slots), as a walk of at most
`*cycle-walk-limit*' objects finds; false when it holds one or is too
large to tell.  Shared parts that form no cycle are no reason for labels:
a list of one string twice prints (\"a\" \"a\"), not (#1=\"a\" #1#)."
  (let ((state (make-hash-table :test 'eq)) (count 0))
    (labels ((enter (x)
               (when (> (incf count) *cycle-walk-limit*)
                 (return-from cycle-free-p nil))
               (case (gethash x state)
                 (:open (return-from cycle-free-p nil))  ; met again on its own path
                 (:done nil)
                 (t (setf (gethash x state) :open) t)))
             (walk (x)
               (typecase x
                 (cons
                  ;; A list's spine iteratively, its elements recursively.
                  (let ((spine '()))
                    (loop while (and (consp x) (enter x))
                          do (push x spine) (walk (car x)) (setf x (cdr x)))
                    (unless (consp x) (walk x))
                    (dolist (cell spine) (setf (gethash cell state) :done))))
                 ((or string bit-vector))
                 (array
                  (when (and (eq (array-element-type x) t) (enter x))
                    (dotimes (i (array-total-size x)) (walk (row-major-aref x i)))
                    (setf (gethash x state) :done)))
                 (structure-object
                  (when (enter x)
                    (dolist (slot (sb-mop:class-slots (class-of x)))
                      (walk (slot-value x (sb-mop:slot-definition-name slot))))
                    (setf (gethash x state) :done))))))
      (walk object)
      t)))

(defun print-bounded (object printer out)
  "Print OBJECT with PRINTER (`prin1' or `princ', called with OBJECT and a
stream) into OUT, a `bounded-output-stream', under the printer variables
in effect, *print-circle*'s first pass included; true when the printer
ran to its end, false when OUT stopped it."
  (flet ((print-into (stream)
           (catch stream (funcall printer object stream) t)))
    (if (and (circularity-pass-p object) (not (cycle-free-p object)))
        (destructuring-bind (table-variable counter-variable) *circularity-variables*
          ;; The first pass prints the second's text without its labels,
          ;; and each object the second pass meets costs it a character at
          ;; least, so a quarter more than the stop of either covers what
          ;; the second pass will print.
          (let ((table (make-hash-table :test 'eq))
                (stop (stop out)))
            (progv (list table-variable counter-variable) (list table nil)
              (print-into (make-instance 'first-pass-stream
                                         :limit 0 :seen table
                                         :stop (+ stop (ceiling stop 4) 1000)))
              ;; What can hold no cycle is never labelled, shared or not.
              (maphash (lambda (seen mark)
                         (declare (ignore mark))
                         (when (typep seen '(or string bit-vector symbol number character))
                           (remhash seen table)))
                       table)
              (progv (list counter-variable) (list 0)
                (print-into out)))))
        (let ((*print-circle* nil))
          (print-into out)))))

(defun print-within (object printer keep past)
  "Print OBJECT with PRINTER (`prin1' or `princ', called with OBJECT and a
stream) under the printer variables in effect, stopping it after KEEP +
PAST characters.  Return the first KEEP characters, and what was cut: 0,
the number of characters cut when printing ended within KEEP + PAST, or
:STOPPED when the printer was stopped, so that the rest is unknown."
  (let ((out (make-instance 'bounded-output-stream :limit keep :stop (+ keep past))))
    (let ((ended (print-bounded object printer out)))
      (values (stream-text out) (if ended (dropped out) :stopped)))))

;;; A value cut by *print-length* or *print-level* says so, as one cut for
;;; its size does: printed again with each one higher, it prints otherwise.
;;; SBCL prints a cut as "..." or "#", so only a text holding one of them is
;;; printed again, and only up to its first difference.

(defclass comparing-stream (bounded-output-stream)
  ((reference :initarg :reference :reader reference
              :documentation "The text the writer is expected to write.")
   (differs :initform nil :accessor differs
            :documentation "True once a character written differs from
REFERENCE's."))
  (:documentation "A stream that keeps nothing: it compares what is
written with REFERENCE and stops the writer at the first difference, or
at REFERENCE's end (its stop)."))

(defmethod sb-gray:stream-write-string :around ((stream comparing-stream) string
                                                &optional (start 0) end)
  "Stop at the first character that differs from the reference's."
  (let* ((end (or end (length string)))
         (at (written stream))
         (reference (reference stream))
         (compared (min end (+ start (max 0 (- (length reference) at))))))
    (when (and (not (stopped stream))
               (mismatch string reference :start1 start :end1 compared
                                          :start2 at :end2 (+ at (- compared start))))
      (setf (differs stream) t)
      (stop-writer stream))
    (call-next-method)))

(defmethod sb-gray:stream-write-char :around ((stream comparing-stream) char)
  "Stop at CHAR when it differs from the reference's."
  (let ((at (written stream))
        (reference (reference stream)))
    (when (and (not (stopped stream))
               (< at (length reference))
               (char/= char (char reference at)))
      (setf (differs stream) t)
      (stop-writer stream)))
  (call-next-method))

(defun printer-cut-p (object text complete)
  "True when *print-length* or *print-level* cut OBJECT's printed TEXT
(COMPLETE: TEXT is the whole print, not its start): printed again with
each one higher, it differs within TEXT or, COMPLETE, is longer.  A
failure to print again counts as no cut."
  (and (or *print-length* *print-level*)
       (or (search "..." text) (find #\# text))
       (ignore-errors
        (let ((*print-length* (and *print-length* (1+ *print-length*)))
              (*print-level* (and *print-level* (1+ *print-level*)))
              (out (make-instance 'comparing-stream :limit 0 :stop (length text)
                                                    :reference text)))
          (let ((ended (print-bounded object #'prin1 out)))
            (or (differs out)
                (if ended (/= (written out) (length text)) complete)))))))

(defun printed-prefix (object printer limit)
  "OBJECT printed with PRINTER (`prin1' or `princ'), at most LIMIT
characters of it, and \"…\" when there was more."
  (multiple-value-bind (text cut) (print-within object printer limit 0)
    (if (eql cut 0)
        text
        (concatenate 'string text "…"))))

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

(defparameter *print-overrun* 10000
  "Characters a value may print past the room left for it before its
printer is stopped: enough to give the exact number cut from a value cut by
a little, and from short values that come after the limit.")

(defun marked-text (text cut)
  "TEXT as `print-within' returned it with CUT, followed, when something
was cut, by a line that says how many characters were, or, when the
printer was stopped `*print-overrun*' characters further on, that there
were more than that.  A CUT of nil (`safe-print's marker) adds nothing."
  (case cut
    ((0 nil) text)
    (:stopped (format nil "~A~%… [printing stopped: more than ~D more ~
                           characters truncated]"
                      text *print-overrun*))
    (t (format nil "~A~%… [~D more characters truncated]" text cut))))

(defun printer-cut-marker ()
  "The line that ends a value cut by the printer's limits (cl-mcp's
render.py completes it with how to reach the value)."
  (format nil "… [cut by *print-length* ~D or *print-level* ~D]" *print-length* *print-level*))

(defun print-values (values limit)
  "VALUES printed under the contract's printer settings, as a list of
strings of at most LIMIT characters in all: the value that crosses LIMIT
is cut, and so are the later ones.  A cut value ends with a line that says
how many characters were cut, or, when its printer was stopped
`*print-overrun*' characters further on, that there were more than that;
a value cut by *print-length* or *print-level* with `printer-cut-marker'."
  (with-result-printing ()
    (let ((used 0))
      (loop for value in values
            for room = (max 0 (- limit used))
            collect (multiple-value-bind (text cut)
                        (safe-print value (lambda (value)
                                            (print-within value #'prin1 room *print-overrun*)))
                      (let ((by-printer (and cut (printer-cut-p value text (eql cut 0)))))
                        (unless cut               ; safe-print's marker
                          (setf (values text cut) (cap-string text room)))
                        (incf used (length text))
                        (if by-printer
                            (format nil "~A~%~A" (marked-text text cut) (printer-cut-marker))
                            (marked-text text cut))))))))

(defparameter *message-limit* 100000
  "Characters of a condition's report kept, at most: far more than a
report is meant to hold, and little enough that an error's reply fits a
Swank frame beside its output.")

(defun condition-message (condition &optional (limit *message-limit*))
  "The report of CONDITION, at most LIMIT characters of it (then a line
that says how many were cut, as for a value), or a marker when the report
itself fails.  The report is stopped while it prints, `*print-overrun*'
characters past LIMIT: that of `(error \"~A\" huge-string)' is never made
whole."
  (multiple-value-bind (text cut)
      (safe-print condition (lambda (condition)
                              (print-within condition #'princ limit *print-overrun*)))
    (marked-text text cut)))

(defun printed-line (object limit &optional (printer #'prin1))
  "OBJECT printed with PRINTER under the printer variables in effect, on
one line of at most LIMIT characters, as `one-line' makes it (\"...\" at
the end when cut); the printer is stopped one character past LIMIT, so a
huge object costs what is shown.  A failure to print is `safe-print's
marker."
  (multiple-value-bind (text cut)
      (safe-print object (lambda (object) (print-within object printer limit 1)))
    (let ((flat (substitute #\Space #\Newline text)))
      (if (or (> (length flat) limit) (not (member cut '(0 nil))))
          (concatenate 'string (subseq flat 0 (max 0 (min (length flat) (- limit 3)))) "...")
          flat))))
