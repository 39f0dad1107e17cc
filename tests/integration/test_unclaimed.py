"""Outcomes of background work nobody fetches are bounded: the image keeps
at most 16 such evaluations (forgetting the oldest finished one), and the
session's record of them mirrors the image's, so neither grows."""

from __future__ import annotations

import asyncio

from cl_mcp.lisp.config import SessionConfig
from cl_mcp.lisp.session import LispSession
from cl_mcp.tools.background import await_evaluation
from cl_mcp.tools.evaluate import evaluate

MAX_UNCLAIMED = 16  # agent/registries.lisp's *max-unclaimed*, as docs/tools.md gives it


async def unclaimed_outcomes() -> None:
    session = LispSession(SessionConfig(max_background=8))
    try:
        numbers = []
        for _ in range(MAX_UNCLAIMED + 3):
            result = await evaluate(session, "(sleep 0.3)", answer_within=0.05)
            assert result["status"] == "running", result
            numbers.append(result["number"])
        await asyncio.sleep(0.5)  # every one has finished; none was fetched
        kept = await evaluate(session, "(length cl-mcp-agent::*background*)")
        assert kept["values"] == [str(MAX_UNCLAIMED)]
        assert len(session.background) == MAX_UNCLAIMED
        assert numbers[0] not in session.background and numbers[3] in session.background

        forgotten = await await_evaluation(session, {"evaluation": numbers[0]})
        assert forgotten.is_error and "to keep at most 16 evaluations in the background" in forgotten.text
        fetched = await await_evaluation(session, {"evaluation": numbers[3]})
        assert fetched.text.startswith("=> NIL") and not fetched.is_error, fetched.text
        assert len(session.background) == MAX_UNCLAIMED - 1
    finally:
        await session.close()


def test_unclaimed_outcomes_are_bounded_in_the_image_and_the_session():
    asyncio.run(unclaimed_outcomes())
