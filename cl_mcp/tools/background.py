"""await-evaluation: the outcome of an evaluation running in the background
(see docs/tools.md).

An evaluation still running at the close of its answer window answered its
call "still running" and runs on in its own thread in the image.  This tool
waits for its outcome without the session's turn, in a Swank thread of its
own, so that every other call goes on meanwhile; the outcome comes back in
evaluate-lisp's shape, its output kept for read-output as any other's.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from cl_mcp.errors import SessionError
from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, error_result
from cl_mcp.tools.calls import agent_plist, agent_value, follow_package, lisp_seconds
from cl_mcp.tools.evaluate import EVALUATION, evaluation_rendered, keep_output, rendered_running
from cl_mcp.wire.sexp import Keyword, Symbol

ABORT_SECONDS = 15.0  # the image gives an aborted evaluation 10 s to unwind, and the grace comes on top


def already_fetched(number: int, base: dict[str, Any]) -> Rendered:
    """The answer to an await-evaluation that lost its outcome to another."""
    return error_result("CL-MCP:ALREADY-FETCHED",
                        f"The outcome of evaluation {number} was handed to another await-evaluation "
                        f'call; read-output {{"evaluation": {number}}} reads its output.', base)


def taken_by_another(session: LispSession, result: dict[str, Any], number: int,
                     stint: int | None) -> bool:
    """True when the image has no outcome of NUMBER because another call
    claimed the STINT this one began in: however the two met in the image
    (its outcome forgotten before this call looked), this one is told so."""
    error = result.get("error") if result.get("status") == "error" else None
    return (isinstance(error, dict) and error.get("type") == "CL-MCP:NO-SUCH-EVALUATION"
            and session.background.handed_out(number, stint))


async def await_evaluation(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    number = arguments["evaluation"]
    work = session.background.work(number, EVALUATION)
    stint = session.background.stint(number)
    window = session.config.answer_within
    wait = min(arguments.get("wait", window), window)
    abort = bool(arguments.get("abort", False))
    form = [Symbol("cl-mcp-agent:await-evaluation-of"), number, Keyword("wait"), lisp_seconds(wait)]
    if abort:
        form += [Keyword("abort"), True]
    try:
        result = await agent_plist(session, form, ABORT_SECONDS if abort else wait, beside=True)
        if taken_by_another(session, result, number, stint):
            return already_fetched(number, work.base)
        if result.get("status") != "running" and result.get("number") == number:
            # Two overlapping calls may both be shown the outcome: the
            # first to claim it keeps it, so its output is kept once.
            if not session.background.claim(number, stint):
                return already_fetched(number, work.base)
            # The outcome stays in the image until it is kept here: a call
            # cancelled before this point loses nothing.
            try:
                result["line-offsets"] = await keep_output(session, result, beside=True)
            except BaseException:
                session.background.release(number, stint)
                raise
            try:  # kept: the image may forget it, whatever happens to this call
                await asyncio.shield(agent_value(
                    session, [Symbol("cl-mcp-agent:forget-outcome"), number], 0, beside=True))
            finally:
                session.background.kept(number, stint)
        elif result.get("status") != "running":
            session.background.discard(number)
        if result.get("status") != "running":
            follow_package(session, result, explicit=True)
    except SessionError as error:
        return error_result(error.kind, error.message, work.base)
    if result.get("status") == "running":
        return rendered_running(result, session.config.max_result_chars, work)
    if work.render is not None and result.get("number") == number:
        return work.render(result)
    return evaluation_rendered(session, result)


def running_message(running: dict[str, Any]) -> str:
    """One line on a still-running evaluation: a task's status message."""
    latest = (running.get("stdout") or "").rstrip("\n").rpartition("\n")[2]
    return (f"evaluation {running['number']} running for {running.get('elapsedMs', 0) / 1000:.0f} s"
            + (f"; latest output: {latest[:200]}" if latest else ""))


async def follow_to_outcome(session: LispSession, rendered: Rendered,
                            note: Callable[[str], None]) -> Rendered:
    """RENDERED, or, while it says its evaluation still runs in the
    background, await-evaluation's next result, until the outcome; NOTE
    hears each still-running answer.  Cancelled, it stops the evaluation."""
    while isinstance(rendered.structured, dict) and rendered.structured.get("running"):
        number = rendered.structured["number"]
        note(running_message(rendered.structured))
        try:
            rendered = await await_evaluation(session, {"evaluation": number})
        except asyncio.CancelledError:
            await asyncio.shield(await_evaluation(session, {"evaluation": number, "abort": True}))
            raise
    return rendered
