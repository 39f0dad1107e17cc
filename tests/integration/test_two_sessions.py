"""Two cl-mcp processes attached to one programmer's image (issue 50): each
has its own evaluations. A call that names no evaluation means its own;
the other's may be read (and is said to be the other's), never restarted,
aborted, evaluated in or awaited; reset-session aborts only its own; a
cl-mcp that ends, closed or killed, takes its running and waiting
evaluations with it within seconds and leaves the other's alone. Checked
from each assistant's answers and from a Swank connection of the
programmer's own."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from tests.integration.attach_fixtures import SwankServer, temporary_home
from tests.integration.conftest import McpProcess

ANOTHERS = "CL-MCP:ANOTHER-SESSIONS-EVALUATION"


@contextmanager
def two_assistants() -> Iterator[tuple[SwankServer, McpProcess, McpProcess]]:
    home = temporary_home()
    with ExitStack() as stack:
        server = SwankServer(home)
        stack.callback(server.stop)
        first = McpProcess("--connect", str(server.port), env={"HOME": str(home)})
        stack.callback(first.close)
        first.initialize()
        second = McpProcess("--connect", str(server.port), env={"HOME": str(home)})
        stack.callback(second.close)
        second.initialize()
        yield server, first, second


def waiting(process: McpProcess, code: str) -> int:
    """Evaluate CODE, which stops at its error; the number it waits as."""
    text = process.call("evaluate-lisp", code=code)["content"][0]["text"]
    found = re.search(r"Evaluation (\d+) is waiting", text)
    assert found, text
    return int(found.group(1))


def number_of(process: McpProcess, code: str) -> int:
    """Evaluate CODE; the evaluation's number (no other evaluates meanwhile)."""
    text, is_error = process.eval(f"(values {code} cl-mcp-agent::*evaluation-counter*)")
    assert not is_error, text
    return int(text.rsplit("\n", 1)[1].removeprefix("=> "))


def error_type(result: dict) -> str:
    return result["structuredContent"]["error"]["type"]


def test_a_call_that_names_no_evaluation_means_its_own_and_the_others_is_only_read():
    with two_assistants() as (_, first, second):
        mine = waiting(first, '(error "the first one\'s")')
        theirs = waiting(second, "(/ 1 (length nil))")
        # No number: the caller's own, whoever stopped last.
        text = first.call("backtrace")["content"][0]["text"]
        assert text.startswith(f"[Backtrace of evaluation {mine}]\n"), text
        read = second.call("backtrace", evaluation=mine)["content"][0]["text"]
        assert read.startswith(f"[Backtrace of evaluation {mine}] (another assistant's"), read
        for tool, arguments in (("invoke-restart", {"restart": "ABORT"}),
                                ("eval-in-frame", {"frame": 0, "code": "(setf cl-user::*touched* t)"}),
                                ("await-evaluation", {"abort": True})):
            refused = second.call(tool, evaluation=mine, **arguments)
            assert refused["isError"] and error_type(refused) == ANOTHERS, (tool, refused)
        assert first.eval("(boundp 'cl-user::*touched*)") == ("=> NIL", False)
        # Each has its own REPL variables and its own record of what it made.
        assert first.eval("(defun ts-firsts () 1)") == ("=> TS-FIRSTS", False)
        assert second.eval("(defun ts-seconds () 2)") == ("=> TS-SECONDS", False)
        assert first.eval("(+ 1 2)") == ("=> 3", False)
        assert second.eval("(+ 10 20)") == ("=> 30", False)
        assert first.eval("*") == ("=> 3", False)
        firsts_value = number_of(first, "(list :ts-kept)")
        seconds_value = number_of(second, "(list :ts-gone)")
        # The second's reset takes only its own evaluation, definition and kept values with it.
        assert not second.call("reset-session")["isError"]
        assert first.eval(f"(cl-mcp-agent:value {firsts_value})") == ("=> (:TS-KEPT)", False)
        assert second.eval(f"(handler-case (cl-mcp-agent:value {seconds_value}) (error (c) (princ-to-string c)))") \
            == (f"=> \"Evaluation {seconds_value}'s value is no longer kept: reset-session forgot it.\"", False)
        assert first.eval("(list (and (fboundp 'ts-firsts) t) (find-symbol \"TS-SECONDS\"))") == ("=> (T NIL)", False)
        assert first.eval("*") == ("=> (T NIL)", False)
        assert first.call("backtrace")["content"][0]["text"].startswith(f"[Backtrace of evaluation {mine}]")
        assert error_type(second.call("backtrace", evaluation=theirs)) == "CL-MCP:NO-SUSPENDED-EVALUATION"
        aborted = first.call("invoke-restart", restart="ABORT")["content"][0]["text"]
        assert aborted.startswith("The evaluation was aborted."), aborted


