"""read-output: the kept output of an earlier evaluation, by lines or by a
regular expression, within the result budget (see cl_mcp/results/outputs.py).
An evaluation's output is kept on this side once its outcome is; the
output so far of one still running in the background is read from the
image (output-slice), beside the session's turn."""

from __future__ import annotations

import asyncio
from itertools import islice
from typing import Any

from cl_mcp.errors import SessionError
from cl_mcp.lisp.session import LispSession
from cl_mcp.results.linepattern import LinePattern, PatternError
from cl_mcp.results.outputs import Lines, NotKept
from cl_mcp.results.render import Rendered, condition_structure, error_text
from cl_mcp.tools.evaluate import output_in_image, read_call

CONTEXT = 1  # lines shown before and after a matching line
MAX_MATCHES = 10_000  # matching lines looked at, at most


def numbered(lines: Lines, number: int, mark: str, room: int) -> str:
    """``   NUMBER: text`` (MARK ``:`` for a line asked for, ``-`` for
    context); a line longer than ROOM keeps its start and says so."""
    text = lines.line(number)
    if len(text) > room:
        text = f"{text[:room]}… [{len(text) - room:,} more characters on this line]"
    return f"{number:>7}{mark} {text}"


def read_slice(lines: Lines, offset: int, last: int, limit: int) -> tuple[list[str], int]:
    """Lines OFFSET to LAST, as long as they fit in LIMIT characters; the
    number of the first line not shown."""
    shown: list[str] = []
    used = 0
    for number in range(offset, last + 1):
        line = numbered(lines, number, ":", max(200, limit // 4))
        if used + len(line) + 1 > limit:
            return shown, number
        shown.append(line)
        used += len(line) + 1
    return shown, last + 1


def search(lines: Lines, pattern: LinePattern, limit: int) -> tuple[list[str], int, int | None]:
    """The lines matching PATTERN (``:``) with CONTEXT lines around them
    (``-``), groups apart separated by ``--``, as long as they fit in
    LIMIT; the number of matching lines, and the first matching line not
    shown (or None)."""
    matching = list(islice(pattern.lines(lines.text), MAX_MATCHES))
    wanted = sorted({each for number in matching
                     for each in range(max(1, number - CONTEXT), min(len(lines), number + CONTEXT) + 1)})
    is_match = set(matching)
    shown: list[str] = []
    used, previous = 0, 0
    for number in wanted:
        line = numbered(lines, number, ":" if number in is_match else "-", max(200, limit // 8))
        gap = ["--"] if previous and number > previous + 1 else []
        size = sum(len(each) + 1 for each in [*gap, line])
        if used + size > limit:
            return shown, len(matching), next((m for m in matching if m >= number), None)
        shown += [*gap, line]
        used += size
        previous = number
    return shown, len(matching), None


def search_for(lines: Lines, pattern: str, limit: int) -> tuple[list[str], int, int | None]:
    """`search` for PATTERN, compiled here; raises PatternError."""
    return search(lines, LinePattern(pattern), limit)


async def output_so_far(session: LispSession, evaluation: int, stream: str) -> str:
    """STREAM of EVALUATION, running in the background: its output so far,
    read from the image (it is kept here once its outcome is)."""
    text = await output_in_image(session, evaluation, stream, 0, beside=True)
    if text is None:
        raise NotKept(f"Evaluation {evaluation} is no longer in the background, and its "
                      "output was not kept (await-evaluation gives its outcome).")
    return text


def read_error(arguments: dict[str, Any], kind: str, message: str) -> Rendered:
    """A tool error whose structured content still fits read-output's outputSchema."""
    return Rendered(error_text(kind, message), True,
                    {"evaluation": arguments["evaluation"], "stream": arguments.get("stream", "stdout"),
                     "totalLines": 0, "lines": [], "error": condition_structure(kind, message)})


async def read_output(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """A slice of an earlier evaluation's stdout, stderr or printed values,
    or the lines a regular expression matches, numbered."""
    evaluation, stream = arguments["evaluation"], arguments.get("stream", "stdout")
    try:
        if evaluation in session.background and stream != "values":
            lines = Lines(await output_so_far(session, evaluation, stream))
        else:
            lines = session.outputs.lines(evaluation, stream)
    except NotKept as reason:
        return read_error(arguments, "CL-MCP:OUTPUT-NOT-KEPT", str(reason))
    except SessionError as error:
        return read_error(arguments, error.kind, error.message)
    limit = session.config.max_result_chars - 400  # the heading and the closing line
    pattern_text = arguments.get("pattern")
    what = f"{stream} of evaluation {evaluation}"
    structure: dict[str, Any] = {"evaluation": evaluation, "stream": stream, "totalLines": len(lines)}
    if pattern_text is not None:
        # RE2 lets go of the GIL while it searches: over megabytes, a pattern
        # its DFA cannot cache (e.g. [xy]*x[xy]{30}z) takes seconds, which
        # must not hold the event loop (ping, cancel, the other calls).  RE2
        # keeps the GIL while it compiles, in the worker too: the schema caps
        # a pattern's length (a 20 MB one took 1.4 s to refuse).
        try:
            shown, count, next_line = await asyncio.to_thread(search_for, lines, pattern_text, limit)
        except PatternError as error:
            return read_error(arguments, "CL-MCP:INVALID-PATTERN",
                              f"The pattern {pattern_text!r} cannot be searched: {error}. Patterns "
                              "are RE2's syntax: Python's without backreferences or lookaround, "
                              "so that a search takes time linear in the output.")
        heading = (f"[{what}: {count:,} line{'s' if count != 1 else ''} of {len(lines):,} match "
                   f"/{pattern_text}/]")
        closing = (f"… matches from line {next_line} on not shown: "
                   f"{read_call(evaluation, stream, next_line, 100)}" if next_line else None)
        structure["matches"] = count
    else:
        offset = arguments.get("offset", 1)
        last = len(lines) if "length" not in arguments else min(len(lines), offset + arguments["length"] - 1)
        shown, next_line = read_slice(lines, offset, last, limit)
        if not shown and offset > len(lines):
            heading = f"[{what}: {len(lines):,} lines; none from line {offset} on]"
        else:
            heading = f"[{what}: lines {offset}–{next_line - 1} of {len(lines):,}]"
        closing = (f"… lines {next_line}–{last} not shown: "
                   f"{read_call(evaluation, stream, next_line, last - next_line + 1)}"
                   if next_line <= last else None)
    structure["lines"] = shown
    text = "\n".join([heading, *shown, *([closing] if closing else [])])
    return Rendered(text, False, structure)
