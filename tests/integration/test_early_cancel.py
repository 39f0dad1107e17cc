"""A cancellation that arrives with its request, in the same read: it is
taken in before the request's task has run at all, and must still stop the
evaluation in the image and free the session."""

import json
import time

from tests.integration.test_protocol_breadth import answers_to


def test_a_request_and_its_cancellation_in_one_write(server):
    server.eval("(defvar *early-cancel* :not-yet)")
    pid = server.eval("(sb-posix:getpid)")[0]
    request_id = "early"
    call = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "evaluate-lisp",
                       "arguments": {"code": "(sleep 2) (setf *early-cancel* :ran)"}}}
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled",
              "params": {"requestId": request_id, "reason": "changed my mind"}}
    server.send_raw((json.dumps(call) + "\n" + json.dumps(cancel) + "\n").encode())

    # The session is free (the lock was not left held: that call would get
    # no answer), and the next call did not wait for the evaluation (it
    # would read :RAN) ...
    assert server.eval("*early-cancel*") == ("=> :NOT-YET", False)
    # ... and the evaluation was aborted in the image, not left running.
    time.sleep(2.5)
    assert server.eval("*early-cancel*") == ("=> :NOT-YET", False)
    assert server.eval("(sb-posix:getpid)")[0] == pid
    assert answers_to(server, request_id) == []  # a cancelled request gets no response
