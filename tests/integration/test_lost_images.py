"""Images that fail to start, die, stop answering or lose a connection:
every request still gets exactly one answer, no SBCL is left behind, and a
live image is never given up for lost."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from cl_mcp.errors import SessionError
from cl_mcp.lisp.config import SessionConfig
from cl_mcp.lisp.image import LispImage
from cl_mcp.lisp.link import EmbeddedLink
from cl_mcp.lisp.session import LispSession
from cl_mcp.lisp.swank.connection import SwankConnection
from cl_mcp.tools.evaluate import evaluate
from cl_mcp.wire.sexp import Symbol
from tests.integration.conftest import McpProcess, pid_alive, sbcl_children
from tests.integration.test_protocol_breadth import answers_to

# ---------------------------------------------------------------- failed starts


def kill_image(session: LispSession) -> None:
    os.kill(session._link._image.pid, signal.SIGKILL)  # type: ignore[union-attr]


def fault_at(monkeypatch, owner, name: str, when, fault):
    """Make OWNER.NAME call FAULT first (when WHEN says so), then do its
    real work."""
    real = getattr(owner, name)

    async def faulty(*args, **kwargs):
        if when(*args, **kwargs):
            fault()
        return await real(*args, **kwargs)
    monkeypatch.setattr(owner, name, faulty)


def sends(symbol: str):
    def test(connection, form, *args, **kwargs) -> bool:
        return isinstance(form, list) and getattr(form[0], "name", None) == symbol
    return test


STAGES = {
    "before Swank listens": (LispImage, "_read_port", lambda *a, **k: True),
    "before the connection": (SwankConnection, "open", lambda host, port, **k: port is not None),
    "before TCP_NODELAY": (SwankConnection, "rex", sends("cl-mcp-agent:set-connection-nodelay")),
    "before configure": (SwankConnection, "rex", sends("cl-mcp-agent:configure")),
}


def refuse() -> None:
    raise OSError("refused at this stage")


@pytest.mark.parametrize("fault", ["killed", "failed"])
@pytest.mark.parametrize("stage", STAGES)
def test_a_start_that_fails_at_any_stage_leaves_no_sbcl(monkeypatch, stage, fault):
    """The image either dies at that stage or is alive when the step fails
    (a refused connection, an error): either way, after two tries (the
    second call starts again) no SBCL runs."""
    owner, name, when = STAGES[stage]

    async def body():
        session = LispSession(SessionConfig())
        fault_at(monkeypatch, owner, name, when,
                 (lambda: kill_image(session)) if fault == "killed" else refuse)
        try:
            for _ in range(2):
                with pytest.raises(SessionError) as failure:
                    await evaluate(session, "(+ 1 2)")
                assert failure.value.kind == "CL-MCP:IMAGE-START-FAILED"
                assert sbcl_children(os.getpid()) == []
        finally:
            await session.close()
    asyncio.run(body())


def test_an_image_without_a_lane_is_kept_and_serves(monkeypatch):
    async def no_lane(self, control):
        return None  # as when the image cannot open one
    monkeypatch.setattr(EmbeddedLink, "_open_lane", no_lane)

    async def body():
        session = LispSession(SessionConfig())
        try:
            assert (await evaluate(session, "(+ 1 2)"))["values"] == ["3"]
            assert len(sbcl_children(os.getpid())) == 1
        finally:
            await session.close()
        assert sbcl_children(os.getpid()) == []
    asyncio.run(body())


def test_a_new_image_never_leaves_the_old_one_running():
    async def body():
        session = LispSession(SessionConfig())
        link = session._link
        try:
            await link._open()
            first = link._image.pid  # type: ignore[union-attr]
            await link._open()
            assert not pid_alive(first)
            assert len(sbcl_children(os.getpid())) == 1
        finally:
            await session.close()
        assert sbcl_children(os.getpid()) == []
    asyncio.run(body())


# ---------------------------------------------------------------- the lane

LANE_FD = ("(sb-sys:fd-stream-fd (swank::connection.socket-io"
           " (cl-mcp-agent::lane-connection cl-mcp-agent::*lane*)))")
SHUT_DOWN_LANE = ("(sb-alien:alien-funcall (sb-alien:extern-alien \"shutdown\""
                  " (function sb-alien:int sb-alien:int sb-alien:int)) " + LANE_FD + " 2)")


def lane_thread(server: McpProcess) -> bool:
    return server.eval("(sb-thread:thread-name sb-thread:*current-thread*)") == ('=> "cl-mcp lane"', False)


def test_losing_the_lane_during_a_call_keeps_the_image(server):
    server.eval("(defun lane-survivor () :alive)")
    pid = server.eval("(sb-posix:getpid)")[0]
    assert lane_thread(server)
    text, is_error = server.eval(f"{SHUT_DOWN_LANE} (sleep 0.5) :done")
    assert is_error and text.startswith("[ERROR] CL-MCP:CONNECTION-LOST")
    assert "definitions are kept" in text
    assert server.eval("(sb-posix:getpid)")[0] == pid
    assert server.eval("(lane-survivor)") == ("=> :ALIVE", False)
    assert lane_thread(server)  # a new lane
    assert not any("Lisp image exited" in line for line in server.stderr_lines)


def test_losing_the_lane_between_calls_keeps_the_image(server):
    server.eval("(defun lane-survivor () :alive)")
    pid = server.eval("(sb-posix:getpid)")[0]
    server.eval(f"(sb-thread:make-thread (lambda () (sleep 0.2) {SHUT_DOWN_LANE}))")
    time.sleep(1)
    assert server.eval("(lane-survivor)") == ("=> :ALIVE", False)
    assert server.eval("(sb-posix:getpid)")[0] == pid
    assert lane_thread(server)
    assert not any("lost" in line and "state" in line for line in server.stderr_lines)


# ---------------------------------------------------------------- discarded images


def test_a_request_queued_behind_an_unresponsive_image_is_answered(server):
    """Code that cannot be interrupted costs its image (after the deadline
    and its grace); the call queued behind it gets a fresh image."""
    stuck = server.start_request("tools/call", {"name": "evaluate-lisp", "arguments": {
        "code": "(sb-sys:without-interrupts (loop))", "timeout": 1}})
    queued = server.start_request("tools/call", {"name": "evaluate-lisp", "arguments": {
        "code": "(+ 1 2)"}})
    first = server.response(stuck, timeout=30)["result"]
    assert first["isError"] and "CL-MCP:IMAGE-UNRESPONSIVE" in first["content"][0]["text"]
    second = server.response(queued, timeout=30)["result"]
    assert not second["isError"] and second["content"][0]["text"].startswith("=> 3")
    assert len(sbcl_children(server.proc.pid)) == 1


def test_requests_queued_behind_a_killed_image_are_answered(server):
    pid = int(server.eval("(sb-posix:getpid)")[0][3:])
    running = server.start_request("tools/call", {"name": "evaluate-lisp", "arguments": {
        "code": "(sleep 30)"}})
    queued = [server.start_request("tools/call", {"name": "evaluate-lisp", "arguments": {
        "code": f"(+ {n} 1)"}}) for n in range(3)]
    time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    first = server.response(running, timeout=30)["result"]
    assert first["isError"] and "CL-MCP:IMAGE-LOST" in first["content"][0]["text"]
    for n, request_id in enumerate(queued):
        result = server.response(request_id, timeout=30)["result"]
        assert result["content"][0]["text"].startswith(f"=> {n + 1}")
    for request_id in [running, *queued]:
        assert len(answers_to(server, request_id)) == 1


def test_requests_waiting_when_stdin_closes_each_get_one_answer():
    server = McpProcess()
    server.initialize()
    calls = [server.start_request("tools/call", {"name": "evaluate-lisp", "arguments": {
        "code": "(sleep 1)"}}) for _ in range(3)]
    time.sleep(0.5)
    assert server.close() == 0
    for request_id in calls:
        answers = [m for m in map(json.loads, list(server.raw_lines)) if m.get("id") == request_id]
        assert len(answers) == 1, answers
    assert sbcl_children(server.proc.pid) == []


# ---------------------------------------------------------------- replies too large for a frame

def test_a_reply_too_large_for_a_swank_frame_is_an_error_and_the_connection_stays():
    """Issue 44: Swank's header holds 24 bits of length, and a reply of 16 MB
    or more dropped the connection (the next call was NOT-CONNECTED).  Every
    call's reply goes through the agent's `fitted-reply`, which answers a
    clear error instead."""
    async def body():
        session = LispSession(SessionConfig())
        try:
            assert (await evaluate(session, "(defvar cl-user::*kept-across* :kept)"))["values"] == ["*KEPT-ACROSS*"]
            with pytest.raises(SessionError) as raised:
                await session.call([Symbol("cl:make-string"), 17_000_000],
                                   deadline=60)
            assert raised.value.kind == "CL-MCP:REPLY-TOO-LARGE"
            assert "17,000,002 bytes, more than a Swank frame holds (16 MB)" in str(raised.value)
            # Just under the frame is sent whole, on the same connection, to the same image.
            fits = 16_000_000
            assert len(await session.call([Symbol("cl:make-string"), fits], deadline=60)) == fits
            assert (await evaluate(session, "cl-user::*kept-across*"))["values"] == [":KEPT"]
        finally:
            await session.close()
    asyncio.run(body())
