"""The places oracle and the check of cl-mcp's places against it.

The oracle (places.lisp, in a plain SBCL) gives the line where each
defining form of a library starts in its files as they are now.  What a
place must say follows from that and from the line the form had when it was
last compiled (docs/tools.md, Places after edits):

- the definition is in the file no more (deleted, renamed, cut off):
  `not-found`;
- it starts on another line than when compiled: that line, `found-after-edit`
  and `compiledLine` the line it was compiled at;
- on the same line with the same text: `unchanged`, no `compiledLine`;
- on the same line with its text edited: that line, `unchanged`, or
  `found-after-edit` with `compiledLine` that same line.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.integration.conftest import McpProcess

ORACLE = Path(__file__).with_name("places.lisp")


@dataclass(frozen=True)
class Definition:
    """One defining form, as the oracle read it."""

    file: str
    line: int
    type: str
    query: str  # the symbol, package-qualified
    package: str  # the symbol's home, where names are printed
    name: str
    qualifiers: str
    specializers: str
    digest: str  # of the form's text
    end: int  # last line of its top-level form

    @property
    def key(self) -> tuple[str, ...]:
        return (self.type, self.package, self.name, self.qualifiers, self.specializers)


@dataclass(frozen=True)
class Form:
    """One top-level form, as the oracle read it: its first and last lines."""

    file: str
    start: int
    end: int


def read_oracle(pristine: Path, system: str, edited: Path,
                files: list[str] | None = None) -> tuple[list[Definition], list[Form]]:
    """Every definition and every top-level form in the files of EDITED
    (those given, or every source file of SYSTEM), as a plain SBCL that
    loaded SYSTEM from PRISTINE reads them."""
    run = subprocess.run(["sbcl", "--script", str(ORACLE), f"{pristine}/", system, f"{edited}/", *(files or [])],
                         capture_output=True, text=True, timeout=900, env=os.environ)
    assert run.returncode == 0 and not run.stderr.strip(), run.stderr[-3000:]
    found, forms = [], []
    for line in run.stdout.splitlines():
        if line.startswith("FORM\t"):
            _, file, start, end = line.split("\t")
            forms.append(Form(file, int(start), int(end)))
            continue
        file, number, kind, query, package, name, qualifiers, specializers, digest, end = line.split("\t")
        found.append(Definition(file, int(number), kind, query, package, name, qualifiers, specializers,
                                digest, int(end)))
    return found, forms


def oracle(pristine: Path, system: str, edited: Path, files: list[str] | None = None) -> list[Definition]:
    """Every definition in the files of EDITED: see `read_oracle`."""
    return read_oracle(pristine, system, edited, files)[0]


def unique(definitions: list[Definition]) -> dict[tuple[str, ...], Definition]:
    """DEFINITIONS by key, leaving out a key defined twice (which one the
    image holds depends on the load order, not on the text)."""
    counts: dict[tuple[str, ...], int] = {}
    for definition in definitions:
        counts[definition.key] = counts.get(definition.key, 0) + 1
    return {d.key: d for d in definitions if counts[d.key] == 1}


@dataclass
class Compiled:
    """What a definition was when it was last compiled: its line and digest;
    TEXT_KNOWN false when cl-mcp cannot know that text (its file, loaded
    from fasls without cl-mcp, was edited before it was first asked about:
    a place then has no compiledLine)."""

    line: int
    digest: str
    text_known: bool = True


@dataclass
class Tally:
    """Right and wrong answers of one library, by (answer, definition type)."""

    right: dict[tuple[str, str], int] = field(default_factory=dict)
    wrong: dict[tuple[str, str], int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def count(self, answer: str, kind: str, failure: str | None) -> None:
        book = self.wrong if failure else self.right
        book[(answer, kind)] = book.get((answer, kind), 0) + 1
        if failure:
            self.failures.append(f"{answer}: {failure}")

    def add(self, other: "Tally", suffix: str) -> None:
        """OTHER's answers, each named with SUFFIX after its own name."""
        for mine, theirs in ((self.right, other.right), (self.wrong, other.wrong)):
            for (answer, kind), n in theirs.items():
                mine[(f"{answer} {suffix}", kind)] = mine.get((f"{answer} {suffix}", kind), 0) + n
        self.failures += [failure.replace(": ", f" {suffix}: ", 1) for failure in other.failures]


def expected_failure(place: dict[str, Any] | None, now: Definition | None, compiled: Compiled) -> str | None:
    """Why PLACE (a place plist: file, line, place, compiledLine) is wrong
    for a definition that is NOW in the file (None: not any more), compiled
    as COMPILED; None when it is right."""
    if place is None:
        return "no place"
    got = (place.get("line"), place.get("place"), place.get("compiledLine"))
    if now is None:
        return None if place.get("place") == "not-found" else f"expected not-found, got {got}"
    if place.get("file") != now.file:
        return f"file {short(place.get('file', ''))}, expected {short(now.file)}"
    if now.line != compiled.line:
        wanted = [(now.line, "found-after-edit", compiled.line)]
    elif now.digest == compiled.digest:
        wanted = [(now.line, "unchanged", None)]
    else:
        wanted = [(now.line, "unchanged", None), (now.line, "found-after-edit", compiled.line)]
    if not compiled.text_known:
        wanted.append((now.line, "found-after-edit", None))
    return None if got in wanted else f"expected {wanted[0]}, got {got}"


