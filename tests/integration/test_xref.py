"""xref: Swank's cross-references over the fixture system, in an image
cl-mcp owns and in a programmer's image it attaches to.  The lines asserted
are the fixture's (tests/fixtures/lisp/cl-mcp-fixture/)."""

from __future__ import annotations


import pytest

from tests.integration.devtools import FIXTURE, MODES, checked_call, cl_mcp_in, load_fixture

SHAPES = str(FIXTURE / "shapes.lisp")
CALLERS = str(FIXTURE / "callers.lisp")


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    """cl-mcp with the fixture system loaded and one caller of GREET
    defined through evaluate-lisp, embedded or attached."""
    with cl_mcp_in(request.param) as process:
        load_fixture(process)
        text, is_error = process.eval('(defun repl-greeter () (cl-mcp-fixture:greet "you"))')
        assert (text, is_error) == ("=> REPL-GREETER", False)
        yield process

def xref(process, **arguments):
    return checked_call(process, "xref", **arguments)


def places(result):
    """(name, file, line, referenceLine) of each referrer with a file."""
    return sorted((r["name"], r["file"], r["line"], r["referenceLine"])
                  for r in result["structuredContent"]["references"] if "file" in r)


def test_callers_from_files_and_from_evaluate_lisp(lisp):
    result = xref(lisp, symbol="cl-mcp-fixture:greet")
    assert not result["isError"]
    assert places(result) == [("CL-MCP-FIXTURE::LOUD-WELCOME", CALLERS, 7, 8),
                              ("CL-MCP-FIXTURE::WELCOME-EVERYONE", CALLERS, 3, 5)]
    structured = result["structuredContent"]
    assert structured["symbol"] == "CL-MCP-FIXTURE:GREET" and structured["relation"] == "calls"
    welcome = next(r for r in structured["references"] if r["name"].endswith("WELCOME-EVERYONE"))
    assert welcome["column"] == 1 and welcome["referenceColumn"] == 3
    assert welcome["snippet"].startswith('(defun welcome-everyone (names)\n  "Greet every one of NAMES."')
    # Defined through evaluate-lisp: known to SBCL's xref, but without a file.
    repl = [r for r in structured["references"] if "file" not in r]
    assert [r["name"] for r in repl] == ["REPL-GREETER"]
    assert "evaluate-lisp" in repl[0]["error"] and "line" not in repl[0]
    lines = result["content"][0]["text"].splitlines()
    assert lines[0] == "Definitions that call CL-MCP-FIXTURE:GREET: 3"
    assert f"CL-MCP-FIXTURE::LOUD-WELCOME  {CALLERS}:7:1 (reference at line 8)" in lines
    assert f"CL-MCP-FIXTURE::WELCOME-EVERYONE  {CALLERS}:3:1 (reference at line 5)" in lines
    assert any(line.startswith("REPL-GREETER  (no source file (defined without one") for line in lines)


def test_symbol_read_in_the_given_package(lisp):
    result = xref(lisp, symbol="greet", package="cl-mcp-fixture")
    # Names are printed as they are read in that package.
    assert [name for name, *_ in places(result)] == ["LOUD-WELCOME", "WELCOME-EVERYONE"]
    assert result["structuredContent"]["symbol"] == "CL-MCP-FIXTURE:GREET"


@pytest.mark.parametrize("symbol, relation, expected", [
    ("cl-mcp-fixture:with-doubled", "macroexpands", [("CL-MCP-FIXTURE::DOUBLED-AREA", CALLERS, 10, 11)]),
    ("cl-mcp-fixture:*greeting*", "sets", [("CL-MCP-FIXTURE::RESET-GREETING", CALLERS, 14, 15)]),
    ("cl-mcp-fixture:*greeting*", "references", [("CL-MCP-FIXTURE::GREETING-LENGTH", CALLERS, 17, 18),
                                                 ("CL-MCP-FIXTURE:GREET", SHAPES, 6, 8)]),
    ("cl-mcp-fixture:*greeting*", "binds", [("CL-MCP-FIXTURE::WITH-GREETING", CALLERS, 20, 21)]),
])
def test_each_relation(lisp, symbol, relation, expected):
    result = xref(lisp, symbol=symbol, relation=relation)
    assert not result["isError"] and result["structuredContent"]["relation"] == relation
    assert places(result) == expected


def test_methods_specialized_on_a_class(lisp):
    result = xref(lisp, symbol="cl-mcp-fixture:circle", relation="specializes")
    found = places(result)
    assert ("CL-MCP-FIXTURE:AREA", SHAPES, 28, 28) in found
    area = next(r for r in result["structuredContent"]["references"] if "AREA" in r["name"])
    assert area["snippet"].startswith("(defmethod area ((shape circle))")
    assert (area["qualifiers"], area["specializers"]) == ([], ["CL-MCP-FIXTURE:CIRCLE"])
    lines = result["content"][0]["text"].splitlines()
    assert lines[0].startswith("Definitions that specialize on CL-MCP-FIXTURE:CIRCLE:")
    assert f"CL-MCP-FIXTURE:AREA (CL-MCP-FIXTURE:CIRCLE)  {SHAPES}:28:1" in lines


