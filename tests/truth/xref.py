"""The xref oracle and the check of xref's callers against it.

For every function and generic function of a library, xref's `calls`
answer lists its callers.  Each caller in the library's files is checked
against the top-level forms a plain SBCL reads (places.lisp) and against
the text:

- its reference line falls inside a top-level form of the file as it is now;
- its place's line is that form's first line;
- the reference opens a form in code (a list, `#'`, a backquote or a
  comma), not in a string or a comment (the form need not name the callee: a macro's or an inline function's
  expansion makes calls that SBCL records at its use);
- its `place` and `compiledLine` are the reference's (docs/tools.md):
  the line the reference had when compiled is one of the callee's reference
  lines in that caller before any edit, and the line it has now is where
  that line went, as a line diff of the two texts maps it: `unchanged` on
  the same line, `found-after-edit` with `compiledLine` on another,
  `not-found` when the line is gone.  In a file that compile-form compiled
  again, the compiled lines are not known and only the places are checked.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from tests.integration.conftest import McpProcess
from tests.truth.places import Definition, Form, Tally, short

CALLEES = {"function", "generic-function"}


def code_lines(text: str) -> list[str]:
    """TEXT's lines with its strings, comments and characters (`#\\x`)
    blanked, so that a parenthesis left in them opens a form."""
    out, i, depth = [], 0, 0
    state = "code"  # or "string", "line-comment", "block-comment", "bars"
    while i < len(text):
        c, pair = text[i], text[i:i + 2]
        if c == "\n":
            out.append(c)
            state = "code" if state == "line-comment" else state
            i += 1
            continue
        if state == "code":
            if c == ";":
                state = "line-comment"
            elif c == '"':
                state = "string"
            elif pair == "#|":
                state, depth = "block-comment", 1
                out.append("  ")
                i += 2
                continue
            elif pair == "#\\" and i + 2 < len(text):
                out.append("   ")
                i += 3
                continue
            elif c == "\\" and i + 1 < len(text):
                out.append(text[i:i + 2] if text[i + 1] != "\n" else " \n")
                i += 2
                continue
            elif c == "|":
                state = "bars"
            out.append(c if state in ("code", "bars") else " ")
        elif state == "string" or state == "bars":
            if c == "\\" and i + 1 < len(text):
                if text[i + 1] == "\n":  # the newline is counted as a line's end
                    out.append(" " if state == "string" else c)
                    i += 1
                else:
                    out.append("  " if state == "string" else text[i:i + 2])
                    i += 2
                continue
            closing = '"' if state == "string" else "|"
            if c == closing:
                out.append(c if state == "bars" else " ")
                state = "code"
            else:
                out.append(" " if state == "string" else c)
        elif state == "block-comment":
            if pair in ("#|", "|#"):
                depth += 1 if pair == "#|" else -1
                state = "code" if depth == 0 else state
                out.append("  ")
                i += 2
                continue
            out.append(" ")
        else:
            out.append(" ")
        i += 1
    return "".join(out).split("\n")


def line_map(compiled: str, now: str) -> dict[int, int]:
    """Each 1-based line of COMPILED that is still in NOW, to its line there."""
    matcher = difflib.SequenceMatcher(None, compiled.splitlines(), now.splitlines(), autojunk=False)
    return {a + k + 1: b + k + 1 for a, b, size in matcher.get_matching_blocks() for k in range(size)}


def callers(process: McpProcess, d: Definition, copy: Path) -> list[dict[str, Any]]:
    """xref's callers of D that are placed in the files of COPY."""
    result = process.call("xref", symbol=d.query, package=d.package, relation="calls")
    return [r for r in result.get("structuredContent", {}).get("references", [])
            if str(r.get("file", "")).startswith(f"{copy}/")]


def place_failure(reference: dict[str, Any], forms: list[Form]) -> str | None:
    """Why REFERENCE's lines are wrong against FORMS (its file's, now) and
    the text; None when they are right."""
    line, at, column = reference["line"], reference["referenceLine"], reference["referenceColumn"]
    holding = [f for f in forms if f.start <= at <= f.end]
    if not holding:
        return f"reference line {at} is in no top-level form"
    form = holding[0]
    if line != form.start:
        return f"place line {line}, but the form holding reference line {at} starts at {form.start}"
    code = code_lines(Path(reference["file"]).read_text(encoding="utf-8"))
    if not code[at - 1][column - 1:].startswith(("(", "#'", "`", ",")):
        return f"reference {at}:{column} opens no form: it is in a string, a comment or a name"
    # A call that a macro's or an inline function's expansion makes is
    # recorded at its use, which need not name the callee.
    return None


def status_failure(reference: dict[str, Any], compiled_lines: list[int], moved: dict[int, int]) -> str | None:
    """Why REFERENCE's `place` and `compiledLine` are wrong, its callee's
    reference lines in its caller having been COMPILED_LINES, which the
    edits MOVED (line when compiled to line now); None when right."""
    got = (reference["referenceLine"], reference.get("place"), reference.get("compiledLine"))
    wanted = set()
    for line in compiled_lines:
        if line not in moved:
            wanted.add(("not-found", line))
        elif moved[line] == line:
            wanted |= {(line, "unchanged", None), (line, "found-after-edit", line)}
        else:
            wanted.add((moved[line], "found-after-edit", line))
    if got[1] == "not-found":
        return None if ("not-found", got[2]) in wanted else f"not-found, compiled at {got[2]}; expected one of {sorted(map(str, wanted))}"
    return None if got in wanted else f"got {got}, expected one of {sorted(map(str, wanted))}"


def check_xref(process: McpProcess, tally: Tally, phase: str, callees: list[Definition], copy: Path,
               pristine: Path, forms: list[Form], baseline: dict[tuple[str, str, str], list[int]],
               recompiled: set[str]) -> None:
    """Ask xref for the callers of each of CALLEES (in COPY, loaded from the
    text in PRISTINE) and count each caller right or wrong against FORMS
    (the oracle's, now).  BASELINE, the reference lines as compiled by
    (callee, caller, file), is filled in before any edit and read after;
    RECOMPILED are the files compile-form compiled again."""
    by_file: dict[str, list[Form]] = {}
    for form in forms:
        by_file.setdefault(form.file, []).append(form)
    maps: dict[str, dict[int, int]] = {}
    for d in callees:
        for reference in callers(process, d, copy):
            file, key = reference["file"], (d.query, reference["name"], reference["file"])
            failure = None if reference.get("place") == "not-found" else place_failure(
                reference, by_file.get(file, []))
            if phase == "before edits":
                baseline.setdefault(key, []).append(reference["referenceLine"])
                if (reference.get("place"), reference.get("compiledLine")) != ("unchanged", None):
                    failure = failure or f"{reference.get('place')} {reference.get('compiledLine')} before any edit"
            elif baseline.get(key) and file not in recompiled:
                if file not in maps:
                    compiled = (pristine / Path(file).relative_to(copy)).read_text(encoding="utf-8")
                    maps[file] = line_map(compiled, Path(file).read_text(encoding="utf-8"))
                failure = failure or status_failure(reference, baseline[key], maps[file])
            tally.count(f"xref {phase}", "caller",
                        failure and f"caller {reference['name']} of {d.query} {short(file)}:{reference['line']}"
                                    f" (reference line {reference['referenceLine']}): {failure}")
