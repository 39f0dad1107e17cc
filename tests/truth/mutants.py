"""Planted faults: each comparison of the harness proved able to fail.

Each mutant is one small fault planted in a scratch copy of cl-mcp (its
Python package, swank-bootstrap.lisp and the agent's parts; the copy runs
first on PYTHONPATH, and its agent, another digest, is compiled afresh).
The harness then checks one library of the corpus against that copy
(`check_library`, a few rounds of edits); the fault must make some answers
wrong.  A mutant that makes none shows a comparison that cannot see it, and
fails `make truth`."""

from __future__ import annotations

import shutil
from collections import Counter
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tests.truth.corpus import CORPUS, Library
from tests.truth.places import Tally
from tests.truth.places_of_tests import check_test_places
from tests.truth.tests_oracle import check_library_tests
from tests.truth.threads import check_library_threads

ROOT = Path(__file__).parents[2]


@dataclass(frozen=True)
class Mutant:
    """A fault: in FILE (of the repository), OLD, found exactly once, becomes NEW."""

    name: str
    file: str
    old: str
    new: str
    library: str = "cl-split-sequence"
    # The check in its reach: "places" (places, xref and notes: run.py's
    # check_library), "running" (backtraces and output: threads.py) or
    # "tests" (run-tests' results and places).
    check: str = "places"


MUTANTS = [
    Mutant("xref drops every other caller", "agent/code.lisp",
           ":references (loop for (name location method) in found\n",
           ":references (loop for (name location method) in found by #'cddr\n"),
    Mutant("xref lists its first caller twice", "cl_mcp/tools/code.py",
           '"references": [reference_structure(r) for r in references]}',
           '"references": [reference_structure(r) for r in references + references[:1]]}'),
    Mutant("xref places each reference at its caller's first line", "cl_mcp/tools/code.py",
           'structure["referenceLine"] = reference["reference-line"]',
           'structure["referenceLine"] = reference["line"]'),
    Mutant("find-definition lists a copy one line up before each definition", "cl_mcp/tools/names.py",
           '"definitions": [definition_structure(d) for d in definitions]}',
           '"definitions": [s for d in definitions for s in ([{**definition_structure(d), '
           '"line": definition_structure(d)["line"] - 1}] if "line" in definition_structure(d) else [])'
           ' + [definition_structure(d)]]}'),
    Mutant("describe-symbol gives no location", "cl_mcp/tools/names.py",
           'if result.get("location"):', 'if result.get("location") and False:'),
    Mutant("a place found after an edit is called unchanged (status unchanged)", "cl_mcp/results/render.py",
           'structure["place"] = place["status"]',
           'structure["place"] = "unchanged" if place["status"] == "found-after-edit" else place["status"]'),
    Mutant("a place gone from the file is called found after an edit (status not-found)",
           "cl_mcp/results/render.py", 'structure["place"] = place["status"]',
           'structure["place"] = "found-after-edit" if place["status"] == "not-found" else place["status"]'),
    Mutant("the compiled line is one more (status found-after-edit)", "cl_mcp/results/render.py",
           'structure["compiledLine"] = place["compiled-line"]',
           'structure["compiledLine"] = place["compiled-line"] + 1'),
    Mutant("edit-form gives Swank's source cache the text it wrote (the trial's xref after an edit-form)",
           "agent/edit.lisp",
           "(lambda () (keep-past-cancel",
           "(lambda () (let ((cache swank/source-file-cache::*source-file-cache*))"
           " (remhash (truename file) cache) (remhash (namestring (truename file)) cache)"
           " (remember-source (truename file))) (keep-past-cancel"),
    Mutant("backtrace puts a made-up frame before each real one", "cl_mcp/results/render.py",
           '        frames.append({"index": index, "call": frame,',
           '        frames.append({"index": index, "call": "(TRUTH-MADE-UP-FRAME)", "locals": []})\n'
           '        frames.append({"index": index, "call": frame,', check="running"),
    Mutant("a frame is placed 1000 lines down", "cl_mcp/results/render.py",
           "    structure = place_structure(place)\n    for key in",
           '    structure = place_structure(place)\n    if "line" in structure:\n'
           '        structure["line"] += 1000\n    for key in', check="running"),
    Mutant("an error's backtrace leaves out its first frame", "cl_mcp/results/render.py",
           'for i, frame in enumerate(backtrace))', 'for i, frame in enumerate(backtrace[1:]))',
           check="running"),
    Mutant("read-output leaves out the last line", "cl_mcp/tools/output.py",
           'last = len(lines) if "length" not in arguments', 'last = len(lines) - 1 if "length" not in arguments',
           "lparallel", check="running"),
    Mutant("run-tests places each problem a line down", "cl_mcp/tools/run_tests.py",
           'structure["place"] = place_structure(problem["place"])',
           'structure["place"] = place_structure(problem["place"])\n'
           '    if "line" in structure["place"]:\n        structure["place"]["line"] += 1', check="tests"),
    Mutant("run-tests counts one test fewer passed", "cl_mcp/tools/run_tests.py",
           'structure.update({key: tests[key] for key in ("counts", "passed", "failed", "errored", "skipped")})',
           'structure.update({key: tests[key] for key in ("counts", "passed", "failed", "errored", "skipped")},'
           ' passed=tests["passed"] - 1)', check="tests"),
    Mutant("compile-file leaves out its first note", "cl_mcp/tools/code.py",
           '"notes": [note_structure(note) for note in notes]}',
           '"notes": [note_structure(note) for note in notes[1:]]}', "cl-ppcre"),
]

