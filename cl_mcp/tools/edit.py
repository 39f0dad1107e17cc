"""edit-form and read-lisp-file: a Lisp file's top-level forms, edited one
at a time by what they define or by a line (the new text read first, the
rest of the file kept byte for byte, the edit compiled as compile-form
compiles it), and read as an outline, a check or one form's text (the
agent's `edit-form-of` and `read-lisp-file-of`)."""

from __future__ import annotations

import logging
from typing import Any

from cl_mcp.errors import CancelledWithAnswer
from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, condition_structure, error_text
from cl_mcp.tools.calls import ask_agent, result_dict
from cl_mcp.tools.forms import render_compiled_form
from cl_mcp.wire.sexp import Keyword, SExp, Symbol

log = logging.getLogger("cl_mcp.edit")

# The camelCase names of the agent's place keys, for structuredContent.
CAMEL = {"end-line": "endLine", "old-line": "oldLine", "old-end-line": "oldEndLine",
         "opened-line": "openedLine", "opened-column": "openedColumn", "form-line": "formLine"}


def camel(plist: dict[str, Any]) -> dict[str, Any]:
    """An agent plist's keys as structuredContent names them."""
    return {CAMEL.get(key, key): value for key, value in plist.items()}


def place(summary: dict[str, Any]) -> str:
    """``LINE-END kind name`` of one form."""
    lines = f"{summary['line']}" + (f"-{summary['end-line']}" if summary["end-line"] != summary["line"] else "")
    return f"{lines} {summary['kind']}" + (f" {summary['name']}" if "name" in summary else "")


def target_form(arguments: dict[str, Any], answer: dict[str, Any]) -> list[SExp] | Rendered:
    """The agent's :target or :line keywords from FORM or LINE (exactly one),
    or the tool error when both or neither are given, its structured
    content ANSWER with the error."""
    if ("form" in arguments) == ("line" in arguments):
        return agent_error({"error": {"type": "CL-MCP:INVALID-ARGUMENTS",
                                      "message": "Give exactly one of form and line."}}, answer)
    if "form" in arguments:
        return [Keyword("target"), arguments["form"]]
    return [Keyword("line"), arguments["line"]]


def agent_error(result: dict[str, Any], answer: dict[str, Any]) -> Rendered:
    """The tool error for a refused call: its problem (where a text stops
    reading) or its candidates (an ambiguous name) kept in ANSWER."""
    kind, message = result["error"]["type"], result["error"]["message"]
    structure = {**answer, "error": condition_structure(kind, message)}
    if isinstance(result.get("problem"), list):
        structure["problem"] = camel(result_dict(result["problem"]))
    if result.get("candidates"):
        structure["candidates"] = [camel(result_dict(c)) for c in result["candidates"]]
    return Rendered(error_text(kind, message), True, structure)


