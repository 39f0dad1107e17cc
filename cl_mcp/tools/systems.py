"""reset-session and load-system: the image's state as a whole."""

from __future__ import annotations

from typing import Any

from cl_mcp.errors import SessionError
from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, condition_structure, error_result, error_text
from cl_mcp.tools.calls import agent_plist, result_dict, strings
from cl_mcp.tools.code import note_counts, note_structure, notes_sections
from cl_mcp.tools.evaluate import Work, rendered_running, sent_to_background
from cl_mcp.tools.window import answer_window, window_keywords
from cl_mcp.wire.sexp import Keyword, Symbol

RESET_TEXT = "Session reset. All definitions cleared."
MAX_WARNINGS = 20
MAX_NAMES = 10


def _named(names: list[str], one: str, many: str) -> str:
    """``2 packages (A, B)``: how many NAMES, and the first of them."""
    shown = ", ".join(names[:MAX_NAMES]) + (f", … {len(names) - MAX_NAMES} more"
                                            if len(names) > MAX_NAMES else "")
    return f"{len(names)} {one if len(names) == 1 else many} ({shown})"


def soft_reset_text(done: dict[str, Any]) -> str:
    """What a soft reset in a shared image removed and what it kept, and why
    (the agent's `soft-reset` plist)."""
    removed = [_named(names, one, many) for names, one, many in (
        (strings(done.get("removed-symbols")), "CL-USER symbol", "CL-USER symbols"),
        (strings(done.get("removed-packages")), "package", "packages")) if names]
    aborted = done.get("aborted") or 0
    lines = ["Session reset (soft: the image is shared, and stays).",
             "Removed: " + (" and ".join(removed) if removed else "nothing this session defined")
             + f"; {aborted} waiting or background evaluation{'' if aborted == 1 else 's'} aborted;"
             " cl-mcp's *, +, / and the rest, its kept values and inspected objects forgotten."]
    kept = [_named(names, one, many) for names, one, many in (
        (strings(done.get("kept-symbols")), "CL-USER symbol", "CL-USER symbols"),
        (strings(done.get("kept-packages")), "package", "packages")) if names]
    if kept:
        lines.append(f"Kept: {' and '.join(kept)}, made by evaluations that also loaded "
                     f"{', '.join(strings(done.get('loaded-systems')))}: the image calls those "
                     "loaded, so what they made stays (restart the image to drop it).")
    if packages := strings(done.get("file-packages")):
        lines.append(f"Kept: {_named(packages, 'package', 'packages')}, defined in a loaded file: "
                     "what the file made is the image's (ASDF may call it loaded).")
    return "\n".join(lines)


async def reset_session(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    try:
        done = await session.reset()
    except SessionError as error:
        return error_result(error.kind, error.message, {"reset": False})
    text = RESET_TEXT if done is None else soft_reset_text(result_dict(done))
    return Rendered(text, False, {"reset": True, "message": text})


def _same_words(text: str) -> str:
    return " ".join(text.split())


def render_load(result: dict[str, Any]) -> Rendered:
    """``Loading system: NAME`` / ``Loaded: NAME (version V)``, or the error;
    then the compiler's notes in the system's own files with their places
    (plain compiler notes counted per file with notes: "warnings"), and the
    other warnings summarised; compiler chatter left out."""
    name = result["system"]
    warnings = result.get("warnings") or []
    notes = [result_dict(note) for note in result.get("notes") or []]
    dropped = result.get("dropped") or 0
    counts = note_counts(result)
    structure: dict[str, Any] = {
        "system": name, "loaded": result.get("status") == "ok", "loader": result.get("loader", "asdf"),
        "warnings": [condition_structure(kind, message) for kind, message in warnings],
        "notes": [note_structure(note) for note in notes]}
    if counts:
        structure["noteCounts"] = counts
    if dropped:
        structure["truncated"] = dropped
    if result.get("status") == "aborted":
        return Rendered(f"Loading system: {name}\nThe load was cancelled.", True, structure)
    if result.get("status") == "ok":
        version = result.get("version")
        text = f"Loading system: {name}\nLoaded: {name}" + (f" (version {version})" if version else "")
        if version:
            structure["version"] = version
        is_error = False
    else:
        error = result["error"]
        reason = error["message"].splitlines()[0] if error["message"] else ""
        text = error_text(error["type"], reason)
        structure["error"] = condition_structure(error["type"], reason)
        is_error = True
    if notes or counts:
        text += "\n\n[notes]\n" + "\n\n".join(notes_sections(notes, dropped, counts))
    # A warning already shown as a note, with its place, is not repeated
    # (the note's message may leave out SBCL's "See also" references).
    shown = tuple(_same_words(note["message"]) for note in notes)
    others = [(kind, message) for kind, message in warnings
              if not _same_words(message).startswith(shown)]
    if others:
        lines = [f"{kind}: {_same_words(message)}" for kind, message in others[:MAX_WARNINGS]]
        if len(others) > MAX_WARNINGS:
            lines.append(f"… and {len(others) - MAX_WARNINGS} more")
        text += "\n\n[warnings]\n" + "\n".join(lines)
    return Rendered(text, is_error, structure, counted="notes")


async def load_system(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    name = arguments["system"]
    work = Work(f"Loading system {name} (number {{number}})",
                {"system": name, "loaded": False, "warnings": [], "notes": []}, render_load)
    window = answer_window(arguments.get("answer-within"), session.config.answer_within,
                           session.config.load_timeout)  # a long load goes on in the background
    try:
        async with session.turn():
            tag = session.new_tag()
            form = [Symbol("cl-mcp-agent:load-system"), name,
                    Keyword("notes"), Keyword(arguments.get("notes", "warnings")), Keyword("tag"), tag,
                    *window_keywords(window)]
            result = await agent_plist(session, form, session.config.load_timeout, tag=tag)
    except SessionError as error:
        return error_result(error.kind, error.message, work.base)
    if result.get("status") == "running":
        sent_to_background(session, result, work)
        return rendered_running(result, session.config.max_result_chars, work)
    if "system" not in result:  # stopped at its window: too many in the background
        return error_result(result["error"]["type"], result["error"]["message"], work.base)
    return render_load(result)
