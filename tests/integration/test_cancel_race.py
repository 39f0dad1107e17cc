"""A cancel that crosses the answer window: the image has answered "still
running" and sent the evaluation to the background, but the caller gives up
before it reads that answer, so it never learns the evaluation's number.
The cancel, which names the call by its tag, must still stop the evaluation:
nothing may hold a --max-background slot that nobody can abort."""

from __future__ import annotations

import asyncio
import time

import pytest

from cl_mcp.session import LispSession, SessionConfig
from cl_mcp.tools.evaluate import evaluate
from tests.integration.attach_fixtures import SwankServer, temporary_home

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

