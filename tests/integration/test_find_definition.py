"""find-definition: every definition of a name, through Swank's
find-definitions, with its place in the fixture system
(tests/fixtures/lisp/cl-mcp-fixture/, whose lines are asserted here), and
the kept source of definitions made through evaluate-lisp; in an image
cl-mcp owns and in a programmer's image it attaches to."""

from __future__ import annotations


import pytest

from tests.integration.devtools import FIXTURE, MODES, checked_call, cl_mcp_in, load_fixture

SHAPES = str(FIXTURE / "shapes.lisp")
PACKAGE = str(FIXTURE / "package.lisp")

REPL_GREETER = '(defun repl-greeter ()\n  "Made at the REPL."\n  (cl-mcp-fixture:greet "you"))'
REPL_PROGN = ("(progn (defvar *repl-count* 1)\n"
              "       (defmethod cl-mcp-fixture:area :around ((shape cl-mcp-fixture:square))\n"
              "         (call-next-method)))")


def evaluation_counter(process) -> int:
    """The number of the evaluation that reads the counter, less one: the
    number of the evaluation before it."""
    text, is_error = process.eval("cl-mcp-agent::*evaluation-counter*")
    assert not is_error, text
    return int(text.removeprefix("=> ")) - 1


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    """cl-mcp with the fixture system loaded through evaluate-lisp, and a
    few definitions made through evaluate-lisp (their evaluations' numbers
    in process.numbers)."""
    with cl_mcp_in(request.param) as process:
        load_fixture(process)
        text, is_error = process.eval('(intern "CL-MCP-FIXTURE" "CL-USER")')
        assert not is_error, text
        process.numbers = {}
        for name, code in (("greeter", REPL_GREETER), ("progn", f"  ; a comment\n{REPL_PROGN}\n 42")):
            text, is_error = process.eval(code)
            assert not is_error, text
            process.numbers[name] = evaluation_counter(process)
        yield process


def find(process, **arguments):
    return checked_call(process, "find-definition", **arguments)


def places(result):
    """(type, file, line, column) of each definition with a file, sorted."""
    return sorted((d["type"], d["file"], d["line"], d["column"])
                  for d in result["structuredContent"]["definitions"] if "file" in d)


def test_a_function_at_its_line(lisp):
    result = find(lisp, symbol="cl-mcp-fixture:greet")
    assert not result["isError"]
    structured = result["structuredContent"]
    assert structured["symbol"] == "CL-MCP-FIXTURE:GREET"
    assert structured["definitions"] == [{
        "type": "function", "name": "CL-MCP-FIXTURE:GREET", "file": SHAPES, "line": 6, "column": 1,
        "snippet": '(defun greet (name)\n  "A greeting for NAME."\n  (format nil "~A, ~A!" *greeting* name))', "place": "unchanged"}]
    assert result["content"][0]["text"] == (
        "Definitions of CL-MCP-FIXTURE:GREET: 1\n\n"
        "function CL-MCP-FIXTURE:GREET\n"
        f"  {SHAPES}:6:1\n"
        '    (defun greet (name)\n      "A greeting for NAME."\n      (format nil "~A, ~A!" *greeting* name))')


@pytest.mark.parametrize("symbol, expected", [
    ("cl-mcp-fixture:*greeting*", [("variable", SHAPES, 3, 1)]),
    ("cl-mcp-fixture:with-doubled", [("macro", SHAPES, 10, 1)]),
    ("cl-mcp-fixture:shape", [("class", SHAPES, 15, 1)]),
    ("cl-mcp-fixture:circle", [("class", SHAPES, 19, 1)]),
    ("cl-mcp-fixture:fixture-error", [("condition", SHAPES, 34, 1)]),
    ("cl-mcp-fixture:twice", [("compiler-macro", SHAPES, 43, 1), ("function", SHAPES, 39, 1)]),
    ("cl-mcp-fixture::counter-value", [("function", SHAPES, 46, 1), ("setf-expander", SHAPES, 48, 1)]),
    ("cl-mcp-fixture::point", [("structure", SHAPES, 51, 1)]),
    ("cl-mcp-fixture::small-count", [("type", SHAPES, 56, 1)]),
    # A symbol named like a package: the package's definition.
    ("cl-mcp-fixture", [("package", PACKAGE, 1, 1)]),
])
def test_each_type_at_its_line(lisp, symbol, expected):
    result = find(lisp, symbol=symbol)
    assert not result["isError"]
    assert places(result) == expected


