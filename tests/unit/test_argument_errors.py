"""Arguments that fail a tool's inputSchema: -32602 before protocol
2025-11-25, a tool error the model reads from 2025-11-25 on (SEP-1303).
The problems' wording (contracts.Schema.problems), the result's text
(render.invalid_arguments), and the server's choice per revision, with a
fake session in place of SBCL (tests/integration/test_argument_errors.py
runs the same against the real cl-mcp)."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

import pytest
from hypothesis import given, settings, strategies as st

from cl_mcp.results.render import invalid_arguments
from cl_mcp.server.server import LEGACY_VERSIONS
from cl_mcp.wire.contracts import MAX_PROBLEMS, json_pointer, json_text, tool_definitions, tool_schema
from tests.unit.test_server_intake import Harness

SCHEMAS = {tool["name"]: tool_schema(tool["inputSchema"]) for tool in tool_definitions()}
OLD_VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18"]
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {}}


def problems(tool: str, arguments: Any) -> list[str]:
    return SCHEMAS[tool].problems(arguments)


# ---------------------------------------------------------------- the problems

def test_valid_arguments_have_no_problems():
    assert problems("evaluate-lisp", {"code": "(+ 1 2)", "timeout": 0.5}) == []
    assert problems("evaluate-lisp", {"code": "1", "not-in-the-schema": [1]}) == []  # ignored, as documented
    assert problems("backtrace", {}) == []


@pytest.mark.parametrize("tool, arguments, expected", [
    ("evaluate-lisp", {"code": "1", "timeout": -1}, "at /timeout: -1 is not greater than 0"),
    ("evaluate-lisp", {"code": "1", "timeout": 86401}, "at /timeout: 86401 is greater than the maximum of 86400"),
    ("invoke-restart", {"restart": -1}, "at /restart: -1 is less than the minimum of 0"),
    ("evaluate-lisp", {"code": 42}, "at /code: expected a string, got 42"),
    ("evaluate-lisp", {"code": None}, "at /code: expected a string, got null"),
    ("evaluate-lisp", {"code": "1", "capture-time": "yes"}, 'at /capture-time: expected a boolean, got "yes"'),
    ("invoke-restart", {"restart": True}, "at /restart: expected an integer or a string, got true"),
    ("backtrace", {"count": 2.5}, "at /count: expected an integer, got 2.5"),
    ("evaluate-lisp", {}, "at /code: required, but missing"),
    ("apropos", {"pattern": ""}, "at /pattern: must not be empty"),
    ("list-definitions", {"type": "funcs"},
     'at /type: "funcs" is not one of "all", "functions", "variables", "macros", "classes"'),
    ("invoke-restart", {"restart": 0, "values": ["1", 2]}, "at /values/1: expected a string, got 2"),
])
def test_one_problem_names_its_path_and_reason(tool, arguments, expected):
    assert problems(tool, arguments) == [expected]


def test_every_problem_on_a_line_of_its_own_in_the_schemas_order():
    assert problems("eval-in-frame", {"frame": -1}) == [
        "at /code: required, but missing", "at /frame: -1 is less than the minimum of 0"]
    assert problems("evaluate-lisp", {"package": 1, "capture-time": None}) == [
        "at /code: required, but missing", "at /package: expected a string, got 1",
        "at /capture-time: expected a boolean, got null"]
    assert problems("eval-in-frame", {}) == ["at /frame: required, but missing",
                                             "at /code: required, but missing"]


def test_many_problems_are_cut_short():
    found = problems("invoke-restart", {"restart": 0, "values": list(range(1000))})
    assert len(found) == MAX_PROBLEMS + 1
    assert found[0] == "at /values/0: expected a string, got 0"
    assert found[-1] == "(more problems not listed)"


def test_a_problem_stays_one_short_line():
    """A value of any size or content is quoted short, as JSON, and nothing
    in it or in a key can break the line."""
    [line] = problems("evaluate-lisp", {"code": ["line\nbreak\u2028" * 10_000]})
    assert "\n" not in line and "\u2028" not in line and len(line) < 200
    assert line.startswith('at /code: expected a string, got ["line\\nbreak\\u2028')
    [line] = problems("evaluate-lisp", {"code": "x" * 100_000, "package": {"a\nb": "x" * 100_000}})
    assert line.startswith('at /package: expected a string, got {"a\\nb": "xxx') and len(line) < 200


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
property_names = sorted({name for schema in SCHEMAS.values() for name in schema.schema.get("properties", {})})


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(sorted(SCHEMAS)),
       st.dictionaries(st.sampled_from(property_names) | st.text(max_size=8), json_values, max_size=5))
def test_problems_for_any_arguments(tool, arguments):
    """Problems exactly when jsonschema finds the arguments invalid; each one
    line, short, starting with its pointer."""
    found = SCHEMAS[tool].problems(arguments)
    assert bool(found) == (not SCHEMAS[tool].validator.is_valid(arguments))
    assert len(found) <= MAX_PROBLEMS + 1
    for line in found:
        assert line.isprintable() and len(line) < 420, line
        assert line.startswith("at /") or line == "(more problems not listed)", line


def test_json_pointer():
    assert json_pointer([]) == "/"
    assert json_pointer(["values", 0]) == "/values/0"
    assert json_pointer(["a/b", "c~d"]) == "/a~1b/c~0d"  # RFC 6901 escapes


def test_json_text():
    assert [json_text(v) for v in (None, True, 1.5, "é", [1, {"a": None}])] == [
        "null", "true", "1.5", '"é"', '[1, {"a": null}]']
    assert json_text("x" * 500, limit=5) == '"xxxxx…"'
    assert json_text(list(range(500)), limit=10) == "[0, 1, 2, …"


def test_too_deep_to_walk_raises_recursion_error():
    deep: Any = "x"
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(RecursionError):
        problems("evaluate-lisp", {"code": deep})


# ---------------------------------------------------------------- the result's text

def test_one_problem_reads_as_one_line():
    rendered = invalid_arguments("evaluate-lisp", ["at /timeout: -1 is not greater than 0"])
    assert rendered.is_error and rendered.structured is None
    assert rendered.text == ("[ERROR] CL-MCP:INVALID-ARGUMENTS\n"
                             "Invalid arguments for evaluate-lisp: at /timeout: -1 is not greater than 0")


def test_several_problems_read_one_a_line():
    rendered = invalid_arguments("eval-in-frame", ["at /code: required, but missing",
                                                   "at /frame: -1 is less than the minimum of 0"])
    assert rendered.text.splitlines() == [
        "[ERROR] CL-MCP:INVALID-ARGUMENTS", "Invalid arguments for eval-in-frame:",
        "at /code: required, but missing", "at /frame: -1 is less than the minimum of 0"]


# ---------------------------------------------------------------- the server, per revision

class Counted(Harness):
    """A Harness whose session has a [session] notice waiting and counts
    the calls that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.notices = ["the image was replaced"]
        self.session.take_notices = lambda: [("session", self.notices.pop())] if self.notices else []  # type: ignore[method-assign]

    def request(self, request_id: Any, method: str, params: Any) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        [response] = self.responses(request_id)
        return response

    def initialize(self, version: str) -> None:
        result = self.request(f"init-{version}", "initialize", {"protocolVersion": version, "capabilities": {},
                                                     "clientInfo": {"name": "t", "version": "0"}})
        assert result["result"]["protocolVersion"] == version


