"""Notes sized for the model, on cl-ppcre (Debian's, code nobody here
wrote) copied to a temporary directory so that ASDF compiles it afresh:
load-system lists its errors, warnings and style-warnings with their
places, grouped by file in line order, and counts its ~900 optimisation
notes per file; an undefined function names every place that uses it.
In an image cl-mcp owns and in a programmer's image it attaches to."""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import pytest

from tests.integration.devtools import MODES, checked_call, cl_mcp_in, registered_copy

CL_PPCRE = Path("/usr/share/common-lisp/source/cl-ppcre")
_copies = itertools.count(1)


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param) as process:
        yield process


def fresh_copy(process, tmp_path: Path) -> Path:
    """A copy of cl-ppcre (without its tests), found before Debian's."""
    return registered_copy(process, CL_PPCRE, tmp_path / f"cl-ppcre-{next(_copies)}",
                           ignore=shutil.ignore_patterns("test"))


def load(process, **arguments) -> dict:
    result = checked_call(process, "load-system", system="cl-ppcre", **arguments)
    assert not result["isError"], result
    return result


def line_holds(path: str, line: int, text: str) -> bool:
    return text in Path(path).read_text().splitlines()[line - 1]


def test_warnings_are_listed_by_file_and_line_and_notes_counted(lisp, tmp_path):
    directory = fresh_copy(lisp, tmp_path)
    result = load(lisp)
    structured, text = result["structuredContent"], result["content"][0]["text"]
    notes = structured["notes"]
    # cl-ppcre's six lambda lists with &optional and &key, in api.lisp.
    assert [n["severity"] for n in notes] == ["style-warning"] * 6
    assert {n["file"] for n in notes} == {str(directory / "api.lisp")}
    lines = [n["line"] for n in notes]
    assert lines == sorted(lines)
    for note in notes:
        assert "&OPTIONAL and &KEY" in note["message"]
        assert line_holds(note["file"], note["line"], "(def")
    counts = {entry["file"]: entry["count"] for entry in structured["noteCounts"]}
    assert set(counts) <= {str(path) for path in directory.glob("*.lisp")}
    assert sum(counts.values()) > 500 and counts[str(directory / "api.lisp")] > 0
    # The files in the order they were compiled: the .asd's order.
    assert list(counts)[-1] == str(directory / "api.lisp")
    assert "\nNOTE at " not in text
    assert f"{directory / 'api.lisp'}: {counts[str(directory / 'api.lisp')]}" in text
    assert len(text) < 6000  # listing every note took over 20 KB
    # A warning listed with its place is not repeated without one.
    assert "[warnings]" not in text


# What Swank reports, gathered as SLIME's C-c C-k gathers it: the plain
# compiler notes of one load, each (message, place) once, counted per file.
SWANK_NOTE_COUNTS = """
(let ((notes '()) (counts '())
      (*standard-output* (make-broadcast-stream)) (*error-output* (make-broadcast-stream)))
  (handler-bind ((swank/backend:compiler-condition
                   (lambda (c)
                     (when (eq (swank/backend::severity c) :note)
                       (pushnew (list (swank/backend::message c) (swank/backend::location c))
                                notes :test #'equal))))
                 (warning #'muffle-warning))
    (swank/backend:with-compilation-hooks () (asdf:load-system "cl-ppcre")))
  (loop for (nil (nil (kind file))) in notes
        when (eq kind :file)
          do (let ((entry (assoc (file-namestring file) counts :test #'string=)))
               (if entry (incf (cdr entry)) (push (cons (file-namestring file) 1) counts))))
  (format nil "~{~{~A ~A~}~^ ~}" (mapcar (lambda (entry) (list (car entry) (cdr entry))) counts)))
"""


def test_the_counts_are_swanks_and_notes_all_lists_them(lisp, tmp_path):
    fresh_copy(lisp, tmp_path)
    text, is_error = lisp.eval(SWANK_NOTE_COUNTS)
    assert not is_error, text
    words = text.removeprefix("=> ").strip('"').split()
    swank = {name: int(count) for name, count in zip(words[::2], words[1::2])}
    fresh_copy(lisp, tmp_path)
    counted = load(lisp)["structuredContent"]["noteCounts"]
    assert {Path(entry["file"]).name: entry["count"] for entry in counted} == swank
    # Another copy loaded with every note listed: as many as were counted
    # and the six style-warnings, each file's in one run, the files in the
    # order they were compiled.
    directory = fresh_copy(lisp, tmp_path)
    listed = load(lisp, notes="all")["structuredContent"]
    assert "noteCounts" not in listed
    # The agent lists 200 at most, and the result's budget may keep fewer:
    # truncated counts every note not in the list.
    assert len(listed["notes"]) <= 200
    assert listed["truncated"] == sum(swank.values()) + 6 - len(listed["notes"])
    order = [str(directory / Path(entry["file"]).name) for entry in counted]
    files = [note["file"] for note in listed["notes"]]
    assert files == sorted(files, key=order.index)


def test_an_undefined_function_names_every_place_that_uses_it(lisp, tmp_path):
    directory = fresh_copy(lisp, tmp_path)
    util, api = directory / "util.lisp", directory / "api.lisp"
    util.write_text(util.read_text() + "\n(defun uses-nowhere-1 (x)\n  (nowhere-helper x))\n")
    api.write_text(api.read_text() + "\n(defun uses-nowhere-2 ()\n  (list 1 (nowhere-helper 2)))\n")
    result = load(lisp)
    [note] = [n for n in result["structuredContent"]["notes"] if "NOWHERE-HELPER" in n["message"]]
    assert note["message"] == "undefined function: CL-PPCRE::NOWHERE-HELPER"
    util_line = len(util.read_text().splitlines())
    api_line = len(api.read_text().splitlines())
    assert note["uses"] == [
        {"file": str(util), "line": util_line, "column": 3, "name": "CL-PPCRE::USES-NOWHERE-1"},
        {"file": str(api), "line": api_line, "column": 11, "name": "CL-PPCRE::USES-NOWHERE-2"}]
    # The note's own place is the use SBCL reported.
    assert (note["file"], note["line"]) in [(use["file"], use["line"]) for use in note["uses"]]
    assert (f"used at:\n  {util}:{util_line}:3 (CL-PPCRE::USES-NOWHERE-1)\n"
            f"  {api}:{api_line}:11 (CL-PPCRE::USES-NOWHERE-2)") in result["content"][0]["text"]


def test_a_long_note_message_says_it_was_cut(lisp, tmp_path):
    # SBCL's warning prints the constant whole: over 2,000 characters.
    path = tmp_path / "long-note.lisp"
    numbers = " ".join(str(n) for n in range(1000))
    path.write_text(f"(defun long-note (x)\n  (+ x '({numbers})))\n")
    result = checked_call(lisp, "compile-file", path=str(path), load=False)
    (note,) = [n for n in result["structuredContent"]["notes"] if n["message"].split()[:2] == ["Constant", "(0"]]
    message = note["message"]
    assert re.search(r"\n… \[\d+ more characters truncated\]$", message), message[-200:]
    assert 2000 < len(message) < 2100, len(message)
