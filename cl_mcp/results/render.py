"""The contract's result text, and the same facts as structured content,
from the agent's plists.  Pure: no I/O.

evaluate-lisp's result text (docs/tools.md):

    [stdout]            omitted when empty
    [stderr]            omitted when empty
    [warnings]          TYPE: message, one per line; omitted when empty
    => value            one line per value
    ; Evaluation N      the evaluation's number, when it has one

An error starts with ``[ERROR] TYPE``, the condition's message and
``[Backtrace]``; output and warnings captured before the error follow in
their usual sections.  Sections are separated by one blank line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

TRUNCATION_MARKER = "… [{count} more characters truncated]"
# The agent's last line of a value cut by *print-length* or *print-level*
# (agent/output.lisp, `printer-cut-marker').
PRINTER_CUT_MARKER = re.compile(r"\n(… \[cut by \*print-length\* \d+ or \*print-level\* \d+)\]\Z")


def with_reach(value: str, number: int) -> str:
    """VALUE, evaluation NUMBER's printed primary value, its printer-cut
    marker (if any) saying how to reach the value itself, as a marker of a
    value cut for the budget does."""
    return PRINTER_CUT_MARKER.sub(
        lambda match: f"\n{match[1]}; the value itself: (cl-mcp-agent:value {number})]", value)


@dataclass(frozen=True, slots=True)
class Rendered:
    text: str
    is_error: bool
    # structuredContent (2025-06-18 and later), matching the tool's outputSchema.
    structured: dict[str, Any] | None = None
    # Both already within the session's result budget (--max-result-chars):
    # the evaluation tools fit their own, with read-output markers.
    fitted: bool = False
    # The list of STRUCTURED whose items left out its `truncated` counts:
    # those the result budget cuts from it count too (`within_budget`).
    counted: str | None = None


def condition_structure(kind: str, message: str, backtrace: Sequence[str] = ()) -> dict[str, Any]:
    """A LispCondition (schemas/shared-types.json): type, message, and the
    backtrace as numbered lines when there is one."""
    condition: dict[str, Any] = {"type": kind, "message": message}
    if backtrace:
        condition["backtrace"] = "\n".join(f"{i}: {frame}" for i, frame in enumerate(backtrace))
    return condition


def error_result(kind: str, message: str, shape: dict[str, Any] | None = None) -> Rendered:
    """A failure of cl-mcp itself (the image was lost, ...) as a tool error,
    its structured content the tool's SHAPE (its outputSchema's required
    fields, empty; evaluate-lisp's by default) with the error."""
    return Rendered(error_text(kind, message), True,
                    {**(shape or {"success": False}), "error": condition_structure(kind, message)})


INVALID_ARGUMENTS = "CL-MCP:INVALID-ARGUMENTS"


def invalid_arguments(tool: str, problems: Sequence[str]) -> Rendered:
    """Arguments that fail TOOL's inputSchema, as the tool error a model
    reads and corrects (protocol 2025-11-25 on, SEP-1303): each problem
    (`at POINTER: REASON`) on a line of its own.  No structuredContent:
    the tool never ran, and an error result need not match the
    outputSchema."""
    if len(problems) == 1:
        message = f"Invalid arguments for {tool}: {problems[0]}"
    else:
        message = "\n".join([f"Invalid arguments for {tool}:", *problems])
    return Rendered(error_text(INVALID_ARGUMENTS, message), True)


def evaluation_structure(result: dict[str, Any]) -> dict[str, Any]:
    """An EvaluationResult (schemas/shared-types.json), with the extra facts
    of evaluation-result.json."""
    status = result.get("status")
    structure: dict[str, Any] = {"success": status == "ok"}
    if status == "ok":
        structure["values"] = list(result.get("values") or [])
    structure["stdout"] = result.get("stdout") or ""
    structure["stderr"] = result.get("stderr") or ""
    warnings = result.get("warnings")
    structure["warnings"] = ([condition_structure(kind, message) for kind, message in warnings]
                             if warnings else [])
    if status == "aborted":
        structure["aborted"] = True
    elif status != "ok":
        error = result["error"]
        structure["error"] = condition_structure(error["type"], error["message"],
                                                 error.get("backtrace") or ())
        if result.get("restarts"):
            structure["restarts"] = [{"name": name, "description": description}
                                     for name, description in result["restarts"]]
        if result.get("evaluation"):
            structure["evaluation"] = result["evaluation"]
    if isinstance(result.get("package"), str):
        structure["package"] = result["package"]
    stdout_dropped, stderr_dropped = result.get("stdout-dropped") or 0, result.get("stderr-dropped") or 0
    if stdout_dropped or stderr_dropped:
        structure["truncated"] = {"stdout": stdout_dropped, "stderr": stderr_dropped}
    if result.get("timing"):
        real, run, gc, consed = result["timing"]
        structure["timing"] = {"realMs": real, "runMs": run, "gcMs": gc, "bytesConsed": consed}
    return structure


