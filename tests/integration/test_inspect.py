"""inspect: the fixture's objects as SLIME's inspector shows them, handles
to drill in, paging, and the handle table's bounds and reset, in an image
cl-mcp owns and in a programmer's image it attaches to
(tests/fixtures/lisp/cl-mcp-fixture/shapes.lisp: CIRCLE, line 19)."""

from __future__ import annotations

import re

import pytest

from tests.integration.devtools import MODES, checked_call, cl_mcp_in, load_fixture

CIRCLE = "(make-instance 'cl-mcp-fixture:circle :radius 2 :name \"disc\")"


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    """cl-mcp with the fixture system loaded, embedded or attached."""
    with cl_mcp_in(request.param) as process:
        load_fixture(process)
        yield process

def inspect(process, **arguments):
    return checked_call(process, "inspect", **arguments)


def test_an_instance_of_the_fixtures_class(lisp):
    result = inspect(lisp, code=CIRCLE)
    assert not result["isError"]
    s = result["structuredContent"]
    assert s["class"] == "CL-MCP-FIXTURE:CIRCLE" and s["printed"].startswith("#<CL-MCP-FIXTURE:CIRCLE {")
    assert s["description"] == "The object is a STANDARD-OBJECT of type CL-MCP-FIXTURE:CIRCLE."
    assert [(p["label"], p["value"]) for p in s["parts"]] == [("NAME", '"disc"'), ("RADIUS", "2")]
    assert (s["start"], s["total"]) == (0, 2)
    name, radius = s["parts"]
    lines = result["content"][0]["text"].splitlines()
    assert lines == [f"CL-MCP-FIXTURE:CIRCLE: {s['printed']}  [{s['handle']}]",
                     "The object is a STANDARD-OBJECT of type CL-MCP-FIXTURE:CIRCLE.",
                     f"[{name['handle']}] NAME: \"disc\"",
                     f"[{radius['handle']}] RADIUS: 2"]


def test_drilling_in_by_handle_and_by_part(lisp):
    s = inspect(lisp, code=CIRCLE)["structuredContent"]
    name = inspect(lisp, handle=s["parts"][0]["handle"])["structuredContent"]
    assert name["printed"] == '"disc"' and name["handle"] == s["parts"][0]["handle"]
    assert ("0", "#\\d") in [(p["label"], p["value"]) for p in name["parts"]]
    radius = inspect(lisp, handle=s["handle"], part=1)["structuredContent"]
    assert (radius["class"], radius["printed"]) == ("FIXNUM", "2")
    # The same object again, by its own handle (a collection between the two
    # calls may have moved it: its printed address is left out).
    again = inspect(lisp, handle=s["handle"])["structuredContent"]
    def unplaced(printed: str) -> str:
        return re.sub(r" \{[0-9A-F]+\}>$", ">", printed)
    assert again["handle"] == s["handle"] and unplaced(again["printed"]) == unplaced(s["printed"])


def test_long_part_lists_are_paged(lisp):
    result = inspect(lisp, code="(loop for i below 120 collect (* i i))")
    s = result["structuredContent"]
    assert s["description"] == "A proper list:" and (s["start"], s["total"]) == (0, 120)
    assert [p["label"] for p in s["parts"]] == [str(i) for i in range(50)]
    assert result["content"][0]["text"].splitlines()[-1] == "parts 0–49 of 120; next page: start 50"
    last = inspect(lisp, handle=s["handle"], start=100)
    page = last["structuredContent"]
    assert page["handle"] == s["handle"] and page["start"] == 100
    assert [(p["label"], p["value"]) for p in page["parts"]] == [(str(i), str(i * i)) for i in range(100, 120)]
    assert last["content"][0]["text"].splitlines()[-1] == "parts 100–119 of 120"
    # Issue 49, item 5: a later page does not print the object again.
    assert last["content"][0]["text"].splitlines()[0] == f"CONS  [{s['handle']}], continued (its printed form: start 0)"
    assert "A proper list:" not in last["content"][0]["text"] and "(0 1 4" not in last["content"][0]["text"]