@pytest.mark.parametrize("ending", ["killed", "closed"])
def test_an_assistant_that_ends_takes_its_work_with_it_and_leaves_the_others(ending):
    with two_assistants() as (server, first, second):
        theirs = waiting(second, '(error "the second one waits")')
        mine = waiting(first, '(error "the first one waits")')
        running = first.call("evaluate-lisp", code="(loop (sleep 0.5))", **{"answer-within": 1})
        assert running["structuredContent"].get("running"), running
        background = running["structuredContent"]["number"]
        # Killed, one runs for a call as well (a clean exit lets a call
        # under way answer first, within its deadline).
        if ending == "killed":
            first.start_request("tools/call", {"name": "evaluate-lisp", "arguments": {
                "code": '(progn (setf (sb-thread:thread-name sb-thread:*current-thread*) "the first\'s call") '
                        "(loop (sleep 0.5)))"}})
        calls = 2 if ending == "killed" else 1
        state = ("(cl:list (cl:sort (cl:mapcar (cl:function cl-mcp-agent::evaluation-id) "
                 "cl-mcp-agent::*suspended*) (cl:function cl:<)) "
                 "(cl:loop for name in (cl:list "
                 f'"cl-mcp evaluation {background} (background)" "the first\'s call") '
                 "count (cl:find name (sb-thread:list-all-threads) :key (cl:function sb-thread:thread-name) "
                 ":test (cl:function cl:equal))))")
        deadline = time.monotonic() + 10
        while (now := server.client_eval(state)) != f"(({theirs} {mine}) {calls})":
            assert time.monotonic() < deadline, now
            time.sleep(0.05)
        if ending == "killed":
            first.proc.kill()  # SIGKILL: no goodbye
            first.proc.wait()
        else:
            first.close()
        deadline = time.monotonic() + 5
        while (now := server.client_eval(state)) != f"(({theirs}) 0)":
            assert time.monotonic() < deadline, now
            time.sleep(0.1)
        # The other's evaluation waits on, and is still the other's to take on.
        text = second.call("backtrace")["content"][0]["text"]
        assert text.startswith(f"[Backtrace of evaluation {theirs}]\n"), text
        aborted = second.call("invoke-restart", restart="ABORT")["content"][0]["text"]
        assert aborted.startswith("The evaluation was aborted."), aborted



def test_a_thread_that_stops_hurries_only_its_own_sessions_calls():
    with two_assistants() as (server, first, second):
        for each in (first, second):  # the agent loaded (seconds on a busy machine), its session made
            assert each.eval("1") == ("=> 1", False)
        request = first.start_request("tools/call", {"name": "evaluate-lisp",
                                                     "arguments": {"code": "(progn (sleep 3) :first-done)"}})
        deadline = time.monotonic() + 60  # a hang's guard: the call runs at once
        running = "(cl:length cl-mcp-agent::*running*)"
        while server.client_eval(running) != "1":
            assert time.monotonic() < deadline, "the first's call never ran"
            time.sleep(0.05)
        text, is_error = second.eval('(sb-thread:make-thread (lambda () (error "the second\'s thread")))')
        assert not is_error, text
        answer = first.response(request)["result"]["content"][0]["text"]
        assert answer.startswith("=> :FIRST-DONE"), answer


