"""The contract's result text, from agent plists (no Lisp involved)."""

from cl_mcp.results.render import render_evaluation, with_reach, without_number_line
from cl_mcp.tools.definitions import render_definitions
from cl_mcp.tools.systems import render_load


def ok(**fields):
    return {"status": "ok", "stdout": "", "stderr": "", "warnings": [], **fields}


def test_single_value():
    assert render_evaluation(ok(values=["6"])).text == "=> 6"


def test_multiple_values():
    assert render_evaluation(ok(values=["3", "1"])).text == "=> 3\n=> 1"


def test_output_sections_as_in_the_contract():
    result = ok(values=["NIL"], stdout="Hello, World!\n", stderr="Warning: deprecated function\n")
    assert render_evaluation(result).text == (
        "[stdout]\nHello, World!\n\n[stderr]\nWarning: deprecated function\n\n=> NIL")


def test_warnings_and_timing():
    result = ok(values=["FOO"], warnings=[["STYLE-WARNING", "undefined function: BAR"]],
                timing=[12, 10, 0, 4096])
    assert render_evaluation(result).text == (
        "[warnings]\nSTYLE-WARNING: undefined function: BAR\n\n=> FOO\n\n"
        "; Timing: 12ms real, 10ms run, 0ms GC, 4096 bytes consed")


def test_no_values():
    assert render_evaluation(ok(values=[])).text == "; No values"


def test_truncated_output_is_marked():
    text = render_evaluation(ok(values=["NIL"], stdout="abc", **{"stdout-dropped": 5})).text
    assert text == "[stdout]\nabc\n… [5 more characters truncated]\n\n=> NIL"


def test_error_then_output_sections():
    result = {"status": "error", "stdout": "before\n", "stderr": "", "warnings": [],
              "error": {"type": "UNDEFINED-FUNCTION",
                        "message": "The function NONEXISTENT-FUNCTION is undefined.",
                        "backtrace": ["(NONEXISTENT-FUNCTION)", "(EVAL (NONEXISTENT-FUNCTION))"]}}
    rendered = render_evaluation(result)
    assert rendered.is_error
    assert rendered.text == (
        "[ERROR] UNDEFINED-FUNCTION\nThe function NONEXISTENT-FUNCTION is undefined.\n\n"
        "[Backtrace]\n0: (NONEXISTENT-FUNCTION)\n1: (EVAL (NONEXISTENT-FUNCTION))\n\n"
        "[stdout]\nbefore")


def test_error_without_backtrace():
    result = {"status": "error", "error": {"type": "END-OF-FILE", "message": "Incomplete form", "backtrace": []}}
    assert render_evaluation(result).text == "[ERROR] END-OF-FILE\nIncomplete form"


def test_definitions_sections_in_contract_order():
    entries = [("macro", "WITH-TIMING", "(FORM)"), ("function", "HELPER", "(X)"),
               ("variable", "*MY-VAR*", "42"), ("class", "POINT", "structure")]
    assert render_definitions(entries, "all") == (
        "[Functions]\n- HELPER (X)\n\n[Variables]\n- *MY-VAR* = 42\n\n"
        "[Macros]\n- WITH-TIMING (FORM)\n\n[Classes]\n- POINT (structure)")
    assert render_definitions([], "all") == "No definitions in the current session."
    assert render_definitions([], "macros") == "No macros defined in the current session."


def test_load_texts():
    loaded = render_load({"status": "ok", "system": "alexandria", "version": "1.0.1", "warnings": []})
    assert loaded.text == "Loading system: alexandria\nLoaded: alexandria (version 1.0.1)"
    unversioned = render_load({"status": "ok", "system": "foo", "version": [], "warnings": []})
    assert unversioned.text == "Loading system: foo\nLoaded: foo"
    missing = render_load({"status": "error", "system": "nonexistent-system", "warnings": [],
                           "error": {"type": "ASDF/FIND-COMPONENT:MISSING-COMPONENT",
                                     "message": 'System "nonexistent-system" not found.'}})
    assert missing.is_error
    assert missing.text == ('[ERROR] ASDF/FIND-COMPONENT:MISSING-COMPONENT\n'
                            'System "nonexistent-system" not found.')


CUT = "(7 7 ...)\n… [cut by *print-length* 100 or *print-level* 10]"


def test_a_printer_cut_marker_says_how_to_reach_the_value():
    assert with_reach(CUT, 4) == ("(7 7 ...)\n… [cut by *print-length* 100 or *print-level* 10; "
                                  "the value itself: (cl-mcp-agent:value 4)]")


def test_only_the_agents_last_line_is_a_printer_cut_marker():
    quoted = '"' + CUT + '"'
    assert with_reach(quoted, 4) == quoted
    assert with_reach("(1 2)", 4) == "(1 2)"


def test_a_numbered_evaluation_ends_with_its_number_line():
    assert render_evaluation(ok(values=["6"], number=7)).text == "=> 6\n\n; Evaluation 7"
    assert render_evaluation(ok(values=[], number=8, timing=[1, 2, 0, 64])).text == (
        "; No values\n\n; Timing: 1ms real, 2ms run, 0ms GC, 64 bytes consed\n\n; Evaluation 8")
    assert render_evaluation({"status": "aborted", "number": 9}).text == (
        "The evaluation was aborted.\n\n; Evaluation 9")


def test_only_the_last_number_line_is_left_out():
    assert without_number_line("=> 6\n\n; Evaluation 7") == "=> 6"
    assert without_number_line("=> 6") == "=> 6"
    assert without_number_line('=> "\n\n; Evaluation 7"') == '=> "\n\n; Evaluation 7"'
    assert without_number_line("; Evaluation 7\n\n=> 6") == "; Evaluation 7\n\n=> 6"
