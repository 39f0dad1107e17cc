"""Attach mode: the threads tool lists the programmer's own threads read-only,
with the reason, and never interrupts or kills them, nor reads their
backtraces (an interrupt, which ran their printers inside them) (one waiting in Emacs's
debugger once got no answer there after cl-mcp interrupted it); a thread
cl-mcp's evaluation started stays cl-mcp's to act on."""

from __future__ import annotations

import re
import time

from tests.integration.conftest import McpProcess
from tests.integration.devtools import checked_call, shared_with_emacs


def listed(process: McpProcess, name: str) -> dict:
    """NAME's entry in the thread list, once it is there with its id."""
    deadline = time.monotonic() + 10
    while True:
        threads = checked_call(process, "threads", action="list")["structuredContent"]["threads"]
        found = [t for t in threads if t["name"] == name and t["id"]]
        if found:
            return found[0]
        assert time.monotonic() < deadline, threads
        time.sleep(0.05)


def test_the_programmers_threads_are_listed_read_only_and_never_touched():
    with shared_with_emacs() as (_server, emacs, process, _home):
        # Attached, with its agent loaded (loading it holds SBCL's world lock,
        # which would delay Emacs's debugger).
        assert process.eval("(+ 1 2)") == ("=> 3", False)
        # Its loop has on its stack an object whose printer counts its prints.
        emacs.slime_eval('(cl:progn (cl:defclass cl-user::pt-noisy () ()) '
                         '(cl:defmethod cl:print-object ((o cl-user::pt-noisy) s) '
                         '(cl:incf (cl:get :pt :printed 0)) (cl:call-next-method)) '
                         '(cl:defun cl-user::pt-loop (o) (cl:loop (cl:incf (cl:get :pt :ticks 0)) '
                         '(cl:sleep 0.05) (cl:when (cl:null o) (cl:return)))) '
                         '(sb-thread:make-thread (cl:lambda () (cl-user::pt-loop '
                         '(cl:make-instance (cl:quote cl-user::pt-noisy)))) :name "programmers-loop") cl:t)')
        emacs.slime_eval('(cl:progn (sb-thread:make-thread (cl:lambda () (cl:error "programmers error"))'
                         ' :name "programmers-failed") cl:t)')
        emacs.await_debugger("the programmer's error")
        for name in ("programmers-loop", "programmers-failed"):
            entry = listed(process, name)
            assert entry["owner"] == "user" and "the programmer's" in entry["read-only"], entry
            ticks = emacs.slime_eval("(cl:get :pt :ticks 0)")
            for action in ("interrupt", "kill", "backtrace"):
                refused = checked_call(process, "threads", action=action, thread=entry["id"])
                assert refused["isError"], refused
                assert "NOT-CL-MCPS-THREAD" in refused["content"][0]["text"], refused
            assert listed(process, name)["id"] == entry["id"]
            # Seen from the programmer's side: it ran on, and nothing printed its frames.
            deadline = time.monotonic() + 10
            while emacs.slime_eval("(cl:get :pt :ticks 0)") == ticks:
                assert time.monotonic() < deadline, "the programmer's loop stopped"
                time.sleep(0.05)
            assert emacs.slime_eval("(cl:get :pt :printed 0)") == "0"
        text = checked_call(process, "threads", action="list")["content"][0]["text"]
        assert re.search(r'"programmers-loop" user \S+ read-only: the programmer\'s', text), text
        # The one in Emacs's debugger is said to be there, at its condition.
        assert ('"programmers-failed" user in-debugger (SLDB level 1 at SIMPLE-ERROR: programmers error)'
                in text), text
        assert listed(process, "programmers-failed")["debugger"] == \
            "SLDB level 1 at SIMPLE-ERROR: programmers error"
        # The programmer's debugger still answers.
        emacs.quit_debuggers()
        text, is_error = process.eval('(sb-thread:make-thread (lambda () (loop (sleep 0.05)))'
                                      ' :name "assistants-loop")')
        assert not is_error, text
        ours = listed(process, "assistants-loop")
        assert "read-only" not in ours, ours
        assert not checked_call(process, "threads", action="kill", thread=ours["id"])["isError"]
