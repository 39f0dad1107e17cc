"""invoke-restart, backtrace and eval-in-frame: acting on an evaluation that
waits at an error, as SLIME's debugger would, without a debugger window."""

from __future__ import annotations

from typing import Any

from cl_mcp.render import Rendered, error_result, render_evaluation, render_frames
from cl_mcp.session import LispSession, SessionError


def whole(value: Any) -> Any:
    """JSON Schema takes 1.0 for an integer; Lisp must get 1."""
    return int(value) if isinstance(value, float) else value


async def invoke_restart(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    try:
        result = await session.invoke_restart(
            whole(arguments["restart"]), evaluation=whole(arguments.get("evaluation")),
            values=arguments.get("values"), timeout=arguments.get("timeout"))
    except SessionError as error:
        return error_result(error.kind, error.message)
    return render_evaluation(result)


async def backtrace(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    try:
        result = await session.backtrace(whole(arguments.get("evaluation")),
                                         whole(arguments.get("count", 20)))
    except SessionError as error:
        return error_result(error.kind, error.message)
    if result.get("status") != "ok":
        return render_evaluation(result)
    return render_frames(result)


async def eval_in_frame(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    try:
        result = await session.eval_in_frame(whole(arguments["frame"]), arguments["code"],
                                             whole(arguments.get("evaluation")))
    except SessionError as error:
        return error_result(error.kind, error.message)
    return render_evaluation(result)
