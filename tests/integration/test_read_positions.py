"""Where a file stops reading is where SBCL's reader says (issue 43, item
5): read-lisp-file's check and compile-file give a stray `)` the line and
column of SBCL's own report (`Line: L, Column: C`), read by a plain SBCL
beside cl-mcp, in files with multi-byte characters, CRLF line ends and
tabs before it (the trial's answers were one and two columns off)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.devtools import cl_mcp_in

STRAY = 50  # the stray ) is at this column of line 15


def lines_of(body: str, ending: str = "\n") -> str:
    above = [f"(defvar *rp-{n}* {n})" for n in range(1, 14)] + ['(defvar *rp-s* "héllo wörld ☃")']
    return ending.join([*above, body + " " * (STRAY - len(body) - 1) + ")", "(defun rp-after () 2)"]) + ending


FILES = {"multi-byte": lines_of('(defun rp-foo () (list "é☃" 1 2 3))'),
         "crlf": lines_of("(defun rp-foo () 1)", "\r\n"),
         "tab": lines_of("\t(defun rp-foo () 1)"),
         "adjacent": lines_of("(defun rp-foo () (list " + "1 " * 12 + "23))")}


def sbcls_position(path: Path) -> tuple[int, int]:
    """The line and column a plain SBCL's compile-file reports for the
    file's read error (its form-tracking stream counts them)."""
    run = subprocess.run([shutil.which("sbcl") or "sbcl", "--noinform", "--non-interactive", "--no-userinit",
                          "--eval", f'(handler-case (compile-file "{path}" :output-file "{path}.fasl" '
                          ":external-format :utf-8) (error (e) (princ e)))"],
                         capture_output=True, text=True, timeout=60)
    found = re.search(r"Line: (\d+), Column: (\d+)", run.stdout + run.stderr)
    assert found, run.stdout + run.stderr
    return int(found.group(1)), int(found.group(2))


@pytest.fixture(scope="module")
def lisp():
    with cl_mcp_in("embedded") as process:
        yield process


@pytest.mark.parametrize("kind", FILES)
def test_a_stray_paren_is_where_sbcl_says_in_check_and_compile_file(lisp, tmp_path, kind):
    path = tmp_path / f"rp-{kind}.lisp"
    path.write_bytes(FILES[kind].encode("utf-8"))
    expected = sbcls_position(path)
    assert expected[0] == 15
    checked = lisp.call("read-lisp-file", path=str(path), mode="check")
    [problem] = checked["structuredContent"]["problems"]
    assert (problem["line"], problem["column"]) == expected, problem
    compiled = lisp.call("compile-file", path=str(path), load=False)
    assert f"READ-ERROR at {path}:{expected[0]}:{expected[1]}" in compiled["content"][0]["text"], compiled