def short(file: str) -> str:
    """FILE within its library's copy, which lives in a temporary directory."""
    return file.split("/edited/", 1)[-1]


def signature(entry: dict[str, Any]) -> tuple[str, str]:
    """A find-definition entry's qualifiers and specializers as the oracle prints them."""
    if entry.get("type") != "method":
        return "", ""
    qualifiers = entry.get("qualifiers") or []
    return ("(" + " ".join(qualifiers) + ")" if qualifiers else "",
            "(" + " ".join(entry.get("specializers") or []) + ")")


def entry_key(entry: dict[str, Any], package: str) -> tuple[str, ...]:
    return (entry.get("type", ""), package, entry.get("name", ""), *signature(entry))


PRIMARY = {"function", "generic-function", "macro", "class", "structure", "condition", "variable", "constant",
           "type", "setf-expander"}
# What places.lisp reads; find-definition lists more (packages, declaims).
READ_TYPES = PRIMARY | {"method", "compiler-macro"}
# Forms that define more than they name: a class's accessors are methods at
# its slots, a generic function's :method options methods at its form.
DEFINES_MORE = {"class", "structure", "condition", "generic-function"}


class Layout:
    """Each file's top-level forms now and the definitions the oracle reads
    in them: where find-definition may list what the oracle cannot name."""

    def __init__(self) -> None:
        self.forms: dict[str, list[Form]] = {}
        self.definitions: dict[str, list[Definition]] = {}

    def update(self, definitions: list[Definition], forms: list[Form], files: list[str] | None = None) -> None:
        """The oracle's DEFINITIONS and FORMS of FILES (or every file)."""
        for file in files if files is not None else {f.file for f in forms}:
            self.forms[file] = [f for f in forms if f.file == file]
            self.definitions[file] = [d for d in definitions if d.file == file]

    def unnamed(self, file: str, line: int) -> bool:
        """True when LINE of FILE is in a top-level form the oracle reads no
        definition in (a library's own defining macro), or one that
        defines more than it names (`DEFINES_MORE`)."""
        for form in self.forms.get(file, []):
            if form.start <= line <= form.end:
                inside = [d for d in self.definitions.get(file, []) if form.start <= d.line <= form.end]
                return not inside or any(d.type in DEFINES_MORE for d in inside)
        return False


def check_places(process: McpProcess, tally: Tally, phase: str, compiled: dict[tuple[str, ...], Definition],
                 lines: dict[tuple[str, ...], Compiled], now: dict[tuple[str, ...], Definition],
                 copy: Path, known: set[tuple[str, ...]], layout: Layout) -> None:
    """Ask find-definition and describe-symbol about every definition of
    COMPILED (the library's, by key, as loaded) and count their places
    right or wrong against NOW (the oracle on the files as they are now)
    and LINES (where each was last compiled), both ways: a definition
    listed twice is wrong, and so is one in COPY's files of a kind the
    oracle reads that KNOWN (every key it read, defined once or more) lacks,
    unless LAYOUT says the oracle cannot name what its line's form defines.
    PHASE names the answers."""
    by_symbol: dict[tuple[str, str], list[Definition]] = {}
    for definition in compiled.values():
        by_symbol.setdefault((definition.query, definition.package), []).append(definition)
    for (query, package), definitions in by_symbol.items():
        found = process.call("find-definition", symbol=query, package=package)
        entries = found.get("structuredContent", {}).get("definitions", [])
        places: dict[tuple[str, ...], dict[str, Any]] = {}
        for entry in (entry for entry in entries if "line" in entry):
            key = entry_key(entry, package)
            where = f"{entry.get('type')} {query} {short(str(entry.get('file', '')))}:{entry['line']}"
            if key in places:
                tally.count(f"find-definition {phase}", "duplicate", f"{where}: duplicate: listed twice")
            elif (str(entry.get("file", "")).startswith(f"{copy}/") and entry.get("type") in READ_TYPES
                  and key not in known and entry.get("place") != "not-found"
                  and not layout.unnamed(entry["file"], entry["line"])):
                tally.count(f"find-definition {phase}", "extra", f"{where}: extra: the text defines no such thing")
            places.setdefault(key, entry)
        for definition in definitions:
            failure = expected_failure(places.get(definition.key), now.get(definition.key), lines[definition.key])
            tally.count(f"find-definition {phase}", definition.type,
                        failure and f"{definition.type} {definition.query} {short(definition.file)}:{definition.line}:"
                                    f" {failure}")
        described = process.call("describe-symbol", symbol=query, package=package)
        location = described.get("structuredContent", {}).get("location")
        primary = [d for d in definitions if d.type in PRIMARY and not d.name.startswith("(")]
        if not (location and "line" in location):
            if any(now.get(d.key) for d in primary):
                tally.count(f"describe-symbol {phase}", "missing",
                            f"{query}: missing: no location, where the library defines {primary[0].type} {primary[0].name}")
            continue
        # Its type says which definition: the symbol's own of that type
        same = [d for d in primary if d.type == location["type"]]
        if len(same) == 1:
            failure = expected_failure(location, now.get(same[0].key), lines[same[0].key])
            tally.count(f"describe-symbol {phase}", same[0].type,
                        failure and f"{same[0].type} {query}: {failure}")