def run(body: Callable[[Counted], Awaitable[None]]) -> None:
    async def main() -> None:
        harness = Counted()
        try:
            await body(harness)
        finally:
            await harness.finish()
    asyncio.run(main())


def bad_call(tool: str = "evaluate-lisp", arguments: Any = None, meta: dict[str, Any] | None = None):
    params: dict[str, Any] = {"name": tool, "arguments": {"code": "1", "timeout": -1} if arguments is None
                              else arguments}
    if meta:
        params["_meta"] = meta
    return params


@pytest.mark.parametrize("version", OLD_VERSIONS)
def test_before_2025_11_25_invalid_arguments_are_invalid_params(version):
    async def body(h: Counted) -> None:
        h.initialize(version)
        error = h.request(1, "tools/call", bad_call())["error"]
        assert error["code"] == -32602
        assert error["message"] == "Invalid arguments for tool evaluate-lisp: -1 is less than or equal to the minimum of 0"
        assert error["data"]["path"] == "params.arguments.timeout"
        assert not h.session.gates and h.notices  # the image was not asked, the notice is kept
    run(body)


@pytest.mark.parametrize("version", ["2025-11-25", "modern"])
def test_from_2025_11_25_invalid_arguments_are_a_tool_error(version):
    async def body(h: Counted) -> None:
        meta = MODERN_META if version == "modern" else None
        if meta is None:
            h.initialize(version)
        result = h.request(1, "tools/call", bad_call(meta=meta))["result"]
        assert result["isError"] is True
        assert result["content"] == [{"type": "text", "text": (
            "[ERROR] CL-MCP:INVALID-ARGUMENTS\n"
            "Invalid arguments for evaluate-lisp: at /timeout: -1 is not greater than 0")}]
        assert "structuredContent" not in result
        assert (result.get("resultType") == "complete") == (meta is not None)
        several = h.request(2, "tools/call", bad_call("eval-in-frame", {"frame": "top"}, meta))["result"]
        assert several["isError"] and several["content"][0]["text"].splitlines()[1:] == [
            "Invalid arguments for eval-in-frame:", "at /code: required, but missing",
            'at /frame: expected an integer, got "top"']
        assert not h.session.gates and h.notices  # the image was not asked, the notice is kept
        # A valid call still runs, and takes the notice.
        h.session.open_all = True
        h.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": bad_call(arguments={"code": "(ok)"}, meta=meta)})
        await h.server.finish(5.0)
        [ok] = h.responses(3)
        assert ok["result"]["isError"] is False and "[session]\nthe image was replaced" in ok["result"]["content"][0]["text"]
    run(body)


