"""The profile tool's deterministic mode (SB-PROFILE) on real code, in an
image cl-mcp owns and in a programmer's image it attaches to: exact call
counts of named functions and of a package's functions, nothing of
cl-mcp's left profiled however the code ends, a function the programmer
profiled before left profiled with its counts, a package its library
locked profiled as any other, and the argument errors."""

from __future__ import annotations

import pytest

from tests.integration.devtools import MODES, checked_call, cl_mcp_in

WORK = """
(defpackage #:pc-lib (:use #:cl))
(defun pc-lib::often () (make-list 3))
(defun pc-lib::once () :once)
(defun pc-lib::never () :never)
(defvar pc-lib::*thing* 0)
(defun (setf pc-lib::thing) (value) (setf pc-lib::*thing* value))
(defun pc-leaf (x) (* x 2))
(defun pc-counted (n) (loop for i below n sum (pc-leaf i)))
(defun pc-mine () :mine)
(defmacro pc-macro () 1)
(defpackage #:pc-locked (:use #:cl))
(defun pc-locked::locked-f () :locked)
(sb-ext:lock-package "PC-LOCKED")
"""

TIMEOUT = 3  # --eval-timeout: the looping code below ends there


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param, "--eval-timeout", str(TIMEOUT), defining=WORK) as process:
        yield process


def calls(lisp, **arguments) -> dict:
    result = checked_call(lisp, "profile", mode="deterministic", **arguments)
    assert not result["isError"], result
    return result


def profiled_now(lisp) -> str:
    text, is_error = lisp.eval("(sb-profile:profile)")
    assert not is_error, text
    return text.split("\n")[0]


def test_a_function_called_n_times_shows_n_calls(lisp):
    result = calls(lisp, code="(pc-counted 37)", functions=["pc-leaf", "pc-counted"])
    profile = result["structuredContent"]
    assert profile["value"] == "1332" and profile["functions"] == 2 and profile["called"] == 2, profile
    counts = {row["function"]: row["calls"] for row in profile["rows"]}
    assert counts == {"PC-LEAF": 37, "PC-COUNTED": 1}, profile
    for row in profile["rows"]:
        assert row["seconds"] >= 0 and row["consedBytes"] >= 0 and row["secondsPerCall"] >= 0, row
    text = result["content"][0]["text"]
    assert text.startswith("2 functions profiled, 2 called (deterministic); the value: 1332"), text
    assert "calls   seconds" in text and "PC-LEAF" in text, text
    # Counters of its own each time: the same call gives the same counts.
    again = calls(lisp, code="(pc-counted 37)", functions=["pc-leaf"])["structuredContent"]
    assert [(row["function"], row["calls"]) for row in again["rows"]] == [("PC-LEAF", 37)], again
    assert profiled_now(lisp) == "=> NIL"


def test_every_function_of_a_package(lisp):
    code = "(dotimes (i 5) (pc-lib::often)) (pc-lib::once) (setf (pc-lib::thing) 4)"
    profile = calls(lisp, code=code, packages=["pc-lib"])["structuredContent"]
    assert profile["functions"] == 4 and profile["called"] == 3, profile
    counts = {row["function"]: row["calls"] for row in profile["rows"]}
    assert counts == {"PC-LIB::OFTEN": 5, "PC-LIB::ONCE": 1, "(SETF PC-LIB::THING)": 1}, profile
    limited = calls(lisp, code=code, packages=["PC-LIB"], **{"max-rows": 1})
    assert len(limited["structuredContent"]["rows"]) == 1, limited
    assert limited["structuredContent"]["called"] == 3
    read_in = calls(lisp, code="(often)", package="PC-LIB", functions=["often"])["structuredContent"]
    assert [(row["function"], row["calls"]) for row in read_in["rows"]] == [("OFTEN", 1)], read_in
    assert profiled_now(lisp) == "=> NIL"


