"""A cancel that crosses the answer window: the image has answered "still
running" and sent the evaluation to the background, but the caller gives up
before it reads that answer, so it never learns the evaluation's number.
The cancel, which names the call by its tag, must still stop the evaluation:
nothing may hold a --max-background slot that nobody can abort."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from cl_mcp.lisp.config import SessionConfig
from cl_mcp.lisp.session import LispSession
from cl_mcp.tools.evaluate import evaluate
from tests.integration.attach_fixtures import SwankServer, temporary_home
from tests.integration.conftest import McpProcess

WINDOW = 0.5
LEFT_IN_THE_BACKGROUND = "(length cl-mcp-agent::*background*)"


async def cancel_after_the_window(session: LispSession) -> None:
    """Start an evaluation with a short answer window, hold the event loop
    until the window has closed in the image (its "still running" answer
    waits unread on the socket), and cancel the call then."""
    call = asyncio.ensure_future(evaluate(
        session, "(progn (sleep 20) (setf (get :cl-mcp-race :finished) t))", answer_within=WINDOW))
    await asyncio.sleep(0.1)  # the call is in the image
    time.sleep(WINDOW + 1.0)  # nothing is read meanwhile
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call


async def race(config: SessionConfig) -> None:
    session = LispSession(config)
    session.start_in_background()  # as the server does: attached, the first connection
    try:
        assert (await evaluate(session, LEFT_IN_THE_BACKGROUND))["values"] == ["0"]
        for _ in range(2):
            await cancel_after_the_window(session)
            # Stopped, and its outcome, which nobody can ask for, not kept.
            assert (await evaluate(session, LEFT_IN_THE_BACKGROUND))["values"] == ["0"]
        assert len(session.background) == 0
        assert (await evaluate(session, "(get :cl-mcp-race :finished)"))["values"] == ["NIL"]
    finally:
        await session.close()


def test_a_cancel_crossing_the_window_stops_the_evaluation():
    asyncio.run(race(SessionConfig()))


def test_a_cancel_crossing_the_window_stops_it_in_a_shared_image(monkeypatch):
    home = temporary_home()
    monkeypatch.setenv("HOME", str(home))
    swank = SwankServer(home)
    try:
        asyncio.run(race(SessionConfig(connect=("127.0.0.1", swank.port))))
        assert swank.alive()
    finally:
        swank.stop()



def stopped_across_the_window(process: McpProcess, cancel) -> None:
    """Freeze cl-mcp (SIGSTOP: the image runs on) until the call's 1 s
    window has closed in the image, send the cancel CANCEL makes, and let
    cl-mcp go on: it finds the "still running" answer and the cancel
    waiting together, and whichever it reads first, the call has not
    answered when the cancel lands."""
    time.sleep(0.3)  # the call is in the image
    os.kill(process.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(1.7)
        cancel()
    finally:
        os.kill(process.proc.pid, signal.SIGCONT)


@pytest.mark.parametrize("how", ["notifications/cancelled", "tasks/cancel"])
def test_a_cancel_crossing_the_window_through_the_server(how):
    process = McpProcess()
    try:
        process.initialize()
        assert process.eval(LEFT_IN_THE_BACKGROUND) == ("=> 0", False)  # the image is up
        params = {"name": "evaluate-lisp", "arguments": {"code": "(sleep 20)", "answer-within": 1}}
        if how == "tasks/cancel":
            task = process.request("tools/call", {**params, "task": {"ttl": 60_000}})["result"]["task"]
            stopped_across_the_window(process, lambda: process.start_request(
                "tasks/cancel", {"taskId": task["taskId"]}))
        else:
            request = process.start_request("tools/call", params)
            stopped_across_the_window(process, lambda: process.notify(
                "notifications/cancelled", {"requestId": request}))
        deadline = time.monotonic() + 10
        while process.eval(LEFT_IN_THE_BACKGROUND) != ("=> 0", False):
            assert time.monotonic() < deadline, "the evaluation runs on in the background"
            time.sleep(0.2)
    finally:
        process.close()
