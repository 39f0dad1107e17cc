"""invoke-restart, backtrace and eval-in-frame: acting on an evaluation that
waits at an error, as SLIME's debugger would, without a debugger window."""

from __future__ import annotations

from typing import Any

from cl_mcp.errors import SessionError
from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, error_result, render_frames
from cl_mcp.tools.calls import agent_plist, follow_package, result_dict
from cl_mcp.tools.evaluate import EVALUATION, Work, keep_output, rendered_within, sent_to_background
from cl_mcp.tools.run_tests import outcome_rendered
from cl_mcp.tools.window import answer_window, window_keywords
from cl_mcp.wire.sexp import Keyword, Symbol


async def invoke_restart(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """Continue a waiting evaluation through one of its restarts; its new
    outcome, as evaluate-lisp renders it (run-tests' result when a test run
    stopped by debug goes on to its end)."""
    timeout = arguments.get("timeout") or session.config.eval_timeout
    try:
        async with session.turn():
            tag = session.new_tag()
            form = [Symbol("cl-mcp-agent:invoke-restart-of"), arguments.get("evaluation"),
                    arguments["restart"],
                    Keyword("values"), [Symbol("cl:quote"), arguments.get("values") or []],
                    Keyword("frame"), arguments.get("frame"),
                    Keyword("timeout"), float(timeout), Keyword("tag"), tag,
                    # A long continuation goes on in the background.
                    *window_keywords(answer_window(None, session.config.answer_within, timeout))]
            result = await agent_plist(session, form, timeout, tag=tag)
            if result.get("status") == "running":
                sent_to_background(session, result, Work(EVALUATION.title, EVALUATION.base,
                                                          lambda outcome: outcome_rendered(session, outcome)))
            else:
                result["line-offsets"] = await keep_output(session, result)
                follow_package(session, result, explicit=True)
    except SessionError as error:
        return error_result(error.kind, error.message)
    return outcome_rendered(session, result)


async def backtrace(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """The frames, with their locals, of a waiting evaluation."""
    form = [Symbol("cl-mcp-agent:backtrace-of"), arguments.get("evaluation"),
            Keyword("count"), arguments.get("count", 20)]
    try:
        async with session.turn():
            result = await agent_plist(session, form, session.config.eval_timeout)
    except SessionError as error:
        return error_result(error.kind, error.message, {"frames": []})
    if result.get("status") != "ok":  # nothing waits there: the error alone
        error = result["error"]
        return error_result(error["type"], error["message"], {"frames": []})
    # Each frame's place is a plist of its own.
    result["frames"] = [(call, local_vars, result_dict(place))
                        for call, local_vars, place in result.get("frames") or []]
    return render_frames(result)


async def eval_in_frame(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """Evaluate code in a frame of a waiting evaluation."""
    timeout = session.config.eval_timeout
    try:
        async with session.turn():
            tag = session.new_tag()  # cancelling the call stops the code in the frame
            form = [Symbol("cl-mcp-agent:eval-in-frame-of"), arguments.get("evaluation"),
                    arguments["frame"], arguments["code"], Keyword("timeout"), float(timeout),
                    Keyword("tag"), tag]
            # Its output is its own, not the waiting evaluation's: not kept.
            result = await agent_plist(session, form, timeout, tag=tag)
    except SessionError as error:
        return error_result(error.kind, error.message)
    return rendered_within(result, session.config.max_result_chars)
