"""The truth harness on part of its corpus (tests/truth/; `make truth` runs
all of it), and the wrong places it found, each on the library it found it
in: every place is checked against the oracle, a plain SBCL reading the
file as it is now (tests/truth/places.lisp)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.integration.conftest import McpProcess
from tests.truth.corpus import CORPUS, copy_library, load_copy
from tests.truth.mutants import FAST, Mutant, caused, run_mutant
from tests.truth.places import Tally, oracle, unique
from tests.truth.run import check_library

LIBRARIES = {library.directory: library for library in CORPUS}
_copies = itertools.count(1)


@pytest.mark.parametrize("name", ["cl-split-sequence", "named-readtables"])
def test_every_place_of_a_library_before_and_after_edits(name):
    tally = check_library(LIBRARIES[name], rounds=8, seed=37, log=lambda text: None)
    assert sum(tally.right.values()) > 200
    assert tally.right[("xref before edits", "caller")] > 10 and tally.right[("xref after edits", "caller")] > 10
    assert tally.failures == []


@pytest.mark.parametrize("name", ["cl-split-sequence", "alexandria"])
def test_every_place_after_edits_to_files_loaded_from_fasls(name):
    """Issue 43, item 3 (the trial's path): code loaded from fasls without
    cl-mcp leaves Swank no text of the files as compiled, so its snippet,
    read from the edited file, matched wherever it pointed: deleted
    definitions were "unchanged", moved ones a form off (145 wrong places
    in split-sequence)."""
    tally = check_library(LIBRARIES[name], rounds=8, seed=37, log=lambda text: None, from_fasls=True)
    assert tally.right[("find-definition after edits", "function")] > 20
    assert tally.right[("xref after edits", "caller")] > 10
    assert tally.failures == []


@pytest.fixture(scope="module")
def unplanted() -> Tally:
    """cl-split-sequence's check, two rounds of edits, without a planted fault."""
    return check_library(LIBRARIES["cl-split-sequence"], rounds=2, seed=37, log=lambda text: None)


@pytest.mark.parametrize("mutant", FAST, ids=[mutant.name for mutant in FAST])
def test_a_planted_fault_makes_answers_wrong(unplanted, mutant: Mutant):
    """The harness's comparisons see what is missing, extra and wrong: each
    fault planted in a copy of cl-mcp (tests/truth/mutants.py) counts."""
    assert mutant.library == "cl-split-sequence"
    assert caused(run_mutant(mutant, 2, 37, check_library), unplanted) > 0


@pytest.fixture(scope="module")
def lisp():
    process = McpProcess()
    process.initialize()
    yield process
    process.close(60)


def loaded(lisp: McpProcess, tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A pristine copy of library NAME and an edited one, the edited one
    loaded in LISP's image (a system loaded twice is compiled afresh from
    the copy registered last)."""
    library = LIBRARIES[name]
    base = tmp_path / f"copy-{next(_copies)}"
    pristine = copy_library(library, base / "pristine")
    edited = copy_library(library, base / "edited")
    load_copy(lisp, library, edited)
    return pristine, edited


def oracle_line(pristine: Path, edited: Path, system: str, file: Path, kind: str, name: str) -> int | None:
    """The line where the oracle reads the definition KIND NAME in FILE now."""
    found = [d for d in unique(oracle(pristine, system, edited, [str(file)])).values()
             if d.type == kind and d.name == name]
    return found[0].line if found else None


def place(lisp: McpProcess, symbol: str, kind: str, name: str) -> dict:
    result = lisp.call("find-definition", symbol=symbol, package=symbol.split(":")[0])
    found = [d for d in result["structuredContent"]["definitions"] if d["type"] == kind and d["name"] == name]
    assert len(found) == 1, result
    return found[0]


def test_a_form_whose_recorded_position_is_inside_it(lisp, tmp_path):
    # SBCL records split-list-if-not at its body's call, line 107.
    pristine, edited = loaded(lisp, tmp_path, "cl-split-sequence")
    line = oracle_line(pristine, edited, "split-sequence", edited / "list.lisp", "function", "SPLIT-LIST-IF-NOT")
    found = place(lisp, "split-sequence::split-list-if-not", "function", "SPLIT-LIST-IF-NOT")
    assert (found["line"], found["place"], found.get("compiledLine")) == (line, "unchanged", None)


def test_a_definition_on_its_line_after_an_edit_above_that_adds_no_line(lisp, tmp_path):
    pristine, edited = loaded(lisp, tmp_path, "cl-split-sequence")
    vector = edited / "vector.lisp"
    vector.write_text(vector.read_text().replace("(defun split-vector-from-start ",
                                                 "(defun split-vector-from-start-renamed "))
    line = oracle_line(pristine, edited, "split-sequence", vector, "function", "SPLIT-VECTOR-IF")
    found = place(lisp, "split-sequence::split-vector-if", "function", "SPLIT-VECTOR-IF")
    assert (found["line"], found["place"], found.get("compiledLine")) == (line, "unchanged", None)


def test_definitions_past_the_end_of_a_file_cut_short(lisp, tmp_path):
    pristine, edited = loaded(lisp, tmp_path, "cl-split-sequence")
    listing = edited / "list.lisp"
    compiled = oracle_line(pristine, edited, "split-sequence", listing, "function", "SPLIT-LIST")
    listing.write_text("".join(listing.read_text().splitlines(keepends=True)[:56]))
    found = place(lisp, "split-sequence::split-list", "function", "SPLIT-LIST")
    assert (found["place"], found["compiledLine"]) == ("not-found", compiled)


# A definition renamed in its file is not placed at a definition of another
# kind with its old name (a condition at a function), nor at a longer name
# (esrap's files are in a :module: their compiled text is kept too).
RENAMED = [
    ("named-readtables", "src/utils.lisp", "(define-condition simple-program-error ",
     "editor-hints.named-readtables::simple-program-error", "condition", "SIMPLE-PROGRAM-ERROR"),
    ("esrap", "src/variables.lisp", "(defparameter *eval-nonterminals* ",
     "esrap::*eval-nonterminals*", "variable", "*EVAL-NONTERMINALS*"),
]


@pytest.mark.parametrize("library, file, opening, symbol, kind, name", RENAMED,
                         ids=[row[4] for row in RENAMED])
def test_a_renamed_definition_is_not_found(lisp, tmp_path, library, file, opening, symbol, kind, name):
    pristine, edited = loaded(lisp, tmp_path, library)
    source = edited / file
    text = source.read_text()
    assert text.count(opening) == 1, opening
    source.write_text(text.replace(opening, opening.rstrip() + "-renamed "))
    found = place(lisp, symbol, kind, name)
    assert found["place"] == "not-found"


def test_the_compiled_line_is_where_compile_form_compiled_it(lisp, tmp_path):
    pristine, edited = loaded(lisp, tmp_path, "cl-split-sequence")
    api = edited / "api.lisp"
    api.write_text(";;; two lines\n;;; added\n" + api.read_text())
    compiled = oracle_line(pristine, edited, "split-sequence", api, "function", "SPLIT-SEQUENCE")
    result = lisp.call("compile-form", path=str(api), line=compiled)
    assert not result["isError"], result
    found = place(lisp, "split-sequence:split-sequence", "function", "SPLIT-SEQUENCE")
    assert (found["line"], found["place"]) == (compiled, "unchanged")
    api.write_text(";;; and three\n;;; more\n;;; lines\n" + api.read_text())
    found = place(lisp, "split-sequence:split-sequence", "function", "SPLIT-SEQUENCE")
    assert (found["line"], found["place"], found["compiledLine"]) == (compiled + 3, "found-after-edit", compiled)

@pytest.mark.parametrize("blank", ["\n  ", "\t"])
def test_compile_form_reads_in_the_package_of_an_in_package_with_a_line_break(lisp, tmp_path, blank):
    pristine, edited = loaded(lisp, tmp_path, "cl-split-sequence")
    api = edited / "api.lisp"
    api.write_text(api.read_text().replace("(in-package :split-sequence)", f"(in-package{blank}:split-sequence)"))
    line = oracle_line(pristine, edited, "split-sequence", api, "function", "SPLIT-SEQUENCE")
    result = lisp.call("compile-form", path=str(api), line=line)
    assert (result["isError"], result["structuredContent"]["package"]) == (False, "SPLIT-SEQUENCE"), result

def test_describe_symbol_says_the_file_was_edited_as_find_definition_does(lisp, tmp_path):
    pristine, edited = loaded(lisp, tmp_path, "cl-split-sequence")
    api = edited / "api.lisp"
    compiled = oracle_line(pristine, edited, "split-sequence", api, "function", "SPLIT-SEQUENCE")
    api.write_text(";;; a line added\n" + api.read_text())
    described = lisp.call("describe-symbol", symbol="split-sequence:split-sequence")
    note = f"api.lisp:{compiled + 1}:1 (the file was edited since this was compiled at line {compiled})"
    assert note in described["content"][0]["text"], described


def test_a_method_after_an_edit_in_a_file_ending_in_forms_for_other_lisps(lisp, tmp_path):
    # Swank counts a method's place by its top-level form's number in the
    # file as it is now; core.lisp ends in #+ccl forms, which SBCL skips.
    pristine, edited = loaded(lisp, tmp_path, "lparallel")
    core = edited / "src" / "kernel" / "core.lisp"
    compiled = oracle_line(pristine, edited, "lparallel", core, "method", "PRINT-OBJECT")
    lines = core.read_text().splitlines(keepends=True)
    core.write_text("".join(lines[:139] + [";; inserted\n"] * 5 + lines[139:]))
    result = lisp.call("find-definition", symbol="print-object", package="LPARALLEL.KERNEL")
    found = [d for d in result["structuredContent"]["definitions"] if d.get("specializers") == ["KERNEL", "T"]]
    assert [(d["line"], d["place"], d.get("compiledLine")) for d in found] == [
        (compiled + 5, "found-after-edit", compiled)]


def callers_of(lisp: McpProcess, symbol: str, caller: str) -> tuple[list[dict], str]:
    """xref's references from CALLER to SYMBOL, and its text."""
    result = lisp.call("xref", symbol=symbol, relation="calls")
    assert not result["isError"], result
    found = [r for r in result["structuredContent"]["references"] if r["name"] == caller]
    return found, result["content"][0]["text"]


def test_an_xref_caller_whose_docstring_has_a_line_opening_a_parenthesis(lisp, tmp_path):
    library = LIBRARIES["cl-split-sequence"]
    pristine = copy_library(library, tmp_path / "pristine")
    edited = copy_library(library, tmp_path / "edited")
    api = edited / "api.lisp"
    api.write_text(api.read_text().replace(
        "(key #'identity))\n  (check-bounds sequence start end)\n  (etypecase sequence\n    (list (split-list-if-not ",
        "(key #'identity))\n  \"Splits where PREDICATE is false:\n(split-sequence-if-not #'alpha-char-p \\\"a1\\\")\"\n"
        "  (check-bounds sequence start end)\n  (etypecase sequence\n    (list (split-list-if-not ", 1))
    load_copy(lisp, library, edited)
    line = oracle_line(pristine, edited, "split-sequence", api, "function", "SPLIT-SEQUENCE-IF-NOT")
    found, _ = callers_of(lisp, "split-sequence::split-list-if-not", "SPLIT-SEQUENCE:SPLIT-SEQUENCE-IF-NOT")
    assert [(r["line"], r["referenceLine"]) for r in found] == [(line, line + 6)], found


def test_an_xref_reference_cut_off_keeps_the_line_it_was_compiled_at(lisp, tmp_path):
    # The caller is gone too: its name, looked for then, gave the caller's line.
    pristine, edited = loaded(lisp, tmp_path, "cl-split-sequence")
    found, _ = callers_of(lisp, "split-sequence::collect-until", "SPLIT-SEQUENCE::SPLIT-LIST-FROM-START")
    compiled = [r["referenceLine"] for r in found]
    listing = edited / "list.lisp"
    listing.write_text("".join(listing.read_text().splitlines(keepends=True)[:56]))
    found, text = callers_of(lisp, "split-sequence::collect-until", "SPLIT-SEQUENCE::SPLIT-LIST-FROM-START")
    assert [(r["place"], r["compiledLine"]) for r in found] == [("not-found", line) for line in compiled]
    assert f"(the reference is not in the file as it is now; line {compiled[0]} when compiled)" in text


def test_xref_says_its_compiled_line_is_the_reference_s(lisp, tmp_path):
    pristine, edited = loaded(lisp, tmp_path, "cl-split-sequence")
    found, _ = callers_of(lisp, "split-sequence::split-list-if-not", "SPLIT-SEQUENCE:SPLIT-SEQUENCE-IF-NOT")
    compiled = found[0]["referenceLine"]
    api = edited / "api.lisp"
    api.write_text(";;; a line added\n" + api.read_text())
    found, text = callers_of(lisp, "split-sequence::split-list-if-not", "SPLIT-SEQUENCE:SPLIT-SEQUENCE-IF-NOT")
    assert (found[0]["referenceLine"], found[0]["compiledLine"]) == (compiled + 1, compiled)
    assert f"(reference at line {compiled + 1}) (the file was edited since this reference was compiled at line {compiled})" in text


def test_an_xref_caller_after_a_feature_expression_is_placed_at_its_form(lisp, tmp_path):
    # `#-:use-acl-regexp2-engine` stands on the line above the method.
    pristine, edited = loaded(lisp, tmp_path, "cl-ppcre")
    api = edited / "api.lisp"
    [method] = [d for d in unique(oracle(pristine, "cl-ppcre", edited, [str(api)])).values()
                if (d.type, d.name, d.specializers) == ("method", "CREATE-SCANNER", "(STRING)")]
    found, _ = callers_of(lisp, "cl-ppcre:parse-string", "(DEFMETHOD CL-PPCRE:CREATE-SCANNER (STRING))")
    assert [r["line"] for r in found] == [method.line], found


def test_an_xref_caller_after_a_form_a_false_feature_skips_is_the_next_form(lisp, tmp_path):
    # Swank places WALK-CDR's reference on the `#+nil` line above it, where SBCL's reader started.
    pristine, edited = loaded(lisp, tmp_path, "iterate")
    line = oracle_line(pristine, edited, "iterate", edited / "iterate.lisp", "function", "WALK-CDR")
    found, _ = callers_of(lisp, "iterate::walk-arglist", "ITERATE::WALK-CDR")
    assert found and [r["line"] for r in found] == [line] * len(found), found


def test_an_xref_reference_on_a_form_a_false_feature_skips_is_at_its_caller_s_opening(lisp, tmp_path):
    # Swank cannot read WALK-CDR's form (its #L is iterate's compile-time
    # readtable's only) and places the reference where SBCL's reader started
    # it, on the `#+nil` form above; lines put between the two move only the caller.
    pristine, edited = loaded(lisp, tmp_path, "iterate")
    source = edited / "iterate.lisp"
    line = oracle_line(pristine, edited, "iterate", source, "function", "WALK-CDR")
    found, _ = callers_of(lisp, "iterate::walk-arglist", "ITERATE::WALK-CDR")
    assert [(r["line"], r["referenceLine"], r["place"]) for r in found] == [(line, line, "unchanged")], found
    source.write_text(source.read_text().replace("\n(defun walk-cdr ", "\n;; one\n;; two\n;; three\n(defun walk-cdr ", 1))
    found, _ = callers_of(lisp, "iterate::walk-arglist", "ITERATE::WALK-CDR")
    assert [(r["line"], r["referenceLine"], r["place"], r["compiledLine"]) for r in found] == [
        (line + 3, line + 3, "found-after-edit", line)], found


def test_an_xref_reference_whose_caller_was_deleted_is_not_found_at_a_like_call(lisp, tmp_path):
    # MODIFY-RULE, further down, holds a `(rule-expression rule)` line too.
    pristine, edited = loaded(lisp, tmp_path, "esrap")
    interface = edited / "src" / "interface.lisp"
    found, _ = callers_of(lisp, "esrap::rule-expression", "ESRAP:ADD-RULE")
    compiled = [r["referenceLine"] for r in found]
    text = interface.read_text()
    start = text.index("(defun add-rule (symbol rule)")
    interface.write_text(text[:start] + text[text.index("(defun find-rule (symbol)"):])
    found, _ = callers_of(lisp, "esrap::rule-expression", "ESRAP:ADD-RULE")
    assert compiled and [(r["place"], r["compiledLine"]) for r in found] == [("not-found", line) for line in compiled]


def test_an_xref_reference_whose_caller_was_renamed_is_not_found_beside_a_compiler_macro_of_its_name(lisp,
                                                                                                     tmp_path):
    # cl-ppcre's SPLIT is a function and, below it, a compiler macro: renamed,
    # its form defines another function, and SPLIT is no longer in the file
    # (issue 43: the held-out oracles found the renamed caller still placed).
    pristine, edited = loaded(lisp, tmp_path, "cl-ppcre")
    api = edited / "api.lisp"
    found, _ = callers_of(lisp, "cl-ppcre::create-scanner", "CL-PPCRE:SPLIT")
    compiled = sorted(r["referenceLine"] for r in found)
    lines = api.read_text().splitlines(keepends=True)
    opening = lines.index("(defun split (regex target-string\n")
    lines[opening] = "(defun split-renamed (regex target-string\n"
    api.write_text("".join(lines[:opening + 1] + [";; inserted\n"] * 4 + lines[opening + 1:]))
    found, _ = callers_of(lisp, "cl-ppcre::create-scanner", "CL-PPCRE:SPLIT")
    assert compiled and sorted((r["place"], r["compiledLine"]) for r in found) == [
        ("not-found", line) for line in compiled], found


def test_an_xref_reference_whose_function_was_deleted_is_not_placed_at_its_compiler_macro(lisp, tmp_path):
    pristine, edited = loaded(lisp, tmp_path, "cl-ppcre")
    api = edited / "api.lisp"
    found, _ = callers_of(lisp, "cl-ppcre::create-scanner", "CL-PPCRE:SPLIT")
    compiled = sorted(r["referenceLine"] for r in found)
    text = api.read_text()
    start = text.index("(defun split (regex target-string\n")
    api.write_text(text[:start] + text[text.index("#-:cormanlisp\n(define-compiler-macro split "):])
    found, _ = callers_of(lisp, "cl-ppcre::create-scanner", "CL-PPCRE:SPLIT")
    assert compiled and sorted((r["place"], r["compiledLine"]) for r in found) == [
        ("not-found", line) for line in compiled], found


def references_from(lisp: McpProcess, symbol: str, caller: str) -> list[dict]:
    """xref's references to SYMBOL from the referrer whose printed name holds CALLER."""
    result = lisp.call("xref", symbol=symbol, relation="calls")
    assert not result["isError"], result
    return [r for r in result["structuredContent"]["references"] if caller in r["name"]]


@pytest.mark.parametrize("name, callee, caller, deleted, next_form", [
    # The two methods differ in their closure macro's name and the opening line.
    ("cl-ppcre", "cl-ppcre::create-matcher-aux", "CREATE-NON-GREEDY-CONSTANT-LENGTH-MATCHER",
     "(defmethod create-non-greedy-constant-length-matcher ", "(defgeneric create-non-greedy-no-zero-matcher "),
    # SPLIT-VECTOR-IF is SPLIT-VECTOR-IF-NOT with position-if for position-if-not.
    ("cl-split-sequence", "split-sequence::split-vector-from-start", "SPLIT-VECTOR-IF-NOT",
     "(defun split-vector-if-not\n", "(defun split-vector\n"),
])
def test_an_xref_reference_whose_caller_was_deleted_is_not_found_in_its_twin(lisp, tmp_path, name, callee,
                                                                              caller, deleted, next_form):
    pristine, edited = loaded(lisp, tmp_path, name)
    [source] = [path for path in edited.rglob("*.lisp") if deleted in path.read_text()]
    compiled = sorted(r["referenceLine"] for r in references_from(lisp, callee, caller))
    text = source.read_text()
    source.write_text(text[:text.index(deleted)] + text[text.index(next_form):])
    found = references_from(lisp, callee, caller)
    assert compiled and sorted((r["place"], r["compiledLine"]) for r in found) == [
        ("not-found", line) for line in compiled], found


def test_an_xref_caller_read_past_forms_a_false_feature_skips_is_placed_at_its_form(lisp, tmp_path):
    # The #-:lispworks method deleted but not its `#-:lispworks` line: that
    # line now reads STREAM-WRITE-CHAR's method, past two #+:lispworks ones.
    pristine, edited = loaded(lisp, tmp_path, "cl-flexi-streams")
    output = edited / "output.lisp"
    text = output.read_text()
    start = text.index("(defmethod write-byte* (byte (flexi-output-stream flexi-output-stream))  \n")
    text = text[:start] + text[text.index("#+:lispworks\n(defmethod write-byte*"):]
    output.write_text(text)
    line = text[:text.index("(defmethod stream-write-char ((stream flexi-output-stream) char)\n")].count("\n") + 1
    found = references_from(lisp, "flexi-streams::char-to-octets", "STREAM-WRITE-CHAR")
    assert found and [r["line"] for r in found] == [line] * len(found), found


def test_a_deleted_method_is_not_found_at_its_twin_that_a_false_feature_skips(lisp, tmp_path):
    # Deleted with its `#-:lispworks` line left: its #+:lispworks twin,
    # word for word, comes next, and SBCL's reader skips it.
    pristine, edited = loaded(lisp, tmp_path, "cl-flexi-streams")
    output = edited / "output.lisp"
    text = output.read_text()
    start = text.index("(defmethod write-byte* (byte (flexi-output-stream flexi-output-stream))  \n")
    output.write_text(text[:start] + text[text.index("#+:lispworks\n(defmethod write-byte*"):])
    result = lisp.call("find-definition", symbol="flexi-streams::write-byte*")
    found = [d for d in result["structuredContent"]["definitions"]
             if d["type"] == "method" and d.get("specializers") == ["T", "FLEXI-STREAMS:FLEXI-OUTPUT-STREAM"]]
    assert len(found) == 1 and found[0]["place"] == "not-found", result


def test_a_deleted_after_method_is_not_found_at_its_primary_method(lisp, tmp_path):
    # flexi-streams' STREAM-WRITE-CHAR has a primary and an :after method
    # with the same specializers: the :after one deleted is not at the other.
    pristine, edited = loaded(lisp, tmp_path, "cl-flexi-streams")
    output = edited / "output.lisp"
    text = output.read_text()
    start = text.index("(defmethod stream-write-char :after ((stream flexi-output-stream) char)\n")
    output.write_text(text[:start] + text[text.index("\n\n(", start) + 2:])
    result = lisp.call("find-definition", symbol="sb-gray:stream-write-char")
    found = [d for d in result["structuredContent"]["definitions"]
             if d["type"] == "method" and d.get("qualifiers") == [":AFTER"]
             and d.get("specializers") == ["FLEXI-STREAMS:FLEXI-OUTPUT-STREAM", "T"]]
    assert len(found) == 1 and found[0]["place"] == "not-found", result


def test_an_xref_reference_in_a_form_holding_a_utf_8_character_literal_is_at_its_call(lisp, tmp_path):
    # esrap's TRACE-RULE holds `#\¶`: Swank reads the file as Latin-1, where
    # that is no character, and placed every reference at the caller's opening.
    pristine, edited = loaded(lisp, tmp_path, "esrap")
    interface = edited / "src" / "interface.lisp"
    lines = interface.read_text().splitlines()
    found = references_from(lisp, "esrap::cell-function", "TRACE-RULE")
    assert found and all(r["referenceLine"] > r["line"] for r in found), found
    assert all("(cell-function " in lines[r["referenceLine"] - 1] for r in found), found


def test_xref_references_in_files_loaded_from_fasls_are_at_their_calls(lisp, tmp_path):
    # cl-ppcre loaded from fasls, each file two lines longer above: a
    # method's cross-reference names its specializers in one list, a
    # `#.*standard-optimize-settings*' and a `#.(truncate char-code-limit 3)'
    # count in the compiler's numbers, a method may be a DEFGENERIC's
    # (:method ...) option, and SCAN-TO-STRINGS has a compiler macro below
    # its DEFUN.  They were placed at the caller's opening, at a twin, or at
    # the compiler macro.
    library = LIBRARIES["cl-ppcre"]
    edited = copy_library(library, tmp_path)
    load_copy(lisp, library, edited, from_fasls=True)
    for name in ["convert.lisp", "regex-class-util.lisp", "charset.lisp", "api.lisp"]:
        path = edited / name
        path.write_text(path.read_text().replace("(in-package :cl-ppcre)\n", "(in-package :cl-ppcre)\n;;; one\n;;; two\n", 1))
    # (symbol, file, the call's text, the callers asked about: None for all in the file)
    calls = [
        ("cl-ppcre::digit-char-p", "convert.lisp", "#'digit-char-p", None),
        ("cl-ppcre::remove-registers", "regex-class-util.lisp", "remove-registers", None),
        ("cl-ppcre::make-char-vector", "charset.lisp", "make-char-vector", None),
        ("cl-ppcre::nsubseq", "api.lisp", "#'nsubseq", {"CL-PPCRE:SCAN-TO-STRINGS"}),
    ]
    for symbol, name, call, callers in calls:
        result = lisp.call("xref", symbol=symbol, relation="calls")
        assert not result["isError"], result
        lines = (edited / name).read_text().splitlines()
        references = [r for r in result["structuredContent"]["references"]
                      if r.get("file") == str(edited / name) and (callers is None or r["name"] in callers)]
        assert len(references) >= (1 if callers else 2), result
        for reference in references:
            assert reference["place"] == "found-after-edit", reference
            assert call in lines[reference["referenceLine"] - 1], reference
            assert lines[reference["line"] - 1].startswith("(def") and reference["line"] <= reference["referenceLine"]
            assert not lines[reference["line"] - 1].startswith("(define-compiler-macro"), reference


def test_setf_methods_in_files_loaded_from_fasls_are_found_by_their_names(lisp, tmp_path):
    # flexi-streams loaded from fasls, in-memory.lisp two lines longer
    # above: each (setf stream-file-position) method was "not found in the
    # file as it is now", its DEFMETHOD (SETF NAME) never matched by name.
    library = LIBRARIES["cl-flexi-streams"]
    edited = copy_library(library, tmp_path)
    load_copy(lisp, library, edited, from_fasls=True)
    path = edited / "in-memory.lisp"
    path.write_text(path.read_text().replace("(in-package :flexi-streams)\n",
                                             "(in-package :flexi-streams)\n;;; one\n;;; two\n", 1))
    lines = path.read_text().splitlines()
    result = lisp.call("find-definition", symbol="trivial-gray-streams:stream-file-position")
    setf_methods = [d for d in result["structuredContent"]["definitions"]
                    if d["name"] == "(SETF TRIVIAL-GRAY-STREAMS:STREAM-FILE-POSITION)" and d["file"] == str(path)]
    assert len(setf_methods) == 2, result["content"][0]["text"]
    for definition in setf_methods:
        assert definition["place"] == "found-after-edit", definition
        assert lines[definition["line"] - 1].startswith("(defmethod (setf stream-file-position) "), definition
        specializer = definition["specializers"][1].rpartition(":")[2].lower()
        assert f"(stream {specializer}))" in lines[definition["line"] - 1], definition
