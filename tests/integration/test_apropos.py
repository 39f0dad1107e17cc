"""apropos: Swank's symbol search over the fixture system, in an image
cl-mcp owns and in a programmer's image it attaches to
(tests/fixtures/lisp/cl-mcp-fixture/)."""

from __future__ import annotations

import json

import pytest

from tests.integration.devtools import MODES, checked_call, cl_mcp_in, load_fixture



@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    """cl-mcp with the fixture system loaded and one function of the
    session's own in CL-USER, embedded or attached."""
    with cl_mcp_in(request.param) as process:
        load_fixture(process)
        text, is_error = process.eval("(defun greet-from-the-repl (who) who)")
        assert text.startswith("=> GREET-FROM-THE-REPL") and not is_error
        yield process

def apropos(process, **arguments):
    return checked_call(process, "apropos", **arguments)


def names(result):
    return [(s["package"], s["name"]) for s in result["structuredContent"]["symbols"]]


def test_a_macro_with_its_kind_and_lambda_list(lisp):
    result = apropos(lisp, pattern="With-Doubled")
    assert not result["isError"]
    found = [s for s in result["structuredContent"]["symbols"] if s["package"] == "CL-MCP-FIXTURE"]
    assert found == [{"name": "WITH-DOUBLED", "package": "CL-MCP-FIXTURE", "external": True,
                      "kinds": ["macro"], "arglist": "((VAR VALUE) &BODY BODY)"}]
    assert "CL-MCP-FIXTURE:WITH-DOUBLED  macro  ((VAR VALUE) &BODY BODY)" in result["content"][0]["text"].splitlines()


def test_the_sessions_symbols_come_first_then_external_ones(lisp):
    result = apropos(lisp, pattern="greet")
    found = names(result)
    assert found[0] == ("COMMON-LISP-USER", "GREET-FROM-THE-REPL")
    # Exported before internal, then by name.
    fixture = [name for package, name in found if package == "CL-MCP-FIXTURE"]
    assert fixture == ["*GREETING*", "GREET", "GREETING-LENGTH", "RESET-GREETING", "WITH-GREETING"]
    lines = result["content"][0]["text"].splitlines()
    assert lines[0] == "COMMON-LISP-USER::GREET-FROM-THE-REPL  function  (WHO)"
    assert "CL-MCP-FIXTURE:*GREETING*  variable" in lines
    assert "CL-MCP-FIXTURE::RESET-GREETING  function  ()" in lines
    assert result["structuredContent"]["truncated"] is False


@pytest.mark.parametrize("arguments, expected", [
    ({"pattern": "greet", "package": "cl-mcp-fixture", "external-only": True},
     [("*GREETING*", ["variable"]), ("GREET", ["function"])]),
    ({"pattern": "greet", "package": "cl-mcp-fixture", "type": "variables"}, [("*GREETING*", ["variable"])]),
    ({"pattern": "area", "package": "cl-mcp-fixture"}, [("AREA", ["generic function"]),
                                                        ("DOUBLED-AREA", ["function"])]),
    ({"pattern": "e", "package": "cl-mcp-fixture", "type": "classes"},
     [("CIRCLE", ["class"]), ("FIXTURE-ERROR", ["condition"]), ("SHAPE", ["class"]), ("SQUARE", ["class"])]),
    ({"pattern": "doubled", "package": "cl-mcp-fixture", "type": "macros"}, [("WITH-DOUBLED", ["macro"])]),
])
def test_package_external_only_and_type(lisp, arguments, expected):
    result = apropos(lisp, **arguments)
    assert [(s["name"], s["kinds"]) for s in result["structuredContent"]["symbols"]] == expected
    assert result["structuredContent"]["total"] == len(expected)


def test_capped_with_the_total(lisp):
    result = apropos(lisp, pattern="a")
    structured = result["structuredContent"]
    # 200 are listed; the result budget (20,000 characters) keeps the
    # structured list to what fits, and the text to its start and end.
    assert structured["truncated"] is True and 0 < len(structured["symbols"]) <= 200
    assert structured["total"] > 1000
    assert len(json.dumps(structured, ensure_ascii=False, separators=(",", ":"))) <= 20_000
    text = result["content"][0]["text"]
    assert len(text) <= 20_000
    assert text.splitlines()[-1] == f"… {structured['total'] - 200} more (narrow the pattern or pass package / type)"
    # Past the session's own symbols, the first of 13,000 by rank then name
    # (chosen in one pass, not sorted): external ones, by name, then package.
    listed = [(not s["external"], s["name"], s["package"]) for s in structured["symbols"]
              if not s["package"].startswith(("COMMON-LISP-USER", "CL-MCP-FIXTURE"))]
    assert len(listed) >= 20 and listed == sorted(listed)
    assert listed[0][0] is False


def test_unknown_package_is_an_error_and_nothing_is_interned(lisp):
    result = apropos(lisp, pattern="greet", package="no-such-package-qq")
    assert result["isError"]
    assert result["content"][0]["text"] == '[ERROR] PACKAGE-ERROR\nThe package "no-such-package-qq" does not exist.'
    result = apropos(lisp, pattern="zqxnothingcalledthis")
    assert not result["isError"] and result["structuredContent"]["symbols"] == []
    assert result["content"][0]["text"] == 'No symbol whose name contains "zqxnothingcalledthis" names anything.'
    assert lisp.eval('(find-symbol "ZQXNOTHINGCALLEDTHIS" "CL-USER")') == ("=> NIL\n=> NIL", False)


def test_an_unknown_arglist_is_printed_as_documented(lisp):
    """A function compiled with (debug 0) keeps no lambda list: SBCL says it
    is unknown, which prints (...), not () as for a function of none."""
    assert lisp.eval("(defun arglist-kept-nowhere (a b) (declare (optimize (debug 0))) (+ a b))"
                     " (defun arglist-of-none () 1)")[1] is False
    result = apropos(lisp, pattern="arglist-kept-nowhere")
    assert [s["arglist"] for s in result["structuredContent"]["symbols"]] == ["(...)"]
    assert "COMMON-LISP-USER::ARGLIST-KEPT-NOWHERE  function  (...)" in result["content"][0]["text"]
    result = apropos(lisp, pattern="arglist-of-none")
    assert [s["arglist"] for s in result["structuredContent"]["symbols"]] == ["()"]
