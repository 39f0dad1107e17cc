"""describe-symbol: what a name is, in parts, over the fixture system
(tests/fixtures/lisp/cl-mcp-fixture/, whose lines are asserted here); in an
image cl-mcp owns and in a programmer's image it attaches to."""

from __future__ import annotations


import pytest

from tests.integration.devtools import FIXTURE, MODES, checked_call, cl_mcp_in, load_fixture

SHAPES = str(FIXTURE / "shapes.lisp")
PACKAGE = str(FIXTURE / "package.lisp")


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    """cl-mcp with the fixture system loaded through evaluate-lisp, embedded
    or attached."""
    with cl_mcp_in(request.param) as process:
        load_fixture(process)
        text, is_error = process.eval('(intern "CL-MCP-FIXTURE" "CL-USER")')
        assert not is_error, text
        yield process

def describe(process, **arguments):
    return checked_call(process, "describe-symbol", **arguments)


def place(structured):
    """(type, file, line, column) of the first definition."""
    location = structured["location"]
    return location["type"], location["file"], location["line"], location["column"]


def test_a_generic_function(lisp):
    result = describe(lisp, symbol="cl-mcp-fixture:area")
    assert not result["isError"]
    structured = result["structuredContent"]
    assert {key: structured[key] for key in ("symbol", "package", "external", "kinds", "arglist",
                                              "documentation", "methodCount", "description")} == {
        "symbol": "CL-MCP-FIXTURE:AREA", "package": "CL-MCP-FIXTURE", "external": True,
        "kinds": ["generic function"], "arglist": "(SHAPE)",
        "documentation": {"function": "The area of SHAPE."}, "methodCount": 2,
        "description": "CL-MCP-FIXTURE:AREA names a generic function."}
    assert sorted(m["specializers"] for m in structured["methods"]) == [
        ["CL-MCP-FIXTURE:CIRCLE"], ["CL-MCP-FIXTURE:SQUARE"]]
    assert all(m["qualifiers"] == [] for m in structured["methods"])
    assert place(structured) == ("generic-function", SHAPES, 25, 1)
    assert structured["location"]["snippet"].startswith("(defgeneric area (shape)\n")
    assert "value" not in structured and "class" not in structured
    text = result["content"][0]["text"]
    assert text.startswith("CL-MCP-FIXTURE:AREA (CL-MCP-FIXTURE, external)\n\n"
                           "[function]\ngeneric function\narglist: (SHAPE)\ndocumentation (function): The area of SHAPE.\n"
                           "methods (2):\n")
    assert "  (CL-MCP-FIXTURE:CIRCLE)\n" in text
    assert text.endswith(f"[location]\ngeneric-function\n  {SHAPES}:25:1\n    (defgeneric area (shape)\n"
                         '      (:documentation "The area of SHAPE."))\n    \n    (defmethod area ((shape circle))')


def test_names_print_as_read_in_the_given_package(lisp):
    structured = describe(lisp, symbol="area", package="cl-mcp-fixture")["structuredContent"]
    assert sorted(m["specializers"] for m in structured["methods"]) == [["CIRCLE"], ["SQUARE"]]
    assert structured["symbol"] == "CL-MCP-FIXTURE:AREA"


def test_a_variable_and_its_value(lisp):
    structured = describe(lisp, symbol="cl-mcp-fixture:*greeting*")["structuredContent"]
    assert (structured["kinds"], structured["value"], structured["documentation"]) == (
        ["variable"], '"Hello"', {"variable": "How greet begins."})
    assert place(structured) == ("variable", SHAPES, 3, 1)
    text = describe(lisp, symbol="cl-mcp-fixture:*greeting*")["content"][0]["text"]
    assert '[variable]\nvariable\nvalue: "Hello"\ndocumentation (variable): How greet begins.' in text


def test_a_long_value_is_capped_on_one_line(lisp):
    text, is_error = lisp.eval("(defparameter *long-list* (loop for i below 1000 collect i))")
    assert not is_error, text
    value = describe(lisp, symbol="*long-list*")["structuredContent"]["value"]
    assert len(value) == 200 and value.startswith("(0 1 2 3") and value.endswith("...")
    assert "\n" not in value


NONE = {"accessors": [], "writers": []}


