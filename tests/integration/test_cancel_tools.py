"""Every tool that runs the user's code can be cancelled, and the cancel
stops that code in the image: the call is not answered (a cancelled
request gets no response), the next call is answered at once, the code's
side effect after its sleep never happens, and the image is the same one
(a variable defined before the cancels is still bound)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

import pytest

from tests.integration.conftest import McpProcess
from tests.integration.devtools import MODES, cl_mcp_in
from tests.integration.test_protocol_breadth import answers_to

SLEEP = 12  # seconds the cancelled code sleeps before its side effect
PROMPT = SLEEP / 2  # the next call's answer, at most: only one that waited for the sleep misses it


def slow(tool: str) -> str:
    """Code that sleeps, then records that TOOL's code ran to its end."""
    return f"(sleep {SLEEP}) (push :{tool} cl-user::*cancelled-ran*)"


def probe_system(directory: Path, code: Callable[[str], str] = slow) -> str:
    """The .asd of two systems whose loading and whose tests run CODE; its
    path."""
    (directory / "slow.lisp").write_text(code("load-system") + "\n")
    asd = directory / "cancel-probe.asd"
    asd.write_text(
        '(defsystem "cancel-probe-load" :components ((:file "slow")))\n'
        '(defsystem "cancel-probe-test" :perform (test-op (o c) '
        f"{code('run-tests')}))\n")
    return str(asd)


def calls(directory: Path, code: Callable[[str], str] = slow) -> list[tuple[str, dict]]:
    """Each tool that runs code, with arguments that make it run CODE."""
    form = directory / "form.lisp"
    form.write_text(f"(progn {code('compile-form')})\n")
    return [("evaluate-lisp", {"code": code("evaluate-lisp")}),
            ("compile-form", {"path": str(form), "line": 1}),
            ("profile", {"code": code("profile")}),
            ("run-tests", {"system": "cancel-probe-test"}),
            ("inspect", {"code": code("inspect")}),
            ("eval-in-frame", {"frame": 0, "code": code("eval-in-frame")}),
            ("load-system", {"system": "cancel-probe-load"})]


def cancel_each(process: McpProcess, directory: Path) -> None:
    assert process.eval("(defvar *x* 1) (defvar *cancelled-ran* nil)") == ("=> *CANCELLED-RAN*", False)
    assert not process.eval(f'(asdf:load-asd "{probe_system(directory)}")')[1]
    assert process.call("evaluate-lisp", code='(error "waits here")')["isError"]  # for eval-in-frame
    cancelled = []
    for tool, arguments in calls(directory):
        request = process.start_request("tools/call", {"name": tool, "arguments": arguments})
        time.sleep(0.5)  # the call is in the image
        process.notify("notifications/cancelled", {"requestId": request})
        cancelled.append(request)
        started = time.monotonic()
        assert process.eval("(boundp '*x*)") == ("=> T", False), tool
        assert time.monotonic() - started < PROMPT, f"{tool}: the next call waited behind the cancelled one"
    time.sleep(SLEEP + 1)  # every cancelled sleep would be over
    assert process.eval("(list (boundp '*x*) *cancelled-ran*)") == ("=> (T NIL)", False)
    assert [answers_to(process, request) for request in cancelled] == [[]] * len(cancelled)


@pytest.mark.parametrize("mode", MODES)
def test_a_cancel_stops_the_code_of_every_tool(mode, tmp_path):
    with cl_mcp_in(mode) as process:
        cancel_each(process, tmp_path)


@pytest.mark.parametrize("mode", MODES)
def test_a_cancel_that_lands_once_its_call_is_over_ends_nothing(mode):
    """A cancel finds the call's thread, and its interrupt lands after that
    call has ended, in the next call the same thread serves: it must end
    nothing there (both used to catch one tag, so it ended the next).  The
    agent's own entry point and cancel are driven from Lisp to time the
    two calls exactly."""
    with cl_mcp_in(mode) as process:
        text, is_error = process.eval(
            "(let* ((first-call nil) (second-started (sb-thread:make-semaphore)) "
            "(thread (sb-thread:make-thread (lambda () "
            "(cl-mcp-agent::call-cancellable \"tc-first\" (lambda () "
            "(setf first-call (cl-mcp-agent::find-running \"tc-first\")) :first) :first-cancelled) "
            "(cl-mcp-agent::call-cancellable \"tc-second\" (lambda () "
            "(sb-thread:signal-semaphore second-started) (sleep 1) :second) :second-cancelled))))) "
            "(sb-thread:wait-on-semaphore second-started) "
            "(cl-mcp-agent::interrupt-running first-call) "
            "(sb-thread:join-thread thread))")
        assert (text, is_error) == ("=> :SECOND", False)


@pytest.mark.parametrize("mode", MODES)
def test_a_cancel_that_overtakes_its_call_still_stops_it(mode):
    """The cancel comes on cl-mcp's first connection and the call on its
    lane, so on a loaded machine the cancel can reach the image first: it
    found nothing under the tag, and the call then ran to its end (a
    cancelled evaluation's (setf ... :ran) took effect). Driven from Lisp:
    the cancel is sent 0.2 s before its call begins."""
    with cl_mcp_in(mode) as process:
        text, is_error = process.eval(
            "(let* ((session (cl-mcp-agent::current-session)) "
            "(canceller (sb-thread:make-thread (lambda () (cl-mcp-agent:cancel-evaluation \"tc-late\" session))))) "
            "(sleep 0.2) "
            "(list (cl-mcp-agent::call-cancellable \"tc-late\" (lambda () (sleep 3) :ran) :late-cancelled) "
            "(sb-thread:join-thread canceller)))")
        assert (text, is_error) == ("=> (:LATE-CANCELLED T)", False)


def until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


@pytest.mark.parametrize("mode", MODES)
def test_a_cancel_once_an_edit_is_written_leaves_it_and_the_log_says_so(mode, tmp_path):
    """A cancel undoes no edit.  One that lands in the edit's compile (a
    macro that sleeps as it expands) gets no response, as the spec has it;
    the image's reply for it said the edit was written, and the log
    (notifications/message) now says so: before, that reply was dropped, and
    nothing told the host that the file had changed."""
    source = tmp_path / "cancel-edit.lisp"
    source.write_text("(defun cancel-edited () 1)\n")
    edited = "(defun cancel-edited () (cancel-slow-expanding))"
    with cl_mcp_in(mode) as process:
        assert not process.eval("(defmacro cl-user::cancel-slow-expanding () (sleep 30) 2)")[1]
        request = process.start_request("tools/call", {"name": "edit-form", "arguments": {
            "path": str(source), "line": 1, "text": edited}})
        until(lambda: "slow-expanding" in source.read_text(), "the edit written")
        time.sleep(0.3)  # into the compile
        process.notify("notifications/cancelled", {"requestId": request})

        def logged() -> list[str]:
            return [m["params"]["data"] for m in map(json.loads, list(process.raw_lines))
                    if m.get("method") == "notifications/message"]
        until(lambda: any("cancelled once the edit was written" in line for line in logged()), "the log")
        [said] = [line for line in logged() if "cancelled once the edit was written" in line]
        assert said.startswith(f"Replaced the form at {source}:1"), said
        assert "the edit is written, and stays written" in said, said
        assert process.eval("(+ 1 2)") == ("=> 3", False)
        assert answers_to(process, request) == []
        assert source.read_text() == edited + "\n"