def _output_section(title: str, text: str, dropped: int) -> str:
    # The section ends where the output does: one final newline is the
    # separator's job, not the content's.
    body = text[:-1] if text.endswith("\n") else text
    if dropped:
        body += ("\n" if body else "") + TRUNCATION_MARKER.format(count=dropped)
    return f"[{title}]\n{body}"


def _warnings_section(warnings: Sequence[Sequence[str]]) -> str:
    lines = [f"{kind}: {message}" for kind, message in warnings]
    return "[warnings]\n" + "\n".join(lines)


def _restarts_section(restarts: Sequence[Sequence[str]], evaluation: int | None) -> str:
    lines = [f"{index}: [{name}] {description}" for index, (name, description) in enumerate(restarts)]
    if evaluation:
        lines.append(f"Evaluation {evaluation} is waiting at this error: invoke-restart continues "
                     "it; backtrace and eval-in-frame inspect it.")
    return "[Restarts]\n" + "\n".join(lines)


def render_frames(result: dict[str, Any]) -> Rendered:
    """The backtrace tool's text: each frame, the place of the form it is
    running, then its locals, indented."""
    whose = (" (another assistant's, in this shared image: it can be read here, not taken on)"
             if result.get("another-sessions") is True else "")
    lines = [f"[Backtrace of evaluation {result.get('evaluation')}]{whose}"]
    frames = []
    for index, (frame, local_vars, place) in enumerate(result.get("frames") or []):
        lines.append(f"{index}: {frame}")
        if (place_line := frame_place_line(place)) is not None:
            lines.append(f"     {place_line}")
        lines += [f"     {name} = {value}" for name, value in local_vars or []]
        frames.append({"index": index, "call": frame, **frame_place_structure(place),
                       "locals": [{"name": name, "value": value} for name, value in local_vars or []]})
    return Rendered("\n".join(lines), False,
                    {"evaluation": result.get("evaluation"), "frames": frames})


def frame_place_line(place: dict[str, Any]) -> str | None:
    """`at FILE:LINE:COLUMN` and the first line of the form there; for code
    compiled from a form (an evaluation), that it has no file and the form;
    nothing when SBCL knows no place (its own functions, whose sources are
    not installed)."""
    if "file" in place:
        form = (place.get("snippet") or "").partition("\n")[0]
        return f"at {place['file']}:{place['line']}:{place['column']}{place_change(place)}: {form}"
    if "form" in place:
        return f"{place.get('error')}: {place['form']}"
    return None


def frame_place_structure(place: dict[str, Any]) -> dict[str, Any]:
    """A frame's place for structuredContent: as `place_structure` gives it,
    or for evaluated code its `form` and the defining `evaluation` when known."""
    structure = place_structure(place)
    for key in ("form", "evaluation"):
        if key in place and "file" not in place:
            structure[key] = place[key]
    return structure


def timing_line(timing: Sequence[int]) -> str:
    real, run, gc, consed = timing
    return f"; Timing: {real}ms real, {run}ms run, {gc}ms GC, {consed} bytes consed"


def number_line(number: int) -> str:
    """The last line of a result that has an evaluation number: the model
    reads the text, not always the structured content, and needs the number
    for read-output, await-evaluation and (cl-mcp-agent:value N)."""
    return f"; Evaluation {number}"


NUMBER_SECTION = re.compile(r"\n\n; Evaluation \d+\Z")