@pytest.mark.parametrize("symbol, superclasses, slots, kind, line", [
    ("circle", ["SHAPE"], [{"name": "NAME", "initargs": [":NAME"], "readers": ["SHAPE-NAME"], **NONE},
                           {"name": "RADIUS", "initargs": [":RADIUS"], "readers": ["RADIUS"], **NONE}], "class", 19),
    ("fixture-error", ["ERROR"], [{"name": "DETAIL", "initargs": [":DETAIL"], "readers": ["DETAIL"], **NONE}],
     "condition", 34),
    # A structure's accessors are not the MOP's: none listed (its initforms are).
    ("point", ["STRUCTURE-OBJECT"], [{"name": "X", "initargs": [], "readers": [], "initform": "0", **NONE},
                                     {"name": "Y", "initargs": [], "readers": [], "initform": "0", **NONE}],
     "structure", 51),
])
def test_a_class_its_superclasses_and_slots(lisp, symbol, superclasses, slots, kind, line):
    structured = describe(lisp, symbol=symbol, package="cl-mcp-fixture")["structuredContent"]
    assert structured["kinds"] == [kind]
    assert structured["class"] == {"superclasses": superclasses, "slots": slots}
    assert place(structured) == (kind, SHAPES, line, 1)


def test_a_class_shows_each_slots_accessors_writers_type_initform_and_allocation(lisp):
    """Issue 49, item 3: only initargs and readers were shown, where SLIME's
    inspector of a class shows the rest; options at their defaults stay out."""
    assert not lisp.eval("(defclass ds-account () ((balance :initarg :balance :accessor balance :type integer"
                         " :initform (+ 1 2)) (owner :reader owner :writer set-owner)"
                         " (opened :allocation :class)))")[1]
    result = describe(lisp, symbol="ds-account")
    assert result["structuredContent"]["class"]["slots"] == [
        {"name": "BALANCE", "initargs": [":BALANCE"], "accessors": ["BALANCE"], "readers": [], "writers": [],
         "type": "INTEGER", "initform": "(+ 1 2)"},
        {"name": "OWNER", "initargs": [], "accessors": [], "readers": ["OWNER"], "writers": ["SET-OWNER"]},
        {"name": "OPENED", "initargs": [], "accessors": [], "readers": [], "writers": [], "allocation": ":CLASS"}]
    assert ("slot BALANCE; initargs :BALANCE; accessors BALANCE; type INTEGER; initform (+ 1 2)\n"
            "slot OWNER; readers OWNER; writers SET-OWNER\n"
            "slot OPENED; allocation :CLASS\n") in result["content"][0]["text"]


def test_a_class_in_text(lisp):
    text = describe(lisp, symbol="circle", package="cl-mcp-fixture")["content"][0]["text"]
    assert text.startswith("CL-MCP-FIXTURE:CIRCLE (CL-MCP-FIXTURE, external)\n\n"
                           "[class]\nclass\nsuperclasses: SHAPE\n"
                           "slot NAME; initargs :NAME; readers SHAPE-NAME\n"
                           "slot RADIUS; initargs :RADIUS; readers RADIUS\n\n"
                           f"[location]\nclass\n  {SHAPES}:19:1\n")


@pytest.mark.parametrize("symbol, kinds, arglist, documentation, location", [
    ("cl-mcp-fixture:greet", ["function"], "(NAME)", {"function": "A greeting for NAME."},
     ("function", SHAPES, 6, 1)),
    ("cl-mcp-fixture:with-doubled", ["macro"], "((VAR VALUE) &BODY BODY)",
     {"function": "Run BODY with VAR bound to twice VALUE."}, ("macro", SHAPES, 10, 1)),
    ("cl-mcp-fixture::small-count", ["type"], None, {"type": "A count below ten."}, ("type", SHAPES, 56, 1)),
    ("cl-mcp-fixture", ["package"], None, {}, ("package", PACKAGE, 1, 1)),
])
def test_what_each_name_is(lisp, symbol, kinds, arglist, documentation, location):
    structured = describe(lisp, symbol=symbol)["structuredContent"]
    assert structured["kinds"] == kinds
    assert structured.get("arglist") == arglist
    assert structured["documentation"] == documentation
    assert place(structured) == location


def test_an_internal_symbol_with_a_setf_expander(lisp):
    result = describe(lisp, symbol="cl-mcp-fixture::counter-value")
    structured = result["structuredContent"]
    assert (structured["external"], structured["kinds"]) == (False, ["function", "setf expander"])
    assert structured["description"] == "CL-MCP-FIXTURE::COUNTER-VALUE names a function, a setf expander."
    text = result["content"][0]["text"]
    assert text.startswith("CL-MCP-FIXTURE::COUNTER-VALUE (CL-MCP-FIXTURE, internal)\n\n"
                           "[function]\nfunction\narglist: (COUNTER)\n\n[setf expander]\nsetf expander\n\n"
                           f"[location]\nfunction\n  {SHAPES}:46:1\n")


