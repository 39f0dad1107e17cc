"""inspect: an object as SLIME's inspector shows it, with a handle for each
part to drill in (the agent's `inspect-of`; the handles live in the image
until reset-session)."""

from __future__ import annotations

from typing import Any

from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, condition_structure, error_text
from cl_mcp.tools.calls import ask_agent, failure, lisp_seconds
from cl_mcp.wire import sexp
from cl_mcp.wire.sexp import Keyword, Symbol


def inspect_error(arguments: dict[str, Any], kind: str, message: str) -> Rendered:
    """A tool error whose structured content still fits inspect's outputSchema."""
    return Rendered(error_text(kind, message), True,
                    {"parts": [], "start": arguments.get("start", 0), "total": 0,
                     "error": condition_structure(kind, message)})


def part_line(part: dict[str, Any]) -> str:
    """``[handle] label: value``; a heading (no value) is its label alone."""
    if "handle" not in part:
        return part["label"]
    head = f"[{part['handle']}] "
    return head + (f"{part['label']}: {part['value']}" if part["label"] else part["value"])


def render_inspect(result: dict[str, Any]) -> Rendered:
    """``CLASS: printed``, the description, one line per part, and which
    parts these are when there are more; a later page has a one-line title
    instead of the first two."""
    parts = []
    for item in result.get("parts") or []:
        plist = dict(sexp.plist(item))
        part: dict[str, Any] = {"label": plist["label"], "value": plist["value"]}
        if isinstance(plist.get("handle"), int):
            part["handle"] = plist["handle"]
        parts.append(part)
    start, total = result["start"], result["total"]
    cut = result.get("cut") is True
    if start == 0:
        lines = [f"{result['class']}: {result['printed']}  [{result['handle']}]"]
        if result.get("description"):
            lines.append(result["description"])
    else:  # a later page: the printed form (up to 1,000 characters) was on the first
        lines = [f"{result['class']}  [{result['handle']}], continued (its printed form: start 0)"]
    lines += [part_line(part) for part in parts]
    if not parts and total == 0:
        lines.append("(no parts)")
    if start > 0 or start + len(parts) < total:
        shown = f"parts {start}–{start + len(parts) - 1}" if parts else f"no parts from {start}"
        more = f"; next page: start {start + len(parts)}" if start + len(parts) < total else ""
        lines.append(f"{shown} of {total}{more}")
    if cut:
        lines.append(f"(the inspector's content was cut after {total} parts)")
    structure: dict[str, Any] = {
        "handle": result["handle"], "class": result["class"], "printed": result["printed"],
        "description": result.get("description") or "", "parts": parts, "start": start, "total": total}
    if cut:
        structure["cut"] = True
    return Rendered("\n".join(lines), False, structure)


async def inspect(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """Inspect the value of code, an object shown earlier, or one of its parts."""
    code, handle, part = arguments.get("code"), arguments.get("handle"), arguments.get("part")
    if (code is None) == (handle is None):
        return inspect_error(arguments, "CL-MCP:INVALID-ARGUMENTS",
                             "Give either `code` (to inspect its value) or `handle` (an object shown earlier).")
    if part is not None and handle is None:
        return inspect_error(arguments, "CL-MCP:INVALID-ARGUMENTS", "`part` goes with `handle`.")
    timeout = session.config.eval_timeout
    form: list[Any] = [Symbol("cl-mcp-agent:inspect-of")]
    if code is not None:
        form += [Keyword("code"), code, Keyword("package"), arguments.get("package") or session.package,
                 Keyword("timeout"), lisp_seconds(timeout)]
    else:
        form += [Keyword("handle"), handle]
        if part is not None:
            form += [Keyword("part"), part]
    if arguments.get("start"):
        form += [Keyword("start"), arguments["start"]]
    result = await ask_agent(session, form, timeout, runs_code=code is not None)
    if failed := failure(result):
        return inspect_error(arguments, *failed)
    return render_inspect(result)