def test_a_package_its_library_locked_is_profiled(lisp):
    """A library may lock its own package (esrap does): that is not SBCL's."""
    profile = calls(lisp, code="(pc-locked::locked-f)", packages=["PC-LOCKED"])["structuredContent"]
    assert [(row["function"], row["calls"]) for row in profile["rows"]] == [("PC-LOCKED::LOCKED-F", 1)], profile
    assert profiled_now(lisp) == "=> NIL"


def test_the_programmers_own_profiling_is_left_alone(lisp):
    text, is_error = lisp.eval("(sb-profile:profile pc-mine) (dotimes (i 5) (pc-mine))")
    assert not is_error, text
    try:
        result = calls(lisp, code="(pc-counted 3) (pc-mine)", functions=["pc-leaf", "pc-mine"])
        profile = result["structuredContent"]
        assert profile["alreadyProfiled"] == ["PC-MINE"] and profile["functions"] == 1, profile
        assert [(row["function"], row["calls"]) for row in profile["rows"]] == [("PC-LEAF", 3)], profile
        assert "left alone" in result["content"][0]["text"] and "PC-MINE" in result["content"][0]["text"]
        calls(lisp, code="(pc-counted 3)", functions=["pc-leaf"])
        assert profiled_now(lisp) == "=> (PC-MINE)"
        # Its counter went on counting (6 calls: 5, then the profiled code's
        # one) and was never cleared by cl-mcp.
        report, is_error = lisp.eval("(with-output-to-string (*trace-output*) (sb-profile:report))")
        assert not is_error, report
        [row] = [line for line in report.split("\n") if "PC-MINE" in line]
        assert row.split("|")[3].strip() == "6", report
    finally:
        lisp.eval("(sb-profile:unprofile pc-mine)")


def test_nothing_stays_profiled_when_the_code_errs_or_times_out(lisp):
    failed = checked_call(lisp, "profile", mode="deterministic", code="(pc-leaf 1) (car 5)",
                          functions=["pc-leaf"])
    assert failed["isError"] and "TYPE-ERROR" in failed["content"][0]["text"], failed
    assert profiled_now(lisp) == "=> NIL"
    endless = checked_call(lisp, "profile", mode="deterministic", code="(loop (pc-leaf 1))",
                           packages=["pc-lib"], functions=["pc-leaf"])
    assert endless["isError"] and "TIMEOUT" in endless["content"][0]["text"].upper(), endless
    assert profiled_now(lisp) == "=> NIL"


@pytest.mark.parametrize("arguments, kind, named", [
    ({"mode": "deterministic"}, "CL-MCP:INVALID-ARGUMENTS", "functions or packages"),
    ({"mode": "cpu", "functions": ["pc-leaf"]}, "CL-MCP:INVALID-ARGUMENTS", "mode deterministic"),
    ({"mode": "deterministic", "functions": ["pc-leaf", "pc-no-such-function"]},
     "CL-MCP:UNKNOWN-SYMBOL", "pc-no-such-function"),
    ({"mode": "deterministic", "functions": ["pc-macro"]}, "CL-MCP:UNDEFINED-FUNCTION", "pc-macro"),
    ({"mode": "deterministic", "packages": ["PC-NO-SUCH-PACKAGE"]}, "PACKAGE-ERROR", "PC-NO-SUCH-PACKAGE"),
    ({"mode": "deterministic", "packages": ["CL"]}, "CL-MCP:INVALID-ARGUMENTS",
     "The package COMMON-LISP is SBCL's own (COMMON-LISP and the SB- packages are refused)"),
    ({"mode": "deterministic", "packages": ["SB-IMPL"]}, "CL-MCP:INVALID-ARGUMENTS",
     "The package SB-IMPL is SBCL's own"),
    ({"mode": "deterministic", "packages": ["CL-MCP-AGENT"]}, "CL-MCP:INVALID-ARGUMENTS",
     "The package CL-MCP-AGENT is cl-mcp's own"),
])
def test_argument_errors(lisp, arguments, kind, named):
    result = checked_call(lisp, "profile", code="(pc-leaf 1)", **arguments)
    text = result["content"][0]["text"]
    assert result["isError"] and kind in text and named in text, result
    assert profiled_now(lisp) == "=> NIL"