def test_hash_table_entries(lisp):
    s = inspect(lisp, code="(let ((h (make-hash-table))) (setf (gethash :apple h) 3) h)")["structuredContent"]
    assert s["class"] == "HASH-TABLE"
    parts = [(p["label"], p["value"], "handle" in p) for p in s["parts"]]
    assert ("Count", "1", True) in parts and ("Contents:", "", False) in parts
    assert parts[-1] == (":APPLE", "3", True)


@pytest.mark.parametrize("arguments, kind, says", [
    ({"code": "(error \"no ~A\" 'luck)"}, "SIMPLE-ERROR", "no LUCK"),
    ({"code": "(list 1"}, "END-OF-FILE", "Incomplete form"),
    ({"code": "1", "package": "no-such-package-qq"}, "PACKAGE-ERROR", "no-such-package-qq"),
    ({"handle": 987654321}, "CL-MCP:UNKNOWN-HANDLE", "handle 987654321"),
    ({}, "CL-MCP:INVALID-ARGUMENTS", "`code`"),
    ({"code": "1", "handle": 1}, "CL-MCP:INVALID-ARGUMENTS", "`handle`"),
])
def test_errors(lisp, arguments, kind, says):
    result = inspect(lisp, **arguments)
    assert result["isError"]
    text = result["content"][0]["text"]
    assert text.startswith(f"[ERROR] {kind}\n") and says in text, text


def test_no_such_part(lisp):
    s = inspect(lisp, code=CIRCLE)["structuredContent"]
    result = inspect(lisp, handle=s["handle"], part=2)
    assert result["isError"] and result["content"][0]["text"].startswith("[ERROR] CL-MCP:NO-SUCH-PART\n")


def test_the_handle_table_is_bounded(lisp):
    s = inspect(lisp, code=CIRCLE)["structuredContent"]
    text, is_error = lisp.eval("(dotimes (i 10000) (cl-mcp-agent::remember-object i))")
    assert not is_error, text
    result = inspect(lisp, handle=s["handle"])
    assert result["isError"] and result["content"][0]["text"].startswith("[ERROR] CL-MCP:UNKNOWN-HANDLE\n")
    # The newest are still there.
    assert not inspect(lisp, handle=s["parts"][1]["handle"] + 10000)["isError"]


def test_the_programmers_inspector_is_left_alone(lisp):
    assert lisp.eval("(progn (setq swank::*istate* :programmers-own) t)") == ("=> T", False)
    assert not inspect(lisp, code=CIRCLE)["isError"]
    assert lisp.eval("swank::*istate*") == ("=> :PROGRAMMERS-OWN", False)


def test_code_sees_the_repls_variables_and_leaves_them(lisp):
    assert lisp.eval("(list 1 2 3)") == ("=> (1 2 3)", False)
    printed = {code: inspect(lisp, code=code)["structuredContent"]["printed"]
               for code in ("*", "+", "/", "(list 4 5)")}
    assert printed == {"*": "(1 2 3)", "+": "(LIST 1 2 3)", "/": "((1 2 3))", "(list 4 5)": "(4 5)"}
    # Inspecting is not an evaluation typed at the REPL: `*` is still the
    # value evaluate-lisp left.
    assert lisp.eval("*") == ("=> (1 2 3)", False)


def test_reset_session_drops_the_handles(lisp):
    # Last: it resets the session (in attach mode, a soft reset).
    s = inspect(lisp, code="(list 1 2 3)")["structuredContent"]
    assert not inspect(lisp, handle=s["handle"])["isError"]
    assert not lisp.call("reset-session")["isError"]
    result = inspect(lisp, handle=s["handle"])
    assert result["isError"] and result["content"][0]["text"].startswith("[ERROR] CL-MCP:UNKNOWN-HANDLE\n")
