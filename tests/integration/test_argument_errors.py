"""Arguments that fail a tool's inputSchema, against the real cl-mcp over
pipes, in every revision: -32602 before 2025-11-25; from 2025-11-25 on
(2026-07-28 included) a result with isError whose text names each failing
argument's path and why, so that the model can correct the call
(SEP-1303).  An unknown tool and a malformed tools/call stay -32602 in
every revision."""

import asyncio
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from cl_mcp.client import JsonRpcError, McpClient, ToolExecutionError
from cl_mcp.wire.contracts import first_error, shared_type
from tests.integration.conftest import McpProcess

OLD = ["2024-11-05", "2025-03-26", "2025-06-18"]
NEW = ["2025-11-25", "2026-07-28"]
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "0"}}
HEADER = "[ERROR] CL-MCP:INVALID-ARGUMENTS"


class Revision:
    """A fresh cl-mcp spoken to under one revision: 2026-07-28 by `_meta`
    on every request (no initialize), the others by initialize."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.process = McpProcess()
        if version != "2026-07-28":
            assert self.process.initialize(version)["protocolVersion"] == version

    def call(self, params):
        if self.version == "2026-07-28":
            params = {**params, "_meta": MODERN_META}
        response = self.process.request("tools/call", params)
        assert first_error(shared_type("JsonRpcResponse"), response) is None, response
        return response

    def close(self):
        self.process.close()


@pytest.fixture(scope="module", params=OLD + NEW)
def revision(request):
    served = Revision(request.param)
    yield served
    served.close()


def test_invalid_arguments(revision):
    response = revision.call({"name": "evaluate-lisp", "arguments": {"code": "(+ 1 2)", "timeout": -1}})
    if revision.version in OLD:
        assert response["error"]["code"] == -32602
        assert response["error"]["data"]["path"] == "params.arguments.timeout"
        return
    result = response["result"]
    assert result["isError"] is True and "structuredContent" not in result
    assert result["content"] == [{"type": "text", "text": (
        f"{HEADER}\nInvalid arguments for evaluate-lisp: at /timeout: -1 is not greater than 0")}]
    assert ("resultType" in result) == (revision.version == "2026-07-28")


def test_every_problem_is_listed(revision):
    response = revision.call({"name": "eval-in-frame", "arguments": {"frame": -1, "evaluation": "first"}})
    if revision.version in OLD:
        assert response["error"]["code"] == -32602
        return
    assert response["result"]["isError"] is True
    assert response["result"]["content"][0]["text"].splitlines() == [
        HEADER, "Invalid arguments for eval-in-frame:",
        "at /code: required, but missing",
        "at /frame: -1 is less than the minimum of 0",
        'at /evaluation: expected an integer, got "first"']


def test_missing_arguments(revision):
    response = revision.call({"name": "load-system"})  # arguments omitted: {}
    if revision.version in OLD:
        assert response["error"]["code"] == -32602
        assert response["error"]["data"]["path"] == "params.arguments"
        return
    assert response["result"]["content"][0]["text"] == (
        f"{HEADER}\nInvalid arguments for load-system: at /system: required, but missing")


def test_the_corrected_call_runs(revision):
    """The model reads the problem, fixes the argument, and the image
    (never asked the first time) answers."""
    result = revision.call({"name": "evaluate-lisp", "arguments": {"code": "(+ 1 2)", "timeout": 5}})["result"]
    assert (result["isError"], result["content"][0]["text"]) == (False, "=> 3\n\n; Evaluation 1")


def test_unknown_tool_stays_a_protocol_error(revision):
    response = revision.call({"name": "no-such-tool", "arguments": {"code": 1}})
    assert response["error"] == {"code": -32602, "message": "Unknown tool: no-such-tool"}


@pytest.mark.parametrize("params, path", [
    ({"arguments": {"code": "1"}}, "params"),  # no name
    ({"name": "evaluate-lisp", "arguments": "(+ 1 2)"}, "params.arguments"),
    ({"name": "evaluate-lisp", "arguments": ["(+ 1 2)"]}, "params.arguments"),
    ({"name": 7, "arguments": {}}, "params.name"),
])
def test_a_malformed_call_stays_a_protocol_error(revision, params, path):
    error = revision.call(params)["error"]
    assert error["code"] == -32602 and error["data"]["path"] == path


def test_params_that_are_no_object(revision):
    process = revision.process
    params = ["evaluate-lisp", {"code": "1"}]
    assert process.request("tools/call", params)["error"]["code"] == -32602
    process.send({"jsonrpc": "2.0", "id": "scalar-params", "method": "tools/call", "params": 3})
    assert process.response("scalar-params")["error"]["code"] == -32600


# ---------------------------------------------------------------- as a host sees it

async def sdk_call(mode):
    params = StdioServerParameters(command=str(Path(sys.executable).parent / "cl-mcp"), args=[])
    async with Client(params, mode=mode) as client:
        result = await client.call_tool("evaluate-lisp", {"code": 42})
        return client.session.protocol_version, result


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_the_sdk_client_hands_the_problem_to_the_model(mode):
    """The official SDK client does not check arguments itself: what the
    model would read is the result's text."""
    version, result = asyncio.run(asyncio.wait_for(sdk_call(mode), 120))
    assert version in NEW
    assert result.is_error is True
    assert result.content[0].text == f"{HEADER}\nInvalid arguments for evaluate-lisp: at /code: expected a string, got 42"


@pytest.mark.parametrize("version", ["2025-06-18", "2025-11-25"])
def test_the_cl_mcp_client_with_a_stale_tool_list(version):
    """McpClient checks arguments itself first; with a stale list (here: an
    empty one) it sends them, and gets the server's answer as it comes."""
    async def body():
        command = [str(Path(sys.executable).parent / "cl-mcp"), "--log-level", "warning"]
        async with McpClient(command, protocol_version=version) as client:
            client._tools = []
            if version < "2025-11-25":
                with pytest.raises(JsonRpcError) as refused:
                    await client.call_tool("evaluate-lisp", {"code": 42})
                assert refused.value.code == -32602
                return
            result = await client.call_tool("evaluate-lisp", {"code": 42})
            assert result.is_error and result.structured_content is None
            assert result.text.endswith("Invalid arguments for evaluate-lisp: at /code: expected a string, got 42")
            with pytest.raises(ToolExecutionError) as failed:
                await client.call_tool("evaluate-lisp", {"code": 42}, raise_on_error=True)
            assert "at /code" in str(failed.value)
    asyncio.run(asyncio.wait_for(body(), 120))
