"""xref and compile-file: the code loaded in the image, through Swank's own
cross-references and its C-c C-k compilation (the agent's `xref-of` and
`compile-file-of`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from cl_mcp.errors import SessionError
from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, condition_structure, error_text, place_change, place_structure
from cl_mcp.tools.calls import agent_plist, ask_agent, failure, result_dict, strings
from cl_mcp.tools.evaluate import Work, rendered_running, sent_to_background
from cl_mcp.tools.window import answer_window, window_keywords
from cl_mcp.wire.sexp import Keyword, Symbol

# What each relation says about a referrer, in the result's first line.
RELATION_VERBS = {
    "calls": "call",
    "references": "reference",
    "binds": "bind",
    "sets": "set",
    "macroexpands": "expand the macro",
    "specializes": "specialize on",
}


# ---------------------------------------------------------------- xref

def reference_structure(reference: dict[str, Any]) -> dict[str, Any]:
    """One referrer for structuredContent: its name and the place of the
    top-level form that holds the reference (or why it has none), and the
    line and column of the reference itself; a method (specializes) has its
    qualifiers and specializers."""
    structure = {"name": reference["name"], **place_structure(reference)}
    if "specializers" in reference:
        structure["qualifiers"] = strings(reference.get("qualifiers"))
        structure["specializers"] = strings(reference["specializers"])
    if "file" in reference:
        structure["referenceLine"] = reference["reference-line"]
        structure["referenceColumn"] = reference["reference-column"]
    return structure



def referrer_title(reference: dict[str, Any]) -> str:
    """The referrer's name; a method's with its qualifiers and specializers,
    ``AREA :AROUND (CIRCLE T)``."""
    if "specializers" not in reference:
        return str(reference["name"])
    qualifiers = "".join(f" {q}" for q in strings(reference.get("qualifiers")))
    return f"{reference['name']}{qualifiers} ({' '.join(strings(reference['specializers']))})"


def reference_line(reference: dict[str, Any], twinned: bool = False) -> str:
    """``NAME  FILE:LINE:COLUMN (reference at line L)`` (a method that
    specializes is its own reference: no such part), with the reference's
    column too when TWINNED (another reference of the same referrer is on
    that line), or the reason it has no place."""
    title = referrer_title(reference)
    if "file" not in reference:
        return f"{title}  ({reference.get('error') or 'no source file'})"
    column = f", column {reference['reference-column']}" if twinned else ""
    at = (f" (reference at line {reference['reference-line']}{column})"
          if "specializers" not in reference else "")
    return (f"{title}  {reference['file']}:{reference['line']}:{reference['column']}{at}"
            f"{reference_change(reference)}")


def reference_key(reference: dict[str, Any]) -> tuple[Any, ...]:
    """A referrer and the line of its reference: two references alike in it
    are twins, told apart by their columns."""
    return referrer_title(reference), reference.get("file"), reference.get("line"), reference.get("reference-line")


def reference_change(reference: dict[str, Any]) -> str:
    """What became of the reference since it was compiled: its status and
    compiled line are the reference's, not its referrer's, and say so."""
    return place_change(reference, "this reference", "the reference is not")


def referrers_count(references: list[dict[str, Any]], dropped: int) -> str:
    """How many definitions refer, and how many references they make when
    that differs: one definition may refer from several places in it."""
    definitions = len({(referrer_title(r), r.get("file"), r.get("line")) for r in references})
    total = len(references) + dropped
    if dropped:
        return f"{total} references, the first {len(references)} listed (from {definitions} definitions)"
    if total == definitions:
        return str(definitions)
    return f"{definitions} ({total} references)"


def render_xref(result: dict[str, Any]) -> Rendered:
    """The referrers, one line each; none found is an answer, not an error."""
    symbol, relation = result["symbol"], result["relation"]
    references = [result_dict(item) for item in result.get("references") or []]
    verb = RELATION_VERBS.get(relation, relation)
    if not references:
        text = f"No definitions that {verb} {symbol} were found."
    else:
        lines = [f"Definitions that {verb} {symbol}: {referrers_count(references, result.get('dropped') or 0)}"]
        on_line = Counter(map(reference_key, references))
        lines += [reference_line(r, on_line[reference_key(r)] > 1) for r in references]
        if result.get("dropped"):
            lines.append(f"… and {result['dropped']} more, not listed")
        text = "\n".join(lines)
    structure: dict[str, Any] = {"symbol": symbol, "relation": relation,
                                 "references": [reference_structure(r) for r in references]}
    if result.get("dropped"):
        structure["truncated"] = result["dropped"]
    return Rendered(text, False, structure, counted="references")


def xref_error(arguments: dict[str, Any], kind: str, message: str) -> Rendered:
    """A tool error whose structured content still fits xref's outputSchema."""
    return Rendered(error_text(kind, message), True,
                    {"symbol": arguments["symbol"], "relation": arguments.get("relation", "calls"),
                     "references": [], "error": condition_structure(kind, message)})


