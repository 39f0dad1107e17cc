"""evaluate-lisp: read and evaluate code in the session's image (see
docs/tools.md)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from cl_mcp.errors import SessionError
from cl_mcp.lisp.session import LispSession
from cl_mcp.lisp.swank.connection import DEFAULT_PACKAGE
from cl_mcp.results import budget
from cl_mcp.results.outputs import Kept
from cl_mcp.results.render import Rendered, error_result, evaluation_structure, render_evaluation, with_reach
from cl_mcp.tools.calls import agent_plist, agent_value, follow_package, lisp_seconds
from cl_mcp.tools.window import answer_window, window_keywords
from cl_mcp.wire.sexp import Keyword, SExp, Symbol

log = logging.getLogger("cl_mcp.tools")

AGENT_MAX_OUTPUT = 1_000_000  # cl-mcp-agent:evaluate's default :max-output
SLICE = 1_000_000  # characters per output-slice: the agent's *inline-output*
SLICE_SECONDS = 25.0


# Made once: a frozen dataclass costs a microsecond to make, on every call.
_EVALUATE, _TIMEOUT, _TAG, _PACKAGE, _EXPLICIT, _CAPTURE, _MAX_OUTPUT = (
    Symbol("cl-mcp-agent:evaluate"), Keyword("timeout"), Keyword("tag"), Keyword("package"),
    Keyword("explicit-package"), Keyword("capture-time"), Keyword("max-output"))
_OUTPUT_SLICE = Symbol("cl-mcp-agent:output-slice")


def evaluate_form(session: LispSession, code: str, package: str | None, capture_time: bool,
                  timeout: float, tag: int, window: float | None) -> list[SExp]:
    """The agent call, with only what differs from its defaults: Swank reads
    every request, and each keyword (a float most of all) costs microseconds."""
    form: list[SExp] = [_EVALUATE, code, _TIMEOUT, lisp_seconds(timeout), _TAG, tag,
                        *window_keywords(window)]
    if (package or session.package) != DEFAULT_PACKAGE:
        form += [_PACKAGE, package or session.package]
    if package is not None:
        form += [_EXPLICIT, True]
    if capture_time:
        form += [_CAPTURE, True]
    if session.config.max_output != AGENT_MAX_OUTPUT:
        form += [_MAX_OUTPUT, session.config.max_output]
    return form


async def evaluate(session: LispSession, code: str, package: str | None = None,
                   capture_time: bool = False, timeout: float | None = None,
                   answer_within: float | None = None) -> dict[str, Any]:
    """Evaluate CODE; the agent's result plist as a dict.  Still running
    after ANSWER_WITHIN seconds (the server's --answer-within by default),
    it is answered "running" (see `rendered_running`) and runs on in the
    background."""
    timeout = timeout or session.config.eval_timeout
    window = answer_window(answer_within, session.config.answer_within, timeout)
    async with session.turn():
        tag = session.new_tag()
        form = evaluate_form(session, code, package, capture_time, timeout, tag, window)
        result = await agent_plist(session, form, timeout, tag=tag)
        if result.get("status") == "running":
            sent_to_background(session, result, EVALUATION)
            return result
        result["line-offsets"] = await keep_output(session, result)
        follow_package(session, result, explicit=package is not None)
        if (result.get("error") or {}).get("type") == "CL-MCP:IMAGE-EXITING":
            await session.image_exiting()
        return result


async def output_in_image(session: LispSession, number: int, stream: str, start: int,
                          total: int | None = None, beside: bool = False) -> str | None:
    """STREAM of evaluation NUMBER from character START to TOTAL (to its end
    when None), read from the image SLICE characters at a time, in the
    session's turn or BESIDE it; None when the image holds no output of
    NUMBER."""
    chunks: list[str] = []
    while total is None or start < total:
        end = start + SLICE if total is None else min(total, start + SLICE)
        piece = await agent_value(session, [_OUTPUT_SLICE, number, Keyword(stream), start, end],
                                  SLICE_SECONDS, beside=beside)
        if not isinstance(piece, str):
            return "".join(chunks) if chunks else None
        if not piece:
            break
        chunks.append(piece)
        start += len(piece)
    return "".join(chunks)


async def keep_output(session: LispSession, result: dict[str, Any], beside: bool = False) -> dict[str, int]:
    """Complete RESULT's streams with what its report left out, read in the
    session's turn (the caller still has it, so the image still holds them)
    or BESIDE it, and keep them, with the printed values, for read-output;
    the lines kept before them in each stream (`OutputStore.keep`)."""
    number = result.get("number")
    if not isinstance(number, int):
        return {}
    for stream in ("stdout", "stderr"):
        total = result.get(f"{stream}-length")
        if not isinstance(total, int):
            continue
        inline = result.get(stream) or ""
        result[stream] = inline + (await output_in_image(session, number, stream, len(inline), total, beside)
                                   or "")
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
    if number is not None and values:
        values[0] = with_reach(values[0], number)
    # Most results are far under the budget: rendered once and weighed
    # once, they need none of the fitting in `_fitted` (which renders each twice).
    whole = render_evaluation(_with_parts(result, result.get("stdout") or "",
                                          result.get("stderr") or "", values))
    structure = whole.structured or {}
    if isinstance(number, int):
        structure["number"] = number
    if len(whole.text) <= limit and budget.json_size(structure) <= limit:
        return Rendered(whole.text, whole.is_error, structure, fitted=True)
    return _fitted(result, values, offsets, limit)


def _with_parts(result: dict[str, Any], stdout: str, stderr: str, values: list[str]) -> dict[str, Any]:
    """RESULT with its output and values as given (cut, or as they were)."""
    return {**result, "stdout": stdout, "stderr": stderr,
            **({"values": values} if "values" in result else {})}


def _fitted(result: dict[str, Any], values: list[str], offsets: dict[str, int], limit: int) -> Rendered:
    """`rendered_within` for a result over the budget: its output and its
    VALUES cut in their middles until the text, and then the structure, fit."""
    number = result.get("number") if offsets else None
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
        return _with_parts(result, cut["stdout"], cut["stderr"],
                           [cut[f"value {index}"] for index in range(len(values))])

    text_parts = budget.fit_parts(parts, lambda cut: len(render_evaluation(with_parts(cut)).text),
                                  limit, how_to_read)
    rendered = render_evaluation(with_parts(text_parts))
    structure = evaluation_structure(with_parts(budget.fit_parts(
        parts, lambda cut: budget.json_size(evaluation_structure(with_parts(cut))), limit, how_to_read)))
    if isinstance(number, int):
        structure["number"] = number
    return Rendered(budget.fit_text(rendered.text, limit), rendered.is_error,
                    budget.fit_structure(structure, limit), fitted=True)


def await_call(number: int, abort: bool = False) -> str:
    stop = ', "abort": true' if abort else ""
    return f'await-evaluation {{"evaluation": {number}{stop}}}'


def latest_output(text: str, total: int, room: int, number: int, stream: str) -> str:
    """The end of a running evaluation's STREAM: TEXT, its last characters
    of TOTAL, within ROOM characters from the start of a line, after a line
    that says how many came before and how to read them."""
    earlier = total - len(text)
    if len(text) > room:
        cut = len(text) - room
        newline = text.find("\n", cut, len(text) - 1)
        cut = newline + 1 if newline >= 0 else cut
        earlier, text = earlier + cut, text[cut:]
    if earlier > 0:
        text = (f'… [{earlier:,} earlier characters: read-output {{"evaluation": {number}, '
                f'"stream": "{stream}"}} reads them]\n{text}')
    return text


@dataclass(frozen=True, slots=True)
class Work:
    """How work in the background shows: its name in a still-running
    result (with `{number}`), the fields its tool's outputSchema requires,
    and how its outcome renders (None: as an evaluation's)."""
    title: str
    base: dict[str, Any]
    render: Callable[[dict[str, Any]], Rendered] | None = None


EVALUATION = Work("Evaluation {number}", {"success": False, "stdout": "", "stderr": "", "warnings": []})


def sent_to_background(session: LispSession, running: dict[str, Any], work: Work) -> None:
    """Record WORK, whose call answered RUNNING ("still running"), for
    await-evaluation; and forget what the image forgot to make room."""
    session.background.add(running["number"], work, running.get("forgotten") or ())


def rendered_running(result: dict[str, Any], limit: int, work: Work = EVALUATION) -> Rendered:
    """WORK still running, in the background: a result, not an error, with
    how long it has run, its latest output, and how to follow it; within
    LIMIT characters."""
    number, elapsed = result["number"], result.get("elapsed-ms") or 0
    follow = await_call(number)
    head = (f"[running] {work.title.format(number=number)} is still running ({elapsed / 1000:.1f} s so far) and "
            f"goes on in the background.\n{follow} returns its outcome when it has one; "
            f'read-output {{"evaluation": {number}}} reads its output so far; '
            f"{await_call(number, abort=True)} stops it.")
    streams = [stream for stream in ("stdout", "stderr") if result.get(stream)]
    room = max(200, (limit - len(head) - 400) // max(1, len(streams)))
    structure: dict[str, Any] = {**work.base, "running": True, "number": number,
                                 "elapsedMs": elapsed, "follow": follow}
    sections = [head]
    for stream in streams:
        text = result[stream]
        shown = latest_output(text, result.get(f"{stream}-length") or len(text), room, number, stream)
        structure[stream] = shown
        sections.append(f"[{stream}] (latest)\n{shown.removesuffix(chr(10))}")
    return Rendered(budget.fit_text("\n\n".join(sections), limit), False,
                    budget.fit_structure(structure, limit), fitted=True)


def evaluation_rendered(session: LispSession, result: dict[str, Any]) -> Rendered:
    """An evaluation's report as the tool's result, within the budget."""
    limit = session.config.max_result_chars
    if result.get("status") == "running":
        return rendered_running(result, limit)
    dropped = (result.get("stdout-dropped") or 0) + (result.get("stderr-dropped") or 0)
    if dropped:
        log.warning("evaluation output truncated: %d characters beyond --max-output dropped", dropped)
    return rendered_within(result, limit)


async def evaluate_lisp(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    try:
        result = await evaluate(session, arguments["code"], package=arguments.get("package"),
                                capture_time=bool(arguments.get("capture-time", False)),
                                timeout=arguments.get("timeout"),
                                answer_within=arguments.get("answer-within"))
    except SessionError as error:
        return error_result(error.kind, error.message)
    return evaluation_rendered(session, result)
