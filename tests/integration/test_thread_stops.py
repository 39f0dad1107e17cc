"""A user's thread stopped by threads :interrupt.  Taken on through its
own frames (RETURN-FROM-FRAME, or a restart of its own invoked from
eval-in-frame), it is back at its work: the call that took it on is
answered, and no deadline is left armed to stop it again with
SB-EXT:TIMEOUT.  Stopped while it held one of the agent's locks, it holds
up no call.  A command to a waiting evaluation whose thread cannot be
interrupted is answered when its deadline and a grace have passed, before
cl-mcp gives up on the image."""

from __future__ import annotations

import time

import pytest

from tests.integration.devtools import MODES, cl_mcp_in
from tests.integration.test_threads_profile import WORK, counter

TIMEOUT = 1  # the deadline a stop could leave armed, in seconds
NAPS = """
(defun tp-nap () (sleep 0.05) :napped)
(defun tp-napping (name)
  (loop (with-simple-restart (tp-skip "Skip this nap.")
          (incf (gethash name *tp-counts* 0))
          (tp-nap))))
"""


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    # eval-in-frame's deadline is --eval-timeout.
    with cl_mcp_in(request.param, "--eval-timeout", str(TIMEOUT)) as process:
        for code in (WORK, NAPS):
            text, is_error = process.eval(code)
            assert not is_error, text
        yield process


def started(lisp, name: str, function: str) -> int:
    """The id of a new thread NAME running FUNCTION (of no arguments)."""
    text, is_error = lisp.eval(f'(sb-thread:make-thread {function} :name "{name}")')
    assert not is_error, text
    thread = None
    while not thread:  # a thread just made gets its Linux id when it starts
        thread = next(t["id"] for t in lisp.call("threads", action="list")["structuredContent"]["threads"]
                      if t["name"] == name)
    return thread


def stopped_in_a_nap(lisp, name: str) -> tuple[int, int, int]:
    """A thread running `tp-napping`, stopped by an interrupt inside
    TP-NAP: its id, its evaluation number and TP-NAP's frame number."""
    thread = started(lisp, name, f"(lambda () (tp-napping \"{name}\"))")
    for _ in range(10):  # it is in TP-NAP nearly all the time
        stopped = lisp.call("threads", action="interrupt", thread=thread)
        assert not stopped["isError"], stopped
        number = stopped["structuredContent"]["evaluation"]
        frames = lisp.call("backtrace", evaluation=number)["structuredContent"]["frames"]
        nap = [index for index, frame in enumerate(frames) if frame["call"].startswith("(TP-NAP")]
        if nap:
            return thread, number, nap[0]
        assert not lisp.call("invoke-restart", evaluation=number, restart="continue")["isError"]
    raise AssertionError("never stopped inside TP-NAP")


def runs_on_unstopped(lisp, name: str) -> None:
    """NAME's thread works on, past the deadline a stop could have left."""
    before = counter(lisp, name)
    time.sleep(TIMEOUT + 2)
    text, is_error = lisp.eval("(length cl-mcp-agent::*suspended*)")
    assert (text.split("\n")[0], is_error) == ("=> 0", False), "the thread was stopped again"
    assert counter(lisp, name) > before


def test_return_from_frame_leaves_no_deadline(lisp):
    thread, number, nap = stopped_in_a_nap(lisp, "tp-returned")
    returned = lisp.call("invoke-restart", evaluation=number, restart="RETURN-FROM-FRAME", frame=nap,
                         values=[":returned"], timeout=TIMEOUT)
    assert not returned["isError"], returned
    assert "returned to its work" in returned["content"][0]["text"], returned
    runs_on_unstopped(lisp, "tp-returned")
    assert not lisp.call("threads", action="kill", thread=thread)["isError"]


def test_a_threads_own_restart_from_eval_in_frame_leaves_no_deadline(lisp):
    thread, number, _ = stopped_in_a_nap(lisp, "tp-skipped")
    skipped = lisp.call("eval-in-frame", evaluation=number, frame=0, code="(invoke-restart 'tp-skip)")
    assert not skipped["isError"], skipped
    assert "returned to its work" in skipped["content"][0]["text"], skipped
    runs_on_unstopped(lisp, "tp-skipped")
    assert not lisp.call("threads", action="kill", thread=thread)["isError"]


@pytest.mark.parametrize("work", ["(cl-mcp-agent::find-suspended nil)",  # the registry lock
                                  "(cl-mcp-agent::repl-definition-plists 'tp-nap)",
                                  # the deadline lock, which every evaluation with a deadline takes
                                  "(let ((e (cl-mcp-agent::make-evaluation :code :tp))) "
                                  "(cl-mcp-agent::schedule-deadline e (list nil :tp) 3600) "
                                  "(cl-mcp-agent::stop-deadline e))",
                                  # the watch lock, which every call takes while an Emacs watches
                                  "(cl-mcp-agent::watch-send (list :tp-locker 1))"])
