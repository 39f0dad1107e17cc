;;;; agent/code.lisp --- xref and compile-file
;;;;
;;;; Cross-references and compiling a file, with notes at their lines.
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define (calls that go back and forth say so).

(in-package #:cl-mcp-agent)

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
