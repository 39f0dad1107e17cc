"""evaluate-lisp: read and evaluate code in the session's image (see
docs/tools.md)."""

from __future__ import annotations

import logging
from typing import Any

from cl_mcp.errors import SessionError
from cl_mcp.render import Rendered, error_result, render_evaluation
from cl_mcp.session import LispSession
from cl_mcp.sexp import Keyword, SExp, Symbol
from cl_mcp.swank.client import DEFAULT_PACKAGE
from cl_mcp.tools.agent import DEADLINE_GRACE, follow_package, lisp_seconds, result_dict

log = logging.getLogger("cl_mcp.tools")

AGENT_MAX_OUTPUT = 1_000_000  # cl-mcp-agent:evaluate's default :max-output


def evaluate_form(session: LispSession, code: str, package: str | None, capture_time: bool,
                  timeout: float, tag: int) -> list[SExp]:
    """The agent call, with only what differs from its defaults: Swank reads
    every request, and each keyword (a float most of all) costs microseconds."""
    form: list[SExp] = [Symbol("cl-mcp-agent:evaluate"), code,
                        Keyword("timeout"), lisp_seconds(timeout), Keyword("tag"), tag]
    if (package or session.package) != DEFAULT_PACKAGE:
        form += [Keyword("package"), package or session.package]
    if package is not None:
        form += [Keyword("explicit-package"), True]
    if capture_time:
        form += [Keyword("capture-time"), True]
    if session.config.max_output != AGENT_MAX_OUTPUT:
        form += [Keyword("max-output"), session.config.max_output]
    return form


async def evaluate(session: LispSession, code: str, package: str | None = None,
                   capture_time: bool = False, timeout: float | None = None) -> dict[str, Any]:
    """Evaluate CODE; the agent's result plist as a dict."""
    timeout = timeout or session.config.eval_timeout
    async with session.turn():
        tag = session.new_tag()
        form = evaluate_form(session, code, package, capture_time, timeout, tag)
        result = result_dict(await session.call(form, timeout + DEADLINE_GRACE, tag))
        follow_package(session, result, explicit=package is not None)
        if (result.get("error") or {}).get("type") == "CL-MCP:IMAGE-EXITING":
            await session.image_exiting()
        return result


async def evaluate_lisp(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    try:
        result = await evaluate(session, arguments["code"], package=arguments.get("package"),
                                capture_time=bool(arguments.get("capture-time", False)),
                                timeout=arguments.get("timeout"))
    except SessionError as error:
        return error_result(error.kind, error.message)
    dropped = (result.get("stdout-dropped") or 0) + (result.get("stderr-dropped") or 0)
    if dropped:
        log.warning("evaluation output truncated: %d characters beyond --max-output dropped", dropped)
    return render_evaluation(result)
