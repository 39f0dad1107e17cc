"""The server's intake limits and the progress of a queued call, with a
fake session in place of SBCL: what is tested here is the server's own
bookkeeping (tests/integration/test_intake.py runs the same against a real
image)."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import tracemalloc
from collections import Counter, defaultdict
from typing import Any, Awaitable, Callable

from cl_mcp.errors import SERVER_BUSY
from cl_mcp.lisp.config import SessionConfig
from cl_mcp.lisp.swank.connection import DEFAULT_PACKAGE
from cl_mcp.server import intake, server as server_module
from cl_mcp.server.intake import MAX_QUEUED_BYTES, MAX_QUEUED_CALLS, MAX_WAITING_BESIDE, CallQueue, QueuedCall
from cl_mcp.server.server import McpServer
from cl_mcp.wire.sexp import Keyword

BUSY_TAIL = "; try again when earlier calls have finished"


class FakeSession:
    """Stands for LispSession: a tool takes its FIFO turn as its first
    await, as with the real one, and each evaluation waits until the test
    opens the gate of its code."""

    def __init__(self) -> None:
        self.config = SessionConfig()
        self.package = DEFAULT_PACKAGE
        self.shared = False
        self._turns = asyncio.Lock()
        self.gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.open_all = False  # the test is over: no call waits any more
        self.running: str | None = None
        self.tail_polls: list[str | None] = []  # the code running at each output_tail
        self.started: list[str] = []  # the code of each call, in the order they reached the image
        self.beside_in_image = 0  # no form runs beside the turn here

    def turn(self) -> asyncio.Lock:
        return self._turns

    def new_tag(self) -> int:
        return 1

    async def call(self, form: Any, deadline: float, tag: int | None = None) -> Any:
        code = form[1]  # (cl-mcp-agent:evaluate CODE ...)
        self.started.append(code)
        self.running = code
        if self.open_all:
            self.gates[code].set()
        try:
            await self.gates[code].wait()
        finally:
            self.running = None
        return [Keyword("status"), Keyword("ok"), Keyword("values"), [code]]

    async def output_tail(self) -> str | None:
        """Like the real one: the output of the call running now, if any."""
        self.tail_polls.append(self.running)
        return f"output of {self.running}" if self.running else None

    def stopped_meanwhile(self) -> list[str]:
        return []

    def take_notices(self) -> list[tuple[str, str]]:
        return []


class Harness:
    """An McpServer over a FakeSession, fed whole lines, keeping what it sends."""

    def __init__(self) -> None:
        self.session = FakeSession()
        self.sent: list[Any] = []
        self.server = McpServer(self.session.config, lambda: self.session, self.sent.append)  # type: ignore[arg-type]

    def send(self, message: Any) -> bytes:
        line = json.dumps(message).encode()
        self.server.receive(line)
        return line

    def call(self, request_id: Any, code: str, token: str | None = None, padding: int = 0) -> bytes:
        """tools/call evaluate-lisp CODE; PADDING adds that many bytes to its line."""
        params: dict[str, Any] = {"name": "evaluate-lisp", "arguments": {"code": code}}
        if token is not None:
            params["_meta"] = {"progressToken": token}
        if padding:
            params["arguments"]["package"] = "P" * padding
        return self.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})

    def answered(self) -> Counter[Any]:
        """How many responses each id got."""
        return Counter(m["id"] for m in self.sent if isinstance(m, dict) and "method" not in m)

    def responses(self, request_id: Any) -> list[dict[str, Any]]:
        return [m for m in self.sent if isinstance(m, dict) and "method" not in m and m["id"] == request_id]

    def progress(self, token: str) -> list[str]:
        return [m["params"]["message"] for m in self.sent if isinstance(m, dict)
                and m.get("method") == "notifications/progress" and m["params"]["progressToken"] == token]

    async def finish(self) -> None:
        self.session.open_all = True
        for gate in self.session.gates.values():
            gate.set()
        await self.server.finish(5.0)


def run(body: Callable[[Harness], Awaitable[None]]) -> None:
    async def main() -> None:
        harness = Harness()
        try:
            await body(harness)
        finally:
            await harness.finish()
    asyncio.run(main())


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.001)


def busy_data(calls: int, queued_bytes: int, request_bytes: int) -> dict[str, int]:
    return {"queuedCalls": calls, "queuedBytes": queued_bytes, "requestBytes": request_bytes,
            "maxQueuedCalls": MAX_QUEUED_CALLS, "maxQueuedBytes": MAX_QUEUED_BYTES}


# ---------------------------------------------------------------- the count limit

def test_a_call_past_the_count_limit_is_refused_at_once_and_cheap_methods_never_are():
    async def body(h: Harness) -> None:
        admitted = sum(len(h.call(i, "(hold)")) for i in range(MAX_QUEUED_CALLS))
        await asyncio.sleep(0)
        assert h.sent == []  # all queued behind the first
        line = h.call("extra", "(+ 1 2)")
        assert h.responses("extra") == [{
            "jsonrpc": "2.0", "id": "extra", "error": {
                "code": SERVER_BUSY,
                "message": f"Server busy: {MAX_QUEUED_CALLS} calls are queued (the limit){BUSY_TAIL}",
                "data": busy_data(MAX_QUEUED_CALLS, admitted, len(line))}}]
        h.send({"jsonrpc": "2.0", "id": "ping", "method": "ping"})
        h.send({"jsonrpc": "2.0", "id": "list", "method": "tools/list"})
        h.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}})
        assert h.responses("ping")[0]["result"] == {}
        assert "tools" in h.responses("list")[0]["result"]
        h.session.gates["(hold)"].set()
        await until(lambda: h.answered()[MAX_QUEUED_CALLS - 1] == 1)
        answered = h.answered()
        assert answered[5] == 0  # cancelled: no response
        assert all(answered[i] == 1 for i in range(MAX_QUEUED_CALLS) if i != 5)
        h.session.gates["(after)"].set()
        h.call("after", "(after)")
        await until(lambda: bool(h.responses("after")))
        assert h.responses("after")[0]["result"]["content"][0]["text"] == "=> (after)"
    run(body)


def test_a_call_past_the_limit_in_a_batch_gets_the_busy_error_as_its_part():
    async def body(h: Harness) -> None:
        h.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"}}})
        for i in range(MAX_QUEUED_CALLS):
            h.call(i, "(hold)")
        h.send([{"jsonrpc": "2.0", "id": "extra", "method": "tools/call",
                 "params": {"name": "evaluate-lisp", "arguments": {"code": "1"}}},
                {"jsonrpc": "2.0", "id": "ping", "method": "ping"}])
        await until(lambda: any(isinstance(m, list) for m in h.sent))
        [batch] = [m for m in h.sent if isinstance(m, list)]
        assert [m["id"] for m in batch] == ["extra", "ping"]
        assert batch[0]["error"]["code"] == SERVER_BUSY and batch[1]["result"] == {}
    run(body)


# ---------------------------------------------------------------- the byte limit

def test_a_call_that_would_pass_the_byte_limit_is_refused(monkeypatch):
    monkeypatch.setattr(intake, "MAX_QUEUED_BYTES", 1 << 20)

    async def body(h: Harness) -> None:
        first = h.call(1, "(hold)", padding=600_000)
        second = h.call(2, "(second)", padding=400_000)
        assert len(first) + len(second) <= 1 << 20
        third = h.call(3, "(third)", padding=100_000)
        queued = len(first) + len(second)
        assert h.responses(1) == h.responses(2) == []
        [refused] = h.responses(3)
        assert refused["error"] == {
            "code": SERVER_BUSY,
            "message": ("Server busy: 2 queued calls hold 1.0 MiB of requests and this one 0.1 MiB, "
                        f"past the limit of 1.0 MiB{BUSY_TAIL}"),
            "data": {**busy_data(2, queued, len(third)), "maxQueuedBytes": 1 << 20}}
        # Once the first call has ended, its bytes are free again.
        h.session.gates["(hold)"].set()
        await until(lambda: bool(h.responses(1)))
        await asyncio.sleep(0)  # the queue forgets a call one pass after it ends
        h.call(4, "(fourth)", padding=100_000)
        assert h.responses(4) == []  # admitted: it waits behind the second
    run(body)


def test_a_call_is_always_admitted_when_none_is_queued_whatever_its_size(monkeypatch):
    monkeypatch.setattr(intake, "MAX_QUEUED_BYTES", 1 << 20)

    async def body(h: Harness) -> None:
        h.call(1, "(big)", padding=2 << 20)
        assert h.responses(1) == []  # running, not refused
        h.call(2, "(small)")
        assert h.responses(2)[0]["error"]["code"] == SERVER_BUSY
        h.session.gates["(big)"].set()
        await until(lambda: bool(h.responses(1)))
        await asyncio.sleep(0)
        h.session.gates["(small)"].set()
        h.call(3, "(small)")
        await until(lambda: bool(h.responses(3)))
        assert h.responses(3)[0]["result"]["content"][0]["text"] == "=> (small)"
    run(body)


def test_a_refused_call_leaves_nothing_behind(monkeypatch):
    """Twenty refused calls of 1 MiB each: the server's memory does not grow
    by their size (each is parsed, answered and dropped)."""
    monkeypatch.setattr(intake, "MAX_QUEUED_BYTES", 1 << 20)

    async def body(h: Harness) -> None:
        h.call(1, "(hold)", padding=1 << 20)
        line = json.dumps({"jsonrpc": "2.0", "id": "big", "method": "tools/call", "params": {
            "name": "evaluate-lisp", "arguments": {"code": "x" * (1 << 20)}}}).encode()
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(20):
                h.server.receive(line)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len(h.responses("big")) == 20
        assert all(r["error"]["code"] == SERVER_BUSY for r in h.responses("big"))
        assert grown < 256 * 1024, grown
    run(body)


def test_the_queue_alone_admits_any_size_when_empty_and_counts_what_it_holds():
    async def body() -> None:
        loop = asyncio.get_running_loop()
        queue = CallQueue()
        assert queue.refusal(60 << 20) is None
        big = QueuedCall(1, "evaluate-lisp", 60 << 20, loop.time())
        queue.add(big, loop.time())
        assert queue.refusal(1) is not None
        queue.remove(big, loop.time())
        assert queue.bytes == 0 and queue.refusal(MAX_QUEUED_BYTES) is None
    asyncio.run(body())


# ---------------------------------------------------------------- progress while queued

QUEUED = re.compile(r"queued for \d+\.\d s behind request (\S+) \((\S+), running for \d+\.\d s\); "
                    r"(\d+) calls? ahead")


def test_a_queued_call_reports_where_it_waits_without_asking_the_image(monkeypatch):
    monkeypatch.setattr(server_module, "PROGRESS_INTERVAL", 0.01)

    async def body(h: Harness) -> None:
        h.call(1, "(first)")
        h.call("second", "(second)")
        h.send({"jsonrpc": "2.0", "id": "bad", "method": "tools/call",
                "params": {"name": "no-such-tool", "arguments": {}}})
        assert h.responses("bad")[0]["error"]["code"] == -32602  # refused, never queued
        h.call(3, "(third)", token="tok")
        await until(lambda: len(h.progress("tok")) >= 2)
        assert all(QUEUED.fullmatch(m) for m in h.progress("tok")), h.progress("tok")
        assert {QUEUED.fullmatch(m).groups() for m in h.progress("tok")} == {("1", "evaluate-lisp", "2")}
        assert h.session.tail_polls == []

        h.session.gates["(first)"].set()
        await until(lambda: QUEUED.fullmatch(h.progress("tok")[-1]).group(1) == '"second"')
        assert QUEUED.fullmatch(h.progress("tok")[-1]).group(3) == "1"
        assert h.progress("tok")[-1].endswith("1 call ahead")

        h.session.gates["(second)"].set()
        await until(lambda: "output of (third)" in h.progress("tok")[-1])
        assert re.fullmatch(r"running for \d+\.\d s; latest output: output of \(third\)",
                            h.progress("tok")[-1])
        # None: polled in the pass between the second's end and the third's
        # start, when nothing runs; never while another call ran.
        assert set(h.session.tail_polls) - {None} == {"(third)"}

        h.session.gates["(third)"].set()
        await until(lambda: bool(h.responses(3)))
        sent = len(h.progress("tok"))
        await asyncio.sleep(0.05)
        assert len(h.progress("tok")) == sent  # none after the response
    run(body)


# ---------------------------------------------------------------- task calls

def task_call(h: Harness, request_id: Any, code: str, padding: int = 0) -> bytes:
    """A 2025-11-25 tools/call evaluate-lisp CODE asking for a task."""
    arguments: dict[str, Any] = {"code": code}
    if padding:
        arguments["package"] = "P" * padding
    return h.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                   "params": {"name": "evaluate-lisp", "arguments": arguments, "task": {"ttl": 60_000}}})


def initialize(h: Harness, version: str) -> None:
    h.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}})


def status_notifications(h: Harness) -> list[dict[str, Any]]:
    return [m["params"] for m in h.sent
            if isinstance(m, dict) and m.get("method") == "notifications/tasks/status"]


def test_task_calls_count_against_the_count_limit_until_their_work_is_done():
    async def body(h: Harness) -> None:
        initialize(h, "2025-11-25")
        for i in range(MAX_QUEUED_CALLS):
            task_call(h, i, "(hold)")
        created = [h.responses(i)[0]["result"]["task"] for i in range(MAX_QUEUED_CALLS)]
        assert {task["status"] for task in created} == {"working"}
        task_call(h, "extra-task", "(+ 1 2)")
        h.call("extra-call", "(+ 1 2)")
        for request_id in ("extra-task", "extra-call"):
            [refused] = h.responses(request_id)
            assert refused["error"]["code"] == SERVER_BUSY
            assert refused["error"]["data"]["queuedCalls"] == MAX_QUEUED_CALLS
        h.session.gates["(hold)"].set()
        await until(lambda: len(status_notifications(h)) == MAX_QUEUED_CALLS)
        assert {n["status"] for n in status_notifications(h)} == {"completed"}
        h.session.gates["(after)"].set()
        task_call(h, "after", "(after)")
        assert "task" in h.responses("after")[0]["result"]
    run(body)


def test_waiting_tasks_results_are_bounded_and_free_their_place_when_answered():
    async def body(h: Harness) -> None:
        initialize(h, "2025-11-25")
        task_call(h, "task", "(hold)")
        task_id = h.responses("task")[0]["result"]["task"]["taskId"]
        for i in range(MAX_WAITING_BESIDE + 1):
            h.send({"jsonrpc": "2.0", "id": f"result-{i}", "method": "tasks/result", "params": {"taskId": task_id}})
        [refused] = h.responses(f"result-{MAX_WAITING_BESIDE}")
        assert refused["error"]["code"] == SERVER_BUSY
        assert refused["error"]["data"] == {"waitingCalls": MAX_WAITING_BESIDE, "maxWaitingCalls": MAX_WAITING_BESIDE}
        h.session.gates["(hold)"].set()
        await until(lambda: all(h.responses(f"result-{i}") for i in range(MAX_WAITING_BESIDE)))
        h.send({"jsonrpc": "2.0", "id": "later", "method": "tasks/result", "params": {"taskId": task_id}})
        assert h.responses("later")[0]["result"]["content"][0]["text"].startswith("=> (hold)")
    run(body)


def test_task_calls_count_against_the_byte_limit(monkeypatch):
    monkeypatch.setattr(intake, "MAX_QUEUED_BYTES", 1 << 20)

    async def body(h: Harness) -> None:
        initialize(h, "2025-11-25")
        task_call(h, 1, "(hold)", padding=600_000)
        task_call(h, 2, "(second)", padding=600_000)
        assert "task" in h.responses(1)[0]["result"]
        [refused] = h.responses(2)
        assert refused["error"]["code"] == SERVER_BUSY
        assert refused["error"]["message"].startswith("Server busy: 1 queued calls hold 0.6 MiB")
    run(body)


def test_a_task_takes_its_place_in_line_at_arrival_and_is_first_seen_working():
    async def body(h: Harness) -> None:
        initialize(h, "2025-11-25")
        h.call(1, "(hold)")
        h.session.gates["(quick)"].set()
        task_call(h, "task", "(task)")
        h.call(2, "(plain)")
        h.session.gates["(hold)"].set()
        h.session.gates["(task)"].set()
        h.session.gates["(plain)"].set()
        await until(lambda: bool(h.responses(2)) and bool(status_notifications(h)))
        assert h.session.started == ["(hold)", "(task)", "(plain)"]
        # A job that ends in its first step: its CreateTaskResult still says
        # working, and its status notification follows it.
        h.sent.clear()
        task_call(h, "quick", "(quick)")
        assert h.session.started[-1] == "(quick)"
        assert h.sent[0]["id"] == "quick" and h.sent[0]["result"]["task"]["status"] == "working"
        await until(lambda: len(h.sent) == 2)
        assert h.sent[1]["method"] == "notifications/tasks/status"
        assert h.sent[1]["params"]["status"] == "completed"
    run(body)