def test_each_method_specialized_on_a_class_with_its_signature(lisp):
    """Two methods of one generic function on the class are two referrers,
    each with its qualifiers and specializers (Swank's who-specializes gave
    one, named (DEFMETHOD PROBE-AREA))."""
    text, is_error = lisp.eval("(progn (defclass probe-shape () ()) (defgeneric probe-area (shape scale))"
                               " (defmethod probe-area ((shape probe-shape) scale) scale)"
                               " (defmethod probe-area :around ((shape probe-shape) (scale integer)) scale))")
    assert not is_error, text
    result = xref(lisp, symbol="probe-shape", relation="specializes")
    methods = sorted((r["name"], r["qualifiers"], r["specializers"])
                     for r in result["structuredContent"]["references"])
    assert methods == [("PROBE-AREA", [], ["PROBE-SHAPE", "T"]),
                       ("PROBE-AREA", [":AROUND"], ["PROBE-SHAPE", "INTEGER"])]
    text = result["content"][0]["text"]
    assert "PROBE-AREA :AROUND (PROBE-SHAPE INTEGER)  (no source file" in text
    assert "PROBE-AREA (PROBE-SHAPE T)  (no source file" in text


def test_the_count_says_definitions_and_references_apart(lisp, tmp_path):
    """It counted references where the model reads callers ("20" for 14)."""
    source = tmp_path / "twice.lisp"
    source.write_text("(defun xr-callee (x) x)\n(defun xr-twice () (xr-callee 1) (xr-callee 2))\n"
                      "(defun xr-once () (xr-callee 3))\n")
    assert not lisp.call("compile-file", path=str(source))["isError"]
    result = xref(lisp, symbol="cl-user::xr-callee")
    assert result["content"][0]["text"].splitlines()[0] == "Definitions that call XR-CALLEE: 2 (3 references)"
    assert sorted(r["name"] for r in result["structuredContent"]["references"]) == ["XR-ONCE", "XR-TWICE", "XR-TWICE"]


def test_none_found_is_not_an_error(lisp):
    result = xref(lisp, symbol="cl-mcp-fixture::doubled-area")
    assert not result["isError"]
    assert result["content"][0]["text"] == "No definitions that call CL-MCP-FIXTURE::DOUBLED-AREA were found."
    assert result["structuredContent"]["references"] == []


def test_unknown_symbol_or_package_is_an_error_and_interns_nothing(lisp):
    result = xref(lisp, symbol="no-such-function-xyz")
    assert result["isError"]
    assert result["content"][0]["text"].startswith("[ERROR] CL-MCP:UNKNOWN-SYMBOL\n")
    assert lisp.eval('(find-symbol "NO-SUCH-FUNCTION-XYZ" "CL-USER")') == ("=> NIL\n=> NIL", False)
    result = xref(lisp, symbol="no-such-package-xyz:greet")
    assert result["isError"] and result["content"][0]["text"].startswith("[ERROR] PACKAGE-ERROR\n")
    result = xref(lisp, symbol="greet", package="no-such-package-xyz")
    assert result["isError"] and "no-such-package-xyz" in result["content"][0]["text"]


def test_a_relation_swank_does_not_implement_is_a_clear_error(lisp):
    # The tool's schema only lets Swank's relations through; the agent
    # still turns Swank's :not-implemented into an error that says so.
    text, is_error = lisp.eval('(getf (getf (cl-mcp-agent:xref-of "car" :frobs) :error) :type)')
    assert (text, is_error) == ('=> "CL-MCP:NOT-IMPLEMENTED"', False)


# What SB-INTROSPECT's who-* search and the agent's faster one find, each
# referrer as (name pathname form-number), compared as sets: the fixture's
# uncommon names (found by the names in the clear) and common ones such as
# CAR (whose data is decoded everywhere), for every packed relation.
SAME_REFERRERS = """
(flet ((keys (entries)
         (mapcar (lambda (entry)
                   (list (car entry)
                         (sb-introspect:definition-source-pathname (cdr entry))
                         (sb-introspect::definition-source-form-number (cdr entry))))
                 entries)))
  (loop for (relation name) in '((:calls cl-mcp-fixture:greet) (:calls car)
                                 (:references cl-mcp-fixture::*greeting*)
                                 (:macroexpands cl-mcp-fixture::with-doubled)
                                 (:macroexpands when) (:binds *print-pretty*)
                                 (:sets cl-mcp-fixture::*greeting*))
        for ours = (keys (cl-mcp-agent::referrers relation name))
        for theirs = (keys (sb-introspect::collect-xref relation name))
        collect (list relation name (length ours)
                      (and (= (length ours) (length theirs))
                           (null (set-difference ours theirs :test #'equal))))))
"""


def test_the_fast_search_finds_what_sb_introspect_finds(lisp):
    text, is_error = lisp.eval("(cl-mcp-agent::referrers-readable-p)")
    assert not is_error and text != "=> NIL", text  # SBCL 2.2.9: the fast search is taken
    text, is_error = lisp.eval(SAME_REFERRERS)
    assert not is_error, text
    assert " NIL)" not in text, text
    assert "(:CALLS CL-MCP-FIXTURE:GREET 3 T)" in text, text


def test_each_reference_says_its_line_and_twins_on_one_line_their_columns(lisp, tmp_path):
    """Issue 49, item 7: a reference on its referrer's first line said no
    reference line, and two references of one caller on one line printed
    as the same line twice."""
    source = tmp_path / "xr-twins.lisp"
    source.write_text("(defun xr-target (x) x)\n(defun xr-twice (a) (list (xr-target a) (xr-target a)))\n")
    loaded, is_error = lisp.eval(f'(load (compile-file "{source}"))')
    assert not is_error, loaded
    text = xref(lisp, symbol="xr-target")["content"][0]["text"]
    assert sorted(text.splitlines()[1:]) == [f"XR-TWICE  {source}:2:1 (reference at line 2, column 27)",
                                             f"XR-TWICE  {source}:2:1 (reference at line 2, column 41)"], text
