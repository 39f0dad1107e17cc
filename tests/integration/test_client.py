"""The client library against cl-mcp, and against servers that are not."""

import asyncio
import logging
import sys
from pathlib import Path

import pytest

from cl_mcp.client import (
    McpClient, JsonRpcError, ServerError, ToolExecutionError, ToolTimeoutError,
    ToolValidationError, argument_digest, audit_to_file,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"
CL_MCP = [str(Path(sys.executable).parent / "cl-mcp"), "--log-level", "warning"]
SDK_SERVER = [sys.executable, str(FIXTURES / "sdk_server.py")]
PAGING_SERVER = [sys.executable, str(FIXTURES / "paging_server.py")]


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 120))


def test_against_cl_mcp():
    async def body():
        async with McpClient(CL_MCP) as client:
            assert client.server_info["name"] == "cl-mcp"
            assert client.protocol_version == "2025-11-25"
            assert await client.available_tools()
            names = [tool["name"] for tool in await client.list_tools()]
            assert "evaluate-lisp" in names
            result = await client.call_tool("evaluate-lisp", {"code": "(+ 1 2)"})
            assert (result.text, result.is_error) == (f"=> 3\n\n; Evaluation {result.structured_content['number']}", False)
            assert result.structured_content["values"] == ["3"]
            failed = await client.call_tool("evaluate-lisp", {"code": "(error \"x\")"})
            assert failed.is_error and failed.text.startswith("[ERROR] SIMPLE-ERROR")
            with pytest.raises(ToolExecutionError) as caught:
                await client.call_tool("evaluate-lisp", {"code": "(error \"y\")"}, raise_on_error=True)
            assert caught.value.result.is_error
            with pytest.raises(ToolValidationError) as invalid:
                await client.call_tool("evaluate-lisp", {"code": 42})
            assert invalid.value.path == "$.code"
            with pytest.raises(JsonRpcError) as refused:
                await client.call_tool("no-such-tool", {})
            assert refused.value.code == -32602
            with pytest.raises(ToolTimeoutError):
                await client.call_tool("evaluate-lisp", {"code": "(sleep 30)"}, timeout=0.5)
            # The timed-out call was cancelled in the image: the session goes on at once.
            assert (await client.call_tool("evaluate-lisp", {"code": ":next"}, timeout=5)).text.startswith("=> :NEXT\n\n; Evaluation ")
            seen = []
            await client.call_tool("evaluate-lisp", {"code": "(sleep 1.2)"},
                                   progress=lambda p, t, m: seen.append((p, m)))
            assert seen and seen[0][1].startswith("running for")
    run(body())


def test_following_work_in_the_background_and_tasks():
    async def body():
        async with McpClient([*CL_MCP, "--answer-within", "1"]) as client:
            heard = []
            running = await client.call_tool("evaluate-lisp", {"code": '(progn (write-line "on") (sleep 3) :end)'})
            assert running.structured_content["running"]
            outcome = await client.outcome(running, progress=lambda *update: heard.append(update))
            assert outcome.text == f"[stdout]\non\n\n=> :END\n\n; Evaluation {running.structured_content['number']}"
            assert heard and "latest output: on" in heard[0][2]
            assert await client.offers_task("evaluate-lisp") and not await client.offers_task("apropos")
            statuses = []
            result = await client.call_tool_as_task("evaluate-lisp", {"code": "(progn (sleep 2) 42)"},
                                                    on_status=statuses.append)
            assert result.text == f"=> 42\n\n; Evaluation {result.structured_content['number']}" and result.meta["io.modelcontextprotocol/related-task"]
            assert statuses and statuses[0]["status"] == "working"
            # Cancelled, the task and its evaluation stop.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.call_tool_as_task(
                    "evaluate-lisp", {"code": "(progn (sleep 3) (setf (get :client-task :done) t))"}), 1.5)
            await asyncio.sleep(3)
            assert (await client.call_tool("evaluate-lisp", {"code": "(get :client-task :done)"})).text.startswith("=> NIL\n\n; Evaluation ")
            tasks = await client.request("tasks/list")
            assert [task["status"] for task in tasks["tasks"]][-1] == "cancelled"
    run(body())


def test_against_a_server_built_on_the_sdk():
    async def body():
        async with McpClient(SDK_SERVER) as client:
            assert client.server_info["name"] == "fixture-sdk-server"
            assert {t["name"] for t in await client.list_tools()} == {"add", "echo", "picture", "fail"}
            assert (await client.call_tool("add", {"a": 2, "b": 40})).text == "42"
            picture = await client.call_tool("picture")
            assert [block["type"] for block in picture.content] == ["image", "text"]
            assert picture.content[0]["mimeType"] == "image/png" and picture.content[0]["data"]
            failed = await client.call_tool("fail", {"reason": "on purpose"})
            assert failed.is_error and "fail" in failed.text
            with pytest.raises(ToolValidationError):
                await client.call_tool("add", {"a": "two", "b": 1})
    run(body())


def test_pagination_and_the_tool_cache():
    async def body():
        async with McpClient(PAGING_SERVER) as client:
            assert [t["name"] for t in await client.list_tools()] == [f"tool-{i}" for i in range(5)]
            with pytest.raises(ToolValidationError):
                await client.call_tool("tool-1", {"n": "x"})
            await client.call_tool("tool-1", {"n": 1})  # the server announces a new tool
            for _ in range(50):
                if any(t["name"] == "late-tool" for t in await client.tools()):
                    break
                await asyncio.sleep(0.05)
            assert "late-tool" in [t["name"] for t in await client.tools()]
    run(body())


def test_audit_log(tmp_path):
    path = tmp_path / "audit.log"
    handler = audit_to_file(str(path))
    try:
        async def body():
            async with McpClient(SDK_SERVER) as client:
                await client.call_tool("echo", {"text": "secret"})
                await client.call_tool("fail", {"reason": "r"})
        run(body())
    finally:
        logging.getLogger("cl_mcp.client.audit").removeHandler(handler)
        handler.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert f"tool=echo args={argument_digest({'text': 'secret'})}" in lines[0]
    assert "outcome=ok" in lines[0] and "outcome=tool-error" in lines[1]
    assert "secret" not in path.read_text()


def test_a_server_that_cannot_start_or_dies():
    async def missing():
        async with McpClient(["/nonexistent/server"]):
            pass
    with pytest.raises(ServerError):
        run(missing())

    async def dies():
        async with McpClient([sys.executable, "-c", "import sys; sys.stdin.readline()"]):
            pass
    with pytest.raises(ServerError):
        run(dies())
