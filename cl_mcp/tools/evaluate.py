"""evaluate-lisp: read and evaluate code in the session's image (see
docs/tools.md)."""

from __future__ import annotations

import logging
from typing import Any

from cl_mcp import budget
from cl_mcp.errors import SessionError
from cl_mcp.outputs import Kept
from cl_mcp.render import Rendered, error_result, evaluation_structure, render_evaluation
from cl_mcp.session import LispSession
from cl_mcp.sexp import Keyword, SExp, Symbol
from cl_mcp.swank.client import DEFAULT_PACKAGE
from cl_mcp.tools.agent import DEADLINE_GRACE, follow_package, lisp_seconds, result_dict

log = logging.getLogger("cl_mcp.tools")

AGENT_MAX_OUTPUT = 1_000_000  # cl-mcp-agent:evaluate's default :max-output
SLICE = 1_000_000  # characters per output-slice: the agent's *inline-output*
SLICE_DEADLINE = 30.0


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
        result["line-offsets"] = await keep_output(session, result)
        follow_package(session, result, explicit=package is not None)
        if (result.get("error") or {}).get("type") == "CL-MCP:IMAGE-EXITING":
            await session.image_exiting()
        return result


async def keep_output(session: LispSession, result: dict[str, Any]) -> dict[str, int]:
    """Complete RESULT's streams with what its report left out (the caller
    still has the turn, so the image still holds them), and keep them, with
    the printed values, for read-output; the lines kept before them in
    each stream (`OutputStore.keep`)."""
    number = result.get("number")
    if not isinstance(number, int):
        return {}
    for stream in ("stdout", "stderr"):
        total = result.get(f"{stream}-length")
        if not isinstance(total, int):
            continue
        chunks = [result.get(stream) or ""]
        have = len(chunks[0])
        while have < total:
            piece = await session.call([Symbol("cl-mcp-agent:output-slice"), number, Keyword(stream),
                                        have, min(total, have + SLICE)], SLICE_DEADLINE)
            if not isinstance(piece, str) or not piece:
                break
            chunks.append(piece)
            have += len(piece)
        result[stream] = "".join(chunks)
    return session.outputs.keep(number, Kept(result.get("stdout") or "", result.get("stderr") or "",
                                             "\n".join(result.get("values") or [])))


def read_call(number: int, stream: str, line: int, lines: int) -> str:
    return (f'read-output {{"evaluation": {number}, "stream": "{stream}", '
            f'"offset": {line}, "length": {lines}}}')


def rendered_within(result: dict[str, Any], limit: int) -> Rendered:
    """RESULT rendered as evaluate-lisp's result, its text and its
    structured content each within LIMIT characters: long output and long
    values cut in their middles, each cut saying how to read the rest
    (RESULT's "line-offsets": the lines kept before its output, as
    `keep_output` returned them; no read-output call without them)."""
    offsets = result.get("line-offsets") or {}
    number = result.get("number") if offsets else None
    values = list(result.get("values") or [])
    parts = {"stdout": result.get("stdout") or "", "stderr": result.get("stderr") or "",
             **{f"value {index}": value for index, value in enumerate(values)}}
    # Where each value starts in the kept "values" stream.
    starts = [1]
    for value in values:
        starts.append(starts[-1] + value.count("\n") + 1)

    def how_to_read(part: str, line: int, lines: int) -> str:
        if number is None:
            return "not kept"
        if not part.startswith("value "):
            return read_call(number, part, offsets[part] + line, lines)
        index = int(part.split()[1])
        reach = f"; the value itself: (cl-mcp-agent:value {number})" if index == 0 else ""
        return read_call(number, "values", starts[index] + line - 1, lines) + reach

    def with_parts(cut: dict[str, str]) -> dict[str, Any]:
        values_cut = [cut[f"value {index}"] for index in range(len(values))]
        return {**result, "stdout": cut["stdout"], "stderr": cut["stderr"],
                **({"values": values_cut} if "values" in result else {})}

    text_parts = budget.fit_parts(parts, lambda cut: len(render_evaluation(with_parts(cut)).text),
                                  limit, how_to_read)
    rendered = render_evaluation(with_parts(text_parts))
    structure = evaluation_structure(with_parts(budget.fit_parts(
        parts, lambda cut: budget.json_size(evaluation_structure(with_parts(cut))), limit, how_to_read)))
    if isinstance(number, int):
        structure["number"] = number
    return Rendered(budget.fit_text(rendered.text, limit), rendered.is_error,
                    budget.fit_structure(structure, limit))


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
    return rendered_within(result, session.config.max_result_chars)
