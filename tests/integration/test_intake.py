"""Intake limits and the progress of a queued call, against the installed
cl-mcp and a real SBCL: a flood of large calls behind a running evaluation
is refused past the limits, with memory kept flat, and a call waiting for
another reports that it waits instead of the other call's output."""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cl_mcp.errors import SERVER_BUSY
from cl_mcp.server.intake import MAX_WAITING_BESIDE
from tests.integration.conftest import McpProcess, cl_mcp

FLOOD_CALLS = 400
FLOOD_CODE_CHARS = 200_000
# Without intake limits cl-mcp grew ~79 MiB here (all 400 calls' code held);
# with them ~33 MiB.  The queue holds at most MAX_QUEUED_BYTES (32 MiB) of
# requests, kept as Python strings of about the same size, plus transient
# copies of the line being parsed and of the call sent to the image: 48 MiB
# leaves room for malloc's slack, and an unbounded queue fails it.
FLOOD_GROWTH_LIMIT_KIB = 48 * 1024


def resident_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def is_python(pid: int) -> bool:
    """True when PID runs Python itself (the console script is a Python
    script, so the kernel runs the interpreter in the pid we started)."""
    return "python" in Path(f"/proc/{pid}/exe").resolve().name


class PeakSampler:
    """The highest VmRSS of PID, sampled every 5 ms until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = resident_kib(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, resident_kib(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def call_line(request_id: Any, code: str, meta: dict[str, Any] | None = None) -> bytes:
    params: dict[str, Any] = {"name": "evaluate-lisp", "arguments": {"code": code}}
    if meta:
        params["_meta"] = meta
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": params}).encode() + b"\n"


def responses_by_id(process: McpProcess) -> Counter[Any]:
    """How many responses cl-mcp wrote to each id, read or not."""
    messages = (json.loads(line) for line in list(process.raw_lines))
    return Counter(m["id"] for m in messages if "id" in m and "method" not in m)


def test_a_flood_of_large_calls_behind_a_running_one_is_refused_past_the_limits():
    with cl_mcp("--log-level", "warning") as process:
        pid = process.proc.pid
        assert is_python(pid)
        process.eval("(+ 1 2)")  # the image is up and the first call's code paths loaded
        baseline = resident_kib(pid)
        sleeper = process.start_request("tools/call", {"name": "evaluate-lisp",
                                                       "arguments": {"code": "(sleep 3)"}})
        code = f'(length "{"x" * (FLOOD_CODE_CHARS - 12)}")'
        flood = [f"flood-{i}" for i in range(FLOOD_CALLS)]
        sampler = PeakSampler(pid)
        writer = threading.Thread(target=lambda: [process.send_raw(call_line(i, code)) for i in flood])
        writer.start()
        try:
            responses = {request_id: process.response(request_id, timeout=120) for request_id in flood}
        finally:
            peak = sampler.stop()
            writer.join(30)
        assert process.response(sleeper)["result"]["isError"] is False
        text, is_error = process.eval("(+ 1 2)")
        assert (text, is_error) == ("=> 3", False)

        busy = [r for r in responses.values() if "error" in r]
        done = [r for r in responses.values() if "result" in r]
        assert busy and done, (len(busy), len(done))
        assert all(r["error"]["code"] == SERVER_BUSY and r["error"]["message"].startswith("Server busy")
                   for r in busy)
        assert all(r["result"]["content"][0]["text"] == f"=> {FLOOD_CODE_CHARS - 12}\n\n; Evaluation "
                   f"{r['result']['structuredContent']['number']}" for r in done)
        counts = responses_by_id(process)
        assert all(counts[request_id] == 1 for request_id in flood + [sleeper])
        growth = peak - baseline
        print(f"cl-mcp VmRSS: baseline {baseline} KiB, peak {peak} KiB (+{growth} KiB); "
              f"{len(done)} admitted, {len(busy)} refused")
        assert growth < FLOOD_GROWTH_LIMIT_KIB


def progress_messages(process: McpProcess, token: str) -> list[str]:
    """The messages of every notifications/progress for TOKEN written so far."""
    messages = (json.loads(line) for line in list(process.raw_lines))
    return [m["params"]["message"] for m in messages
            if m.get("method") == "notifications/progress" and m["params"]["progressToken"] == token]


def test_a_queued_call_reports_that_it_waits_and_then_its_own_progress():
    with cl_mcp("--log-level", "warning") as process:
        process.eval("(+ 1 2)")
        first = process.start_request("tools/call", {"name": "evaluate-lisp", "arguments": {
            "code": '(progn (format t "first-call-output~%") (finish-output) (sleep 2) :first)'}})
        second = "queued-2"
        process.send_raw(call_line(second, '(progn (format t "second-call-output~%") (finish-output) '
                                           "(sleep 1.2) :second)", {"progressToken": "tok-2"}))
        assert process.response(first)["result"]["content"][0]["text"].endswith("=> :FIRST\n\n; Evaluation 2")
        assert process.response(second)["result"]["content"][0]["text"].endswith("=> :SECOND\n\n; Evaluation 3")

        messages = progress_messages(process, "tok-2")
        queued = [m for m in messages if m.startswith("queued")]
        running = [m for m in messages if m.startswith("running")]
        assert queued and running and queued + running == messages, messages
        assert all(re.fullmatch(rf"queued for \d+\.\d s behind request {first} "
                                r"\(evaluate-lisp, running for \d+\.\d s\); 1 call ahead", m)
                   for m in queued), queued
        assert not any("first-call-output" in m for m in messages), messages
        # Its running time starts when it took the session, not when it arrived.
        assert float(re.match(r"running for (\d+\.\d) s", running[0])[1]) < 1.0, running
        assert any("latest output: second-call-output" in m for m in running), running


def test_calls_waiting_beside_the_session_are_bounded():
    """1,000 concurrent await-evaluation {wait: 20} took the image from 9
    to 1,009 threads, none refused; past MAX_WAITING_BESIDE they are busy."""
    with cl_mcp() as process:
        threads = "(length (sb-thread:list-all-threads))"
        before = int(process.eval(threads)[0].removeprefix("=> "))
        running = process.call("evaluate-lisp", code="(progn (sleep 8) :done)", **{"answer-within": 1})
        number = running["structuredContent"]["number"]
        count = MAX_WAITING_BESIDE + 8
        process.send_raw(b"".join(json.dumps({
            "jsonrpc": "2.0", "id": f"wait-{i}", "method": "tools/call",
            "params": {"name": "await-evaluation", "arguments": {"evaluation": number, "wait": 20}}}).encode()
            + b"\n" for i in range(count)))
        busy = [process.response(f"wait-{i}") for i in range(MAX_WAITING_BESIDE, count)]
        assert all(r["error"]["code"] == SERVER_BUSY and r["error"]["message"].startswith("Server busy")
                   for r in busy), busy
        assert int(process.eval(threads)[0].removeprefix("=> ")) <= before + MAX_WAITING_BESIDE + 4
        answers = [process.response(f"wait-{i}")["result"] for i in range(MAX_WAITING_BESIDE)]
        assert sum(not a["isError"] for a in answers) == 1, answers  # the one that took the outcome
        assert "result" in process.request("tools/call", {"name": "read-output", "arguments": {"evaluation": number}})


def test_a_cancelled_waiting_call_counts_until_the_image_answers_it():
    """Cancelling await-evaluation frees no image thread (its wait goes on
    there): cancelled calls still count, so cancelling and sending again
    cannot grow the image's threads past the limit."""
    with cl_mcp() as process:
        running = process.call("evaluate-lisp", code="(progn (sleep 8) :done)", **{"answer-within": 1})
        number = running["structuredContent"]["number"]
        waiting = [process.start_request("tools/call", {"name": "await-evaluation",
                                                        "arguments": {"evaluation": number, "wait": 20}})
                   for _ in range(MAX_WAITING_BESIDE)]
        for request_id in waiting:
            process.notify("notifications/cancelled", {"requestId": request_id})
        process.request("ping")  # read after the cancellations, answered once they have been handled
        refused = process.request("tools/call", {"name": "read-output", "arguments": {"evaluation": number}})
        assert refused["error"]["code"] == SERVER_BUSY, refused
        outcome, deadline = None, time.monotonic() + 60
        while outcome is None:  # the evaluation ends within its 8 s, and the image answers the waits
            response = process.request("tools/call", {"name": "await-evaluation",
                                                      "arguments": {"evaluation": number, "wait": 20}})
            if "result" in response:
                outcome = response["result"]
            else:
                assert response["error"]["code"] == SERVER_BUSY and time.monotonic() < deadline
                time.sleep(0.2)  # polling for the image's answers, which nothing announces
        assert outcome["content"][0]["text"].startswith("=> :DONE"), outcome
