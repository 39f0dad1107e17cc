"""macroexpand: the fixture's WITH-DOUBLED and standard macros, once and
fully, in an image cl-mcp owns and in a programmer's image it attaches to
(tests/fixtures/lisp/cl-mcp-fixture/shapes.lisp, line 10)."""

from __future__ import annotations


import pytest

from tests.integration.devtools import MODES, checked_call, cl_mcp_in, load_fixture



@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    """cl-mcp with the fixture system loaded, embedded or attached."""
    with cl_mcp_in(request.param) as process:
        load_fixture(process)
        yield process

def expand(process, **arguments):
    return checked_call(process, "macroexpand", **arguments)


def test_one_step_of_the_fixtures_macro(lisp):
    form = "(cl-mcp-fixture:with-doubled (x 3) (when x (print x)))"
    result = expand(lisp, form=form)
    assert not result["isError"]
    expansion = "(LET ((X (* 2 3)))\n  (WHEN X (PRINT X)))"
    assert result["content"][0]["text"] == expansion
    assert result["structuredContent"] == {"form": form, "expansion": expansion, "expanded": True, "all": False}


def test_the_whole_expansion(lisp):
    result = expand(lisp, form="(cl-mcp-fixture:with-doubled (x 3) (when x (print x)))", all=True)
    assert result["content"][0]["text"] == "(LET ((X (* 2 3)))\n  (IF X\n      (PRINT X)))"
    assert result["structuredContent"]["expanded"] is True and result["structuredContent"]["all"] is True


def test_read_and_printed_in_the_given_package(lisp):
    result = expand(lisp, form="(with-doubled (r (area s)) r)", package="cl-mcp-fixture")
    # The fixture's symbols print unqualified there.
    assert result["content"][0]["text"] == "(LET ((R (* 2 (AREA S))))\n  R)"
    result = expand(lisp, form="(cl-mcp-fixture:with-doubled (r (cl-mcp-fixture:area s)) r)")
    assert result["content"][0]["text"] == "(LET ((R (* 2 (CL-MCP-FIXTURE:AREA S))))\n  R)"


def test_a_form_that_is_no_macro_form(lisp):
    result = expand(lisp, form="(car x)")
    assert not result["isError"]
    assert result["content"][0]["text"] == "(CAR X)\n; not a macro form: it comes back unchanged"
    assert result["structuredContent"]["expanded"] is False


@pytest.mark.parametrize("arguments, kind, says", [
    ({"form": "(cl-mcp-fixture:with-doubled (x 3)"}, "END-OF-FILE", "Incomplete form"),
    ({"form": "(a) (b)"}, "CL-MCP:MORE-THAN-ONE-FORM", "one form"),
    ({"form": "  "}, "END-OF-FILE", "no form"),
    ({"form": "(cl-mcp-fixture:with-doubled x)"}, "ERROR", "CL-MCP-FIXTURE:WITH-DOUBLED"),
    ({"form": "(when x)", "package": "no-such-package-qq"}, "PACKAGE-ERROR", "no-such-package-qq"),
])
def test_errors(lisp, arguments, kind, says):
    result = expand(lisp, **arguments)
    assert result["isError"]
    text = result["content"][0]["text"]
    assert text.startswith(f"[ERROR] {kind}\n") and says in text
    assert result["structuredContent"]["error"]["type"] == kind
