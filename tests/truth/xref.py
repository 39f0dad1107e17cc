"""The xref oracle and the two-sided check of xref's callers against it.

For every function and generic function of a library, xref's `calls`
answer must list exactly the calls SBCL recorded, no fewer, no more, none
twice.  The oracle (callers.lisp, in a plain SBCL that loaded the pristine
library; no part of cl-mcp) asks `sb-introspect:who-calls` and places each
recorded call by reading the texts: its line in the text it was compiled
from, and in the file as it is now, its top-level form's first line and
its own line (or that the caller's form is gone: deleted, renamed, cut
off).  Each answer of cl-mcp is matched to one recorded call by its file
and the line the call had when compiled (`compiledLine`, or for an
`unchanged` reference its line), and then must be:

- for a call still in the file: `line` the first line of its top-level
  form now, `referenceLine` its line now, and `place` `unchanged` on the
  line it was compiled at (`found-after-edit` with that same line is right
  too, for a text edited inside), else `found-after-edit` with
  `compiledLine` the line it was compiled at;
- for a call whose form is gone: `not-found`, `compiledLine` its line.

A recorded call no answer matches is missing; an answer that matches none
is extra, or a duplicate when it names a call already matched; a matched
answer with a field wrong is a wrong field.  Each is counted apart.  The
callers compile-form or edit-form compiled again during the edits are left
out: the image's code for them is no longer the pristine library's.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.integration.conftest import McpProcess
from tests.truth.places import Definition, Form, Tally, short

CALLEES = {"function", "generic-function"}
ORACLE = Path(__file__).with_name("callers.lisp")


@dataclass(frozen=True)
class Call:
    """A call SBCL recorded, as the oracle placed it."""

    callee: str
    file: str
    compiled_line: int
    compiled_form_line: int  # its caller's top-level form's first line in the text compiled
    form_line: int | None  # None: its caller's form is not in the file any more
    line: int | None


def recorded_calls(pristine: Path, system: str, edited: Path, callees: list[Definition]) -> list[Call]:
    """Every call of CALLEES that SBCL records in SYSTEM (loaded from
    PRISTINE), placed in the files of EDITED as they are now."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as names:
        names.write("".join(f"{d.query}\n" for d in callees))
        names.flush()
        run = subprocess.run(["sbcl", "--script", str(ORACLE), f"{pristine}/", system, f"{edited}/", names.name],
                             capture_output=True, text=True, timeout=900, env=os.environ)
    assert run.returncode == 0 and not run.stderr.strip(), run.stderr[-3000:]
    calls = []
    for row in run.stdout.splitlines():
        _, callee, file, compiled, compiled_form, form_line, line = row.split("\t")
        calls.append(Call(callee, file, int(compiled), int(compiled_form),
                          None if form_line == "-" else int(form_line), None if line == "-" else int(line)))
    return calls


def answered_line(reference: dict[str, Any]) -> int:
    """The line the reference had when compiled, as REFERENCE says."""
    if reference.get("place") in ("not-found", "found-after-edit"):
        return reference.get("compiledLine") or 0
    return reference.get("referenceLine") or 0


def field_failure(call: Call, reference: dict[str, Any]) -> str | None:
    """Why REFERENCE, matched to CALL, has a field wrong; None when right."""
    got = (reference.get("line"), reference.get("referenceLine"), reference.get("place"),
           reference.get("compiledLine"))
    if call.line is None:
        return None if got[2] == "not-found" else f"got {got}, expected not-found (its caller's form is gone)"
    if call.line == call.compiled_line:
        wanted = {(call.form_line, call.line, "unchanged", None),
                  (call.form_line, call.line, "found-after-edit", call.compiled_line)}
    else:
        wanted = {(call.form_line, call.line, "found-after-edit", call.compiled_line)}
    return None if got in wanted else f"got {got}, expected {sorted(wanted, key=str)[0]}"


def form_start(forms: list[Form], d: Definition) -> int:
    """The first line of the top-level form of FORMS that holds D."""
    return next((f.start for f in forms if f.file == d.file and f.start <= d.line <= f.end), d.line)