def test_standard_names(lisp):
    structured = describe(lisp, symbol="if")["structuredContent"]
    assert (structured["package"], structured["kinds"]) == ("COMMON-LISP", ["special operator"])
    assert "arglist" not in structured and structured["documentation"]["function"].startswith("IF predicate")
    structured = describe(lisp, symbol="pi")["structuredContent"]
    assert (structured["kinds"], structured["value"]) == (["constant"], "3.141592653589793d0")


def test_a_symbol_that_names_nothing(lisp):
    result = describe(lisp, symbol="cl-mcp-fixture::name")
    assert not result["isError"]
    assert result["content"][0]["text"] == (
        "CL-MCP-FIXTURE::NAME (CL-MCP-FIXTURE, internal)\n\n"
        "It names no function, variable, class, type or package.")
    assert result["structuredContent"] == {
        "symbol": "CL-MCP-FIXTURE::NAME", "package": "CL-MCP-FIXTURE", "external": False, "kinds": [],
        "description": "CL-MCP-FIXTURE::NAME names nothing.", "documentation": {}}


def test_unknown_symbol_or_package_is_an_error_and_interns_nothing(lisp):
    result = describe(lisp, symbol="no-such-description-xyz")
    assert result["isError"]
    assert result["content"][0]["text"].startswith("[ERROR] CL-MCP:UNKNOWN-SYMBOL\n")
    assert lisp.eval('(find-symbol "NO-SUCH-DESCRIPTION-XYZ" "CL-USER")') == ("=> NIL\n=> NIL", False)
    result = describe(lisp, symbol="greet", package="no-such-package-xyz")
    assert result["isError"] and result["content"][0]["text"].startswith("[ERROR] PACKAGE-ERROR\n")


def test_a_qualified_name_that_names_nothing_is_said_to_be_missing_from_its_own_package(lisp):
    """Issue 49, item 4: `pkg::no-such` was reported as "not accessible in
    COMMON-LISP-USER", where it is missing from PKG; `pkg:internal` is
    there, only not external, and the answer says how to write it."""
    missing = describe(lisp, symbol="cl-mcp-fixture::no-such-thing-zz")
    assert missing["isError"], missing
    assert missing["content"][0]["text"] == ("[ERROR] CL-MCP:UNKNOWN-SYMBOL\nNo symbol named NO-SUCH-THING-ZZ"
                                             " exists in CL-MCP-FIXTURE (nothing was interned).")
    internal = describe(lisp, symbol="cl-mcp-fixture:name")
    assert internal["isError"], internal
    assert internal["content"][0]["text"] == ("[ERROR] CL-MCP:UNKNOWN-SYMBOL\ncl-mcp-fixture:name is not external"
                                              " in CL-MCP-FIXTURE: it is an internal symbol there, written"
                                              " CL-MCP-FIXTURE::NAME.")
    assert lisp.eval('(find-symbol "NO-SUCH-THING-ZZ" "CL-MCP-FIXTURE")') == ("=> NIL\n=> NIL", False)


def test_an_arglists_default_forms_name_their_package(lisp):
    """Parameter names are bare, as written; a default form's symbols are
    printed as from CL-USER: hunchentoot's (COMPUTE-PARAMETER ...) read as
    a CL-USER function (issue 49's trial replay)."""
    assert not lisp.call("evaluate-lisp", code="(defpackage :ll-pkg (:use :cl))")["isError"]
    definition = ("(defun ll-pkg::ll-fn (a &optional (b (ll-pkg::ll-helper) b-p) "
                  "&key ((:cee c) 'll-pkg::sym) (d :keyword) ((e f)) &aux (g (list a))) "
                  "(list a b b-p c d e f g))")
    assert not lisp.call("evaluate-lisp", code=definition)["isError"]
    structured = describe(lisp, symbol="ll-pkg::ll-fn")["structuredContent"]
    assert structured["arglist"] == ("(A &OPTIONAL (B (LL-PKG::LL-HELPER) B-P) &KEY ((:CEE C) (QUOTE LL-PKG::SYM)) "
                                     "(D :KEYWORD) ((E F)) &AUX (G (LIST A)))"), structured
