"""The JSON-RPC and MCP layer of the real cl-mcp, over pipes."""

import json
import os
import shutil
import signal
import sys
import time

import pytest

from cl_mcp.wire.contracts import first_error, shared_type
from tests.integration.conftest import McpProcess, cl_mcp

CONTRACT_TOOLS = {"evaluate-lisp", "list-definitions", "reset-session", "load-system"}
RESTART_TOOLS = {"invoke-restart", "backtrace", "eval-in-frame"}
DEVELOPMENT_TOOLS = {"xref", "compile-file", "compile-form", "apropos", "macroexpand", "inspect",
                     "find-definition", "describe-symbol", "threads", "profile", "edit-form", "read-lisp-file"}
OUTPUT_TOOLS = {"read-output", "await-evaluation"}
TEST_TOOLS = {"run-tests"}


def valid_response(message):
    return first_error(shared_type("JsonRpcResponse"), message) is None


# ---------------------------------------------------------------- lifecycle

@pytest.mark.parametrize("version", ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"])
def test_initialize_echoes_a_supported_version(version):
    process = McpProcess()
    try:
        result = process.initialize(version)
        assert result["protocolVersion"] == version
        assert result["capabilities"]["tools"] == {"listChanged": False}
        assert result["serverInfo"]["name"] == "cl-mcp"
        assert result["instructions"]
        assert ("title" in result["serverInfo"]) == (version >= "2025-06-18")
        tools = process.request("tools/list")["result"]["tools"]
        assert all(("annotations" in tool) == (version >= "2025-03-26") for tool in tools)
    finally:
        process.close()


def test_initialize_with_an_unknown_version_offers_the_latest(shared_server):
    response = shared_server.request("initialize", {"protocolVersion": "1999-01-01", "capabilities": {},
                                                    "clientInfo": {"name": "x", "version": "1"}})
    assert response["result"]["protocolVersion"] == "2025-11-25"


def test_initialize_is_answered_before_the_image_is_ready(tmp_path):
    sbcl = tmp_path / "sbcl"  # an SBCL that takes 60 s to start (and dies at once when stopped)
    sbcl.write_text(f"#!{sys.executable}\nimport os, sys, time\ntime.sleep(60)\n"
                    f"os.execv({shutil.which('sbcl')!r}, sys.argv)\n")
    sbcl.chmod(0o755)
    started = time.monotonic()
    with cl_mcp("--sbcl", str(sbcl)):
        assert time.monotonic() - started < 30  # half the image's start


def test_ping(shared_server):
    assert shared_server.request("ping")["result"] == {}


# ---------------------------------------------------------------- tools/list

def test_tools_list_matches_the_contract(shared_server):
    tools = shared_server.request("tools/list")["result"]["tools"]
    assert {tool["name"] for tool in tools} == CONTRACT_TOOLS | RESTART_TOOLS | DEVELOPMENT_TOOLS | OUTPUT_TOOLS | TEST_TOOLS
    for tool in tools:
        assert first_error(shared_type("ToolDefinition"), tool) is None
    evaluate = next(t for t in tools if t["name"] == "evaluate-lisp")
    assert evaluate["description"] == ("Evaluate Common Lisp code in a persistent REPL session. "
                                       "Definitions and variables persist across calls.")
    assert evaluate["inputSchema"]["required"] == ["code"]
    assert {"code", "package", "capture-time"} <= set(evaluate["inputSchema"]["properties"])
    listing = next(t for t in tools if t["name"] == "list-definitions")
    assert listing["annotations"]["readOnlyHint"] is True
    assert listing["inputSchema"]["properties"]["type"]["enum"] == [
        "all", "functions", "variables", "macros", "classes"]


def test_tools_list_rejects_a_cursor_it_never_issued(shared_server):
    response = shared_server.request("tools/list", {"cursor": "nope"})
    assert response["error"]["code"] == -32602


# ---------------------------------------------------------------- errors

def test_unparseable_line(shared_server):
    shared_server.send_raw(b"this is not json\n")
    shared_server.send_raw(b'{"jsonrpc": "2.0", "id": 77, "method": "ping"\n')
    for _ in range(2):
        response = shared_server.response(None)
        assert response["error"]["code"] == -32700
        assert valid_response(response)
    assert shared_server.request("ping")["result"] == {}


def test_invalid_request(shared_server):
    shared_server.send({"jsonrpc": "1.0", "id": "bad-version", "method": "ping"})
    response = shared_server.response("bad-version")
    assert response["error"]["code"] == -32600
    assert response["error"]["data"]["path"] == "$.jsonrpc"
    shared_server.send({"jsonrpc": "2.0", "id": "no-method"})
    assert shared_server.response("no-method")["error"]["code"] == -32600
    shared_server.send({"jsonrpc": "2.0", "id": "bad-params", "method": "ping", "params": 3})
    assert shared_server.response("bad-params")["error"]["code"] == -32600


def test_unknown_method(shared_server):
    response = shared_server.request("no/such/method")
    assert response["error"] == {"code": -32601, "message": "Method not found: no/such/method"}


def test_unknown_tool(shared_server):
    response = shared_server.request("tools/call", {"name": "invalid-tool-name", "arguments": {}})
    assert response["error"] == {"code": -32602, "message": "Unknown tool: invalid-tool-name"}


INVALID_ARGUMENTS = [  # arguments, the error's path before 2025-11-25, the pointer from then on
    ({}, "params.arguments", "/code"),
    ({"code": 42}, "params.arguments.code", "/code"),
    ({"code": "1", "capture-time": "yes"}, "params.arguments.capture-time", "/capture-time"),
    ({"code": "1", "package": ["CL-USER"]}, "params.arguments.package", "/package"),
    ({"code": "1", "timeout": -1}, "params.arguments.timeout", "/timeout"),
]


@pytest.fixture(scope="module")
def server_2025_06_18():
    process = McpProcess()
    process.initialize("2025-06-18")
    yield process
    process.close()


@pytest.mark.parametrize("arguments, path, pointer", INVALID_ARGUMENTS)
def test_invalid_arguments_name_the_failing_path(server_2025_06_18, arguments, path, pointer):
    """Before 2025-11-25: a protocol error (tests/integration/test_argument_errors.py has every revision)."""
    response = server_2025_06_18.request("tools/call", {"name": "evaluate-lisp", "arguments": arguments})
    assert response["error"]["code"] == -32602
    assert response["error"]["data"]["path"] == path
    assert response["error"]["data"]["schemaPath"].startswith("#/")


@pytest.mark.parametrize("arguments, path, pointer", INVALID_ARGUMENTS)
def test_invalid_arguments_are_a_tool_error_from_2025_11_25(shared_server, arguments, path, pointer):
    result = shared_server.request("tools/call", {"name": "evaluate-lisp", "arguments": arguments})["result"]
    assert result["isError"] is True
    assert f"Invalid arguments for evaluate-lisp: at {pointer}: " in result["content"][0]["text"]


def test_invalid_tools_call_params(shared_server):
    response = shared_server.request("tools/call", {"arguments": {}})
    assert response["error"]["code"] == -32602
    response = shared_server.request("tools/call", {"name": "evaluate-lisp", "arguments": "(+ 1 2)"})
    assert response["error"]["data"]["path"] == "params.arguments"


def test_a_tool_without_arguments_may_omit_them(shared_server):
    response = shared_server.request("tools/call", {"name": "list-definitions"})
    assert "result" in response


def test_notifications_get_no_response(shared_server):
    shared_server.notify("notifications/initialized")
    shared_server.notify("notifications/unknown-thing", {"x": 1})
    shared_server.notify("ping")
    before = len(shared_server.raw_lines)
    assert shared_server.request("ping")["result"] == {}
    time.sleep(0.2)
    assert len(shared_server.raw_lines) == before + 1


def test_string_ids_and_every_response_is_well_formed(shared_server):
    shared_server.send({"jsonrpc": "2.0", "id": "s-1", "method": "ping"})
    assert shared_server.response("s-1")["result"] == {}
    for line in shared_server.raw_lines:
        assert valid_response(json.loads(line)), line


def test_an_id_past_64_bits_is_answered_and_cancelled_as_sent(shared_server):
    big = 2**64 + 1  # orjson reads it as a float; 2**80 would survive as one
    shared_server.send({"jsonrpc": "2.0", "id": big, "method": "ping"})
    assert shared_server.response(big)["result"] == {}
    assert any(line.startswith(b'{"jsonrpc":"2.0","id":18446744073709551617,')
               for line in list(shared_server.raw_lines))
    shared_server.send({"jsonrpc": "2.0", "id": big + 2, "method": "tools/call",
                        "params": {"name": "evaluate-lisp", "arguments": {"code": "(sleep 30)"}}})
    shared_server.notify("notifications/cancelled", {"requestId": big + 2})
    assert shared_server.eval("(+ 1 2)") == ("=> 3", False)  # the sleep was stopped
    assert b"18446744073709551619" not in b"".join(list(shared_server.raw_lines))


def test_batches_are_rejected_cleanly(shared_server):
    shared_server.send_raw(b'[{"jsonrpc":"2.0","id":"in-batch","method":"ping"}]\n')
    assert shared_server.response(None)["error"]["code"] == -32600


# ---------------------------------------------------------------- concurrency and order

def test_ping_and_tools_list_are_answered_while_an_evaluation_runs(shared_server):
    slow = shared_server.start_request("tools/call", {"name": "evaluate-lisp",
                                                      "arguments": {"code": "(sleep 5) :slept"}})
    assert shared_server.request("ping")["result"] == {}
    assert "tools" in shared_server.request("tools/list")["result"]
    assert not shared_server.answered(slow)  # both came first
    assert shared_server.response(slow)["result"]["content"][0]["text"].startswith("=> :SLEPT\n\n; Evaluation ")


def test_evaluations_run_one_at_a_time_in_arrival_order(shared_server):
    shared_server.eval("(defvar *order* nil)")
    ids = [shared_server.start_request("tools/call", {"name": "evaluate-lisp", "arguments": {
        "code": f"(sleep (random 0.02)) (push {i} *order*) {i}"}}) for i in range(20)]
    for i, request_id in enumerate(ids):
        result = shared_server.response(request_id)["result"]
        assert result["content"][0]["text"] == f"=> {i}\n\n; Evaluation {result['structuredContent']['number']}"
    assert shared_server.eval("(reverse *order*)")[0] == "=> " + "(" + " ".join(map(str, range(20))) + ")"


def test_large_code_and_large_lines(shared_server):
    code = "(length \"" + "x" * 2_000_000 + "\")"
    assert shared_server.eval(code) == ("=> 2000000", False)


# ---------------------------------------------------------------- stray writes

def image_writes_to_fd(fd: int, text: str) -> str:
    """Lisp code that writes TEXT and a newline straight to the image's file
    descriptor FD, under every stream."""
    return (f'(let ((octets (sb-ext:string-to-octets (format nil "~A~%" "{text}"))))'
            f' (sb-unix:unix-write {fd} octets 0 (length octets)))')


def image_writes_to_stream(stream: str, text: str) -> str:
    return f'(progn (write-line "{text}" {stream}) (finish-output {stream}))'


# Everything in the image that could reach a standard output: its file
# descriptors, its standard streams, and a thread that is not the user's
# (a user's thread's output is kept for the model: test_thread_news.py),
# which sees the global *STANDARD-OUTPUT* and writes after its evaluation
# has answered.
STRAY_IMAGE_WRITES = {
    "stray-image-fd-1": image_writes_to_fd(1, "stray-image-fd-1"),
    "stray-image-fd-2": image_writes_to_fd(2, "stray-image-fd-2"),
    "stray-image-stdout-stream": image_writes_to_stream("sb-sys:*stdout*", "stray-image-stdout-stream"),
    "stray-image-stderr-stream": image_writes_to_stream("sb-sys:*stderr*", "stray-image-stderr-stream"),
    "stray-image-thread": ('(sb-thread:make-thread (lambda () (sleep 0.2) '
                           '(write-line "stray-image-thread") (finish-output)) :name "cl-mcp stray")'),
}

# Loaded by cl-mcp's own Python at start-up (PYTHONPATH, no hook in cl-mcp):
# on SIGUSR1, a print() and a raw write to file descriptor 1, the latter
# without a newline, so that it would run into the next line of stdout.
STRAY_PYTHON_WRITES = """
import os
import signal


def write_stray(signum, frame):
    print("stray-python-print", flush=True)
    os.write(1, b"stray-python-fd-1")


signal.signal(signal.SIGUSR1, write_stray)
"""


def is_json_rpc_message(line: bytes) -> bool:
    """A response, or a notification from the server."""
    try:
        message = json.loads(line)
    except ValueError:
        return False
    if not isinstance(message, dict):
        return False
    if "method" in message:
        return "id" not in message and first_error(shared_type("JsonRpcRequest"), message) is None
    return valid_response(message)


def check_stdout_so_far(process: McpProcess) -> None:
    """Fails at once on a line that is not JSON-RPC (McpProcess stops
    reading stdout there, so waiting for more would only time out)."""
    strays = [line for line in list(process.raw_lines) if not is_json_rpc_message(line)]
    assert not strays, f"stdout carried lines that are not JSON-RPC messages: {strays}"


def wait_for(process: McpProcess, what: str, condition, *arguments, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition(process, *arguments):
        check_stdout_so_far(process)
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.01)


def logged(process: McpProcess, text: str) -> bool:
    return any(text in line for line in list(process.stderr_lines))


def answered(process: McpProcess, request_id: int) -> bool:
    return any(b'"id":%d,' % request_id in line for line in list(process.raw_lines))


def test_nothing_but_json_rpc_on_stdout_whatever_writes_to_it(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(STRAY_PYTHON_WRITES)
    python_path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    process = McpProcess(env={"PYTHONPATH": python_path})
    try:
        process.initialize()
        evaluations = [process.start_request("tools/call", {"name": "evaluate-lisp", "arguments": {"code": code}})
                       for code in [*STRAY_IMAGE_WRITES.values(), '(format t "captured~%") (print :captured)']]
        process.proc.send_signal(signal.SIGUSR1)
        for stray in [*STRAY_IMAGE_WRITES, "stray-python-print", "stray-python-fd-1"]:
            wait_for(process, f"{stray} in the log (the write happened)", logged, stray)
        ping = process.start_request("ping")  # its answer is written after every stray write
        wait_for(process, "the ping's answer", answered, ping)
        check_stdout_so_far(process)
        results = [process.response(request)["result"] for request in evaluations]
        assert [result["isError"] for result in results] == [False] * len(results)
        assert results[-1]["content"][0]["text"].startswith("[stdout]\ncaptured")  # the evaluation's own output
    finally:
        process.close()
