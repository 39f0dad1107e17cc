"""list-definitions, reset-session and load-system against a real SBCL."""

import pytest

DEFINITIONS = """
(defun my-function (a b &optional c) (list a b c))
(defgeneric area (shape))
(defvar *my-var* 42)
(defconstant +my-constant+ "hello")
(defmacro with-timing (form) form)
(defstruct point x y)
(defclass shape () ((name :initarg :name)))
(define-condition my-error (error) ())
(defpackage :session-pkg (:use :cl))
(defun session-pkg::helper (x) x)
"""


@pytest.fixture(scope="module")
def defined(request):
    from tests.integration.conftest import McpProcess
    process = McpProcess()
    process.initialize()
    text, is_error = process.eval(DEFINITIONS)
    assert not is_error, text
    yield process
    process.close()


def listing(process, kind=None):
    arguments = {} if kind is None else {"type": kind}
    result = process.call("list-definitions", **arguments)
    assert result["isError"] is False
    return result["content"][0]["text"]


def test_all_sections_in_contract_order(defined):
    text = listing(defined)
    assert [line for line in text.splitlines() if line.startswith("[")] == [
        "[Functions]", "[Variables]", "[Macros]", "[Classes]"]
    assert listing(defined, "all") == text


def test_functions(defined):
    lines = listing(defined, "functions").splitlines()
    assert lines[0] == "[Functions]"
    assert "- MY-FUNCTION (A B &OPTIONAL C)" in lines
    assert "- AREA (SHAPE)" in lines               # generic functions too
    assert "- SESSION-PKG::HELPER (X)" in lines     # qualified outside CL-USER
    assert "- POINT-X (INSTANCE)" in lines
    names = [line.split()[1] for line in lines[1:]]
    assert names == sorted(names)


def test_variables(defined):
    assert listing(defined, "variables") == (
        '[Variables]\n- *MY-VAR* = 42\n- +MY-CONSTANT+ = "hello"')


def test_macros(defined):
    assert listing(defined, "macros") == "[Macros]\n- WITH-TIMING (FORM)"


def test_classes(defined):
    assert listing(defined, "classes") == (
        "[Classes]\n- MY-ERROR (condition)\n- POINT (structure)\n- SHAPE (class)")


def test_long_values_are_cut_to_one_line(defined):
    defined.eval("(defparameter *long* (make-list 1000 :initial-element :item))")
    line = next(l for l in listing(defined, "variables").splitlines() if "*LONG*" in l)
    assert len(line) < 100 and line.endswith("...")
    defined.eval("(makunbound '*long*) (unintern '*long*)")


def test_empty_session(server):
    assert listing(server) == "No definitions in the current session."
    assert listing(server, "macros") == "No macros defined in the current session."


def test_reset_clears_everything(server):
    server.eval("(defun doomed () 1) (defpackage :doomed-pkg) (defvar *doomed* 1)"
                "(setf *print-base* 16) (defpackage :elsewhere (:use :cl)) (in-package :elsewhere)")
    result = server.call("reset-session")
    assert result["content"] == [{"type": "text", "text": "Session reset. All definitions cleared."}]
    assert result["isError"] is False
    assert listing(server) == "No definitions in the current session."
    assert server.eval("(package-name *package*)") == ('=> "COMMON-LISP-USER"', False)
    assert server.eval("(find-package :doomed-pkg)") == ("=> NIL", False)
    assert server.eval("*print-base*") == ("=> 10", False)
    text, is_error = server.eval("(doomed)")
    assert is_error and text.startswith("[ERROR] UNDEFINED-FUNCTION")


def test_load_system_and_use_it(server):
    result = server.call("load-system", system="alexandria")
    assert result["isError"] is False
    # Compiled afresh (each run has a cache of its own, tests/conftest.py), its
    # own files' notes follow.
    text, _, notes = result["content"][0]["text"].partition("\n\n")
    assert text == "Loading system: alexandria\nLoaded: alexandria (version 1.0.1)"
    assert notes == "" or notes.startswith("[notes]\n"), notes
    assert server.eval("(alexandria:iota 3)") == ("=> (0 1 2)", False)
    server.call("reset-session")
    assert server.eval("(find-package :alexandria)") == ("=> NIL", False)


def test_load_a_missing_system(shared_server):
    result = shared_server.call("load-system", system="nonexistent-system")
    assert result["isError"] is True
    assert result["content"][0]["text"] == (
        '[ERROR] ASDF/FIND-COMPONENT:MISSING-COMPONENT\nSystem "nonexistent-system" not found.')
