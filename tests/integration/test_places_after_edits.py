"""Places that stay true after edits: find-definition, xref and
describe-symbol on split-sequence (Debian's cl-split-sequence, code nobody
here wrote), copied to a temporary directory and loaded, then edited on
disk without recompiling.  Every place is checked against the file as it
is at that moment: its line holds the definition's first line.  In an
image cl-mcp owns and in a programmer's image it attaches to."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.devtools import MODES, checked_call, cl_mcp_in, loaded_copy

SPLIT_SEQUENCE = Path("/usr/share/common-lisp/source/cl-split-sequence")


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param) as process:
        yield process


@pytest.fixture
def library(lisp, tmp_path):
    """A fresh copy of split-sequence, loaded from its directory: (process, directory)."""
    return lisp, loaded_copy(lisp, SPLIT_SEQUENCE, "split-sequence", tmp_path)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


def line_of(path: Path, opening: str) -> int:
    """The 1-based line of the file as it is now that starts with OPENING."""
    lines = [number for number, line in enumerate(path.read_text().splitlines(), 1)
             if line.lstrip().startswith(opening)]
    assert len(lines) == 1, (opening, lines)
    return lines[0]


def definition(process, symbol: str, kind: str = "function") -> dict:
    result = checked_call(process, "find-definition", symbol=symbol)
    found = [d for d in result["structuredContent"]["definitions"] if d["type"] == kind]
    assert len(found) == 1, result
    return found[0] | {"text": result["content"][0]["text"]}


def test_an_unedited_file_is_unchanged(library):
    process, directory = library
    place = definition(process, "split-sequence:split-sequence")
    assert place["file"] == str(directory / "api.lisp")
    assert place["line"] == line_of(directory / "api.lisp", "(defun split-sequence ")
    assert place["place"] == "unchanged" and "compiledLine" not in place
    assert place["snippet"].startswith("(defun split-sequence ")


def test_lines_added_above_a_definition(library):
    process, directory = library
    api = directory / "api.lisp"
    compiled = line_of(api, "(defun split-sequence ")
    edit(api, "(declaim (ftype", ";;; Four lines\n;;; added above\n(defvar *new* 1)\n\n(declaim (ftype")
    place = definition(process, "split-sequence:split-sequence")
    assert place["line"] == line_of(api, "(defun split-sequence ") == compiled + 4
    assert (place["place"], place["compiledLine"]) == ("found-after-edit", compiled)
    assert place["snippet"].startswith("(defun split-sequence ")
    assert f"api.lisp:{compiled + 4}:1 (the file was edited since this was compiled at line {compiled})" in place["text"]


def test_lines_added_inside_an_earlier_definition_and_removed_above(library):
    process, directory = library
    api = directory / "api.lisp"
    edit(api, "  (check-tests test test-p test-not test-not-p)\n  (etypecase sequence\n    (list (split-list ",
         "  (check-tests test test-p test-not test-not-p)\n  ;; a note\n  ;; another\n"
         "  (etypecase sequence\n    (list (split-list ")
    edit(api, "(define-condition simple-program-error (program-error simple-condition) ())\n\n", "")
    for symbol, opening in (("split-sequence:split-sequence-if", "(defun split-sequence-if "),
                            ("split-sequence::check-tests", "(defmacro check-tests"),
                            ("split-sequence::list-long-enough-p", "(defun list-long-enough-p")):
        place = definition(process, symbol, "macro" if "tests" in symbol else "function")
        assert place["line"] == line_of(api, opening), (symbol, place)
        assert place["snippet"].startswith(opening)


def test_a_definition_edited_inside_is_still_found(library):
    process, directory = library
    api = directory / "api.lisp"
    edit(api, "(defun check-bounds (sequence start end)\n  (progn",
         ";; checks\n(defun check-bounds (sequence start end)\n  \"Bounds.\"\n  (progn")
    place = definition(process, "split-sequence::check-bounds")
    assert place["line"] == line_of(api, "(defun check-bounds ")
    assert place["place"] == "found-after-edit"


def test_a_deleted_definition_is_not_found_with_its_compiled_line(library):
    process, directory = library
    api = directory / "api.lisp"
    compiled = line_of(api, "(defun list-long-enough-p")
    edit(api, "(defun list-long-enough-p (list length)\n  (or (zerop length)\n"
              "      (not (null (nthcdr (1- length) list)))))\n", "")
    place = definition(process, "split-sequence::list-long-enough-p")
    assert (place["place"], place["line"], place["compiledLine"]) == ("not-found", compiled, compiled)
    assert f"line {compiled} when compiled" in place["text"]
    # Its form as compiled, not the form now at that place (issue 49's
    # trial replay showed a deleted defparameter as the next definition).
    assert place["snippet"].startswith("(defun list-long-enough-p (list length)"), place


def test_xref_callers_after_edits(library):
    process, directory = library
    api = directory / "api.lisp"
    edit(api, "(in-package :split-sequence)\n", "(in-package :split-sequence)\n\n;;; one\n;;; two\n")
    result = checked_call(process, "xref", symbol="split-sequence::check-bounds", relation="calls")
    callers = {r["name"]: r for r in result["structuredContent"]["references"]}
    assert sorted(callers) == ["SPLIT-SEQUENCE:SPLIT-SEQUENCE", "SPLIT-SEQUENCE:SPLIT-SEQUENCE-IF",
                               "SPLIT-SEQUENCE:SPLIT-SEQUENCE-IF-NOT"]
    lines = api.read_text().splitlines()
    for name, caller in callers.items():
        assert caller["file"] == str(api)
        assert caller["line"] == line_of(api, f"(defun {name.split(':')[1].lower()} "), caller
        assert lines[caller["referenceLine"] - 1].strip() == "(check-bounds sequence start end)"
        assert caller["place"] == "found-after-edit"
        assert caller["compiledLine"] == caller["referenceLine"] - 3


def test_describe_symbol_after_edits(library):
    process, directory = library
    api = directory / "api.lisp"
    edit(api, "(declaim (ftype", ";;; one line\n(declaim (ftype")
    result = checked_call(process, "describe-symbol", symbol="split-sequence:split-sequence")
    location = result["structuredContent"]["location"]
    assert location["line"] == line_of(api, "(defun split-sequence ")
    assert location["place"] == "found-after-edit"


# ---------------------------------------------------------------- compile-form

def compile_form(process, path: Path, line: int) -> dict:
    return checked_call(process, "compile-form", path=str(path), line=line)


def test_compile_form_places_its_definitions_in_the_file(library):
    process, directory = library
    api = directory / "api.lisp"
    edit(api, "(defun split-sequence-if (", ";;; moved down\n\n(defun split-sequence-if (")
    line = line_of(api, "(defun split-sequence-if ")
    result = compile_form(process, api, line + 2)  # a line inside the form
    structure = result["structuredContent"]
    assert not result["isError"], result
    assert (structure["success"], structure["line"], structure["package"]) == (True, line, "SPLIT-SEQUENCE")
    assert structure["defined"] == ["function SPLIT-SEQUENCE:SPLIT-SEQUENCE-IF"]
    assert structure["notes"] == []
    assert f"Compiled the form at {api}:{line}-" in result["content"][0]["text"]
    text, _ = process.eval('(find-symbol "SPLIT-SEQUENCE-IF" "CL-USER")')
    assert text == "=> NIL\n=> NIL", text
    # The place Swank gives Emacs names the buffer by the whole path: M-.
    # prefers an open buffer of that name (another project's api.lisp).
    text, _ = process.eval("(second (second (second (first (swank/backend:find-definitions"
                           " 'split-sequence:split-sequence-if)))))")
    assert text == f'=> "{api.resolve()}"', text
    edit(api, ";;; moved down\n", ";;; moved down\n;;; and again\n")
    place = definition(process, "split-sequence:split-sequence-if")
    assert (place["file"], place["line"]) == (str(api), line + 1)
    described = checked_call(process, "describe-symbol", symbol="split-sequence:split-sequence-if")
    assert described["structuredContent"]["location"]["line"] == line + 1
    callers = checked_call(process, "xref", symbol="split-sequence::check-bounds", relation="calls")
    caller = next(r for r in callers["structuredContent"]["references"]
                  if r["name"] == "SPLIT-SEQUENCE:SPLIT-SEQUENCE-IF")
    assert (caller["file"], caller["line"]) == (str(api), line + 1)


def test_compile_form_notes_are_at_their_lines_in_the_file(library):
    process, directory = library
    api = directory / "api.lisp"
    edit(api, "  (or (zerop length)\n", "  (or (zerop length)\n      (print *no-such-variable*)\n")
    line = line_of(api, "(defun list-long-enough-p")
    result = compile_form(process, api, line)
    notes = result["structuredContent"]["notes"]
    warnings = [n for n in notes if n["severity"] == "warning"]
    assert warnings and warnings[0]["file"] == str(api), notes
    assert warnings[0]["line"] == line + 2 and "*NO-SUCH-VARIABLE*" in warnings[0]["message"]
    assert result["structuredContent"]["success"] is True  # warnings do not fail it


def test_compile_form_errors_give_the_line(library):
    process, directory = library
    api = directory / "api.lisp"
    first_blank = api.read_text().splitlines().index("") + 1
    result = compile_form(process, api, first_blank)
    assert result["isError"] and "is not inside a top-level form" in result["content"][0]["text"]
    edit(api, "(defun check-bounds (sequence start end)\n", "(defun check-bounds (sequence start end)\n  (let ((x\n")
    line = line_of(api, "(defun check-bounds ")
    result = compile_form(process, api, line + 3)
    assert result["isError"]
    assert result["structuredContent"]["error"]["type"] == "CL-MCP:READ-ERROR"
    assert f"The form at line {line} does not read" in result["content"][0]["text"]
    # Where the reader stopped, in the file: the end of the form left open.
    end = len(api.read_text().splitlines())
    assert f", at line {end}, column " in result["content"][0]["text"], result
    assert "Stream: " not in result["content"][0]["text"], result


def test_a_compile_form_read_error_is_placed_in_the_file_alone(library):
    """Read by the real reader (a package that does not exist), its message
    names no line of Swank's temporary file."""
    process, directory = library
    api = directory / "api.lisp"
    edit(api, "  (or (zerop length)\n", "  (or (zerop length)\n      no-such-package:x\n")
    line = line_of(api, "(defun list-long-enough-p")
    result = compile_form(process, api, line)
    [note] = result["structuredContent"]["notes"]
    assert (note["severity"], note["file"], note["line"]) == ("read-error", str(api), line + 2), note
    assert "NO-SUCH-PACKAGE does not exist" in note["message"], note
    assert "Line: " not in note["message"] and "Stream: " not in note["message"], note
