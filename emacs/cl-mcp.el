;;; cl-mcp.el --- See, stop and hold cl-mcp's assistant in your SLIME image  -*- lexical-binding: t -*-

;; Part of cl-mcp.  Needs SLIME only.

;;; Commentary:

;; When cl-mcp attaches to the image SLIME is connected to, the assistant
;; evaluates, compiles and runs tests in the programmer's own image.  Load
;; this file after SLIME, `(require 'cl-mcp)', and a `*cl-mcp*' buffer shows
;; each tool call as it starts and ends: its number, tool, the form or file
;; it acts on, its outcome, duration and evaluation number.
;;
;; The package registers each SLIME connection with cl-mcp's agent in the
;; image (and again, every `cl-mcp-register-interval' seconds, until the
;; agent is there: cl-mcp may attach later).  Only a registered Emacs is
;; told of the calls, as `:channel-send' events `slime-event-hooks' takes.
;;
;; Commands (keys in the `*cl-mcp*' buffer):
;;   s  `cl-mcp-stop'     abort the assistant's running evaluation
;;   h  `cl-mcp-hold'     refuse every call that runs code or changes the image
;;   r  `cl-mcp-release'  end the hold
;;   RET `cl-mcp-jump'    go to the line's file and line, or its backtrace
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

(defvar cl-mcp-mode-map
  (let ((map (make-sparse-keymap)))
    (define-key map (kbd "s") #'cl-mcp-stop)
    (define-key map (kbd "h") #'cl-mcp-hold)
    (define-key map (kbd "r") #'cl-mcp-release)
    (define-key map (kbd "RET") #'cl-mcp-jump)
    map)
  "Keys of the `*cl-mcp*' buffer.")

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

(defun cl-mcp--line (event)
  "The text of EVENT's call line, carrying EVENT as a property."
  (let* ((phase (plist-get event :phase))
         (text (format "#%-4d %s %-16s %s  =>  %s"
                       (plist-get event :call)
                       (format-time-string "%H:%M:%S")
                       (plist-get event :tool)
                       (or (plist-get event :subject) "")
                       (if (eq phase :start)
                           "running..."
                         (format "%s  (%d ms%s)" (plist-get event :outcome) (plist-get event :ms)
                                 (if (plist-get event :evaluation)
                                     (format ", evaluation %d" (plist-get event :evaluation))
                                   ""))))))
    (propertize text 'cl-mcp-call (plist-get event :call) 'cl-mcp-event event)))

(defvar-local cl-mcp--lines 0
  "How many lines the `*cl-mcp*' buffer has (counting them each time would
cost Emacs time on every message).")

(defun cl-mcp--show-1 (event)
  "Show EVENT, one of the agent's messages, in the current buffer."
  (pcase (plist-get event :phase)
    (:hold (cl-mcp--set-held (plist-get event :held))
           (goto-char (point-max))
           (insert (if (plist-get event :held)
                       "-- the programmer holds the assistant --\n"
                     "-- the programmer released the assistant --\n"))
           (cl-incf cl-mcp--lines))
    (:written (cl-mcp--revert-visiting (plist-get event :file)))
    (:dropped (goto-char (point-max))
              (insert (format "-- %d messages dropped (Emacs was slow) --\n"
                              (plist-get event :count)))
              (cl-incf cl-mcp--lines))
    (:start (goto-char (point-max))
            (insert (cl-mcp--line event) "\n")
            (cl-incf cl-mcp--lines))
    (:end (if (cl-mcp--find-line (plist-get event :call))
              (let ((start (get-text-property (point) 'cl-mcp-event)))
                (delete-region (line-beginning-position) (line-end-position))
                (insert (cl-mcp--line (append event start))))
            (goto-char (point-max))
            (insert (cl-mcp--line event) "\n")
            (cl-incf cl-mcp--lines)))))

(defun cl-mcp--revert-visiting (file)
  "Revert the buffers visiting FILE, which cl-mcp just wrote, that have no
unsaved changes (cl-mcp writes no file a modified buffer visits)."
  (let ((buffer (find-buffer-visiting file)))
    (when (and buffer (not (buffer-modified-p buffer)))
      (with-current-buffer buffer
        (revert-buffer t t t)))))

(defun cl-mcp--show (events)
  "Show EVENTS, a batch of the agent's messages, in the `*cl-mcp*' buffer,
which keeps its last `cl-mcp-max-lines' lines."
  (with-current-buffer (cl-mcp--buffer)
    (let ((inhibit-read-only t))
      (save-excursion
        (mapc #'cl-mcp--show-1 events)
        (when (> cl-mcp--lines cl-mcp-max-lines)
          (goto-char (point-min))
          (forward-line (- cl-mcp--lines cl-mcp-max-lines))
          (delete-region (point-min) (point))
          (setq cl-mcp--lines cl-mcp-max-lines))))))

(defun cl-mcp--set-held (held)
  "Record that the assistant is HELD (or not)."
  (setq cl-mcp--held held)
  (force-mode-line-update t))

(defun cl-mcp--event-hook (event)
  "Take the agent's `:cl-mcp-watch' batches out of SLIME's events."
  (pcase event
    (`(:channel-send 0 (:cl-mcp-watch . ,messages))
     (cl-mcp--show messages)
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

(defun cl-mcp-stop ()
  "Abort the assistant's running evaluation; cl-mcp answers it as cancelled
by the programmer."
  (interactive)
  (cl-mcp--eval "WATCH-STOP" '() (lambda (answer) (message "cl-mcp: %s" answer))))

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
  "Go to the place of this line's call: its file and line, or the backtrace
of its evaluation waiting at an error."
  (interactive)
  (let* ((event (get-text-property (line-beginning-position) 'cl-mcp-event))
         (file (plist-get event :file))
         (evaluation (plist-get event :evaluation)))
    (cond (file
           (find-file-other-window file)
           (goto-char (point-min))
           (forward-line (1- (or (plist-get event :line) 1))))
          ((and evaluation (plist-get event :waiting))
           (cl-mcp--eval "BACKTRACE-OF" (list evaluation) #'cl-mcp--show-backtrace))
          (t (message "cl-mcp: this call has no file and no evaluation waiting at an error")))))

(defun cl-mcp--show-backtrace (report)
  "Show REPORT, the agent's backtrace of a waiting evaluation, in a buffer."
  (with-current-buffer (get-buffer-create "*cl-mcp backtrace*")
    (let ((inhibit-read-only t))
      (erase-buffer)
      (if (not (eq (plist-get report :status) :ok))
          (insert (format "%S\n" (plist-get report :error)))
        (insert (format "Evaluation %s, waiting at its error:\n" (plist-get report :evaluation)))
        (dolist (frame (plist-get report :frames))
          (insert (format "%s\n" (car frame)))))
      (special-mode))
    (display-buffer (current-buffer))))

(add-hook 'slime-event-hooks #'cl-mcp--event-hook)
(add-hook 'slime-connected-hook #'cl-mcp--start-registering)
(when (slime-connected-p)
  (cl-mcp--start-registering))

(provide 'cl-mcp)

;;; cl-mcp.el ends here