def test_methods_with_specializers_and_qualifiers(lisp):
    result = find(lisp, symbol="area", package="cl-mcp-fixture")
    definitions = result["structuredContent"]["definitions"]
    # Names print as read in the package given.
    assert sorted((d["type"], d.get("qualifiers"), d.get("specializers"), d.get("line"))
                  for d in definitions if "file" in d) == [
        ("generic-function", None, None, 25),
        ("method", [], ["CIRCLE"], 28),
        ("method", [], ["SQUARE"], 31)]
    assert all(d["name"] == "AREA" for d in definitions)
    circle = next(d for d in definitions if d.get("specializers") == ["CIRCLE"])
    assert circle["snippet"].startswith("(defmethod area ((shape circle))\n")
    text = result["content"][0]["text"]
    assert f"method AREA (CIRCLE)\n  {SHAPES}:28:1\n    (defmethod area ((shape circle))" in text
    assert f"generic-function AREA\n  {SHAPES}:25:1\n" in text
    # The :around method made through evaluate-lisp comes first, newest.
    assert definitions[0] == {"type": "method", "name": "AREA", "qualifiers": [":AROUND"],
                              "specializers": ["SQUARE"], "evaluation": lisp.numbers["progn"],
                              "source": REPL_PROGN}
    assert len(definitions) == 4


def test_a_definition_made_through_evaluate_lisp(lisp):
    result = find(lisp, symbol="repl-greeter")
    assert not result["isError"]
    number = lisp.numbers["greeter"]
    # Swank's own entry for it (no source file) gives way to the kept source.
    assert result["structuredContent"]["definitions"] == [
        {"type": "function", "name": "REPL-GREETER", "evaluation": number, "source": REPL_GREETER}]
    assert result["content"][0]["text"] == (
        "Definitions of REPL-GREETER: 1\n\n"
        f"function REPL-GREETER\n  defined by evaluation {number}:\n"
        '    (defun repl-greeter ()\n      "Made at the REPL."\n      (cl-mcp-fixture:greet "you"))')
    # Inside PROGN: the whole top-level form, without the comment before it.
    result = find(lisp, symbol="*repl-count*")
    assert result["structuredContent"]["definitions"] == [
        {"type": "variable", "name": "*REPL-COUNT*", "evaluation": lisp.numbers["progn"],
         "source": REPL_PROGN}]


def test_a_redefinition_replaces_the_kept_source(lisp):
    assert lisp.eval("(defun repl-twice (x) (* 2 x))") == ("=> REPL-TWICE", False)
    text, is_error = lisp.eval("(defun repl-twice (x) (+ x x))")
    assert not is_error and text.endswith("=> REPL-TWICE")
    number = evaluation_counter(lisp)
    # A top-level form that ends in an error is not kept.
    text, is_error = lisp.eval("(progn (defun repl-twice (x) (- x)) (error \"no\"))")
    assert is_error and text.startswith("[ERROR] SIMPLE-ERROR")
    definitions = find(lisp, symbol="repl-twice")["structuredContent"]["definitions"]
    assert [(d["evaluation"], d["source"]) for d in definitions] == [(number, "(defun repl-twice (x) (+ x x))")]


def test_no_definition_is_not_an_error(lisp):
    # NAME is a slot's name in the fixture, and names nothing.
    result = find(lisp, symbol="cl-mcp-fixture::name")
    assert not result["isError"]
    assert result["content"][0]["text"] == "No definitions of CL-MCP-FIXTURE::NAME were found."
    assert result["structuredContent"] == {"symbol": "CL-MCP-FIXTURE::NAME", "definitions": []}


def test_unknown_symbol_or_package_is_an_error_and_interns_nothing(lisp):
    result = find(lisp, symbol="no-such-definition-xyz")
    assert result["isError"]
    assert result["content"][0]["text"].startswith("[ERROR] CL-MCP:UNKNOWN-SYMBOL\n")
    assert lisp.eval('(find-symbol "NO-SUCH-DEFINITION-XYZ" "CL-USER")') == ("=> NIL\n=> NIL", False)
    result = find(lisp, symbol="no-such-package-xyz:greet")
    assert result["isError"] and result["content"][0]["text"].startswith("[ERROR] PACKAGE-ERROR\n")
    result = find(lisp, symbol="greet", package="no-such-package-xyz")
    assert result["isError"] and "no-such-package-xyz" in result["content"][0]["text"]


@pytest.mark.parametrize("mode", MODES)
def test_reset_session_forgets_the_kept_sources(mode):
    with cl_mcp_in(mode) as process:
        method = "(defmethod make-load-form ((object (eql :names-reset-probe)) &optional environment)\n  environment)"
        text, is_error = process.eval(method)
        assert not is_error, text

        def kept():
            result = process.call("find-definition", symbol="make-load-form")
            assert not result["isError"], result
            return [d for d in result["structuredContent"]["definitions"] if "evaluation" in d]

        assert [(d["specializers"], d["source"]) for d in kept()] == [(["(EQL :NAMES-RESET-PROBE)"], method)]
        assert not process.call("reset-session")["isError"]
        # Attached, the method is still in the programmer's image (a soft
        # reset leaves it), but its kept source is gone.
        assert kept() == []
