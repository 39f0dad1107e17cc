;;;; lisp_server.lisp --- a minimal MCP server written in Common Lisp.
;;;;
;;;; The "Lisp-native" baseline of bench/run.py: newline-delimited JSON-RPC
;;;; on stdin and stdout, parsed and written with yason (Debian's
;;;; cl-yason), and one tool, evaluate-lisp, evaluated in this very process:
;;;; no second process and no Swank between the client and the evaluation.
;;;; What it leaves out (schema checks, deadlines, restarts, warnings,
;;;; capped output, a process the image may crash without taking the server
;;;; along) is what cl-mcp spends its time on.
;;;;
;;;;     sbcl --script bench/lisp_server.lisp

(require :asdf)
(let ((*standard-output* *error-output*))  ; the compiler's notes stay off stdout
  (asdf:load-system :yason))

(defpackage #:lisp-mcp-baseline
  (:use #:cl)
  (:export #:serve))

(in-package #:lisp-mcp-baseline)

(defun obj (&rest keys-and-values)
  "A JSON object from alternating keys and values."
  (let ((table (make-hash-table :test 'equal)))
    (loop for (key value) on keys-and-values by #'cddr
          do (setf (gethash key table) value))
    table))

(defparameter *tools*
  (list (obj "name" "evaluate-lisp"
             "description" "Evaluate Common Lisp code; return its output and values."
             "inputSchema" (obj "type" "object"
                                "properties" (obj "code" (obj "type" "string"))
                                "required" (list "code"))))
  "The one tool, as tools/list shows it.")

(defun evaluate (code)
  "Read and evaluate the forms of CODE in CL-USER.  The result text, and
true when it is an error."
  (let ((output (make-string-output-stream))
        (values '()))
    (handler-case
        (let ((*standard-output* output)
              (*package* (find-package "COMMON-LISP-USER")))
          (with-input-from-string (in code)
            (loop for form = (read in nil in)
                  until (eq form in)
                  do (setf values (multiple-value-list (eval form)))))
          (let ((printed (get-output-stream-string output)))
            (format nil "~:[~;[stdout]~%~:*~a~%~%~]~{=> ~s~^~%~}"
                    (and (plusp (length printed)) printed) values)))
      (error (condition)
        (values (format nil "[ERROR] ~s~%~a" (type-of condition) condition) t)))))

(defun write-message (message stream)
  (yason:encode message stream)
  (terpri stream)
  (finish-output stream))

(defun answer (request)
  "The result of REQUEST, a parsed JSON-RPC request; nil for an unknown method."
  (let ((method (gethash "method" request))
        (params (gethash "params" request)))
    (cond ((equal method "initialize")
           (obj "protocolVersion" "2025-06-18"
                "capabilities" (obj "tools" (obj))
                "serverInfo" (obj "name" "lisp-mcp-baseline" "version" "0")))
          ((equal method "ping") (obj))
          ((equal method "tools/list") (obj "tools" *tools*))
          ((equal method "tools/call")
           (multiple-value-bind (text errorp)
               (evaluate (gethash "code" (gethash "arguments" params)))
             (obj "content" (list (obj "type" "text" "text" text))
                  "isError" (if errorp 'yason:true 'yason:false)))))))

(defun serve ()
  "Answer requests from stdin until it ends; notifications get no answer."
  (let ((in (sb-sys:make-fd-stream 0 :input t :external-format :utf-8 :buffering :full))
        (out (sb-sys:make-fd-stream 1 :output t :external-format :utf-8 :buffering :full)))
    (loop for line = (read-line in nil)
          while line
          when (plusp (length line))
            do (let* ((request (yason:parse line))
                      (id (gethash "id" request)))
                 (when id
                   (let ((result (answer request)))
                     (write-message
                      (if result
                          (obj "jsonrpc" "2.0" "id" id "result" result)
                          (obj "jsonrpc" "2.0" "id" id
                               "error" (obj "code" -32601 "message" "Method not found")))
                      out)))))))

(serve)
