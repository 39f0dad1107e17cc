"""The chaos soak of issue 36, in both modes: seeded rounds of cl-mcp (or,
embedded, its image) killed, reset-session, a thread of an evaluation
stopping at its error, a task call, a cancel of every tool that runs code
and a 10 MB output read back. After every round the programmer's state is
intact (attach mode: their variable, function, table, counting thread,
hooks and running SB-SPROF, seen from a Swank client of their own, which
evaluates between rounds too), every request got one response (a cancelled
one at most one), and cl-mcp's resident memory stays within a fixed bound
of where it started.

`make test` runs one round of each kind, in a seeded order; `make soak`
runs CL_MCP_SOAK_ROUNDS seeded random rounds (docs/attach.md, "The chaos
soak")."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.integration.attach_fixtures import SwankServer, temporary_home
from tests.integration.conftest import McpProcess, pid_alive, sbcl_children
from tests.integration.devtools import MODES
from tests.integration.test_cancel_tools import PROMPT, SLEEP, calls, probe_system
from tests.integration.test_intake import resident_kib
from tests.integration.test_protocol_breadth import answers_to
from tests.integration.test_tasks import start_task
from tests.integration.test_thread_news import thread_entry

SEED = int(os.environ.get("CL_MCP_SOAK_SEED", "36"))
ROUNDS = int(os.environ.get("CL_MCP_SOAK_ROUNDS", "0"))  # 0: one round of each kind
KINDS = ["kill", "reset", "thread-error", "task", "cancels", "big-output"]
# cl-mcp's growth over one life: two kept 10 MB outputs and their indexes,
# with room for the allocator; the same bound for 6 rounds and for 200.
RSS_GROWTH_LIMIT_KIB = 96 * 1024
OUTPUT_LINES = 200_000  # of 50 characters: 10 MB

PROGRAMMER = """(progn
  (defvar *programmer-var* (list 1 2 3))
  (defun programmer-fn (x) (* x 7))
  (defvar *programmer-table* (let ((h (make-hash-table))) (setf (gethash :k h) "v") h))
  (defvar *programmer-count* 0)
  (defvar *programmer-calls* 0)
  (sb-thread:make-thread (lambda () (loop (incf *programmer-count*) (sleep 0.01)))
                         :name "programmer-counter")
  (defun programmer-pre-reply () nil)
  (defun programmer-closed (connection) (declare (ignore connection)) nil)
  (push 'programmer-pre-reply swank::*pre-reply-hook*)
  (push 'programmer-closed swank::*connection-closed-hook*)
  (defvar *programmer-hooks* (list (copy-list swank::*pre-reply-hook*)
                                   (copy-list swank::*connection-closed-hook*)))
  (sb-sprof:start-profiling :threads :all)
  t)"""

# The programmer's state as they left it, cl-mcp's own hooks aside; their
# counter must move within 5 s.
INTACT = """(flet ((theirs (hooks)
         (remove-if (lambda (h) (and (symbolp h) (symbol-package h)
                                     (string= (package-name (symbol-package h)) "CL-MCP-AGENT")))
                    hooks)))
  (list (equal *programmer-var* '(1 2 3)) (programmer-fn 6) (gethash :k *programmer-table*)
        (let ((count *programmer-count*))
          (loop repeat 250 until (> *programmer-count* count) do (sleep 0.02))
          (> *programmer-count* count))
        (equal (list (theirs swank::*pre-reply-hook*) (theirs swank::*connection-closed-hook*))
               *programmer-hooks*)
        (and sb-sprof::*profiling* t)))"""


# With no cl-mcp attached: the hooks exactly the programmer's, make-thread
# unwrapped.
DETACHED = """(list (equal (list swank::*pre-reply-hook* swank::*connection-closed-hook*)
                   *programmer-hooks*)
             (or (sb-int:encapsulated-p 'sb-thread:make-thread 'cl-mcp-agent::watched)
                 (sb-int:encapsulated-p 'swank::close-connection% 'cl-mcp-agent::cl-mcp-unsent)))"""

# What holds up the detach, when it does not come: the connections, and
# Swank's sentinel thread (which runs the connection-closed hooks): the
# condition it stopped at, if it stopped in the debugger, and its backtrace.
SENTINEL = """(let ((sentinel (swank::find-registered 'swank::sentinel)) (seen nil))
  (when (and sentinel (sb-thread:thread-alive-p sentinel))
    (ignore-errors
     (sb-thread:interrupt-thread sentinel
       (lambda () (setf seen (list (ignore-errors (princ-to-string swank::*swank-debugger-condition*))
                                   (with-output-to-string (s) (sb-debug:print-backtrace :stream s :count 30)))))))
    (loop repeat 50 until seen do (sleep 0.1)))
  (list :connections (length swank::*connections*) :cl-mcp (length cl-mcp-agent::*connections*)
        :sentinel seen))"""


class Soak:
    """One mode's soak: the cl-mcp of the moment, what was asked of it, and
    the programmer's image (attach mode)."""

    def __init__(self, mode: str, directory: Path) -> None:
        self.mode = mode
        self.directory = directory
        self.effects = directory / "cancelled-ran"  # written by cancelled code that ran on
        self.swank: SwankServer | None = None
        self.home: Path | None = None
        self.programmer_calls = 0
        self.last_cancel = 0.0
        self.cancelled: set[Any] = set()
        self.lives: list[list[int]] = []  # each ended cl-mcp life's RSS (KiB) at each check
        if mode == "attached":
            self.home = temporary_home()
            self.swank = SwankServer(self.home)
            self.swank.client_eval("(require :sb-sprof)")  # before PROGRAMMER is read
            assert self.swank.client_eval(PROGRAMMER) == "T"
        self.process = self.start()

    def start(self) -> McpProcess:
        """A new cl-mcp, initialized, each request it is sent recorded."""
        if self.swank:
            process = McpProcess("--connect", str(self.swank.port), env={"HOME": str(self.home)})
        else:
            process = McpProcess()
        process.sent = []
        send = process.send

        def recording(message: dict[str, Any]) -> None:
            if "id" in message:
                process.sent.append(message["id"])
            send(message)
        process.send = recording
        process.initialize()
        process.rss = [resident_kib(process.proc.pid)]
        return process

    # ------------------------------------------------------------ checks

    def check(self, what: str) -> None:
        """The programmer's state, one response to each request, flat RSS."""
        if self.swank:
            assert self.swank.client_eval(INTACT) == '(T 42 "v" T T T)', what
            self.programmer_calls += 1
            assert self.swank.client_eval("(incf *programmer-calls*)") == str(self.programmer_calls)
        self.check_answers(what)
        process = self.process
        process.rss.append(resident_kib(process.proc.pid))
        assert process.rss[-1] - process.rss[0] < RSS_GROWTH_LIMIT_KIB, (what, process.rss)

    def check_answers(self, what: str) -> None:
        for request in self.process.sent:
            answers = len(answers_to(self.process, request))
            if request in self.cancelled:
                assert answers <= 1, (what, request, answers)
            else:
                assert answers == 1, (what, request, answers)

    # ------------------------------------------------------------ rounds

    def kill(self) -> None:
        """Attach mode: cl-mcp SIGKILLed and started again. Embedded: the
        image killed, and the next call says so in its [session] notice."""
        if self.swank:
            self.lives.append(self.process.rss)
            self.process.proc.kill()
            self.process.proc.wait()
            self.check_answers("killed")
            assert self.swank.client_eval(INTACT) == '(T 42 "v" T T T)', "with no cl-mcp"
            deadline = time.monotonic() + 30  # Swank's sentinel closes the connection
            while (detached := self.swank.client_eval(DETACHED)) != "(T NIL)":
                assert time.monotonic() < deadline, ("cl-mcp's marks outlive it", detached,
                                                     self.swank.client_eval(SENTINEL))
                time.sleep(0.1)
            self.process = self.start()
            return
        assert not self.process.eval("(defvar *soak-before-kill* t)")[1]
        [image] = sbcl_children(self.process.proc.pid)
        os.kill(image, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(image):
            assert time.monotonic() < deadline, "the image outlived SIGKILL"
            time.sleep(0.05)
        # A call that reaches cl-mcp before it has read its image's socket
        # close is answered IMAGE-LOST, which says the next call runs fresh.
        text, is_error = self.process.eval("(boundp '*soak-before-kill*)")
        if is_error:
            assert text.startswith("[ERROR] CL-MCP:IMAGE-LOST"), text
            assert self.process.eval("(boundp '*soak-before-kill*)") == ("=> NIL", False)
        else:
            assert text.startswith("=> NIL") and "killed by signal 9" in text, text

    def reset(self) -> None:
        result = self.process.call("reset-session")
        assert not result["isError"], result
        assert self.process.eval("(+ 2 3)") == ("=> 5", False)

    def thread_error(self) -> None:
        """A thread of the evaluation's stops at its error; it is aborted."""
        name = f"soak-stopper-{time.monotonic_ns()}"
        text, is_error = self.process.eval(
            f'(sb-thread:make-thread (lambda () (error "soak stop")) :name "{name}")')
        assert not is_error, text
        deadline = time.monotonic() + 30
        while (entry := thread_entry(self.process, name)) is None or entry["state"] != "stopped-at-error":
            assert time.monotonic() < deadline, ("the thread never stopped", entry)
            time.sleep(0.1)
        ended = self.process.call("invoke-restart", evaluation=entry["evaluation"], restart="ABORT")
        assert not ended["isError"], ended
        deadline = time.monotonic() + 30
        while thread_entry(self.process, name) is not None:
            assert time.monotonic() < deadline, "the aborted thread lives on"
            time.sleep(0.1)

    def task(self) -> None:
        task_id = start_task(self.process, "evaluate-lisp", {"code": "(progn (sleep 1) (* 6 7))"})
        result = self.process.request("tasks/result", {"taskId": task_id})["result"]
        assert result["content"][0]["text"].startswith("=> 42"), result

    def cancels(self) -> None:
        """Each tool that runs code cancelled in turn, in a seeded order; the
        next call is answered at once in the same image."""
        process = self.process
        assert not process.eval("(defvar *soak-x* 1)")[1]
        assert not process.eval(f'(asdf:load-asd "{probe_system(self.directory, self.effect)}")')[1]
        tools = calls(self.directory, self.effect)
        self.random.shuffle(tools)
        for tool, arguments in tools:
            if tool == "eval-in-frame":
                assert process.call("evaluate-lisp", code='(error "soak waits")')["isError"]
            request = process.start_request("tools/call", {"name": tool, "arguments": arguments})
            self.cancelled.add(request)
            time.sleep(0.5)  # the call is in the image
            process.notify("notifications/cancelled", {"requestId": request})
            started = time.monotonic()
            assert process.eval("(boundp '*soak-x*)") == ("=> T", False), tool
            assert time.monotonic() - started < PROMPT, f"{tool}: the next call waited"
            if tool == "eval-in-frame":
                assert not process.call("invoke-restart", restart="ABORT")["isError"]
        self.last_cancel = time.monotonic()

    def effect(self, tool: str) -> str:
        """Code that sleeps, then records in a file that TOOL's code ran on."""
        return (f'(sleep {SLEEP}) (with-open-file (s "{self.effects}" :direction :output '
                f':if-exists :append :if-does-not-exist :create) (write-line "{tool}" s))')

    def big_output(self) -> None:
        """10 MB of output, read back by line and by pattern."""
        code = (f'(dotimes (i {OUTPUT_LINES}) (format t "line ~7,\'0D ~A~%" i '
                f'(make-string 36 :initial-element #\\o)))')
        result = self.process.call("evaluate-lisp", code=code, timeout=120)
        assert not result["isError"], result["content"][0]["text"][:2000]
        number = result["structuredContent"]["number"]
        line = self.process.call("read-output", evaluation=number, offset=123457, length=1)
        assert "line 0123456 ooo" in line["content"][0]["text"], line
        found = self.process.call("read-output", evaluation=number, pattern="^line 0199999 ")
        assert "line 0199999 ooo" in found["content"][0]["text"], found

    # ------------------------------------------------------------ the soak

    def run(self) -> None:
        self.random = random.Random(SEED)
        schedule = KINDS[:] if ROUNDS == 0 else [self.random.choice(KINDS) for _ in range(ROUNDS)]
        if ROUNDS == 0:
            self.random.shuffle(schedule)
        rounds: dict[str, Callable[[], None]] = {
            "kill": self.kill, "reset": self.reset, "thread-error": self.thread_error,
            "task": self.task, "cancels": self.cancels, "big-output": self.big_output}
        for number, kind in enumerate(schedule, 1):
            rounds[kind]()
            self.check(f"round {number} ({kind}), seed {SEED}")
        remaining = self.last_cancel + SLEEP + 1 - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)  # every cancelled sleep would be over
        assert not self.effects.exists(), self.effects.read_text()
        self.check("the end")
        self.lives.append(self.process.rss)
        longest = max(self.lives, key=len)
        print(f"\nsoak {self.mode}, seed {SEED}: {len(schedule)} rounds "
              f"({', '.join(f'{schedule.count(kind)} {kind}' for kind in KINDS)}); "
              f"{len(self.lives)} cl-mcp lives; largest RSS growth in one life "
              f"{max(max(rss) - rss[0] for rss in self.lives) // 1024} MiB; "
              f"the longest life's RSS (MiB) every 10 checks: "
              f"{' '.join(str(kib // 1024) for kib in longest[::10])}")

    def close(self) -> None:
        self.process.close()
        if self.swank:
            assert self.swank.alive()
            self.swank.stop()


@pytest.mark.parametrize("mode", MODES)
def test_chaos_soak(mode, tmp_path):
    soak = Soak(mode, tmp_path)
    try:
        soak.run()
    finally:
        soak.close()
