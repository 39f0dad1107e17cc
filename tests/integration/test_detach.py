"""Attach mode: when the last cl-mcp connection to the programmer's image
goes (cl-mcp killed, or closed), the image is as it would be without
cl-mcp, seen from Emacs: no make-thread wrapper, no hooks of cl-mcp's, the
dead connection forgotten, a thread cl-mcp started printing to the stream
it would have had and stopping in Emacs's debugger (one stopped for cl-mcp
then too); attaching again puts
the wrapper and the hooks back."""

from __future__ import annotations

import time

from tests.integration.attach_fixtures import Emacs
from tests.integration.conftest import McpProcess
from tests.integration.devtools import shared_with_emacs

# What cl-mcp puts on the image, as one list Emacs reads.
MARKS = ("(cl:list (cl:and (sb-int:encapsulated-p (cl:quote sb-thread:make-thread) "
         "(cl:quote cl-mcp-agent::watched)) cl:t) "
         "(cl:length (cl:intersection swank::*pre-reply-hook* "
         "(cl:quote (cl-mcp-agent::deliver-thread-news cl-mcp-agent::prune-swank-mailboxes)))) "
         "(cl:and (cl:member (cl:quote cl-mcp-agent::forget-connection) "
         "swank::*connection-closed-hook*) cl:t) "
         "(cl:length cl-mcp-agent::*connections*) "
         "(cl:and (sb-int:encapsulated-p (cl:quote sb-rt::do-entry) "
         "(cl:quote cl-mcp-agent::cl-mcp-run-tests)) cl:t) "
         "(cl:and (cl:member (cl:quote cl-mcp-agent::note-heap-after-gc) "
         "sb-ext:*after-gc-hooks*) cl:t))")

ATTACHED = "(t 2 t 1 t t)"
DETACHED = "(nil 0 nil 0 nil nil)"

# RT wrapped as a run of run-tests wraps it, and a thread cl-mcp starts
# that prints until told to fail.
TICKER = """
(require :sb-rt)
(cl-mcp-agent::install-hooks)
(defvar *tick-fail* nil)
(sb-thread:make-thread
  (lambda () (loop (format t "tick~%") (finish-output) (when *tick-fail* (error "late tick"))
                   (sleep 0.05)))
  :name "ticker")
"""

# Where the ticker's output goes now: the image's global *standard-output*,
# caught for a moment in a string (up to 10 s for a tick to arrive).
CATCH_TICKS = """(cl:let ((old (sb-ext:symbol-global-value (cl:quote cl:*standard-output*)))
          (caught (cl:make-string-output-stream)) (seen ""))
  (cl:setf (sb-ext:symbol-global-value (cl:quote cl:*standard-output*)) caught)
  (cl:unwind-protect
       (cl:loop repeat 200 until (cl:search "tick" seen)
                do (cl:sleep 0.05)
                   (cl:setf seen (cl:concatenate (cl:quote cl:string) seen
                                                 (cl:get-output-stream-string caught))))
    (cl:setf (sb-ext:symbol-global-value (cl:quote cl:*standard-output*)) old))
  (cl:list (cl:and (cl:search "tick" seen) cl:t)
           (cl:plusp (cl:hash-table-count cl-mcp-agent::*news-by-owner*))))"""


def marks_once_settled(emacs: Emacs, wanted: str) -> str:
    """The marks Emacs sees, once they are WANTED (Swank's sentinel closes
    a connection a moment after its socket ends), or the last seen after
    30 s."""
    deadline = time.monotonic() + 30
    while (marks := emacs.slime_eval(MARKS)) != wanted and time.monotonic() < deadline:
        time.sleep(0.1)
    return marks


def test_killing_cl_mcp_leaves_the_image_as_without_it_and_attaching_again_restores(tmp_path):
    with shared_with_emacs() as (server, emacs, process, home):
        text, is_error = process.eval(TICKER)
        assert not is_error, text
        # A thread of cl-mcp's that stops at its error waits for cl-mcp.
        text, is_error = process.eval('(sb-thread:make-thread (lambda () (error "stopped for cl-mcp"))'
                                      ' :name "stopper")')
        assert not is_error, text
        deadline = time.monotonic() + 10
        while "stopped-at-error" not in process.call("threads", action="list")["content"][0]["text"]:
            assert time.monotonic() < deadline, "the stopper never stopped"
            time.sleep(0.05)
        assert emacs.slime_eval(MARKS) == ATTACHED
        process.proc.kill()  # SIGKILL: cl-mcp says no goodbye
        process.proc.wait()
        assert marks_once_settled(emacs, DETACHED) == DETACHED
        # The ticker prints where it would have without cl-mcp, and nothing
        # piles up for a cl-mcp that is gone.
        assert emacs.slime_eval(CATCH_TICKS) == "(t nil)"
        # The stopper's error, and the ticker's, go to Emacs's debugger.
        for what in ("the stopper's", "the ticker's"):
            emacs.await_debugger(f"{what} error")
            emacs.quit_debuggers()
            emacs.slime_eval("(cl:setf cl-user::*tick-fail* cl:t)")
        # A cl-mcp attaching again puts its marks back; closing it takes
        # them off again.
        again = McpProcess("--connect", str(server.port), env={"HOME": str(home)})
        try:
            again.initialize()
            assert again.eval("(cl-mcp-agent::install-hooks)")[1] is False
            assert emacs.slime_eval(MARKS) == ATTACHED
        finally:
            again.close()
        assert marks_once_settled(emacs, DETACHED) == DETACHED
