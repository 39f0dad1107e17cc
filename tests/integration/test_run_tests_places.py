"""run-tests' failure places go through the edit–compile loop's resolver,
embedded and attached: copies of split-sequence (Debian's FiveAM suite,
nobody here wrote it) and of the fixture suites (Fiasco, RT) are loaded,
then lines are inserted above their failing tests.  A test run by name
(which loads nothing) gives each failing test where it is now, with the
status and compiled line find-definition gives for a definition moved by
the same edit; a run of the system, whose test-op recompiles the edited
file, gives the same line as unchanged."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.devtools import FIXTURES, MODES, checked_call, cl_mcp_in, registered_copy

SPLIT_SEQUENCE = Path("/usr/share/common-lisp/source/cl-split-sequence")
INSERTED = ";;; Three lines\n;;; inserted above\n\n"


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param) as process:
        yield process


def edit(path: Path, old: str, new: str) -> None:
    """Replace OLD in PATH a second after now: ASDF's timestamps have whole
    seconds, so an edit in the second its fasl was written would look already
    compiled, and the system's test-op would not compile it again."""
    text = path.read_text()
    assert text.count(old) == 1, old
    time.sleep(1.05)
    path.write_text(text.replace(old, new))


def line_of(path: Path, opening: str) -> int:
    """The 1-based line of the file as it is now that starts with OPENING."""
    lines = [number for number, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(opening)]
    assert len(lines) == 1, (opening, lines)
    return lines[0]


def load(process, system: str) -> None:
    loaded = process.call("load-system", system=system)
    assert not loaded["isError"], loaded


def places(process, **arguments) -> set[tuple]:
    """The places of run-tests' failures and errors: (file, line, place, compiledLine)."""
    result = checked_call(process, "run-tests", **arguments)
    problems = result["structuredContent"]["tests"]["problems"]
    assert problems, result
    return {(p["place"]["file"], p["place"]["line"], p["place"].get("place"), p["place"].get("compiledLine"))
            for p in problems}


def definition(process, symbol: str) -> dict:
    found = checked_call(process, "find-definition", symbol=symbol)["structuredContent"]["definitions"]
    assert len(found) == 1, found
    return found[0]


def test_a_fiveam_failure_moved_by_an_edit_is_where_find_definition_places_its_file(lisp, tmp_path):
    copy = registered_copy(lisp, SPLIT_SEQUENCE, tmp_path / "split-sequence")
    tests_file = copy / "tests.lisp"
    edit(tests_file, '(define-test split-sequence.1 (:input (input "a;;b;c")\n',
         '(define-test split-sequence.1 (:input (input "a;;b;;c")\n')
    load(lisp, "split-sequence/tests")
    compiled = line_of(tests_file, "(define-test split-sequence.1 ")
    macro_compiled = line_of(tests_file, "(defmacro epmv ")
    edit(tests_file, "(in-package :split-sequence/tests)\n", "(in-package :split-sequence/tests)\n" + INSERTED)
    moved = line_of(tests_file, "(define-test split-sequence.1 ")
    assert moved == compiled + 3
    macro = definition(lisp, "split-sequence/tests::epmv")
    assert (macro["line"], macro["place"], macro["compiledLine"]) == (
        macro_compiled + 3, "found-after-edit", macro_compiled)
    assert places(lisp, test=":split-sequence") == {(str(tests_file), moved, "found-after-edit", compiled)}
    # The system's test-op recompiles the edited file: the place is as compiled.
    assert places(lisp, system="split-sequence") == {(str(tests_file), moved, "unchanged", None)}
    assert definition(lisp, "split-sequence/tests::epmv")["place"] == "unchanged"


def test_fiasco_and_rt_failures_moved_by_an_edit(lisp, tmp_path):
    copy = registered_copy(lisp, FIXTURES / "run-tests-fixture", tmp_path / "run-tests-fixture")
    fiasco, rt = copy / "fiasco-suite.lisp", copy / "rt-suite.lisp"
    load(lisp, "run-tests-fixture/fiasco")
    load(lisp, "run-tests-fixture/rt")
    edit(fiasco, "(defun triple ", INSERTED + "(defun triple ")
    edit(rt, "(deftest adds.1 ", INSERTED + "(deftest adds.1 ")
    # Fiasco's test is a function: its place is the one Swank records.
    failing = definition(lisp, "run-tests-fixture/fiasco::triples-wrongly")
    assert (failing["line"], failing["place"], failing["compiledLine"]) == (17, "found-after-edit", 14)
    assert places(lisp, test="run-tests-fixture/fiasco::triples-wrongly") == {
        (str(fiasco), 17, "found-after-edit", 14)}
    # RT's entries record none: found by name in the compiled text, then resolved.
    assert places(lisp, test="run-tests-fixture/rt::adds.2") == {(str(rt), 11, "found-after-edit", 8)}


def test_a_test_made_by_a_generating_form_is_not_placed_at_a_form_of_its_name(lisp, tmp_path):
    """ironclad's test ADLER32, made by a #.(loop … collect `(rtest:deftest
    ,digest …)) form, was placed at (defstruct (adler32 …) (issue 43): a
    form whose operator defines no test is no test's place."""
    copy = registered_copy(lisp, FIXTURES / "run-tests-fixture", tmp_path / "run-tests-fixture")
    rt = copy / "rt-suite.lisp"
    rt.write_text(rt.read_text() + "\n(defstruct (made.1) x)\n\n"
                  "(macrolet ((checks () `(progn ,@(loop for name in '(made.1)\n"
                  "                                       collect `(deftest ,name (+ 1 1) 3)))))\n"
                  "  (checks))\n")
    load(lisp, "run-tests-fixture/rt")
    result = checked_call(lisp, "run-tests", test="run-tests-fixture/rt::made.1")
    [problem] = result["structuredContent"]["tests"]["problems"]
    assert "line" not in problem["place"] and "no form naming this test" in problem["place"]["error"], problem
