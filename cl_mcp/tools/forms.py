"""compile-form: one top-level form of a file, as SLIME's C-c C-c compiles
the form around point (the agent's `compile-form-of`).  The definitions it
makes record the file and the form's place, so find-definition, xref and
describe-symbol place them in the file."""

from __future__ import annotations

from typing import Any

from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, condition_structure, error_text
from cl_mcp.tools.calls import ask_agent, result_dict, strings
from cl_mcp.tools.code import counts_text, note_structure, note_text
from cl_mcp.wire.sexp import Symbol



def render_compiled_form(result: dict[str, Any], notes_mode: str = "warnings") -> Rendered:
    """``Compiled the form at FILE:LINE-END (package P): N notes``, what it
    defined, then one block per note listed: with NOTES_MODE "warnings",
    as compile-file's, the plain compiler notes are counted, not listed."""
    every = [result_dict(note) for note in result.get("notes") or []]
    notes = every if notes_mode == "all" else [note for note in every if note["severity"] != "note"]
    plain = len(every) - len(notes)
    counts = [{"file": result["file"], "count": plain}] if plain else []
    dropped = result.get("dropped") or 0
    success = result.get("success") is True
    defined = strings(result.get("defined"))
    error = result.get("error") if isinstance(result.get("error"), dict) else None
    total = len(notes) + dropped
    count = f"{total} note" + ("" if total == 1 else "s")
    place = f"{result['file']}:{result['line']}" + (
        f"-{result['end-line']}" if result["end-line"] != result["line"] else "")
    head = f"{'Compiled' if success else 'Compiling'} the form at {place} (package {result['package']})"
    if plain:
        count += f" listed, {plain} compiler note{'' if plain == 1 else 's'} counted"
    head += f": {count}" if success else f" failed: {count}"
    sections = [error_text("CL-MCP:COMPILATION-FAILED", head) if not success else head]
    if error:
        sections.append(error_text(error["type"], error["message"]))
    sections[-1] += "\ndefined: " + (", ".join(defined) if defined else "nothing named")
    sections += [note_text(note) for note in notes]
    if dropped:
        sections.append(f"… and {dropped} more notes, not listed")
    if counts:
        sections.append(counts_text(counts))
    structure: dict[str, Any] = {
        "success": success, "file": result["file"], "line": result["line"],
        "endLine": result["end-line"], "package": result["package"], "defined": defined,
        "notes": [note_structure(note) for note in notes]}
    if error:
        structure["error"] = condition_structure(error["type"], error["message"])
    if dropped:
        structure["truncated"] = dropped
    if counts:
        structure["noteCounts"] = counts
    return Rendered("\n\n".join(sections), not success, structure, counted="notes")


def compile_form_error(kind: str, message: str) -> Rendered:
    """A tool error whose structured content still fits the outputSchema."""
    return Rendered(error_text(kind, message), True,
                    {"success": False, "defined": [], "notes": [],
                     "error": condition_structure(kind, message)})


async def compile_form(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """Compile the top-level form of a file that holds a line."""
    form = [Symbol("cl-mcp-agent:compile-form-of"), arguments["path"], arguments["line"]]
    result = await ask_agent(session, form, session.config.load_timeout, runs_code=True)
    if "success" not in result:  # no form there, it does not read, or the session failed
        return compile_form_error(result["error"]["type"], result["error"]["message"])
    return render_compiled_form(result, arguments.get("notes", "warnings"))