def test_a_session_that_never_initialized_is_served_as_2025_11_25():
    async def body(h: Counted) -> None:
        assert h.request(1, "tools/call", bad_call())["result"]["isError"] is True
    run(body)


def test_arguments_too_deep_to_check():
    deep = "[" * 1000 + "]" * 1000  # orjson reads up to 1,024 levels
    line = ('{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"evaluate-lisp",'
            '"arguments":{"code":%s}}}')

    async def body(h: Counted) -> None:
        h.initialize("2025-06-18")
        h.server.receive((line % (1, deep)).encode())
        assert h.responses(1)[0]["error"] == {
            "code": -32602, "message": "Invalid arguments: nested too deeply to validate"}
        h.initialize("2025-11-25")
        h.server.receive((line % (2, deep)).encode())
        result = h.responses(2)[0]["result"]
        assert result["isError"] and result["content"][0]["text"].endswith(
            "Invalid arguments for evaluate-lisp: at /: nested too deeply to check")
    run(body)


@pytest.mark.parametrize("version", [*LEGACY_VERSIONS, "modern"])
def test_unknown_tools_and_malformed_calls_stay_protocol_errors(version):
    async def body(h: Counted) -> None:
        meta = MODERN_META if version == "modern" else None
        if meta is None:
            h.initialize(version)
        extra = {"_meta": meta} if meta else {}
        unknown = h.request(1, "tools/call", {"name": "no-such-tool", "arguments": {"x": 1}, **extra})
        assert unknown["error"] == {"code": -32602, "message": "Unknown tool: no-such-tool"}
        unnamed = h.request(2, "tools/call", {"arguments": {"code": "1"}, **extra})
        assert unnamed["error"]["code"] == -32602 and unnamed["error"]["data"]["path"] == "params"
        not_an_object = h.request(3, "tools/call", {"name": "evaluate-lisp", "arguments": "(+ 1 2)", **extra})
        assert not_an_object["error"]["code"] == -32602
        assert not_an_object["error"]["data"]["path"] == "params.arguments"
        assert h.request(4, "tools/call", ["evaluate-lisp", {"code": "1"}])["error"]["code"] == -32602
        assert h.request(5, "tools/call", 3)["error"]["code"] == -32600  # no JSON-RPC request at all
        assert not h.session.gates
    run(body)


def test_the_result_is_well_formed_json():
    async def body(h: Counted) -> None:
        result = h.request(1, "tools/call", bad_call("xref", {"symbol": 7}))["result"]
        assert json.loads(json.dumps(result)) == result
        assert result["content"][0]["text"].endswith("at /symbol: expected a string, got 7")
    run(body)