def without_number_line(text: str) -> str:
    """TEXT without the number line that ends it, if it has one: for a
    reader to whom the number reaches nothing (`cl-mcp eval`: its image is
    gone once it has printed)."""
    return NUMBER_SECTION.sub("", text)


def error_text(kind: str, message: str, backtrace: Sequence[str] = ()) -> str:
    """``[ERROR] TYPE`` / message, and the backtrace section when there is one."""
    text = f"[ERROR] {kind}\n{message}"
    if backtrace:
        frames = "\n".join(f"{index}: {frame}" for index, frame in enumerate(backtrace))
        text += f"\n\n[Backtrace]\n{frames}"
    return text


def render_evaluation(result: dict[str, Any]) -> Rendered:
    """The text of an evaluate-lisp result from the agent's plist."""
    sections: list[str] = []
    status = result.get("status")
    structure = evaluation_structure(result)
    is_error = status not in ("ok", "aborted")
    if status == "aborted":
        sections.append("The evaluation was aborted.")
    elif is_error:
        error = result["error"]
        sections.append(error_text(error["type"], error["message"], error.get("backtrace") or ()))
        if result.get("restarts"):
            sections.append(_restarts_section(result["restarts"], result.get("evaluation")))
    # Each section only when it has something to say (most results have one value).
    for stream in ("stdout", "stderr"):
        text, dropped = result.get(stream, ""), result.get(f"{stream}-dropped", 0)
        if text or dropped:
            sections.append(_output_section(stream, text, dropped))
    if result.get("warnings"):
        sections.append(_warnings_section(result["warnings"]))
    if status == "ok":
        values = result.get("values") or []
        sections.append("\n".join([f"=> {value}" for value in values]) if values else "; No values")
    if result.get("timing"):
        sections.append(timing_line(result["timing"]))
    if isinstance(result.get("number"), int):
        sections.append(number_line(result["number"]))
    return Rendered("\n\n".join(sections), is_error, structure)


# ---------------------------------------------------------------- places (the development tools)

def place_structure(place: dict[str, Any]) -> dict[str, Any]:
    """A source place for structuredContent: `file` (absolute), `line` and
    `column` (1-based) and `snippet` (the first lines of the form there) in
    the file as it is now, `place` (unchanged, found-after-edit or not-found
    since it was compiled) and `compiledLine` (the line it had, unless unchanged);
    or `{"error": why}` when it has none (a definition made at the REPL)."""
    if "file" not in place:
        return {"error": str(place.get("error") or "no source location")}
    structure = {"file": place["file"], "line": place["line"], "column": place["column"],
                 "snippet": place.get("snippet") or ""}
    if isinstance(place.get("status"), str):
        structure["place"] = place["status"]
    if isinstance(place.get("compiled-line"), int):
        structure["compiledLine"] = place["compiled-line"]
    return structure


def place_change(place: dict[str, Any], this: str = "this", gone: str = "not found") -> str:
    """What became of a place since it was compiled, for the text: nothing
    when it is where it was, else `(the file was edited since THIS was
    compiled at line N)` or `(GONE in the file as it is now; line N when
    compiled)`, N "not known" when the text compiled is (code loaded from
    fasls that cl-mcp did not load, its file edited since)."""
    status, compiled = place.get("status"), place.get("compiled-line")
    if status == "found-after-edit":
        if compiled is None:
            return f" (the file was edited since {this} was compiled; its line then is not known)"
        return f" (the file was edited since {this} was compiled at line {compiled})"
    if status == "not-found":
        if compiled is None:
            return f" ({gone} in the file as it is now; its line when compiled is not known)"
        return f" ({gone} in the file as it is now; line {compiled} when compiled)"
    return ""


def place_text(place: dict[str, Any], indent: str = "  ") -> str:
    """`FILE:LINE:COLUMN` and the snippet below it, indented; or the reason
    there is no place."""
    if "file" not in place:
        return f"{indent}(no source file: {place.get('error') or 'unknown'})"
    lines = [f"{indent}{place['file']}:{place['line']}:{place['column']}{place_change(place)}"]
    lines += [f"{indent}  {line}" for line in (place.get("snippet") or "").splitlines()]
    return "\n".join(lines)
