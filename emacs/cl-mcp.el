;;; cl-mcp.el --- See, stop and hold cl-mcp's assistant in your SLIME image  -*- lexical-binding: t -*-

;; Part of cl-mcp.  Needs SLIME only.

;;; Commentary:

;; When cl-mcp attaches to the image SLIME is connected to, the assistant
;; evaluates, compiles and runs tests in the programmer's own image.  Load
;; this file after SLIME, `(require 'cl-mcp)', and a `*cl-mcp*' buffer shows
;; each tool call as it starts and ends: its number, the time it started,
;; which assistant made it (its host's name and cl-mcp's process id), its
;; tool, the form or file it acts on, its outcome, duration and evaluation
;; number.  Each assistant's attaching and leaving is a line of its own.
;;
;; The package registers each SLIME connection with cl-mcp's agent in the
;; image (and again, every `cl-mcp-register-interval' seconds, until the
;; agent is there: cl-mcp may attach later).  Only a registered Emacs is
;; told of the calls, as `:channel-send' events `slime-event-hooks' takes.
;;
;; Commands (keys in the `*cl-mcp*' buffer, and in every buffer after the
;; prefix `cl-mcp-keys-prefix', C-c ; by default):
;;   s  `cl-mcp-stop'     abort the call on this line, or the newest running
;;   h  `cl-mcp-hold'     refuse every call that runs code or changes the image
;;   r  `cl-mcp-release'  end the hold
;;   b  `cl-mcp-show'     show the `*cl-mcp*' buffer (C-c ; only)
;;   RET `cl-mcp-jump'    go to the line's file and line, or its backtrace
;; While the programmer holds the assistant, every mode line says so.
;; `cl-mcp-share' opens a listener for assistants and saves its port, which
;; `cl-mcp --connect' (with no port) reads.
;; `cl-mcp-unregister' has the images tell this Emacs nothing more, and
;; `cl-mcp-register' undoes it.

;;; Code:

(require 'cl-lib)
(require 'subr-x)
(require 'slime)

(defgroup cl-mcp nil
  "See, stop and hold what cl-mcp's assistant does in the image."
  :group 'slime)

(defcustom cl-mcp-max-lines 1000
  "Lines the `*cl-mcp*' buffer keeps; older ones are deleted."
  :type 'integer)

(defcustom cl-mcp-line-width 140
  "Columns a call's line fits in when no window shows the `*cl-mcp*'
buffer (else the window's width): a long form is shortened so that the
outcome shows."
  :type 'integer)

(defcustom cl-mcp-register-interval 5
  "Seconds between attempts to register a connection whose image has no
cl-mcp agent yet."
  :type 'number)

(defconst cl-mcp-buffer-name "*cl-mcp*"
  "The buffer that shows the assistant's calls.")

(slime-def-connection-var cl-mcp--registered nil
  "Whether this connection is registered with cl-mcp's agent.")

(defvar cl-mcp--held nil
  "Whether the image says the assistant is held.")

(defvar cl-mcp--enabled t
  "Whether this Emacs registers its connections (`cl-mcp-unregister' ends it).")

(defvar cl-mcp--timer nil
  "The timer that registers the connections not registered yet.")

(defun cl-mcp--agent-form (name &rest arguments)
  "A form calling the agent's function NAME (a string, upper case) with
ARGUMENTS: nil in an image without the agent, or with part of it loaded,
and on an error (no reader error, never SLDB)."
  `(cl:ignore-errors
    (cl:let* ((package (cl:find-package "CL-MCP-AGENT"))
              (entry (cl:and package (cl:find-symbol ,name package))))
      (cl:and entry (cl:fboundp entry) (cl:funcall entry ,@arguments)))))

(defun cl-mcp--eval (name arguments continuation)
  "Call the agent's NAME with ARGUMENTS in the current connection's image,
then CONTINUATION with its value."
  (slime-eval-async (apply #'cl-mcp--agent-form name arguments) continuation))

;;;; Registering

(defun cl-mcp--register (connection)
  "Register CONNECTION with cl-mcp's agent, if its image has one."
  (let ((slime-dispatching-connection connection))
    (cl-mcp--eval "WATCH-REGISTER" '()
                  (lambda (answer)
                    (when answer
                      (setf (cl-mcp--registered connection) t)
                      (cl-mcp--set-held (plist-get answer :held)))))))

(defun cl-mcp--register-all ()
  "Register every SLIME connection not registered yet."
  (dolist (connection slime-net-processes)
    (when (and cl-mcp--enabled
               (process-live-p connection)
               (not (cl-mcp--registered connection)))
      (cl-mcp--register connection))))

(defun cl-mcp--start-registering ()
  "Register the connections now, and keep trying for those whose image
has no agent yet."
  (cl-mcp--register-all)
  (unless cl-mcp--timer
    (setq cl-mcp--timer (run-with-timer cl-mcp-register-interval cl-mcp-register-interval
                                        #'cl-mcp--register-all))))

;;;; The buffer

(defvar cl-mcp-command-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "s") #'cl-mcp-stop)
    (define-key map (kbd "h") #'cl-mcp-hold)
    (define-key map (kbd "r") #'cl-mcp-release)
    (define-key map (kbd "b") #'cl-mcp-show)
    map)
  "cl-mcp's commands, under `cl-mcp-keys-prefix' in every buffer.")
(fset 'cl-mcp-command-map cl-mcp-command-map)

(defvar cl-mcp-mode-map
  (let ((map (make-sparse-keymap)))
    (set-keymap-parent map cl-mcp-command-map)
    (define-key map (kbd "RET") #'cl-mcp-jump)
    map)
  "Keys of the `*cl-mcp*' buffer: cl-mcp's commands, and RET.")

(easy-menu-define cl-mcp-menu cl-mcp-mode-map "cl-mcp's assistant."
  '("cl-mcp"
    ["Stop the running evaluation" cl-mcp-stop]
    ["Hold the assistant" cl-mcp-hold :visible (not cl-mcp--held)]
    ["Release the hold" cl-mcp-release :visible cl-mcp--held]
    ["Jump to this call's place" cl-mcp-jump]
    ["Open a port for assistants" cl-mcp-share]))

(define-derived-mode cl-mcp-mode special-mode "cl-mcp"
  "The assistant's tool calls, one line each.
\\{cl-mcp-mode-map}"
  (setq-local truncate-lines t)
  (setq header-line-format '(:eval (if cl-mcp--held
                                        "cl-mcp: HELD (r releases)   s stop  RET jump"
                                      "cl-mcp: s stop  h hold  RET jump"))))

(defun cl-mcp--buffer ()
  "The `*cl-mcp*' buffer, made when missing."
  (or (get-buffer cl-mcp-buffer-name)
      (with-current-buffer (get-buffer-create cl-mcp-buffer-name)
        (cl-mcp-mode)
        (current-buffer))))

(defun cl-mcp--find-line (call)
  "Move to the line of CALL (its number); nil when it is gone."
  (goto-char (point-max))
  (let ((found nil))
    (while (and (not found) (not (bobp)))
      (forward-line -1)
      (when (eql (get-text-property (point) 'cl-mcp-call) call)
        (setq found t)))
    found))

(defun cl-mcp--width ()
  "The columns a line of the current buffer fits in."
  (let ((window (get-buffer-window (current-buffer) t)))
    (if window (window-body-width window) cl-mcp-line-width)))

(defun cl-mcp--clock (event)
  "The time of EVENT (when its call started), as HH:MM:SS."
  (format-time-string "%H:%M:%S" (plist-get event :time)))

(defun cl-mcp--line (event)
  "The text of EVENT's call line, carrying EVENT as a property: its form is
shortened first, so that its outcome is never cut off."
  (let* ((head (format "#%-4d %s %-18s %-16s " (plist-get event :call) (cl-mcp--clock event)
                       (or (plist-get event :who) "") (plist-get event :tool)))
         (tail (concat "  =>  "
                       (if (eq (plist-get event :phase) :start)
                           "running..."
                         (format "%s  (%d ms%s)" (plist-get event :outcome) (plist-get event :ms)
                                 (if (plist-get event :evaluation)
                                     (format ", evaluation %d" (plist-get event :evaluation))
                                   "")))))
         (room (max 12 (- (cl-mcp--width) (length head) (length tail))))
         (subject (cl-mcp--shortened (or (plist-get event :subject) "") room
                                     (plist-get event :file))))
    (propertize (concat head subject tail) 'cl-mcp-call (plist-get event :call) 'cl-mcp-event event)))

(defun cl-mcp--shortened (text room from-left)
  "TEXT in at most ROOM columns, its cut marked: a file's (FROM-LEFT) loses
its start, so that its name and line stay, a form its end."
  (cond ((<= (string-width text) room) text)
        (from-left (concat "..." (substring text (- (length text) (- room 3)))))
        (t (truncate-string-to-width text room nil nil "..."))))

(defun cl-mcp--merge (newer older)
  "The plist OLDER with NEWER's entries put over it, but for NEWER's nils."
  (let ((merged (copy-sequence older)))
    (cl-loop for (key value) on newer by #'cddr
             when value do (setq merged (plist-put merged key value)))
    merged))

(defun cl-mcp--session-line (event)
  "The text of the line that says an assistant attached or left."
  (let ((aborted (or (plist-get event :aborted) 0)))
    (format "-- %s %s %s --" (cl-mcp--clock event) (plist-get event :who)
            (if (eq (plist-get event :phase) :attach)
                "attached"
              (format "left%s" (if (zerop aborted) ""
                                 (format ", aborting %d evaluation%s" aborted
                                         (if (= aborted 1) "" "s"))))))))

(defvar-local cl-mcp--lines 0
  "How many lines the `*cl-mcp*' buffer has (counting them each time would
cost Emacs time on every message).")

(defun cl-mcp--insert-line (text)
  "Insert TEXT as the buffer's last line."
  (goto-char (point-max))
  (insert text "\n")
  (cl-incf cl-mcp--lines))

(defun cl-mcp--show-1 (event)
  "Show EVENT, one of the agent's messages, in the current buffer."
  (pcase (plist-get event :phase)
    (:hold (cl-mcp--set-held (plist-get event :held))
           (cl-mcp--insert-line (if (plist-get event :held)
                                    "-- the programmer holds the assistant --"
                                  "-- the programmer released the assistant --")))
    (:written (cl-mcp--revert-visiting (plist-get event :file)))
    (:dropped (cl-mcp--insert-line (format "-- %d messages dropped (Emacs was slow) --"
                                           (plist-get event :count))))
    ((or :attach :leave) (cl-mcp--insert-line (cl-mcp--session-line event)))
    (:start (cl-mcp--insert-line (cl-mcp--line event)))
    (:end (if (cl-mcp--find-line (plist-get event :call))
              (let ((start (get-text-property (point) 'cl-mcp-event)))
                (delete-region (line-beginning-position) (line-end-position))
                (insert (cl-mcp--line (cl-mcp--merge event start))))
            (cl-mcp--insert-line (cl-mcp--line event))))))

(defun cl-mcp--revert-visiting (file)
  "Revert the buffers visiting FILE, which cl-mcp just wrote, that have no
unsaved changes (cl-mcp writes no file a modified buffer visits)."
  (let ((buffer (find-buffer-visiting file)))
    (when (and buffer (not (buffer-modified-p buffer)))
      (with-current-buffer buffer
        (revert-buffer t t t)))))

(defun cl-mcp--show (events)
  "Show EVENTS, a batch of the agent's messages, in the `*cl-mcp*' buffer,
which keeps its last `cl-mcp-max-lines' lines.  As a compilation buffer
does, the buffer and each window on it that were at its end follow the new
lines; one the programmer moved stays where it is."
  (with-current-buffer (cl-mcp--buffer)
    (let ((inhibit-read-only t)
          (following (= (point) (point-max)))
          (windows (cl-remove-if-not (lambda (window) (= (window-point window) (point-max)))
                                     (get-buffer-window-list (current-buffer) nil t))))
      (save-excursion
        (mapc #'cl-mcp--show-1 events)
        (when (> cl-mcp--lines cl-mcp-max-lines)
          (goto-char (point-min))
          (forward-line (- cl-mcp--lines cl-mcp-max-lines))
          (delete-region (point-min) (point))
          (setq cl-mcp--lines cl-mcp-max-lines)))
      (when following
        (goto-char (point-max)))
      (dolist (window windows)
        (set-window-point window (point-max))))))

(defun cl-mcp--set-held (held)
  "Record that the assistant is HELD (or not), which every mode line shows."
  (setq cl-mcp--held held)
  (force-mode-line-update t))

(defcustom cl-mcp-held-mode-line " [cl-mcp HELD]"
  "What every mode line shows while the programmer holds the assistant."
  :type 'string)
(put 'cl-mcp-held-mode-line 'risky-local-variable t)

(defconst cl-mcp--mode-line-entry '(cl-mcp--held (:propertize cl-mcp-held-mode-line face warning))
  "The part of `global-mode-string' that shows the hold.")

(unless (member cl-mcp--mode-line-entry (if (listp global-mode-string) global-mode-string '()))
  (setq global-mode-string (append (if (listp global-mode-string)
                                       global-mode-string
                                     (list global-mode-string))
                                   (list cl-mcp--mode-line-entry))))

(defun cl-mcp--answer (question)
  "This Emacs's answer to the agent's QUESTION, a plist: to (:unsaved FILE),
whether a buffer visiting FILE has unsaved changes."
  (let* ((file (plist-get question :unsaved))
         (buffer (and file (find-buffer-visiting file))))
    (when (and buffer (buffer-modified-p buffer))
      (list :modified t :buffer (buffer-name buffer) :emacs (format "%d" (emacs-pid))))))

(defun cl-mcp--event-hook (event)
  "Take the agent's `:cl-mcp-watch' batches and `:cl-mcp-ask' questions out
of SLIME's events (a question is answered on the connection it came on)."
  (pcase event
    (`(:channel-send 0 (:cl-mcp-watch . ,messages))
     (cl-mcp--show messages)
     t)
    (`(:channel-send 0 (:cl-mcp-ask ,number ,question))
     (cl-mcp--eval "WATCH-ANSWER" (list number `(quote ,(cl-mcp--answer question))) #'ignore)
     t)))

;;;; Commands

(defun cl-mcp-show ()
  "Show the `*cl-mcp*' buffer."
  (interactive)
  (display-buffer (cl-mcp--buffer)))

(defun cl-mcp-register ()
  "Have the images of SLIME's connections tell this Emacs of cl-mcp's calls."
  (interactive)
  (setq cl-mcp--enabled t)
  (cl-mcp--start-registering))

(defun cl-mcp-unregister ()
  "Have the images of SLIME's connections tell this Emacs nothing more."
  (interactive)
  (setq cl-mcp--enabled nil)
  (dolist (connection slime-net-processes)
    (when (and (process-live-p connection) (cl-mcp--registered connection))
      (let ((slime-dispatching-connection connection))
        (cl-mcp--eval "WATCH-UNREGISTER" '()
                      (lambda (_) (setf (cl-mcp--registered connection) nil)))))))

(defun cl-mcp--line-event ()
  "The event of the `*cl-mcp*' line point is on, or nil elsewhere."
  (and (derived-mode-p 'cl-mcp-mode)
       (get-text-property (line-beginning-position) 'cl-mcp-event)))

(defun cl-mcp-stop ()
  "Stop the assistant's call on this line of the `*cl-mcp*' buffer (or the
evaluation it left running in the background) while it runs; elsewhere,
its newest call that runs code, or else its newest evaluation running in
the background.  cl-mcp answers the call as cancelled by the programmer."
  (interactive)
  (let* ((event (cl-mcp--line-event))
         (arguments (cond ((null event) '())
                          ((plist-get event :background) (list nil (plist-get event :evaluation)))
                          (t (list (plist-get event :call))))))
    (cl-mcp--eval "WATCH-STOP" arguments (lambda (answer) (message "cl-mcp: %s" answer)))))

(defun cl-mcp-hold ()
  "Hold the assistant: every call that runs code or changes the image is
refused until `cl-mcp-release'; calls that only read go on."
  (interactive)
  (cl-mcp--eval "WATCH-HOLD" '(t) (lambda (answer) (cl-mcp--set-held (plist-get answer :held))
                                     (message "cl-mcp: the assistant is held"))))

(defun cl-mcp-release ()
  "End the hold of `cl-mcp-hold'."
  (interactive)
  (cl-mcp--eval "WATCH-HOLD" '(nil) (lambda (answer) (cl-mcp--set-held (plist-get answer :held))
                                       (message "cl-mcp: the assistant is released"))))

(defcustom cl-mcp-port-file "~/.cl-mcp-port"
  "Where `cl-mcp-share' saves the port it opened; `cl-mcp --connect' with no
port reads it."
  :type 'file)

(defun cl-mcp--saved-port ()
  "The port `cl-mcp-port-file' holds, or nil."
  (let ((file (expand-file-name cl-mcp-port-file)))
    (when (file-readable-p file)
      (with-temp-buffer
        (insert-file-contents file)
        (let ((text (string-trim (buffer-string))))
          (and (string-match-p "\\`[0-9]+\\'" text) (string-to-number text)))))))

(defun cl-mcp--command ()
  "How to run cl-mcp: the one beside this package's checkout, or on PATH."
  (let ((beside (expand-file-name "../.venv/bin/cl-mcp"
                                  (file-name-directory (or load-file-name (locate-library "cl-mcp") "")))))
    (or (and (file-executable-p beside) beside) (executable-find "cl-mcp") "cl-mcp")))

(defun cl-mcp-share ()
  "Open a loopback Swank listener in the current connection's image for
assistants to attach to, and save its port in `cl-mcp-port-file', so that
`cl-mcp --connect' with no port finds it.  The listener stays open for
every assistant (`:dont-close'); run again, it reuses the saved port while
that image still listens there."
  (interactive)
  (let ((saved (cl-mcp--saved-port)))
    (slime-eval-async
        `(cl:let ((saved ,saved))
           (cl:if (cl:and saved (cl:find saved swank::*servers* :key (cl:function cl:second)))
                  saved
                  (swank:create-server :port 0 :dont-close cl:t :interface "127.0.0.1")))
      (lambda (port)
        (let* ((file (expand-file-name cl-mcp-port-file))
               (temporary (format "%s.%d" file (emacs-pid))))
          ;; Written whole, and private, before a cl-mcp can read it.
          (with-temp-file temporary (insert (format "%d\n" port)))
          (set-file-modes temporary #o600)
          (rename-file temporary file t)
          (message "cl-mcp: assistants can attach on port %d; register cl-mcp with your MCP host as: %s --connect"
                   port (cl-mcp--command)))))))

(defun cl-mcp-jump ()
  "Go to the place of this line's call: its form's file and line, or the
backtrace of its evaluation waiting at an error."
  (interactive)
  (let* ((event (get-text-property (line-beginning-position) 'cl-mcp-event))
         (file (plist-get event :file))
         (evaluation (plist-get event :evaluation)))
    (cond (file
           (find-file-other-window file)
           (goto-char (point-min))
           (forward-line (1- (or (plist-get event :line) 1))))
          ((and evaluation (plist-get event :waiting))
           (cl-mcp--eval "BACKTRACE-OF" (list evaluation)
                         (lambda (report) (cl-mcp--show-backtrace evaluation report))))
          (evaluation
           (message "cl-mcp: evaluation %d did not stop at an error: it has no backtrace to show"
                    evaluation))
          (t (message "cl-mcp: this call has no file and no evaluation")))))

(defun cl-mcp--show-backtrace (evaluation report)
  "Show REPORT, the agent's backtrace of EVALUATION waiting at its error, in
a buffer; say in words when it waits no more."
  (if (not (eq (plist-get report :status) :ok))
      (message "cl-mcp: evaluation %d no longer waits at its error (it was continued or aborted, or its assistant left): %s"
               evaluation (or (plist-get (plist-get report :error) :message) ""))
    (with-current-buffer (get-buffer-create "*cl-mcp backtrace*")
      (let ((inhibit-read-only t))
        (erase-buffer)
        (insert (format "Evaluation %s, waiting at its error:\n" evaluation))
        (dolist (frame (plist-get report :frames))
          (insert (format "%s\n" (car frame))))
        (special-mode))
      (display-buffer (current-buffer)))))

;;;; Keys in every buffer

(defvar cl-mcp-keys-mode-map (make-sparse-keymap)
  "The keymap of `cl-mcp-keys-mode': `cl-mcp-command-map' under its prefix.")

(defcustom cl-mcp-keys-prefix "C-c ;"
  "The prefix of cl-mcp's keys in every buffer (`kbd' syntax); set it with
customize, or with `customize-set-variable' (a plain setq binds no key)."
  :type 'string
  :set (lambda (symbol prefix)
         (when (boundp symbol)
           (define-key cl-mcp-keys-mode-map (kbd (symbol-value symbol)) nil))
         (set-default symbol prefix)
         (define-key cl-mcp-keys-mode-map (kbd prefix) 'cl-mcp-command-map)))

(define-minor-mode cl-mcp-keys-mode
  "cl-mcp's keys in every buffer, under `cl-mcp-keys-prefix' (C-c ; by
default): s stops the assistant's newest call that runs code, h holds it,
r releases it, b shows the `*cl-mcp*' buffer."
  :global t :init-value t :keymap cl-mcp-keys-mode-map)

(add-hook 'slime-event-hooks #'cl-mcp--event-hook)
(add-hook 'slime-connected-hook #'cl-mcp--start-registering)
(when (slime-connected-p)
  (cl-mcp--start-registering))

(provide 'cl-mcp)

;;; cl-mcp.el ends here