@dataclass(frozen=True)
class Recompiled:
    """The callers compiled again since the library was loaded: their
    top-level forms' first lines in the pristine text and now, and the
    files where one of them is gone since (where no call that is gone is
    checked: which caller's it was, only the text compiled could say)."""

    pristine: set[tuple[str, int]]
    now: set[tuple[str, int]]
    gone_in: set[str]

    @classmethod
    def of(cls, keys: set[tuple[str, ...]], compiled: dict[tuple[str, ...], Definition], pristine: list[Form],
           now: dict[tuple[str, ...], Definition], forms: list[Form]) -> "Recompiled":
        """KEYS, of definitions COMPILED (as loaded, PRISTINE's forms) and NOW
        (the oracle's now, FORMS the top-level forms now)."""
        return cls({(compiled[k].file, form_start(pristine, compiled[k])) for k in keys if k in compiled},
                   {(now[k].file, form_start(forms, now[k])) for k in keys if k in now},
                   {compiled[k].file for k in keys if k in compiled and k not in now})

    def recorded(self, call: Call) -> bool:
        """Whether CALL may be a recompiled caller's."""
        if call.form_line is None:
            return call.file in self.gone_in
        return (call.file, call.compiled_form_line) in self.pristine

    def answered_by(self, reference: dict[str, Any]) -> bool:
        """Whether REFERENCE may be a recompiled caller's."""
        if reference.get("place") == "not-found":
            return reference["file"] in self.gone_in
        return (reference["file"], reference.get("line")) in self.now


def matched_now(expected: dict[tuple[str, str, int], list[Call]], callee: str,
                reference: dict[str, Any]) -> tuple[str, str, int] | None:
    """The key of a call of CALLEE that REFERENCE, without a compiledLine
    (its file's text as compiled unknown), names by where it is now: its
    form's line and its own, or its file for a call that is gone; that
    call moved last in its list, where the match takes it from."""
    gone = reference.get("place") == "not-found"
    for key, calls in expected.items():
        if key[:2] != (callee, reference["file"]):
            continue
        for index, call in enumerate(calls):
            if (call.line is None) if gone else \
                    (call.form_line, call.line) == (reference.get("line"), reference.get("referenceLine")):
                calls.append(calls.pop(index))
                return key
    return None


def check_xref(process: McpProcess, tally: Tally, phase: str, callees: list[Definition], copy: Path,
               pristine: Path, system: str, recompiled: Recompiled, text_unknown: set[str] = frozenset()) -> None:
    """Ask xref for the callers of each of CALLEES (in COPY, loaded from
    the text in PRISTINE) and count its answers against the oracle's
    recorded calls, both ways; the RECOMPILED callers left out.  In the
    files of TEXT_UNKNOWN (`Compiled.text_known`), an answer without a
    compiledLine is matched by where its call is now."""
    answer = f"xref {phase}"
    expected: dict[tuple[str, str, int], list[Call]] = defaultdict(list)
    for call in recorded_calls(pristine, system, copy, callees):
        if not recompiled.recorded(call):
            expected[(call.callee, call.file, call.compiled_line)].append(call)
    for d in callees:
        result = process.call("xref", symbol=d.query, package=d.package, relation="calls")
        references = [r for r in result.get("structuredContent", {}).get("references", [])
                      if str(r.get("file", "")).startswith(f"{copy}/") and not recompiled.answered_by(r)]
        for reference in references:
            key = (d.query, reference["file"], answered_line(reference))
            unknown = (reference["file"] in text_unknown and reference.get("place") != "unchanged"
                       and reference.get("compiledLine") is None)
            if unknown:
                key = matched_now(expected, d.query, reference) or key
            where = (f"caller {reference['name']} of {d.query} {short(reference['file'])}:{reference.get('line')}"
                     f" (reference line {reference.get('referenceLine')})")
            calls = expected.get(key)
            if calls:
                call = calls.pop()
                failure = field_failure(call, {**reference, "compiledLine": call.compiled_line} if unknown
                                        else reference)
                tally.count(answer, "caller" if not failure else "caller, wrong field",
                            failure and f"{where}: wrong field: {failure}")
            elif key in expected:  # matched already, its calls all taken
                tally.count(answer, "caller, duplicate", f"{where}: duplicate: answered twice")
            else:
                tally.count(answer, "caller, extra", f"{where}: extra: SBCL records no such call")
        for key in [k for k in expected if k[0] == d.query]:
            for call in expected.pop(key):
                tally.count(answer, "caller, missing",
                            f"a call of {d.query} at {short(call.file)}:{call.compiled_line} when compiled"
                            f" (now {call.line or 'gone'}): missing from xref's answer")
