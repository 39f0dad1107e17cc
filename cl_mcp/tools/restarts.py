"""invoke-restart, backtrace and eval-in-frame: acting on an evaluation that
waits at an error, as SLIME's debugger would, without a debugger window."""

from __future__ import annotations

from typing import Any

from cl_mcp.render import Rendered, error_result, render_evaluation, render_frames
from cl_mcp.session import LispSession, SessionError


async def invoke_restart(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    try:
        result = await session.invoke_restart(
            arguments["restart"], evaluation=arguments.get("evaluation"),
            values=arguments.get("values"), timeout=arguments.get("timeout"))
    except SessionError as error:
        return error_result(error.kind, error.message)
    return render_evaluation(result)


async def backtrace(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    try:
        result = await session.backtrace(arguments.get("evaluation"), arguments.get("count", 20))
    except SessionError as error:
        return error_result(error.kind, error.message)
    if result.get("status") != "ok":
        return render_evaluation(result)
    return render_frames(result)


async def eval_in_frame(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    try:
        result = await session.eval_in_frame(arguments["frame"], arguments["code"],
                                             arguments.get("evaluation"))
    except SessionError as error:
        return error_result(error.kind, error.message)
    return render_evaluation(result)
