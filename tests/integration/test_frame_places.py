"""Backtrace frames carry the place of the form they are running, through
the resolver every place goes through: a frame of a function compiled from
a file gives the file and the line of the erring form as the file is now
(also after lines were added above it), and a frame of code compiled from
an evaluation says it has no file and which evaluation defined it.  In an
image cl-mcp owns and in a programmer's image it attaches to."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.integration.devtools import MODES, checked_call, cl_mcp_in, registered_copy

_packages = itertools.count(1)

SOURCE = """\
(defpackage #:{package} (:use #:cl))
(in-package #:{package})

(defun inner (a b)
  (declare (optimize (debug 2)))
  (let ((sum (+ a b)))
    (error "bad ~a" sum)))

(defun outer (x)
  (declare (optimize (debug 2)))
  (1+ (inner x 10)))
"""


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param) as process:
        yield process


@pytest.fixture
def waiting(lisp, tmp_path):
    """OUTER of a file of the test's own, compiled with compile-file and
    called so that it errors inside INNER: (process, file, package)."""
    package = f"frame-places-{next(_packages)}"
    path = tmp_path / "frames.lisp"
    path.write_text(SOURCE.format(package=package))
    compiled = lisp.call("compile-file", path=str(path))
    assert not compiled["isError"], compiled
    result = lisp.call("evaluate-lisp", code=f"({package}::outer 5)")
    assert result["isError"] and result["structuredContent"]["evaluation"], result
    yield lisp, path, package.upper()
    lisp.call("invoke-restart", restart="ABORT")


def line_of(path: Path, opening: str) -> int:
    """The 1-based line of the file as it is now that starts with OPENING."""
    lines = [number for number, line in enumerate(path.read_text().splitlines(), 1)
             if line.lstrip().startswith(opening)]
    assert len(lines) == 1, (opening, lines)
    return lines[0]


def frame(process, call: str) -> tuple[dict, str]:
    """The backtrace's frame whose call starts with CALL, and the text."""
    result = checked_call(process, "backtrace")
    assert not result["isError"], result
    frames = [f for f in result["structuredContent"]["frames"] if f["call"].startswith(call)]
    assert len(frames) == 1, result
    return frames[0], result["content"][0]["text"]


def test_a_frame_of_a_file_gives_the_erring_forms_line(waiting):
    process, path, package = waiting
    inner, text = frame(process, f"({package}::INNER 5 10)")
    assert inner["file"] == str(path)
    assert inner["line"] == line_of(path, '(error "bad ~a" sum)')
    assert inner["column"] == 5
    assert inner["place"] == "unchanged" and "compiledLine" not in inner
    assert inner["snippet"].startswith('(error "bad ~a" sum)')
    assert f"     at {path}:{inner['line']}:5: (error \"bad ~a\" sum)))" in text.splitlines()
    outer, _ = frame(process, f"({package}::OUTER 5)")
    assert (outer["file"], outer["line"]) == (str(path), line_of(path, "(1+ (inner x 10))"))
    assert outer["snippet"].startswith("(inner x 10)")


def test_the_line_follows_lines_added_above(waiting):
    process, path, package = waiting
    compiled = line_of(path, '(error "bad ~a" sum)')
    text = path.read_text()
    path.write_text(text.replace("(defun inner",
                                 ";;; Three lines\n(defvar *added* 1)\n\n(defun inner", 1))
    inner, text = frame(process, f"({package}::INNER 5 10)")
    assert inner["line"] == line_of(path, '(error "bad ~a" sum)') == compiled + 3
    assert inner["place"] == "found-after-edit" and inner["compiledLine"] == compiled
    assert (f"     at {path}:{compiled + 3}:5 (the file was edited since this was compiled "
            f"at line {compiled}): (error \"bad ~a\" sum)))") in text.splitlines()
    outer, _ = frame(process, f"({package}::OUTER 5)")
    assert outer["line"] == line_of(path, "(1+ (inner x 10))")


def test_a_frame_of_evaluated_code_names_its_evaluation(lisp):
    defined = lisp.call("evaluate-lisp", code="(defun frame-places-car (x) (car x))")
    assert not defined["isError"], defined
    found = lisp.call("find-definition", symbol="frame-places-car")["structuredContent"]
    number = found["definitions"][0]["evaluation"]
    failed = lisp.call("evaluate-lisp", code="(frame-places-car 5)")
    assert failed["isError"], failed
    try:
        place, text = frame(lisp, "(FRAME-PLACES-CAR 5)")
    finally:
        lisp.call("invoke-restart", restart="ABORT")
    assert "file" not in place
    assert place["evaluation"] == number
    assert place["error"] == f"no file: defined by evaluation {number}"
    # The function's form, SBCL's marker before the call that failed.
    form = "(SB-INT:NAMED-LAMBDA FRAME-PLACES-CAR (X) (BLOCK FRAME-PLACES-CAR (#:***HERE*** (CAR X))))"
    assert place["form"] == form
    assert f"     no file: defined by evaluation {number}: {form}" in text.splitlines()


def test_a_frame_running_a_form_that_opens_inside_another_is_unchanged(lisp, tmp_path):
    # Alexandria's PLIST-ALIST fails in DO's end test "((safe-endp tail)
    # ...)": Swank counts that frame's position from 0, and read as
    # counted from 1 it fell on the outer parenthesis, as if moved.
    copy = registered_copy(lisp, Path("/usr/share/common-lisp/source/alexandria"), tmp_path / "alexandria")
    loaded = lisp.call("load-system", system="alexandria")
    assert not loaded["isError"], loaded
    result = lisp.call("evaluate-lisp", code="(alexandria:plist-alist :not-a-plist)")
    assert result["isError"], result
    try:
        frame = checked_call(lisp, "backtrace", evaluation=result["structuredContent"]["evaluation"],
                             count=1)["structuredContent"]["frames"][0]
        lists = copy / "alexandria-1" / "lists.lisp"
        line = next(n for n, text in enumerate(lists.read_text().splitlines(), 1)
                    if "((safe-endp tail) (nreverse alist))" in text)
        assert (frame["file"], frame["line"], frame["place"]) == (str(lists), line, "unchanged"), frame
        assert frame["snippet"].startswith("(safe-endp tail)"), frame
    finally:
        lisp.call("invoke-restart", restart="ABORT")