def test_a_thread_stopped_holding_a_lock_holds_up_no_call(lisp, work):
    """A thread that takes one of the agent's locks all the time, stopped
    again and again: each time it holds none of them (they defer
    interrupts), and the next evaluation (which takes the registry and
    deadline locks: its number, the definition it records) is answered."""
    # Many definitions kept: looking them up holds the lock most of the time.
    defined = lisp.call("evaluate-lisp", code=" ".join(f"(defvar *tp-{n}* {n})" for n in range(300)), timeout=60)
    assert not defined["isError"], defined
    thread = started(lisp, f"tp-locker {work}", f"(lambda () (loop {work}))")
    for _ in range(10):
        stopped = lisp.call("threads", wait=20, action="interrupt", thread=thread)
        assert not stopped["isError"], stopped
        assert lisp.eval(f'(let ((locker (find "tp-locker {work}" (sb-thread:list-all-threads) '
                         ':key (function sb-thread:thread-name) :test (function equal)))) '
                         '(loop for lock in (list cl-mcp-agent::*registry-lock* cl-mcp-agent::*deadline-lock* '
                         'cl-mcp-agent::*watch-lock*) when (eq (sb-thread:mutex-owner lock) locker) '
                         'collect (sb-thread:mutex-name lock)))') == ("=> NIL", False)
        text, is_error = lisp.eval("(defun tp-defined () 3) (tp-defined)")
        assert "=> 3" in text and not is_error, text  # its first a redefinition's warning
        continued = lisp.call("invoke-restart", wait=20, evaluation=stopped["structuredContent"]["evaluation"],
                              restart="continue")
        assert not continued["isError"], continued
    assert not lisp.call("threads", action="kill", thread=thread)["isError"]


def test_a_command_that_cannot_be_interrupted_is_answered_in_time(lisp):
    assert not lisp.eval("(defvar *tp-kept* :kept)")[1]
    assert lisp.call("evaluate-lisp", code='(error "waits here")')["isError"]
    # Past its deadline (1 s) and the image's grace (3 s), before cl-mcp's (5 s).
    blocked = lisp.call("eval-in-frame", frame=0, code="(sb-sys:without-interrupts (sleep 6))")
    assert blocked["isError"] and "CL-MCP:NO-REPORT" in blocked["content"][0]["text"], blocked
    assert lisp.eval("*tp-kept*") == ("=> :KEPT", False)  # the same image
    # Its report, when it comes, answers nothing: the next command gets its own.
    for _ in range(5):
        frames = lisp.call("backtrace")
        if not frames["isError"]:
            break
        assert "CL-MCP:NO-REPORT" in frames["content"][0]["text"], frames
    assert frames["structuredContent"]["frames"], frames
    assert not lisp.call("invoke-restart", restart="abort")["isError"]


def test_a_thread_that_does_not_answer_is_told_with_the_real_reason(lisp):
    """Its backtrace asked of it: one that runs with interrupts disabled is
    told so; one whose frames print slowly (a PRINT-OBJECT that sleeps) is
    told that, and stops printing after that frame, back at its work
    (both used to be "it blocks interrupts, or is inside foreign code")."""
    assert not lisp.eval("(defvar *tp-counts* (make-hash-table :test 'equal))"
                         "(defclass tp-slow-printing () ())"
                         "(defmethod print-object ((o tp-slow-printing) s) (sleep 3) (call-next-method))"
                         "(defun tp-holding (o) (loop (incf (gethash \"tp-slow\" *tp-counts* 0)) (sleep 0.05)"
                         " (when (null o) (return))))")[1]
    blocked = started(lisp, "tp-blocked", "(lambda () (sb-sys:without-interrupts (sleep 5)))")
    answer = lisp.call("threads", action="backtrace", thread=blocked)
    assert answer["isError"], answer
    assert "CL-MCP:THREAD-DID-NOT-ANSWER" in answer["content"][0]["text"], answer
    assert "interrupts disabled (inside SB-SYS:WITHOUT-INTERRUPTS)" in answer["content"][0]["text"], answer
    slow = started(lisp, "tp-slow", "(lambda () (tp-holding (make-instance 'tp-slow-printing)))")
    deadline = time.monotonic() + 20
    while lisp.eval('(gethash "tp-slow" *tp-counts*)')[0].startswith("=> NIL"):  # in its loop
        assert time.monotonic() < deadline, "the slow printer's thread never began its loop"
        time.sleep(0.05)
    answer = lisp.call("threads", action="backtrace", thread=slow)
    assert answer["isError"], answer
    assert "printing its frames took longer: a PRINT-OBJECT method" in answer["content"][0]["text"], answer
    deadline = time.monotonic() + 20
    before = counter(lisp, "tp-slow")
    while counter(lisp, "tp-slow") == before:
        assert time.monotonic() < deadline, "the slow printer's thread never went back to its work"
        time.sleep(0.1)
    assert not lisp.call("threads", action="kill", thread=slow)["isError"]
