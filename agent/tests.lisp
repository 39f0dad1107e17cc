;;;; agent/tests.lisp --- run-tests: a project's tests, their results read from the framework
;;;;
;;;; A run is an evaluation (`evaluate' of a call to `run-tests-now'), so its
;;;; output is kept, it waits at an error, and it goes to the background at
;;;; the close of its answer window as any evaluation does.  The results
;;;; come from the frameworks' own data, never from their printout:
;;;;  - FiveAM: the result objects `5am:run' returns (one per check), caught
;;;;    by an encapsulation of `5am:run' that records them only inside a run
;;;;    of ours, so that `asdf:test-system' (which calls `5am:run!') is seen
;;;;    too, and only the outermost run's (a test's own runs are its own);
;;;;  - Fiasco: the contexts `fiasco:run-tests' returns (one per test run,
;;;;    holding its assertions and failures), caught by an encapsulation of
;;;;    `run-tests' as FiveAM's `run' is;
;;;;  - RT (and SBCL's SB-RT, which alexandria-tests uses, and copies of RT
;;;;    kept in a library's own package, see `rt-packages'): its entries,
;;;;    pending after the run when they failed, the values each was
;;;;    compared with (an encapsulation of its `equalp-with-case', which RT
;;;;    calls once per entry that did not signal), and the condition an
;;;;    entry signalled (see `run-rt-entry').
;;;; A test's place goes through the edit-compile loop's resolver: a Fiasco
;;;; test's as Swank records it, a FiveAM or RT test's (which record none)
;;;; found by its name in the text its file was compiled from (see `placed'),
;;;; a FiveAM test's own file first (see `fiveam-test-file').
;;;;
;;;; One of the agent's parts, loaded in the order `*agent-parts*' gives
;;;; in swank-bootstrap.lisp; it uses only what the parts before it
;;;; define.

(in-package #:cl-mcp-agent)

(defstruct (test-run (:constructor make-test-run (system test debug)))
  "One run-tests call: what to run, and what the frameworks reported."
  system test debug
  (frameworks '())        ; names of the frameworks seen running, first first
  (fiveam-results '())    ; 5am:run's result lists, newest first
  (fiasco-contexts '())   ; fiasco:run-tests' top-level contexts, newest first
  (rt-compared (make-hash-table :test 'eq))  ; RT entry name -> values compared
  (rt-entries '())        ; (NAME FORM VALS PASSED) of each RT entry run
  (signalled nil)         ; the error that ended the run, as `describe-error'
  (started (get-internal-real-time))
  (report nil))           ; the :tests plist, once the run is over

(defmethod print-object ((run test-run) stream)
  (print-unreadable-object (run stream :type t)
    (let ((report (test-run-report run)))
      (cond ((null report) (write-string "running" stream))
            ((null (getf report :frameworks)) (write-string "no framework recognised" stream))
            (t (format stream "~{~A~^, ~}: ~D passed, ~D failed, ~D errored"
                  (getf report :frameworks) (getf report :passed)
                  (getf report :failed) (getf report :errored)))))))

(defvar *test-run* nil
  "The run-tests call this thread is running, else nil: the frameworks'
hooks record only inside one.")

(defparameter *failure-limit* 200
  "Failures and errors listed at most; the others are counted.")

(defparameter *text-limit* 2000
  "Characters at most of a failed check's form, reason or values.")

(defun note-framework (run name)
  (unless (member name (test-run-frameworks run) :test #'string=)
    (setf (test-run-frameworks run) (append (test-run-frameworks run) (list name)))))

(defun flat-text (text limit)
  "TEXT on one line, at most LIMIT characters of it."
  (let ((flat (substitute #\Space #\Newline text)))
    (subseq flat 0 (min (length flat) limit))))

(defun printed (object)
  "OBJECT printed readably-ish on one line, cut at `*text-limit*'."
  (flat-text (safe-print object (lambda (o) (let ((*print-length* 20) (*print-level* 6))
                                             (prin1-to-string o))))
            *text-limit*))

;;;; The frameworks' hooks

(defun framework-symbol (package name)
  "The symbol NAME of PACKAGE when that package exists, else nil."
  (and (find-package package) (find-symbol name package)))

(defvar *hooked* '()
  "The framework functions `encapsulate-once' wrapped.")

(defun encapsulate-once (symbol hook)
  "Wrap SYMBOL's function with HOOK (called with the function and the
arguments), once per image: `sb-int:encapsulate', as TRACE does."
  (when (and symbol (fboundp symbol)
             (not (sb-int:encapsulated-p symbol 'cl-mcp-run-tests)))
    (sb-int:encapsulate symbol 'cl-mcp-run-tests hook)
    (pushnew symbol *hooked*)))

(defun remove-hooks ()
  "Unwrap the framework functions `install-hooks' wrapped (the next run
wraps them again)."
  (dolist (symbol (shiftf *hooked* '()))
    (when (sb-int:encapsulated-p symbol 'cl-mcp-run-tests)
      (sb-int:unencapsulate symbol 'cl-mcp-run-tests))))

(defun rt-packages ()
  "The names of the packages that hold an RT: SB-RT, RT, and a copy of
RT's code that a library keeps in its own package (named-readtables'
tests do)."
  (loop for package in (list-all-packages)
        when (every (lambda (name)
                      (let ((symbol (find-symbol name package)))
                        (and symbol (eq (symbol-package symbol) package))))
                    '("DO-ENTRY" "EQUALP-WITH-CASE" "*ENTRIES*" "*TEST*" "*CATCH-ERRORS*"))
          collect (package-name package)))

(defun install-hooks ()
  "Hook the loaded frameworks, so that a run of ours records what they
return: FiveAM's result lists, RT's compared values."
  (encapsulate-once (framework-symbol "FIVEAM" "RUN")
                    (lambda (function &rest arguments)
                      (let* ((run *test-run*)
                             ;; A run inside a test (FiveAM's self-tests
                             ;; run inner suites) is that test's business:
                             ;; FiveAM counts only the outermost run.
                             (results (let ((*test-run* nil)) (apply function arguments))))
                        (when run
                          (note-framework run "FiveAM")
                          (push results (test-run-fiveam-results run)))
                        results)))
  (encapsulate-once (framework-symbol "FIASCO" "RUN-TESTS")
                    (lambda (function testable &rest arguments)
                      (let ((run *test-run*))
                        (if (null run)
                            (apply function testable arguments)
                            ;; The leftmost :interactive wins: with debug,
                            ;; Fiasco stops at the first failure or error.
                            (multiple-value-bind (passed contexts)
                                (apply function testable (append (and (test-run-debug run) '(:interactive t))
                                                                 arguments))
                              (note-framework run "Fiasco")
                              (setf (test-run-fiasco-contexts run)
                                    (append (reverse contexts) (test-run-fiasco-contexts run)))
                              (values passed contexts))))))
  (dolist (package (rt-packages))
    (let ((do-entry (framework-symbol package "DO-ENTRY")))
      (encapsulate-once (framework-symbol package "EQUALP-WITH-CASE")
                        (lambda (function &rest arguments)
                          (let ((run *test-run*)
                                (name (symbol-value (framework-symbol package "*TEST*"))))
                            ;; RT compares an entry's values once, then
                            ;; recursively their parts: the first is theirs.
                            (when (and run (not (nth-value 1 (gethash name (test-run-rt-compared run)))))
                              (setf (gethash name (test-run-rt-compared run)) (first arguments))))
                          (apply function arguments)))
      (encapsulate-once do-entry
                        (lambda (function entry &rest arguments)
                          (if (null *test-run*)
                              (apply function entry arguments)
                              (run-rt-entry *test-run* package function entry arguments)))))))

;;;; RT's entries

(defun condition-noting-dispatch (note)
  "A copy of the current pprint dispatch table that calls NOTE on each
condition it prints, then prints it as it would be without the copy."
  (let* ((original *print-pprint-dispatch*)
         (table (copy-pprint-dispatch original)))
    (set-pprint-dispatch 'condition (lambda (stream condition)
                                      (funcall note condition)
                                      (let ((*print-pprint-dispatch* original))
                                        (write condition :stream stream)))
                         0 table)
    table))

(defun run-rt-entry (run package function entry arguments)
  "Call RT's do-entry FUNCTION on ENTRY and ARGUMENTS, recording the entry
in RUN: `rt-entry-fields', the values RT compared, whether it was
expected to fail, and the condition it signalled, taken when it
happened: the error that reached this frame (a debug run: RT's
*catch-errors* nil), else the last condition RT printed as the entry's
actual value, which is the one RT caught.  An entry left by a restart
(one that ends a debug run) is pending: it is recorded as errored."
  (let ((name (first (rt-entry-fields package entry)))
        (compared (test-run-rt-compared run))
        (raised nil)
        (shown nil))
    ;; An entry may run twice (alexandria's suite runs interpreted, then
    ;; compiled).
    (remhash name compared)
    (unwind-protect
         (handler-bind ((error (lambda (condition) (unless raised (setf raised condition)))))
           (let ((*print-pprint-dispatch* (condition-noting-dispatch (lambda (condition) (setf shown condition)))))
             (apply function entry arguments)))
      (note-framework run "RT")
      (push (append (rt-entry-fields package entry)
                    (multiple-value-list (gethash name compared))
                    (list (rt-expected-p package name) (or raised shown)))
            (test-run-rt-entries run)))))

(defun rt-expected-p (package name)
  "True when RT (in PACKAGE) expects the test NAME to fail: it is on the
*EXPECTED-FAILURES* list (SB-RT's and RT's), which the do-tests summary
excludes from the unexpected failures."
  (let ((expected (framework-symbol package "*EXPECTED-FAILURES*")))
    (and expected (boundp expected) (member name (symbol-value expected)) t)))

(defun rt-entry-fields (package entry)
  "(NAME FORM VALS PASSED) of RT ENTRY (`run-rt-entry' records after them
the values RT compared, whether it compared any, whether the entry was
expected to fail and the condition it signalled): SB-RT keeps a list (PEND
NAME FORM . VALS), RT a structure."
  (if (consp entry)
      (destructuring-bind (pend name form &rest vals) entry
        (list name form vals (not pend)))
      (flet ((field (name) (funcall (framework-symbol package name) entry)))
        (list (field "NAME") (field "FORM") (field "VALS") (not (field "PEND"))))))

(defun rt-outcome (fields)
  "RT entry FIELDS as a failure or error plist (with :expected-to-fail t when RT
expected it to fail), or nil when it passed.  An entry whose values were
never compared signalled an error, which RT keeps nowhere: the condition
`run-rt-entry' took, else (none was printed: *print-pretty* nil) its form
is evaluated once more here for the condition."
  (destructuring-bind (name form vals passed actual compared expected condition) fields
    (unless passed
      (append
        (if compared
            (list :kind :failure :test (printed name) :symbol name :form (printed form)
                  :reason (format nil "Expected ~A, got ~A"
                                  (printed-values vals) (printed-values actual))
                  :expected (printed-values vals) :actual (printed-values actual))
            (list* :kind :error :test (printed name) :symbol name :form (printed form)
                   (condition-fields (or condition (nth-value 1 (ignore-errors (eval form)))))))
        (and expected (list :expected-to-fail t))))))

(defun rt-not-run (entries)
  "How many tests of RT's (and SB-RT's) that ran ENTRIES (rt-entry-fields
lists) did not run: a debug run ended by a restart stops short."
  (let ((ran (make-hash-table :test 'eq)))
    (dolist (fields entries)
      (setf (gethash (first fields) ran) t))
    (loop for package in (rt-packages)
          for symbol = (framework-symbol package "*ENTRIES*")
          for names = (and symbol (boundp symbol)
                           (mapcar (lambda (entry) (first (rt-entry-fields package entry)))
                                   (cdr (symbol-value symbol))))
          when (some (lambda (name) (gethash name ran)) names)
            sum (count-if-not (lambda (name) (gethash name ran)) names))))

(defun printed-values (values)
  (format nil "~{~A~^ ~}" (mapcar #'printed values)))

(defun condition-fields (condition)
  (if (typep condition 'condition)
      (list :type (condition-type-name condition) :message (condition-message condition *text-limit*))
      (list :type "ERROR" :message "It signalled an error when RT ran it, and none when run again.")))

;;;; FiveAM's results

(defun fiveam-class-p (object name)
  (typep object (framework-symbol "FIVEAM" name)))

(defun fiveam-test-name (result)
  (let ((test (funcall (framework-symbol "FIVEAM" "TEST-CASE") result)))
    (funcall (framework-symbol "FIVEAM" "NAME") test)))

(defun fiveam-outcome (result)
  "A FiveAM result object as a failure or error plist, or nil for a pass or a skip."
  (flet ((slot (name) (funcall (framework-symbol "FIVEAM" name) result)))
    (cond ((fiveam-class-p result "UNEXPECTED-TEST-FAILURE")
           (list* :kind :error :test (printed (fiveam-test-name result)) :symbol (fiveam-test-name result)
                  (condition-fields (slot "ACTUAL-CONDITION"))))
          ((fiveam-class-p result "TEST-FAILURE")
           (list :kind :failure :test (printed (fiveam-test-name result)) :symbol (fiveam-test-name result)
                 :form (printed (slot "TEST-EXPR"))
                 :reason (string-trim " " (flat-text (or (slot "REASON") "no reason given") *text-limit*)))))))

;;;; Fiasco's results

(defun fiasco-call (name &rest arguments)
  (apply (framework-symbol "FIASCO" name) arguments))

(defun fiasco-counts (contexts)
  "(PASSED FAILED ERRORED SKIPPED) of Fiasco's top-level CONTEXTS, in tests
as its printout marks them ([ OK ], [FAIL], [SKIP]): each test run that
ran no other test, by its own failures, an unexpected error making it
errored."
  (let ((totals (list 0 0 0 0)))
    (dolist (context contexts totals)
      (dolist (test-run (fiasco-call "ALL-TEST-RUNS-OF" context))
        (unless (fiasco-call "CHILDREN-CONTEXTS-OF" test-run)
          (let ((failures (remove-if (lambda (failure) (fiasco-call "EXPECTED-P" failure))
                                     (fiasco-call "FAILURES-OF" test-run))))
            (incf (nth (cond ((some (lambda (failure)
                                      (typep failure (framework-symbol "FIASCO" "UNEXPECTED-ERROR")))
                                    failures)
                              2)
                             (failures 1)
                             ((fiasco-call "SKIPPED-P" test-run) 3)
                             (t 0))
                       totals))))))))

(defun fiasco-outcome (failure)
  "A Fiasco failure (a condition it recorded) as a failure or error plist;
nil for one the test declared expected."
  (unless (fiasco-call "EXPECTED-P" failure)
    (let* ((context (fiasco-call "CONTEXT-OF" failure))
           (symbol (and context (fiasco-call "NAME-OF" (fiasco-call "TEST-OF" context))))
           (test (printed symbol)))
      (if (typep failure (framework-symbol "FIASCO" "UNEXPECTED-ERROR"))
          (list* :kind :error :test test :symbol symbol (condition-fields (fiasco-call "ERROR-OF" failure)))
          (list :kind :failure :test test :symbol symbol :form (printed (fiasco-call "FORM-OF" failure))
                :reason (string-trim " " (flat-text (with-output-to-string (stream)
                                                      (describe-object failure stream))
                                                    *text-limit*)))))))

;;;; Where a test is defined
;;;
;;; Every place goes through the edit-compile loop's resolver
;;; (`location-plist' of agent/names.lisp), which checks it against the
;;; file as it is now.  What SBCL records differs by framework:
;;;  - a Fiasco test is a function (`deftest' expands to a DEFUN), so Swank
;;;    finds its definition as for find-definition;
;;;  - FiveAM's test functions are made by EVAL when the test is
;;;    registered (their recorded source is the file being loaded at the
;;;    top, not the test's), and RT's entries are data: neither records a
;;;    place.  Those are found by name in the text the file was compiled
;;;    from, when Swank's source cache holds it (load-system and run-tests
;;;    {system} keep it: `remember-system-sources'), and that place is then
;;;    resolved as a recorded one; else by name in the file as it is now,
;;;    with no status, as nothing says what was compiled.  A FiveAM test's
;;;    function is named after the file that was loading (see
;;;    `fiveam-test-file'): that file is searched first.

(defun dependency-system-name (dependency)
  "The system an ASDF :depends-on entry names: NAME, (:version NAME
VERSION), (:feature FEATURE NAME) or (:require NAME); nil for another form."
  (cond ((or (stringp dependency) (symbolp dependency)) dependency)
        ((and (consp dependency) (member (first dependency) '(:version :require)))
         (second dependency))
        ((and (consp dependency) (eq (first dependency) :feature))
         (dependency-system-name (third dependency)))))

(defun compiled-file-source (compiled)
  "The source file whose compiled file is COMPILED (a namestring): itself
when it is not a fasl, else the file of the loaded ASDF component that
compiles to it, else the .lisp beside it (COMPILE-FILE's default); nil
when none exists."
  (let ((fasl (probe-file compiled)))
    (cond ((null fasl) nil)
          ((not (equal (pathname-type fasl) (pathname-type (compile-file-pathname "x.lisp")))) fasl)
          ((loop for name in (asdf:already-loaded-systems)
                 for system = (asdf:find-system name nil)
                 thereis (and system
                              (loop for component in (asdf:required-components system :other-systems nil)
                                    thereis (and (typep component 'asdf:cl-source-file)
                                                 (equal (probe-file (first (asdf:output-files 'asdf:compile-op
                                                                                              component)))
                                                        fasl)
                                                 (probe-file (asdf:component-pathname component)))))))
          (t (probe-file (make-pathname :type "lisp" :defaults fasl))))))

(defun fiveam-test-file (name)
  "The source file of the FiveAM test NAME, from the one place SBCL records
for its function: FiveAM makes it by EVAL while the test's file loads, so
its name says which file (`(LABELS %TEST-NAME :IN FILE)'), with no
position; nil when that is not known."
  (let* ((get-test (framework-symbol "FIVEAM" "GET-TEST"))
         (test (and get-test (symbolp name) (funcall get-test name)))
         (slot (framework-symbol "FIVEAM" "TEST-LAMBDA"))
         (function (and test slot (slot-exists-p test slot) (slot-boundp test slot) (slot-value test slot)))
         (function-name (and (functionp function) (sb-kernel:%fun-name function)))
         (file (and (consp function-name) (getf (cddr function-name) :in))))
    (and (stringp file) (compiled-file-source file))))

(defun framework-files (framework)
  "The source files of the loaded ASDF systems that depend on FRAMEWORK's
system, where its tests are."
  (let ((system-name (string-downcase framework)))
    (loop for name in (asdf:already-loaded-systems)
          for system = (asdf:find-system name nil)
          when (and system
                    (some (lambda (dependency)
                            (let ((named (dependency-system-name dependency)))
                              (and named
                                   (member (string-downcase (string named))
                                           (list system-name (format nil "sb-~A" system-name))
                                           :test #'string=))))
                          (asdf:system-depends-on system)))
            append (mapcar #'namestring (system-source-files system)))))

(defun test-opening-p (lowered name-start)
  "True when the line holding NAME-START opens a form whose first argument
is the name there: `(test NAME', `(deftest NAME', `(5am:test (NAME'..."
  (let ((at (skip-blanks-and-comments lowered (line-start lowered name-start))))
    (and (< at name-start) (= (aref lowered at) 40)
         (let ((word-end (or (position-if-not #'symbol-octet-p lowered :start (1+ at) :end name-start)
                             name-start)))
           (and (> word-end (1+ at))
                (every (lambda (octet) (or (octet-blank-p octet) (= octet 40)))
                       (subseq lowered word-end name-start))
                (<= (count 40 lowered :start word-end :end name-start) 1))))))

(defparameter +test-octets+ (coerce (map 'list #'char-code "test") 'octets)
  "What the operators that define tests have in their names (FiveAM's test
and def-test, RT's and Fiasco's deftest, define-test).")

(defun test-definer-p (lowered opening)
  "True when the form opening at OPENING names a test in its operator."
  (let ((end (or (position-if-not #'symbol-octet-p lowered :start (1+ opening)) (length lowered))))
    (search +test-octets+ lowered :start2 (1+ opening) :end2 end)))

(defun test-opening (needle lowered)
  "The byte where a form naming NEEDLE (lowered bytes) opens in LOWERED
whose operator names a test: another form of that name is no test's place
\(esrap names a rule and its test alike; ironclad's test ADLER32 is made by
a #. form, and its (defstruct (adler32 is a digest's)."
  (let ((openings (loop for start in (occurrences needle lowered)
                        for end = (+ start (length needle))
                        when (and (plusp start) (not (symbol-octet-p (aref lowered (1- start))))
                                  (or (= end (length lowered)) (not (symbol-octet-p (aref lowered end))))
                                  (test-opening-p lowered start))
                          collect (skip-blanks-and-comments lowered (line-start lowered start)))))
    (find-if (lambda (opening) (test-definer-p lowered opening)) openings)))

(defun name-candidates (name)
  "NAME, then NAME without each trailing .PART or -PART: a test made by a
macro (split-sequence's DEFINE-TEST makes SPLIT-SEQUENCE.0.VECTOR from
SPLIT-SEQUENCE.0) is found at the macro's form."
  (loop for candidate = name then (subseq candidate 0 cut)
        for cut = (position-if (lambda (c) (member c '(#\. #\-))) candidate :from-end t)
        collect candidate
        while (and cut (plusp cut))))

(defun opening-in (candidate octets)
  "The byte where a form naming CANDIDATE (a lowered name) opens in OCTETS."
  (test-opening (sb-ext:string-to-octets candidate :external-format :utf-8) (lowered-octets octets)))

(defun compiled-location (file candidate)
  "Swank's kind of location for the form naming CANDIDATE in the text FILE
was compiled from: (:location (:file FILE) (:position CHARACTERS)
(:snippet TEXT)), as SBCL would record it; nil when that text is not kept
or does not name it."
  (let* ((text (compiled-text file))
         (octets (and text (sb-ext:string-to-octets text :external-format :utf-8)))
         (offset (and octets (opening-in candidate octets))))
    (when offset
      (list :location (list :file file)
            (list :position (1+ (length (utf-8-text octets 0 offset))))
            (list :snippet (nth-value 2 (place-at octets offset)))))))

(defun searched-place (name files cache)
  "Where the test NAME (printed) is, found by its name (see
`name-candidates') in FILES: resolved from the text they were compiled
from when it is kept, else in them as they are now, with no status."
  (let ((bare (string-downcase (subseq name (1+ (or (position #\: name :from-end t) -1))))))
    (dolist (candidate (name-candidates bare))
      (dolist (file files)
        (let ((location (compiled-location file candidate)))
          (when location
            (return-from searched-place (location-plist location cache :name candidate :characters t)))))
      (dolist (file files)
        (let* ((source (file-source file cache))
               (offset (opening-in candidate (source-file-octets source))))
          (when offset
            (return-from searched-place (place-plist source offset nil nil))))))
    (list :error "no form naming this test in its system's files")))

(defun recorded-place (symbol cache)
  "The place of the function SYMBOL as Swank finds it (a Fiasco test's
DEFUN), resolved as find-definition resolves it; nil when none is in a
file."
  (let ((definitions (call-guarded (lambda () (swank/backend:find-definitions symbol)) 30)))
    (when (eq (first definitions) :ok)
      (loop for (dspec location) in (second definitions)
            for place = (and (consp dspec) (eq (first dspec) 'defun)
                             (location-plist location cache :name symbol :characters t))
            when (and place (getf place :file))
              return place))))

(defun run-system-files (system)
  "The source files of the loaded systems SYSTEM (a run's, or nil) names:
itself and its secondary systems (\"named-readtables/test\"), whose tests
a framework kept in the library's own package runs (named-readtables'
copy of RT), so that no system depends on the framework's."
  (when system
    (let ((primary (asdf:primary-system-name system)))
      (loop for name in (asdf:already-loaded-systems)
            for loaded = (asdf:find-system name nil)
            when (and loaded (string= (asdf:primary-system-name name) primary))
              append (mapcar #'namestring (system-source-files loaded))))))

(defun placed (outcomes framework system)
  "OUTCOMES (each with :symbol, the test's name, which is dropped) with
each test's :place (see `location-plist'), looked for in the files of the
systems that use FRAMEWORK, then in those of the run's SYSTEM."
  (let ((files (remove-duplicates (append (framework-files framework) (run-system-files system))
                                  :test #'string= :from-end t))
        (cache (make-hash-table :test 'equal)))
    (loop for outcome in outcomes
          for symbol = (getf outcome :symbol)
          for rest = (let ((copy (copy-list outcome))) (remf copy :symbol) copy)
          collect (append rest
                          (list :place (or (and (string= framework "Fiasco") (symbolp symbol) symbol
                                                (recorded-place symbol cache))
                                           (let ((own (and (string= framework "FiveAM")
                                                           (fiveam-test-file symbol))))
                                             (searched-place (getf rest :test)
                                                             (if own (cons (namestring own) files) files)
                                                             cache))))))))

;;;; The report

(defun fiveam-counts (results)
  "(PASSED FAILED ERRORED SKIPPED) of FiveAM's RESULTS, each a check."
  (list (count-if (lambda (r) (fiveam-class-p r "TEST-PASSED")) results)
        (count-if (lambda (r) (and (fiveam-class-p r "TEST-FAILURE")
                                   (not (fiveam-class-p r "UNEXPECTED-TEST-FAILURE"))))
                  results)
        (count-if (lambda (r) (fiveam-class-p r "UNEXPECTED-TEST-FAILURE")) results)
        (count-if (lambda (r) (fiveam-class-p r "TEST-SKIPPED")) results)))

(defun test-run-plist (run)
  "The :tests plist of RUN, over: :frameworks (none: not recognised),
:counts (what a count counts: \"checks\" for FiveAM, \"tests\" for RT),
:passed :failed :errored :skipped (absent when nothing was recognised),
:elapsed-ms, :problems (failures and errors, at most `*failure-limit*'),
:unlisted, :not-run (RT's tests that a run of a system did not reach:
a debug run ended by a restart), :expected-failures (RT's failed tests
that it expected to fail), and :signalled (the error that ended
the run)."
  (let* ((fiveam (reduce #'append (reverse (test-run-fiveam-results run))))
         (fiasco (reverse (test-run-fiasco-contexts run)))
         (rt (reverse (test-run-rt-entries run)))
         (counts (mapcar #'+ (fiveam-counts fiveam) (fiasco-counts fiasco)
                         (list (count-if #'fourth rt) 0 0 0)))
         (rt-problems (remove nil (mapcar #'rt-outcome rt)))
         (system (test-run-system run))
         (problems (append (placed (remove nil (mapcar #'fiveam-outcome fiveam)) "FiveAM" system)
                           (placed (loop for context in fiasco
                                         append (remove nil (mapcar #'fiasco-outcome
                                                                    (fiasco-call "FAILURES-OF" context))))
                                   "Fiasco" system)
                           (placed rt-problems "RT" system))))
    (setf counts (list (first counts)
                       (+ (second counts) (count :failure rt-problems :key #'second))
                       (+ (third counts) (count :error rt-problems :key #'second))
                       (fourth counts)))
    ;; Failures first, then errors.
    (setf problems (stable-sort problems #'< :key (lambda (p) (if (eq (getf p :kind) :failure) 0 1))))
    (append (list :frameworks (test-run-frameworks run)
                  :elapsed-ms (round (* 1000 (- (get-internal-real-time) (test-run-started run)))
                                     internal-time-units-per-second)
                  :problems (subseq problems 0 (min (length problems) *failure-limit*))
                  :unlisted (max 0 (- (length problems) *failure-limit*)))
            (and (test-run-frameworks run)
                 (list :counts (cond ((null fiveam) "tests") ((or rt fiasco) "checks and tests") (t "checks"))
                       :passed (first counts) :failed (second counts)
                       :errored (third counts) :skipped (fourth counts)))
            (let ((not-run (if (and rt (null (test-run-test run))) (rt-not-run rt) 0))
                  (expected (count-if (lambda (problem) (getf problem :expected-to-fail)) rt-problems)))
              (append (and (plusp not-run) (list :not-run not-run))
                      (and (plusp expected) (list :expected-failures expected))))
            (and (test-run-signalled run) (list :signalled (test-run-signalled run))))))

;;;; Running

(defun test-designator (text)
  "The test or suite TEXT names, read in *PACKAGE*: a symbol."
  (let ((*read-eval* nil))
    (let ((name (read-from-string text)))
      (unless (symbolp name)
        (error "~S does not name a test: a test's name is a symbol." text))
      name)))

(defun run-named-test (name)
  "Run the FiveAM or Fiasco test or suite, or the RT entry, NAME; the framework's
printout goes to *standard-output*."
  (let ((fiveam-get (framework-symbol "FIVEAM" "GET-TEST")))
    (cond ((and fiveam-get (funcall fiveam-get name))
           (funcall (framework-symbol "FIVEAM" "EXPLAIN!")
                    (funcall (framework-symbol "FIVEAM" "RUN") name)))
          ((let ((fiasco-find (framework-symbol "FIASCO" "FIND-TEST")))
             (and fiasco-find (funcall fiasco-find name :otherwise nil)
                  (progn (fiasco-call "RUN-TESTS" name) t))))
          ((loop for package in (rt-packages)
                 for get-entry = (framework-symbol package "GET-ENTRY")
                 thereis (and get-entry
                              (ignore-errors (funcall get-entry name))
                              (progn (funcall (framework-symbol package "DO-TEST") name) t))))
          (t (error "No FiveAM or Fiasco test or suite and no RT test is named ~S." name)))))

(defun load-test-dependencies (system)
  "Load SYSTEM and the systems its test-op needs first, so that their
frameworks are hooked before the tests run, and keep the text their files
were compiled from (ASDF recompiles an edited file here), where test
places are found (see `placed').  What they define is a library's, as
after load-system (`call-loading-libraries')."
  (call-loading-libraries
   (lambda ()
     (asdf:load-system system)
     (remember-system-sources system)
     (loop for (operation . components) in (asdf:component-depends-on 'asdf:test-op (asdf:find-system system))
           when (member (string operation) '("LOAD-OP" "TEST-OP") :test #'string=)
             do (dolist (component components)
                  (when (or (stringp component) (symbolp component))
                    (asdf:load-system component)
                    (remember-system-sources component)))))))

(defun call-with-debugging (run thunk)
  "Call THUNK with the frameworks told to stop at a failed check or an
error when RUN debugs (FiveAM's *on-error* and *on-failure* :debug; RT's
*catch-errors* nil), so that the evaluation waits there; else as they
are by default."
  (let ((symbols (remove nil (list* (framework-symbol "FIVEAM" "*ON-ERROR*")
                                    (framework-symbol "FIVEAM" "*ON-FAILURE*")
                                    (mapcar (lambda (package) (framework-symbol package "*CATCH-ERRORS*"))
                                            (rt-packages))))))
    (progv symbols (mapcar (lambda (symbol)
                             (if (search "CATCH" (symbol-name symbol))
                                 (not (test-run-debug run))
                                 (and (test-run-debug run) :debug)))
                           symbols)
      (funcall thunk))))

(defun run-tests-now ()
  "Run the tests of `*test-run*' (called as an evaluation's code); the
run, whose report the evaluation's report carries as :tests, or when no
framework was recognised, the values the system's test-op returned (the
fallback's result shows them as an evaluation's)."
  (let ((run *test-run*)
        (returned '()))
    (when (test-run-system run)
      ;; Its redefinition warnings left out, as load-system leaves them out.
      (handler-bind ((warning (lambda (w) (when (redefinition-p w) (muffle-warning w)))))
        (load-test-dependencies (test-run-system run))))
    (install-hooks)
    (flet ((run-them ()
             (call-with-debugging
              run (lambda ()
                    (setf returned
                          (multiple-value-list
                           (if (test-run-test run)
                               (run-named-test (test-designator (test-run-test run)))
                               (asdf:test-system (test-run-system run)))))))))
      (if (test-run-debug run)
          ;; The error waits where it was signalled, as an evaluation's.
          (run-them)
          ;; An error that escapes the framework ends the run, reported
          ;; with what ran.
          (handler-case (run-them)
            (error (condition)
              (setf (test-run-signalled run) (describe-error condition nil))))))
    (setf (test-run-report run) (test-run-plist run))
    (if (test-run-frameworks run) run (values-list returned))))

;;;; Entry point

(defun run-tests-of (&key system test package (debug nil) (timeout nil) (answer-within nil)
                          (max-output 1000000) (tag nil))
  "Run SYSTEM's tests (`asdf:test-system') or the test or suite TEST (a
name read in PACKAGE) as an evaluation (see `evaluate', whose plist this
returns), with FiveAM's and RT's results added as :tests once the run is
over (see `test-run-plist').  With DEBUG, the first failed check or error
stops the run where it happened, waiting as an evaluation at an error."
  (let* ((run (make-test-run system test debug))
         (*test-run* run)
         (*report-additions* (lambda ()
                               (let ((report (test-run-report run)))
                                 (and report (list :tests report))))))
    (evaluate "(cl-mcp-agent::run-tests-now)" :package package :explicit-package (and package t)
                                              :timeout timeout :answer-within answer-within
                                              :max-output max-output :tag tag)))
