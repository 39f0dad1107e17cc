"""A definition the programmer compiled with C-c C-c (`slime-compile-defun`
in a real Emacs with SLIME, visiting the file) is found by cl-mcp,
attached to the same image, in its file at its line: Swank records it as
`(:buffer-and-file ...)`."""

from __future__ import annotations

import time

import pytest

from tests.integration.attach_fixtures import Emacs
from tests.integration.devtools import checked_call, shared_with_emacs

SOURCE = """\
(in-package #:cl-user)

;;; Compiled from Emacs with C-c C-c, one form at a time.

(defun emacs-compiled-helper (x)
  (* x 3))

(defun emacs-compiled-defun (x)
  (1+ (emacs-compiled-helper x)))
"""


@pytest.fixture(scope="module")
def shared():
    """The programmer's image, Emacs connected to it with SLIME, and cl-mcp
    attached to the same image."""
    with shared_with_emacs() as (_server, emacs, process, home):
        yield emacs, process, home


def compile_defun(emacs: Emacs, path, line: int) -> None:
    """C-c C-c on LINE of PATH in Emacs, then wait until SLIME has its
    answer (a synchronous slime-eval meanwhile can hang emacsclient)."""
    emacs.eval(f'(with-current-buffer (find-file-noselect "{path}") '
               f"(goto-char (point-min)) (forward-line {line - 1}) (slime-compile-defun))")
    deadline = time.monotonic() + 30
    while emacs.eval("(length (slime-rex-continuations))") != "0":
        assert time.monotonic() < deadline, "C-c C-c did not finish"
        time.sleep(0.1)


def test_a_function_compiled_with_c_c_c_is_found_in_its_file(shared):
    emacs, process, home = shared
    path = home / "compiled-from-emacs.lisp"
    path.write_text(SOURCE)
    line = SOURCE.splitlines().index("(defun emacs-compiled-defun (x)") + 1
    compile_defun(emacs, path, line + 1)
    assert emacs.slime_eval("(cl:if (cl:fboundp (cl:quote cl-user::emacs-compiled-defun)) 1 0)") == "1"
    result = checked_call(process, "find-definition", symbol="cl-user::emacs-compiled-defun")
    [definition] = [d for d in result["structuredContent"]["definitions"] if d["type"] == "function"]
    assert definition["file"] == str(path)
    assert definition["line"] == line and definition["column"] == 1
    assert definition["snippet"].startswith("(defun emacs-compiled-defun (x)")
    assert definition["place"] == "unchanged"
    # The form alone was compiled: the one above it is not defined.
    assert emacs.slime_eval("(cl:if (cl:fboundp (cl:quote cl-user::emacs-compiled-helper)) 1 0)") == "0"
