"""The live definition comes first: a function defined through
evaluate-lisp and then compiled again from its file (compile-form,
compile-file) is listed after the file's definition, marked replaced; one
defined from the file and then through evaluate-lisp is the REPL's, first
and not replaced.  describe-symbol's location is find-definition's first
live primary definition.  On split-sequence (Debian's cl-split-sequence)
copied to a temporary directory, in an image cl-mcp owns and in one it
attaches to."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.devtools import checked_call
from tests.integration.test_places_after_edits import library, line_of, lisp  # noqa: F401 (fixtures)

SYMBOL = "split-sequence:split-sequence-if"
OPENING = "(defun split-sequence-if "


def defun_text(path: Path) -> str:
    """The defun of SPLIT-SEQUENCE-IF as the file holds it."""
    text = path.read_text()
    start = text.index(OPENING)
    return text[start:text.index("\n\n(defun", start)]


def evaluate(process, code: str) -> None:
    text, is_error = process.eval(code, package="SPLIT-SEQUENCE")
    assert not is_error, text


def definitions(process) -> tuple[list[dict], str]:
    result = checked_call(process, "find-definition", symbol=SYMBOL)
    return result["structuredContent"]["definitions"], result["content"][0]["text"]


def location(process) -> dict:
    return checked_call(process, "describe-symbol", symbol=SYMBOL)["structuredContent"]["location"]


def test_a_repl_definition_compiled_again_with_compile_form_is_replaced(library):  # noqa: F811
    process, directory = library
    api = directory / "api.lisp"
    evaluate(process, defun_text(api))
    compiled = checked_call(process, "compile-form", path=str(api), line=line_of(api, OPENING))
    assert compiled["structuredContent"]["success"] is True, compiled
    found, text = definitions(process)
    functions = [d for d in found if d["type"] == "function"]
    assert [("file" in d, d.get("replaced")) for d in functions] == [(True, None), (False, True)]
    assert functions[0]["line"] == line_of(api, OPENING)
    assert "(replaced by a later definition):" in text
    assert text.index(f"{api}:{line_of(api, OPENING)}") < text.index("defined by evaluation")
    assert (location(process)["file"], location(process)["line"]) == (str(api), functions[0]["line"])


def test_a_repl_definition_compiled_again_with_compile_file_is_replaced(library):  # noqa: F811
    process, directory = library
    api = directory / "api.lisp"
    evaluate(process, defun_text(api))
    compiled = checked_call(process, "compile-file", path=str(api))
    assert not compiled["isError"], compiled
    functions = [d for d in definitions(process)[0] if d["type"] == "function"]
    assert [("file" in d, d.get("replaced")) for d in functions] == [(True, None), (False, True)]
    assert location(process)["line"] == line_of(api, OPENING)


def test_a_file_definition_evaluated_again_is_the_repl_ones(library):  # noqa: F811
    process, directory = library
    api = directory / "api.lisp"
    evaluate(process, defun_text(api))
    found, text = definitions(process)
    functions = [d for d in found if d["type"] == "function"]
    assert len(functions) == 1 and "evaluation" in functions[0] and "replaced" not in functions[0]
    assert "replaced by a later definition" not in text
    assert location(process) == {"type": "function", "evaluation": functions[0]["evaluation"]}


def test_the_location_is_the_primary_definition_not_a_compiler_macro(library, tmp_path):  # noqa: F811
    """A function of the REPL's with a compiler macro from a file: the
    location is the function, made through evaluate-lisp, not the file's
    compiler macro (the first definition with a file)."""
    process, _ = library
    macro_file = tmp_path / "compiler-macro.lisp"
    macro_file.write_text("(in-package :split-sequence)\n\n"
                          "(define-compiler-macro split-sequence-if (&whole form &rest arguments)\n"
                          "  (declare (ignore arguments))\n  form)\n")
    assert not checked_call(process, "compile-file", path=str(macro_file))["isError"]
    evaluate(process, defun_text(process_api(library)))
    found, _ = definitions(process)
    assert found[0]["type"] == "function" and "evaluation" in found[0]
    assert location(process) == {"type": "function", "evaluation": found[0]["evaluation"]}
    text, is_error = process.eval("(setf (compiler-macro-function 'split-sequence-if) nil)",
                                  package="SPLIT-SEQUENCE")
    assert not is_error, text


def process_api(library) -> Path:  # noqa: F811
    return library[1] / "api.lisp"


@pytest.mark.parametrize("kind, definition, redefinition", [
    ("variable", "(defvar *live-probe* 1)", "(defvar *live-probe* 2)"),
    ("class", "(defclass live-probe () ())", "(defclass live-probe () ((slot)))"),
])
def test_a_variable_or_class_from_the_repl_replaced_by_a_file(lisp, tmp_path, kind, definition,  # noqa: F811
                                                              redefinition):
    """A variable or a class has no object that a redefinition replaces:
    the REPL's is replaced once Swank finds the definition in a file."""
    name = "*live-probe*" if kind == "variable" else "live-probe"
    text, is_error = lisp.eval(definition)
    assert not is_error, text
    source = tmp_path / f"live-probe-{kind}.lisp"
    source.write_text(f"(in-package :cl-user)\n\n{redefinition}\n")
    assert not checked_call(lisp, "compile-file", path=str(source))["isError"]
    found = checked_call(lisp, "find-definition", symbol=name)["structuredContent"]["definitions"]
    mine = [d for d in found if d["type"] == kind]
    assert [(d.get("file"), d.get("replaced")) for d in mine] == [(str(source), None), (None, True)]
    text, is_error = lisp.eval(redefinition)
    assert not is_error, text
    found = checked_call(lisp, "find-definition", symbol=name)["structuredContent"]["definitions"]
    assert "evaluation" in found[0] and "replaced" not in found[0]