def test_a_thread_of_a_session_that_ended_is_anyones_once_it_stops():
    with two_assistants() as (server, first, second):
        text, is_error = first.eval('(sb-thread:make-thread (lambda () (sleep 2) (error "orphaned")) '
                                    ':name "ts-orphan")')
        assert not is_error, text
        first.proc.kill()
        first.proc.wait()
        deadline = time.monotonic() + 30
        while True:
            entries = second.call("threads", action="list")["structuredContent"]["threads"]
            entry = next((e for e in entries if e["name"] == "ts-orphan"), None)
            if entry and entry["state"] == "stopped-at-error":
                break
            assert time.monotonic() < deadline, entries
            time.sleep(0.1)
        aborted = second.call("invoke-restart", evaluation=entry["evaluation"], restart="ABORT")
        assert aborted["content"][0]["text"].startswith("The evaluation was aborted."), aborted


def test_two_sessions_commanding_one_evaluation_at_once_each_get_their_own_answer():
    """Commands and reports each have one slot: a reader's backtrace, sent
    while the owner's eval-in-frame ran, took the eval-in-frame's report (or
    the owner took the frames)."""
    with two_assistants() as (_, first, second):
        mine = waiting(first, '(error "read by both")')
        for _ in range(3):
            evaluated = first.start_request("tools/call", {"name": "eval-in-frame", "arguments": {
                "evaluation": mine, "frame": 0, "code": "(progn (sleep 1) :from-the-frame)"}})
            time.sleep(0.3)
            frames = second.call("backtrace", evaluation=mine)["content"][0]["text"]
            assert frames.startswith(f"[Backtrace of evaluation {mine}] (another assistant's"), frames
            value = first.response(evaluated)["result"]["content"][0]["text"]
            assert value.startswith("=> :FROM-THE-FRAME"), value


def test_a_thread_one_assistant_started_is_not_the_others_to_interrupt_or_kill():
    with two_assistants() as (_, first, second):
        text, is_error = first.eval('(sb-thread:make-thread (lambda () (sleep 60)) :name "ts-firsts")')
        assert not is_error, text

        def entry(process: McpProcess) -> dict:
            entries = process.call("threads", action="list")["structuredContent"]["threads"]
            return next(e for e in entries if e["name"] == "ts-firsts")
        thread = entry(second)["id"]
        for action in ("interrupt", "kill"):
            refused = second.call("threads", action=action, thread=thread)
            assert refused["isError"], refused
            assert "CL-MCP:ANOTHER-SESSIONS-THREAD" in refused["content"][0]["text"], refused
            assert f"only that assistant may {action} it" in refused["content"][0]["text"], refused
        read = second.call("threads", action="backtrace", thread=thread)
        assert not read["isError"] and "SLEEP" in read["content"][0]["text"], read
        assert entry(first)["id"] == thread  # still alive
        killed = first.call("threads", action="kill", thread=thread)
        assert not killed["isError"], killed


def test_the_news_of_a_thread_goes_to_the_assistant_whose_evaluation_started_it():
    """A thread's output and its stop are news for the session that started
    it; the other assistant's answers carry none of it (the news was one
    pile, and whichever cl-mcp the image answered next took it all)."""
    with two_assistants() as (server, first, second):
        for each in (first, second):  # the agent loaded, its session made
            assert each.eval("1") == ("=> 1", False)
        started, is_error = first.eval('(sb-thread:make-thread (lambda () (sleep 0.5) (format t "ts-news line~%") '
                                       '(finish-output) (sleep 1) (error "ts-news fails")) :name "ts-news")')
        assert not is_error, started
        seconds = []
        deadline = time.monotonic() + 60
        stopped = '(cl:length cl-mcp-agent::*suspended*)'
        while server.client_eval(stopped) != "1":
            assert time.monotonic() < deadline, "the thread never stopped"
            seconds.append(second.eval("(+ 1 1)")[0])
        seconds += [second.eval("(+ 1 1)")[0] for _ in range(3)]
        assert len(seconds) > 3 and not [text for text in seconds if "ts-news" in text], seconds
        text = first.eval("(+ 2 2)")[0]
        # Its line may come with the answer that started it, if written by then.
        assert "ts-news line" in started + text and "ts-news fails" in text, (started, text)
        waits = int(re.search(r"It waits as evaluation (\d+)", text).group(1))
        assert not first.call("invoke-restart", evaluation=waits, restart="ABORT")["isError"]