# The three make test runs, fast (cl-split-sequence, two rounds of edits).
FAST = [MUTANTS[0], MUTANTS[2], MUTANTS[3]]


def planted(mutant: Mutant, scratch: Path) -> Path:
    """A copy of cl-mcp in SCRATCH with MUTANT's fault; its directory."""
    copy = scratch / "cl-mcp"
    shutil.copytree(ROOT / "cl_mcp", copy / "cl_mcp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "agent", copy / "agent")
    shutil.copy(ROOT / "swank-bootstrap.lisp", copy / "swank-bootstrap.lisp")
    target = copy / mutant.file
    text = target.read_text(encoding="utf-8")
    assert text.count(mutant.old) == 1, f"{mutant.name}: {mutant.old!r} is not in {mutant.file} exactly once"
    target.write_text(text.replace(mutant.old, mutant.new), encoding="utf-8")
    return copy


def check_of(mutant: Mutant, rounds: int, seed: int, check_library: Callable[..., Tally],
             env: dict[str, str] | None = None) -> Tally:
    """The tally of the check that MUTANT's fault is in reach of, on its
    library: CHECK_LIBRARY's (tests/truth/run.py's; ROUNDS rounds of edits
    seeded with SEED), or the running-code answers', cl-mcp in ENV."""
    library: Library = next(lib for lib in CORPUS if lib.directory == mutant.library)
    if mutant.check == "places":
        return check_library(library, rounds, seed, log=lambda text: None, env=env)
    tally = Tally()
    if mutant.check == "running":
        check_library_threads(library, tally, 1, seed, log=lambda text: None, env=env)
    else:
        check_library_tests(library, tally, env=env)
        check_test_places(library, tally, log=lambda text: None, env=env)
    return tally


def run_mutant(mutant: Mutant, rounds: int, seed: int, check_library: Callable[..., Tally]) -> Tally:
    """`check_of' MUTANT against cl-mcp with MUTANT planted."""
    with tempfile.TemporaryDirectory(prefix="cl-mcp-mutant-") as scratch:
        copy = planted(mutant, Path(scratch))
        return check_of(mutant, rounds, seed, check_library, env={"PYTHONPATH": str(copy)})


def caused(planted_tally: Tally, baseline: Tally) -> int:
    """How many wrong answers PLANTED_TALLY has that BASELINE, the same run
    without the fault, does not."""
    return sum((Counter(planted_tally.failures) - Counter(baseline.failures)).values())
