"""evaluate-lisp: contracts/evaluate-lisp.md."""

from __future__ import annotations

import logging
from typing import Any

from cl_mcp.render import Rendered, error_result, render_evaluation
from cl_mcp.session import LispSession, SessionError

log = logging.getLogger("cl_mcp.tools")


async def evaluate_lisp(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    try:
        result = await session.evaluate(
            arguments["code"],
            package=arguments.get("package"),
            capture_time=bool(arguments.get("capture-time", False)),
            timeout=arguments.get("timeout"),
        )
    except SessionError as error:
        return error_result(error.kind, error.message)
    dropped = (result.get("stdout-dropped") or 0) + (result.get("stderr-dropped") or 0)
    if dropped:
        log.warning("evaluation output truncated: %d characters beyond --max-output dropped", dropped)
    return render_evaluation(result)
