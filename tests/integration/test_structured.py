"""Structured results: every structuredContent validates against the
outputSchema its tool declares, in the revisions that define them."""

import asyncio
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from mcp import Client, StdioServerParameters

from cl_mcp.wire.contracts import first_error, shared_type
from tests.integration.conftest import McpProcess, cl_mcp

CALLS = [
    ("evaluate-lisp", {"code": '(format t "hi~%") (warn "w") (values 1 "two")', "capture-time": True}),
    ("evaluate-lisp", {"code": "(defun sq (x) (* x x)) (defvar *v* 1) (defmacro m (a) a) (defstruct pt x)"}),
    ("list-definitions", {}),
    ("evaluate-lisp", {"code": "(undefined-fn 1)"}),
    ("backtrace", {}),
    ("eval-in-frame", {"frame": 0, "code": "(+ 1 2)"}),
    ("invoke-restart", {"restart": "USE-VALUE", "values": ["(lambda (x) (* 10 x))"]}),
    ("evaluate-lisp", {"code": "(error \"again\")"}),
    ("invoke-restart", {"restart": "ABORT"}),
    ("evaluate-lisp", {"code": "(1 2"}),
    ("load-system", {"system": "alexandria"}),
    ("load-system", {"system": "nonexistent-system"}),
    ("reset-session", {}),
    ("backtrace", {}),  # nothing waits: an error that still fits
]


@pytest.fixture(scope="module")
def results():
    process = McpProcess()
    process.initialize("2025-06-18")
    tools = {tool["name"]: tool for tool in process.request("tools/list")["result"]["tools"]}
    collected = [(name, arguments, process.call(name, **arguments)) for name, arguments in CALLS]
    process.close()
    return tools, collected


def test_every_tool_declares_an_object_output_schema(results):
    tools, _ = results
    for tool in tools.values():
        assert tool["outputSchema"]["type"] == "object"
        Draft202012Validator.check_schema(tool["outputSchema"])


def test_every_result_validates_against_its_output_schema(results):
    tools, collected = results
    for name, arguments, result in collected:
        assert "structuredContent" in result, (name, arguments)
        errors = list(Draft202012Validator(tools[name]["outputSchema"]).iter_errors(result["structuredContent"]))
        assert errors == [], (name, arguments, result["structuredContent"], errors)


def test_evaluation_results_are_contract_evaluation_results(results):
    _, collected = results
    for name, arguments, result in collected:
        if name in ("evaluate-lisp", "invoke-restart", "eval-in-frame"):
            assert first_error(shared_type("EvaluationResult"), result["structuredContent"]) is None


def test_the_facts_match_the_text(results):
    _, collected = results
    first = collected[0][2]["structuredContent"]
    assert first["success"] is True
    assert first["values"] == ["1", '"two"']
    assert first["stdout"] == "hi\n"
    assert first["warnings"] == [{"type": "SIMPLE-WARNING", "message": "w"}]
    assert set(first["timing"]) == {"realMs", "runMs", "gcMs", "bytesConsed"}
    assert first["package"] == "COMMON-LISP-USER"
    definitions = collected[2][2]["structuredContent"]["definitions"]
    assert {"name": "SQ", "kind": "function", "lambdaList": "(X)"} in definitions
    assert {"name": "*V*", "kind": "variable", "value": "1"} in definitions
    assert {"name": "PT", "kind": "class", "classKind": "structure"} in definitions
    error = collected[3][2]["structuredContent"]
    assert error["success"] is False and error["error"]["type"] == "UNDEFINED-FUNCTION"
    assert error["error"]["backtrace"].startswith("0: (UNDEFINED-FN 1)")
    assert error["restarts"][0] == {"name": "CONTINUE", "description": "Retry calling UNDEFINED-FN."}
    assert isinstance(error["evaluation"], int)
    assert collected[6][2]["structuredContent"]["values"] == ["10"]
    assert collected[8][2]["structuredContent"] == {**collected[8][2]["structuredContent"], "aborted": True}
    loaded = collected[10][2]["structuredContent"]
    assert loaded == {**loaded, "system": "alexandria", "loaded": True, "version": "1.0.1"}
    assert collected[11][2]["structuredContent"]["loaded"] is False
    assert collected[12][2]["structuredContent"]["reset"] is True


@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26"])
def test_older_revisions_have_neither_field(version):
    with cl_mcp(version=version) as process:
        tools = process.request("tools/list")["result"]["tools"]
        assert all("outputSchema" not in tool for tool in tools)
        assert "structuredContent" not in process.call("evaluate-lisp", code="(+ 1 2)")
        assert "structuredContent" not in process.call("list-definitions")


CL_MCP = str(Path(sys.executable).parent / "cl-mcp")


async def sdk_calls(mode):
    # The SDK client validates structuredContent against outputSchema itself.
    async with Client(StdioServerParameters(command=CL_MCP, args=[]), mode=mode) as client:
        await client.list_tools()
        out = []
        for name, arguments in CALLS:
            result = await client.call_tool(name, arguments)
            out.append((name, result.is_error, result.structured_content))
        return out


@pytest.mark.parametrize("mode", ["legacy", "auto", "2026-07-28"])
def test_the_sdk_client_accepts_every_result(mode):
    out = asyncio.run(asyncio.wait_for(sdk_calls(mode), 180))
    assert [name for name, _, _ in out] == [name for name, _ in CALLS]
    assert all(structured is not None for _, _, structured in out)


# Valid arguments for every tool: each call fails, for want of an image.
EVERY_TOOL = {
    "evaluate-lisp": {"code": "(+ 1 2)"}, "list-definitions": {}, "reset-session": {},
    "load-system": {"system": "alexandria"}, "invoke-restart": {"restart": "ABORT"},
    "backtrace": {}, "eval-in-frame": {"frame": 0, "code": "1"},
    "xref": {"symbol": "car"}, "compile-file": {"path": "/tmp/none.lisp"},
    "compile-form": {"path": "/tmp/none.lisp", "line": 1},
    "edit-form": {"path": "/tmp/none.lisp", "line": 1, "text": "(x)"}, "read-lisp-file": {"path": "/tmp/none.lisp"},
    "apropos": {"pattern": "car"}, "macroexpand": {"form": "(when a b)"},
    "inspect": {"code": "1"}, "find-definition": {"symbol": "car"},
    "describe-symbol": {"symbol": "car"},
    "read-output": {"evaluation": 1},  # needs no image: nothing was kept
    "await-evaluation": {"evaluation": 1},
    "threads": {"action": "list"}, "profile": {"code": "1"},
    "run-tests": {"system": "alexandria-tests"},
}


def test_a_session_error_still_fits_every_tools_output_schema(tmp_path):
    """Hosts' SDK clients refuse a result whose structuredContent does not
    fit the outputSchema, error or not, and the model then sees nothing."""
    process = McpProcess("--sbcl", str(tmp_path / "no-such-sbcl"))
    process.initialize("2025-06-18")
    tools = {tool["name"]: tool for tool in process.request("tools/list")["result"]["tools"]}
    assert set(tools) == set(EVERY_TOOL)
    for name, arguments in EVERY_TOOL.items():
        result = process.call(name, **arguments)
        assert result["isError"], name
        assert name == "read-output" or "IMAGE-START-FAILED" in result["content"][0]["text"], name
        errors = list(Draft202012Validator(tools[name]["outputSchema"]).iter_errors(
            result["structuredContent"]))
        assert errors == [], (name, result["structuredContent"])
    process.close()
