"""The official MCP Python SDK client drives cl-mcp, as hosts do."""

import asyncio
import sys
from pathlib import Path

import pytest
from mcp import Client, MCPError, StdioServerParameters

CL_MCP = str(Path(sys.executable).parent / "cl-mcp")


async def session(mode):
    async with Client(StdioServerParameters(command=CL_MCP, args=[]), mode=mode) as client:
        listed = await client.list_tools()
        names = {tool.name for tool in listed.tools}
        evaluated = await client.call_tool("evaluate-lisp", {"code": "(defun sq (x) (* x x)) (sq 12)"})
        failed = await client.call_tool("evaluate-lisp", {"code": "(nonexistent-function)"})
        definitions = await client.call_tool("list-definitions", {"type": "functions"})
        reset = await client.call_tool("reset-session")
        after = await client.call_tool("list-definitions")
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("no-such-tool", {})
        return client.session.protocol_version, names, evaluated, failed, definitions, reset, after, unknown.value


@pytest.mark.parametrize("mode, expected_version", [
    ("legacy", "2025-11-25"), ("auto", "2026-07-28"), ("2026-07-28", "2026-07-28")])
def test_sdk_client(mode, expected_version):
    version, names, evaluated, failed, definitions, reset, after, unknown = asyncio.run(
        asyncio.wait_for(session(mode), 120))
    assert version == expected_version
    assert names == {"evaluate-lisp", "list-definitions", "reset-session", "load-system",
                     "invoke-restart", "backtrace", "eval-in-frame", "xref", "compile-file", "compile-form",
                     "apropos", "macroexpand", "inspect", "find-definition", "describe-symbol",
                     "threads", "profile", "read-output", "await-evaluation", "run-tests",
                     "edit-form", "read-lisp-file"}
    assert (evaluated.is_error, evaluated.content[0].text) == (False, "=> 144\n\n; Evaluation 1")
    assert failed.is_error and failed.content[0].text.startswith("[ERROR] UNDEFINED-FUNCTION")
    assert definitions.content[0].text == "[Functions]\n- SQ (X)"
    assert reset.content[0].text == "Session reset. All definitions cleared."
    assert after.content[0].text == "No definitions in the current session."
    assert unknown.code == -32602 and "Unknown tool: no-such-tool" in str(unknown)