async def xref(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """The definitions that call, reference, bind, set, macroexpand or
    specialize on a symbol, with their places."""
    relation = arguments.get("relation", "calls")
    form = [Symbol("cl-mcp-agent:xref-of"), arguments["symbol"], Keyword(relation),
            Keyword("package"), arguments.get("package") or session.package]
    result = await ask_agent(session, form, session.config.eval_timeout)
    if failed := failure(result):
        return xref_error(arguments, *failed)
    return render_xref(result)


# ---------------------------------------------------------------- compile-file

def note_structure(note: dict[str, Any]) -> dict[str, Any]:
    """One compiler note for structuredContent: severity, message, place,
    and for an undefined function, variable or type every use found."""
    structure = {"severity": note["severity"], "message": note["message"], **place_structure(note)}
    if "uses" in note:
        structure["uses"] = [use_structure(result_dict(use)) for use in note["uses"] or []]
    return structure


def use_structure(use: dict[str, Any]) -> dict[str, Any]:
    """One use of an undefined name: file, line, column, and the definition
    that holds it when the cross-references know it."""
    structure = {"file": use["file"], "line": use["line"], "column": use["column"]}
    if isinstance(use.get("name"), str):
        structure["name"] = use["name"]
    return structure


def note_text(note: dict[str, Any]) -> str:
    """``SEVERITY at FILE:LINE:COLUMN``, the message, the snippet indented,
    and the uses of an undefined name one a line."""
    severity = note["severity"].upper()
    if "file" not in note:
        head = f"{severity} (no source location: {note.get('error') or 'unknown'})"
        return f"{head}\n{note['message']}"
    snippet = "\n".join(f"  {line}" for line in (note.get("snippet") or "").splitlines())
    head = f"{severity} at {note['file']}:{note['line']}:{note['column']}"
    uses = [use_structure(result_dict(use)) for use in note.get("uses") or []]
    used = ("used at:\n" + "\n".join(
        f"  {use['file']}:{use['line']}:{use['column']}" + (f" ({use['name']})" if "name" in use else "")
        for use in uses)) if uses else ""
    return "\n".join(part for part in (head, note["message"], snippet, used) if part)


def note_counts(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The plain compiler notes counted per file (notes: "warnings"), as
    ``{"file": F, "count": N}`` (no file for notes without a place)."""
    return [{k: v for k, v in result_dict(entry).items() if k in ("file", "count")}
            for entry in result.get("note-counts") or []]


def counts_text(counts: list[dict[str, Any]]) -> str:
    """The counted notes' section: their total and the number per file."""
    total = sum(entry["count"] for entry in counts)
    lines = [f"[compiler notes: {total}, counted per file, not listed (notes: \"all\" lists them)]"]
    lines += [f"{entry.get('file', '(no source location)')}: {entry['count']}" for entry in counts]
    return "\n".join(lines)


def notes_head(notes: list[Any], dropped: int, counts: list[dict[str, Any]]) -> str:
    """``N notes``, ``K listed`` when only K of them are, and ``M compiler
    notes counted`` when some were."""
    total = len(notes) + dropped
    # Distinct: SBCL prints a note once per expansion where cl-mcp lists it once.
    head = {0: "0 notes", 1: "1 note"}.get(total, f"{total} distinct notes")
    if dropped:
        head += f", {len(notes)} listed"
    counted = sum(entry["count"] for entry in counts)
    if counted:
        head += f"{'' if dropped else ' listed'}, {counted} compiler note{'' if counted == 1 else 's'} counted"
    return head


def notes_sections(notes: list[dict[str, Any]], dropped: int, counts: list[dict[str, Any]]) -> list[str]:
    """One block per listed note, the dropped ones' count, the counted ones."""
    sections = [note_text(note) for note in notes]
    if dropped:
        sections.append(f"… and {dropped} more notes, not listed")
    if counts:
        sections.append(counts_text(counts))
    return sections


def render_compile(path: str, result: dict[str, Any]) -> Rendered:
    """``Compiled FILE: N notes`` (or the failure), the fasl, whether it was
    loaded, then one block per note listed and the counted ones per file."""
    notes = [result_dict(note) for note in result.get("notes") or []]
    dropped = result.get("dropped") or 0
    counts = note_counts(result)
    success, loaded = result.get("success") is True, result.get("loaded") is True
    fasl = result.get("fasl") if isinstance(result.get("fasl"), str) else None
    error = result.get("error") if isinstance(result.get("error"), dict) else None
    count = notes_head(notes, dropped, counts)
    sections = []
    if not success:
        sections.append(error_text("CL-MCP:COMPILATION-FAILED", f"Compiling {path} failed: {count}"))
    elif error:
        reason = error["message"].splitlines()[0] if error["message"] else ""
        sections.append(error_text(error["type"], f"Loading the compiled {path} failed: {reason}"))
        sections.append(f"Compiled {path}: {count}")
    else:
        sections.append(f"Compiled {path}: {count}")
    sections[-1] += f"\nfasl: {fasl or 'none'}\nloaded: {'yes' if loaded else 'no'}"
    sections += notes_sections(notes, dropped, counts)
    structure: dict[str, Any] = {"success": success, "loaded": loaded,
                                 "notes": [note_structure(note) for note in notes]}
    if counts:
        structure["noteCounts"] = counts
    if fasl:
        structure["fasl"] = fasl
    if error:
        structure["error"] = condition_structure(error["type"], error["message"])
    if dropped:
        structure["truncated"] = dropped
    return Rendered("\n\n".join(sections), not success or error is not None, structure, counted="notes")


def compile_error(kind: str, message: str) -> Rendered:
    """A tool error whose structured content still fits compile-file's
    outputSchema."""
    return Rendered(error_text(kind, message), True,
                    {"success": False, "loaded": False, "notes": [],
                     "error": condition_structure(kind, message)})


async def compile_file(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """Compile a file as SLIME's C-c C-k does and load it unless told not
    to: every compiler note with its place."""
    path = arguments["path"]
    work = Work(f"Compiling {path} (number {{number}})", {"success": False, "loaded": False, "notes": []},
                lambda result: compile_outcome(path, result))
    window = answer_window(arguments.get("answer-within"), session.config.answer_within,
                           session.config.load_timeout)  # a long compilation goes on in the background
    try:
        async with session.turn():
            tag = session.new_tag()  # cancelling the call stops the compilation
            form = [Symbol("cl-mcp-agent:compile-file-of"), path,
                    Keyword("load"), bool(arguments.get("load", True)),
                    Keyword("notes"), Keyword(arguments.get("notes", "warnings")), Keyword("tag"), tag,
                    *window_keywords(window)]
            result = await agent_plist(session, form, session.config.load_timeout, tag=tag)
    except SessionError as error:
        return compile_error(error.kind, error.message)
    if result.get("status") == "running":
        sent_to_background(session, result, work)
        return rendered_running(result, session.config.max_result_chars, work)
    return compile_outcome(path, result)


def compile_outcome(path: str, result: dict[str, Any]) -> Rendered:
    """compile-file's result from the agent's report."""
    if result.get("status") == "aborted":
        return compile_error("CL-MCP:CANCELLED", f"Compiling {path} was cancelled.")
    if result.get("status") == "error" and "success" not in result:
        return compile_error(result["error"]["type"], result["error"]["message"])
    return render_compile(path, result)