async def edit_form(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """Replace, insert before or after, or delete one top-level form of a
    file, then compile what was written."""
    located = target_form(arguments, {"written": False})
    if isinstance(located, Rendered):
        return located
    form = [Symbol("cl-mcp-agent:edit-form-of"), arguments["path"], *located,
            Keyword("action"), Keyword(arguments.get("action", "replace")),
            Keyword("text"), arguments.get("text", ""),
            Keyword("compile"), bool(arguments.get("compile", True))]
    try:
        result = await ask_agent(session, form, session.config.load_timeout, runs_code=True)  # its compile runs macros
    except CancelledWithAnswer as cancelled:
        # No answer goes to a cancelled call: the log says the edit stands.
        log.warning("%s", render_edit(result_dict(cancelled.answer)).text.split("\n", 1)[0])
        raise
    if result.get("status") != "ok":
        return agent_error(result, {"written": False})
    return render_edit(result, arguments.get("notes", "warnings"))


def render_edit(result: dict[str, Any], notes_mode: str = "warnings") -> Rendered:
    """``Replaced the form at FILE:OLD (now LINES)``, then compile-form's
    result for what was written (its notes as NOTES_MODE says)."""
    action = result["action"]
    verb = {"replace": "Replaced", "insert-before": "Inserted before", "insert-after": "Inserted after",
            "delete": "Deleted"}[action]
    old = f"{result['old-line']}" + (f"-{result['old-end-line']}"
                                      if result["old-end-line"] != result["old-line"] else "")
    head = f"{verb} the form at {result['file']}:{old}"
    if "line" in result:
        head += f"; the new text is at lines {result['line']}-{result['end-line']}"
    if result.get("ended-line") is True:
        head += (" (a newline was put after it: its last line ends in a comment, which would have"
                 " taken the rest of the line, and the form there, with it)")
    if isinstance(result.get("unknown-readtable"), str):
        head += (f" (the file's readtable {result['unknown-readtable']} is not in the image: the text"
                 " was delimited as standard syntax; load the system that defines it)")
    if isinstance(result.get("scanned"), int):  # the file's forms and the new text's, read again after the edit
        head += (" (delimited as standard syntax where a reader macro of the file's readtable fails when"
                 " the reader only skips a form: it ignores *read-suppress*)")
    if result.get("written-before-cancel") is True:
        head += " (the call was cancelled once the edit was written: a cancel undoes no edit)"
    structure: dict[str, Any] = {"written": True, "file": result["file"], "action": action,
                                 "oldLine": result["old-line"], "oldEndLine": result["old-end-line"]}
    if "line" in result:
        structure |= {"line": result["line"], "endLine": result["end-line"]}
    if not isinstance(result.get("compiled"), list):
        return Rendered(head + ("" if action == "delete" else "\nnot compiled"), False, structure)
    compiled = render_compiled_form(result_dict(result["compiled"]), notes_mode)
    structure["compiled"] = compiled.structured
    written = "the edit is written" + ("" if not compiled.is_error else ", and stays written")
    return Rendered(f"{head} ({written})\n\n{compiled.text}", compiled.is_error, structure)


async def read_lisp_file(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """A file's outline, its check, or one form's text."""
    mode = arguments.get("mode", "outline")
    located: list[SExp] | Rendered = []
    if mode == "form":
        located = target_form(arguments, {"mode": mode})
        if isinstance(located, Rendered):
            return located
    elif mode == "outline" and "line" in arguments:
        located = [Keyword("line"), arguments["line"]]
    form = [Symbol("cl-mcp-agent:read-lisp-file-of"), arguments["path"], Keyword("mode"), Keyword(mode),
            *located]
    result = await ask_agent(session, form, session.config.eval_timeout)
    if result.get("status") != "ok":
        return agent_error(result, {"mode": mode})
    rendered = {"outline": render_outline, "check": render_check, "form": render_form}[mode](result)
    if isinstance(scanned := result.get("scanned"), int):
        rendered = Rendered(rendered.text + f"\n[{scanned} form{'' if scanned == 1 else 's'} delimited as"
                            " standard syntax: a reader macro of the file's readtable fails when the reader"
                            " only skips a form (it ignores *read-suppress*)]", rendered.is_error,
                            {**(rendered.structured or {}), "scanned": scanned})
    if unevaluated := result.get("unevaluated"):
        structure = {**(rendered.structured or {}), "unevaluated": unevaluated}
        rendered = Rendered(rendered.text + f"\n[{unevaluated} #. form{'' if unevaluated == 1 else 's'} read"
                            " without being evaluated: reading a file runs none of its code]",
                            rendered.is_error, structure)
    return rendered


def render_outline(result: dict[str, Any]) -> Rendered:
    """One line per form, ``LINES kind name``, with a line whenever the
    package or readtable it is read in changes (its structure's contexts:
    a 3,000-line file's outline fits the result budget)."""
    forms = [result_dict(entry) for entry in result.get("forms") or []]
    total = result["total"]
    lines = [f"{result['file']}: {result['lines']} lines, {total} top-level forms"]
    if skipped := result.get("skipped"):
        lines.append(f"[the {skipped} forms above line {forms[0]['line'] if forms else result['lines']}"
                     " are left out]")
    contexts: list[dict[str, Any]] = []
    for entry in forms:
        now = {"package": entry.pop("package"), **({"readtable": entry.pop("readtable")}
                                                   if "readtable" in entry else {})}
        if not contexts or {k: v for k, v in contexts[-1].items() if k != "line"} != now:
            contexts.append({"line": entry["line"], **now})
            lines.append(f"[package {now['package']}"
                         + (f", readtable {now['readtable']}" if "readtable" in now else "") + "]")
        lines.append(place(entry))
    structure = {"file": result["file"], "mode": "outline", "lines": result["lines"], "count": total,
                 "forms": [camel(entry) for entry in forms], "contexts": contexts}
    if (following := result.get("next")) is not None:
        left = total - result.get("skipped", 0) - len(forms)
        lines.append(f"[{left} more forms from line {following} on: read-lisp-file with line {following}]")
        structure["next"] = following
    return Rendered("\n".join(lines), False, structure)


def render_check(result: dict[str, Any]) -> Rendered:
    """``FILE reads: N forms``, or each problem at its line and column with
    the top-level form it sits in."""
    problems = [result_dict(problem) for problem in result.get("problems") or []]
    counted = result.get("problem-count", len(problems))
    structure = {"file": result["file"], "mode": "check", "count": result["forms"],
                 "problems": [camel(problem) for problem in problems], "problemCount": counted}
    if not problems:
        return Rendered(f"{result['file']} reads: {result['forms']} top-level forms", False, structure)
    lines = [f"{result['file']}: {counted} problem" + ("" if counted == 1 else "s")
             + (f", the first {len(problems)} listed" if counted > len(problems) else "")]
    for problem in problems:
        within = f" (in the form at line {problem['form-line']}" + (
            f", {problem['kind']} {problem['name']})" if "name" in problem else ")") if "form-line" in problem else ""
        lines.append(f"line {problem['line']}, column {problem['column']}{within}: "
                     f"{problem.get('message') or problem.get('what')}")
    return Rendered("\n".join(lines), True, structure)


def render_form(result: dict[str, Any]) -> Rendered:
    """The form's lines and kind, then its text as it is in the file."""
    structure = {"file": result["file"], "mode": "form",
                 "forms": [camel({k: v for k, v in result.items() if k in
                                  ("line", "end-line", "kind", "name", "text")})]}
    text = f"{result['file']}:{place(result)}\n{result['text']}"
    if (whole := result.get("text-length")) is not None:
        structure["textLength"] = whole
        text += (f"\n[the form is {whole:,} characters; its first {len(result['text']):,} are shown:"
                 f" lines {result['line']}-{result['end-line']} of the file hold it all]")
    return Rendered(text, False, structure)
