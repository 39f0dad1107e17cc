"""The compiler notes oracle and the check of compile-file's notes against it.

A plain SBCL that loaded the library compiles each of its files again
(notes.lisp) and prints every condition the compiler signals with a place:
its severity, its message and the number of the top-level form SBCL was
compiling.  compile-file (`notes: "all"`, not loaded) of the same file, in
cl-mcp's image that loaded the same library, must list the same notes:

- each of cl-mcp's notes is one of the oracle's, same severity and message
  (whitespace runs made one space), and its line falls inside the
  top-level form SBCL named, as the places oracle reads the file
  (places.lisp: a form starts at its opening parenthesis, past comments
  and false feature expressions);
- its `place` is `unchanged` (the file was compiled as it is);
- each of the oracle's notes is listed, unless compile-file said it left
  notes out (at most 200 are listed, within the result budget).
A note is its severity, message and top-level form: SBCL may signal one
twice for a form (an inline expansion compiled twice), Swank may list it
once.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tests.integration.conftest import McpProcess
from tests.truth.places import Form, Tally, short

ORACLE = Path(__file__).with_name("notes.lisp")


@dataclass(frozen=True)
class Note:
    """One condition SBCL signalled while compiling FILE."""

    file: str
    severity: str
    form: int  # 0-based number of the top-level form
    after: int  # the line where reading that form began
    message: str


UNREADABLE = re.compile(r"#<[^<>]*>")
TRUNCATED = re.compile(r" … \[\d+ more characters truncated\]$")


def one_line(text: str) -> str:
    """TEXT with its whitespace runs one space, and each unreadable object
    (`#<SB-C::CTRAN 1 {1004A2B3C3}>`, whose number and address differ
    between two compilations) the same."""
    return UNREADABLE.sub("#<>", " ".join(text.split()))


def read_notes(pristine: Path, system: str, edited: Path) -> list[Note]:
    """Every note of every source file of SYSTEM in EDITED, as a plain SBCL
    that loaded SYSTEM from PRISTINE compiles them."""
    run = subprocess.run(["sbcl", "--script", str(ORACLE), f"{pristine}/", system, f"{edited}/"],
                         capture_output=True, text=True, timeout=1800, env=os.environ)
    assert run.returncode == 0 and not run.stderr.strip(), run.stderr[-3000:]
    notes = []
    for line in run.stdout.splitlines():
        _, file, severity, form, after, message = line.split("\t", 5)
        notes.append(Note(file, severity, int(form), int(after), one_line(message)))
    return notes


def check_notes(process: McpProcess, tally: Tally, phase: str, notes: list[Note], forms: list[Form],
                files: list[str]) -> None:
    """compile-file's notes of each of FILES against the oracle's NOTES, the
    top-level forms FORMS placing them, counted in TALLY under
    `compiler notes PHASE` by severity."""
    answer = f"compiler notes {phase}"
    by_file: dict[str, list[Form]] = defaultdict(list)
    for form in forms:
        by_file[form.file].append(form)
    for file in files:
        # SBCL may signal one note twice for one form (an inline expansion
        # compiled twice): a note is its severity, message and form.
        expected = {(n.severity, n.message, n.form) for n in notes if n.file == file}
        result = process.call("compile-file", path=file, load=False, notes="all", wait=600)
        got = (result.get("structuredContent") or {}).get("notes")
        if got is None:
            tally.count(answer, "compile-file", f"{short(file)}: no notes: {result['content'][0]['text'][:300]}")
            continue
        text = result["content"][0]["text"]
        # Past 200 notes, or past the result budget, the answer says what it left out.
        cut = "more notes, not listed" in text or "left out: the result was longer" in text
        seen: set[tuple[str, str, int]] = set()
        for note in got:
            if note.get("file") == file:  # another file's notes (its undefined names' uses) are that file's
                tally.count(answer, note["severity"], wrong_note(note, expected, seen, by_file[file], file))
        if not cut:
            for severity, message, form in sorted(expected - seen):
                tally.count(answer, severity, f"{short(file)}: not listed: {severity} in top-level form "
                                              f"{form}: {message[:120]}")


def wrong_note(note: dict, expected: set[tuple[str, str, int]], seen: set[tuple[str, str, int]],
               forms: list[Form], file: str) -> str | None:
    """Why NOTE (one of compile-file's) is wrong, or None; the oracle's note
    it is goes into SEEN."""
    message, line = one_line(note["message"]), note.get("line") or 0
    where = f"{short(file)}:{line} {note['severity']} {message[:100]!r}"
    # A message cut at cl-mcp's limit ends with a line that says so.
    cut = TRUNCATED.search(message)
    kept = message[:cut.start()] if cut else None
    candidates = sorted((form, text) for severity, text, form in expected
                        if severity == note["severity"]
                        and (text == message or (kept is not None and len(text) > len(kept)
                                                 and text.startswith(kept))))
    if not candidates:
        return f"{where}: SBCL signalled no such condition in the file"
    for form, text in candidates:
        if form < len(forms) and forms[form].start <= line <= forms[form].end:
            seen.add((note["severity"], text, form))
            if note.get("place", "unchanged") != "unchanged":
                return f"{where}: place {note.get('place')} in a file compiled as it is"
            return None
    spans = ", ".join(f"{forms[f].start}-{forms[f].end}" if f < len(forms) else f"form {f}" for f, _ in candidates[:3])
    return f"{where}: not inside the top-level form SBCL compiled ({spans})"
