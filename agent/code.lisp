;;;; agent/code.lisp --- xref, compile-file and load-system
;;;;
;;;; Cross-references, and compiling a file or loading a system with the
;;;; compiler's notes at their lines.
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

(defun reference-plist (name dspec location files)
  "A referrer NAME (printed; DSPEC as Swank gives it) at Swank's LOCATION,
the place of the reference inside it, as (:name N :file F :line L :column C
:snippet S :status S [:compiled-line CL] :reference-line RL
:reference-column RC): the place is the top-level form that holds the
reference, in the file as it is now (see `resolved-location').  Without a
source file: (:name N :error MESSAGE)."
  (multiple-value-bind (source offset status compiled-line)
      ;; The snippet is the reference's own, which need not name the
      ;; referrer: the referrer's name is looked for only when it is gone.
      (multiple-value-bind (source offset status compiled-line)
          (resolved-location location files :characters t)
        (if (and source (string= status "not-found"))
            (resolved-location location files :name dspec :characters t)
            (values source offset status compiled-line)))
    (if (null source)
        (list :name name
              :error (if (search "DEFINITION-SOURCE" offset)
                         "no source file (defined without one, e.g. through evaluate-lisp)"
                         offset))
        (let ((reference (place-plist source offset status compiled-line))
              (start (top-level-form-start (source-file-octets source) offset)))
          (append (list :name name)
                  (place-plist source start status compiled-line)
                  (list :reference-line (getf reference :line)
                        :reference-column (getf reference :column)))))))

;;; Swank's who-calls, who-references, who-binds, who-sets and
;;; who-macroexpands are SB-INTROSPECT's: they decode the packed
;;; cross-reference data of every global function, macro and method in the
;;; image, about 80 ms with alexandria loaded.  SBCL writes a referenced
;;; name into that data by its index in a table of the most common names
;;; or, for any other name, in the clear beside it; so the functions that
;;; refer to an uncommon name are the ones whose data holds it, and only
;;; those need decoding (about 20 ms).  `referrers' is SB-INTROSPECT's
;;; search with that test first; Swank's backend then makes its locations
;;; as for its own who-calls.

(defparameter *packed-relations* '(:calls :references :binds :sets :macroexpands)
  "The relations SBCL keeps in each function's packed cross-reference data.")

(defun referrers-readable-p ()
  "Whether this SBCL and Swank have what `referrers' uses (SBCL 2.2.9's
packed cross-references; Swank's SBCL backend).  Every SBCL internal it
names is written with a double colon, so that an SBCL without one still
reads the agent and gets `swank::xref-doit' instead."
  (and (every #'fboundp '(sb-c::map-simple-funs sb-c::map-packed-xref-data
                          sb-kernel::%simple-fun-xrefs sb-c::transform-p
                          sb-c::transform-type sb-c::vop-info-p sb-c::vop-info-name
                          sb-introspect::find-function-definition-source
                          swank/sbcl::source-location-for-xref-data
                          swank/sbcl::sanitize-xrefs
                          (setf sb-introspect::definition-source-form-number)))
       (boundp 'sb-c::**most-common-xref-names-by-name**)
       ;; `xref-references' calls agent functions: it has cross-references.
       (let ((xrefs (sb-kernel::%simple-fun-xrefs #'xref-references)))
         (and (simple-vector-p xrefs)
              (typep (svref xrefs 0) '(simple-array (unsigned-byte 8) (*)))
              (find 'referrers xrefs :start 1)))))

(defun referrer-name (referrer fun)
  "The name SB-INTROSPECT gives REFERRER, whose code is FUN: an SBCL built
with cross-references for its internals also lists its transforms, as
the function name with the argument types, and its VOPs."
  (cond ((sb-c::transform-p referrer)
         (let ((type (sb-c::transform-type referrer))
               (name (sb-kernel:%fun-name fun)))
           (append (if (consp name) name (list name))
                   (and (sb-kernel:fun-type-p type)
                        (list (second (sb-kernel:type-specifier type)))))))
        ((sb-c::vop-info-p referrer)
         (list 'sb-c:define-vop (sb-c::vop-info-name referrer)))
        (t referrer)))

(defun referrers (relation name)
  "The global functions, macros and methods whose code stands in RELATION
to NAME, as SB-INTROSPECT's who-* functions list them: (NAME-OF-REFERRER
. DEFINITION-SOURCE), the source's form number that of the reference."
  (let ((common (nth-value 1 (gethash name sb-c::**most-common-xref-names-by-name**)))
        (found '()))
    (sb-c::map-simple-funs
     (lambda (referrer fun)
       (let ((xrefs (sb-kernel::%simple-fun-xrefs fun)))
         (when (and xrefs (or common (find name xrefs :start 1 :test #'equal)))
           (sb-c::map-packed-xref-data
            (lambda (kind xref-name form-number)
              (when (and (eq kind relation) (equal xref-name name))
                (let ((source (sb-introspect::find-function-definition-source fun)))
                  (setf (sb-introspect::definition-source-form-number source) form-number)
                  (push (cons (referrer-name referrer fun) source) found))))
            xrefs)))))
    found))

(defun specializing-methods (symbol)
  "Each method specialized directly on the class SYMBOL names, as (NAME
LOCATION METHOD), NAME its generic function's: Swank's who-specializes
names a method by its generic function alone and keeps one method of
each, so AREA's primary and :AROUND methods on CIRCLE were one line."
  (let ((class (find-class symbol nil)))
    (and class
         (loop for method in (sb-mop:specializer-direct-methods class)
               for function = (sb-mop:method-generic-function method)
               when function
                 collect (list (sb-mop:generic-function-name function)
                               (swank/backend:find-source-location method)
                               method)))))

(defun xref-references (relation symbol)
  "Swank's cross-references of RELATION to SYMBOL: (NAME LOCATION) lists,
as `swank::xref-doit' returns them; for :specializes, (NAME LOCATION
METHOD) lists (see `specializing-methods')."
  (cond ((eq relation :specializes) (specializing-methods symbol))
        ((and (member relation *packed-relations*) (referrers-readable-p))
         (swank/sbcl::sanitize-xrefs
          (mapcar #'swank/sbcl::source-location-for-xref-data (referrers relation symbol))))
        (t (swank::xref-doit relation symbol))))

(defun xref-of (text relation &key package)
  "The definitions that stand in RELATION (one of `*xref-relations*') to
the symbol TEXT names, read in PACKAGE: a plist :status :ok, :symbol,
:relation, :references (see `reference-plist'; with a method's
:qualifiers and :specializers for :specializes), and :dropped, the number
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
                              (xref-references relation symbol)))))))
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
                  :references (loop for (name location method) in found
                                    repeat *reference-limit*
                                    collect (append
                                             (reference-plist
                                              (safe-print name (lambda (name)
                                                                 (let ((*print-pretty* nil))
                                                                   (prin1-to-string name))))
                                              (if method (list 'defmethod name) name)
                                              location files)
                                             (and method (method-signature-plist method))))
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

(defun note-plists (notes &optional (keep (constantly t)))
  "Swank's compiler NOTES as `note-plist's in the order of their places,
duplicates, left-out ones and those KEEP is false of dropped, at most
`*note-limit*'; the number dropped for the limit second."
  (let* ((files (make-hash-table :test 'equal))
         (plists (stable-sort
                  (remove-duplicates
                   (remove-if-not keep (remove nil (mapcar (lambda (note) (note-plist note files))
                                                           notes)))
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

(defun compile-file-of (path &key (load t) (max-output 20000) (tag nil) (answer-within nil))
  "Compile the file at PATH (absolute) as SLIME's C-c C-k does, and load the
fasl when LOAD and the compilation did not fail (warnings do not stop it;
errors do).  Return a plist: :status (:ok; :error when compilation failed
or the load signalled an error; :aborted when cancelled under TAG),
:success, :fasl, :loaded, :notes (see `note-plist'), :dropped (notes past
`*note-limit*'), and :error (the load's error, or why PATH cannot be
compiled).  The compiler's output goes to a capped stream (MAX-OUTPUT
characters) and is dropped.  Still running after ANSWER-WITHIN seconds, it
goes on in the background (see `call-within-window')."
  (or (source-file-problem path)
      (call-within-window
       (lambda ()
         (with-running (tag sb-thread:*current-thread*)
           (or (catch 'load-cancelled
                 (%compile-file-of (probe-file path) load max-output))
               (list :status :aborted :success nil :loaded nil :notes '() :dropped 0))))
       answer-within tag)))

(defun call-with-failure (stdout thunk)
  "Call THUNK with the standard streams going to STDOUT and the debugger
kept out: (values ITS-VALUE nil), or (values nil FAILURE) when it
signalled an error, FAILURE as `describe-error' gives it."
  (let ((failure nil))
    (values (block calling
              (flet ((fail (condition)
                       (setf failure (describe-error condition nil))
                       (return-from calling nil)))
                (with-standard-streams (stdout stdout)
                  (with-debugger-calling (#'fail)
                    (funcall thunk)))))
            failure)))

(defun %compile-file-of (pathname load max-output)
  "`compile-file-of' of the file at PATHNAME, which exists."
  (let ((stdout (make-capped-output-stream max-output))
        (loaded nil))
    (multiple-value-bind (result failure)
        (call-with-failure
         stdout
         (lambda ()
           (let ((*package* (find-package "COMMON-LISP-USER")))
             (swank::collect-notes
              (lambda ()
                (multiple-value-bind (fasl warnings-p failure-p)
                    (swank/backend:swank-compile-file
                     pathname (swank::fasl-pathname pathname '()) nil
                     (or (swank/backend:guess-external-format pathname) :default))
                  (declare (ignore warnings-p failure-p))
                  (values t nil fasl)))))))
      (multiple-value-bind (notes dropped) (note-plists (and result (swank::compilation-result-notes result)))
        (let* ((fasl (and result (swank::compilation-result-faslfile result)))
               (success (and fasl (not failure) (notany #'failing-severity-p notes) t)))
          (when (and success load)
            (multiple-value-bind (load-result load-failure)
                (call-with-failure stdout
                                   (lambda ()
                                     (swank::collect-notes
                                      (lambda ()
                                        (swank/backend:with-compilation-hooks ()
                                          (load fasl))
                                        (values t t nil)))))
              (setf failure load-failure
                    loaded (and load-result (not failure) t))
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
                 (and failure (list :error failure))))))))

;;;; Entry point: loading systems

(defun quicklisp-setup-file ()
  "Quicklisp's setup file in the home directory, if it is there."
  (probe-file (merge-pathnames "quicklisp/setup.lisp" (user-homedir-pathname))))

(defun ensure-quicklisp ()
  "True when Quicklisp is loaded, loading it from ~/quicklisp when present."
  (or (find-package "QL")
      (let ((setup (quicklisp-setup-file)))
        (when setup
          (load setup)
          (find-package "QL")))))

(defun system-version (name)
  "The version of ASDF system NAME, or nil."
  (let ((system (asdf:find-system name nil)))
    (and system (asdf:component-version system))))

(defparameter *redefinition-warning*
  (first (existing-symbols '(("SB-KERNEL" "REDEFINITION-WARNING"))))
  "SBCL's class of warnings about redefining a function or macro.")

(defun redefinition-p (warning)
  "True for a redefinition warning: ASDF compiles a file, then loads it into
the same image, so every macro of a freshly compiled system is 'redefined'."
  (and *redefinition-warning* (typep warning *redefinition-warning*)))

(defun missing-system-p (condition name)
  "True when CONDITION says that system NAME itself cannot be found (not one
of its dependencies)."
  (or (and (typep condition 'asdf:missing-component)
           (not (typep condition 'asdf:missing-dependency))
           (equal (asdf/find-component:missing-requires condition) name))
      (string= (symbol-name (type-of condition)) "SYSTEM-NOT-FOUND")))

(defun system-file-p (plist directory)
  "True when the note PLIST has a place in a file under DIRECTORY (a
namestring ending in /)."
  (let ((file (getf plist :file)))
    (and file directory (eql 0 (search directory file)))))

(defun system-notes (name notes)
  "Swank's compiler NOTES as `note-plist's, keeping those in the files of
system NAME (under its source directory), not of its dependencies; the
number dropped for `*note-limit*' second."
  (let* ((system (ignore-errors (asdf:find-system name nil)))
         (directory (and system (asdf:system-source-directory system)
                         (namestring (truename (asdf:system-source-directory system))))))
    (note-plists notes (lambda (plist) (system-file-p plist directory)))))

(defun %load-system (name quicklisp stdout record-warning record-note)
  "Load NAME with output to STDOUT; return (:ok) or (:error PLIST).
Warnings other than redefinitions go to RECORD-WARNING as (TYPE MESSAGE),
and Swank's compiler notes (as C-c C-k gathers them) to RECORD-NOTE, also
when the load fails."
  (block loading
    (flet ((fail (c)
             (return-from loading
               (list :error
                     (if (missing-system-p c name)
                         (list :type (condition-type-name c)
                               :message (format nil "System ~S not found." name)
                               :backtrace nil)
                         (describe-error c (frame-lines (error-frames) c
                                                        *backtrace-frame-limit*)))))))
      ;; Swank's compilation hooks signal each warning again, to this
      ;; handler, and make it a note only if that returns; the warning then
      ;; comes here a second time, and is muffled (warnings do not stop a
      ;; load: ASDF on SBCL fails a file whose compilation warned).
      (handler-bind ((warning
                       (let ((last nil))
                         (lambda (w)
                           (cond ((eq w last) (muffle-warning w))
                                 (t (setf last w)
                                    (unless (redefinition-p w)
                                      (funcall record-warning
                                               (list (public-type-name w 'warning)
                                                     (condition-message w)))))))))
                     (serious-condition #'fail))
        (with-standard-streams (stdout stdout)
          ;; BREAK and INVOKE-DEBUGGER end the load too.
          (with-debugger-calling (#'fail)
            (handler-bind ((swank/backend:compiler-condition
                             (lambda (c) (funcall record-note (swank::make-compiler-note c)))))
              (swank/backend:with-compilation-hooks ()
                (if quicklisp
                    (funcall (find-symbol "QUICKLOAD" "QL") name :silent t)
                    (asdf:load-system name))))
            (list :ok)))))))

(defun load-system (name &key (max-output 20000) (tag nil) (answer-within nil))
  "Load the ASDF system NAME as `load-system-report' does; still running
after ANSWER-WITHIN seconds, the load goes on in the background (see
`call-within-window')."
  (call-within-window (lambda () (load-system-report name max-output tag)) answer-within tag))

(defun remember-source (truename)
  "Keep the text of the file at TRUENAME in Swank's source cache as it is
now.  Swank looks the cache up by the pathname SBCL recorded when it finds
a definition's position, and by its namestring when it reads the snippet:
the one entry goes under both keys, or the two would disagree once the
file is edited."
  (let ((cache swank/source-file-cache::*source-file-cache*)
        (namestring (namestring truename)))
    (swank/source-file-cache:source-cache-get truename (file-write-date truename))
    (let ((entry (gethash truename cache)))
      (when entry
        (setf (gethash namestring cache) entry)))))

(defun remember-system-sources (name)
  "Keep the text of every Lisp file of system NAME, and of the systems it
depends on, in Swank's source cache as it is now that they are loaded (as
Swank's compile-file does for the file it loads): their definitions are
then found by their compiled text after the files are edited, and the
line each had is known (see `resolved-location')."
  (handler-case
      (dolist (component (asdf:required-components (asdf:find-system name)
                                                   :other-systems t
                                                   :component-type 'asdf:cl-source-file))
        (let ((file (asdf:component-pathname component)))
          (when (and file (probe-file file))
            (remember-source (truename file)))))
    (serious-condition (condition)
      (log-note "could not keep the sources of ~A: ~A" name (condition-message condition)))))

(defun load-system-report (name max-output tag)
  "Load the ASDF system NAME (a string), through Quicklisp when it is
available.  Return a plist: :status (:ok, :error, or :aborted when
cancelled under TAG), :system, :loader (\"quicklisp\" or \"asdf\"),
:warnings as (TYPE MESSAGE) lists, :notes (see `note-plist') for the
system's own files that were compiled, :dropped (notes past
`*note-limit*'), and :version or :error.  Compiler chatter goes to a
capped stream (MAX-OUTPUT characters) and is dropped.  Packages the
system creates are libraries, not the session's own definitions."
  (let* ((stdout (make-capped-output-stream max-output))
         (warnings '())
         (notes '())
         (before (list-all-packages))
         (quicklisp (ensure-quicklisp))
         (outcome (with-running (tag sb-thread:*current-thread*)
                    (or (catch 'load-cancelled
                          (%load-system name quicklisp stdout
                                        (lambda (w) (push w warnings))
                                        (lambda (note) (push note notes))))
                        (list :aborted)))))
    (setf *baseline-packages*
          (union *baseline-packages* (set-difference (list-all-packages) before)))
    (when (eq (first outcome) :ok)
      (remember-system-sources name))
    (multiple-value-bind (notes dropped) (system-notes name (nreverse notes))
      (list* :status (first outcome)
             :system name
             :loader (if quicklisp "quicklisp" "asdf")
             :warnings (nreverse warnings)
             :notes notes
             :dropped dropped
             (case (first outcome)
               (:ok (list :version (system-version name)))
               (:error (list :error (second outcome))))))))
