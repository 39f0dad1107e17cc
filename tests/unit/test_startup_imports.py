"""What cl-mcp loads before it answers initialize: a host waits for that
answer, so the session (the image, the link, the Swank client), the tools
(their modules, tools.json and its compiled schemas) and the extensions a
session may never use (RE2) wait for their first use.
Checked in a fresh interpreter, whose modules are what this test's process
has not imported already."""

from __future__ import annotations

import json
import subprocess
import sys

from cl_mcp.wire.contracts import tool_definitions

SERVE_INITIALIZE = """
import asyncio, json, sys
from cl_mcp.lisp.config import SessionConfig
from cl_mcp.server.server import McpServer
from cl_mcp.wire import jsonrpc

def make_session():
    from cl_mcp.lisp.session import LispSession
    return LispSession(SessionConfig())

async def main():
    sent = []
    server = McpServer(SessionConfig(), make_session, sent.append)
    server.receive(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"}}}).encode())
    answered = [m for m in sent if m.get("id") == 1 and "result" in m]
    loaded_then = sorted(sys.modules)
    server.receive(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}).encode())
    listed = json.loads(jsonrpc.encode([m for m in sent if m.get("id") == 2][0]))
    tools = listed["result"]["tools"]
    print(json.dumps({"answered": bool(answered), "loaded": loaded_then, "tools": len(tools),
                      "listed": sorted(sys.modules)}))

asyncio.run(main())
"""


def initialize_in_fresh_process() -> dict:
    done = subprocess.run([sys.executable, "-c", SERVE_INITIALIZE], capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout)


def test_initialize_is_answered_before_the_tools_are_loaded() -> None:
    outcome = initialize_in_fresh_process()
    assert outcome["answered"]
    assert not [name for name in outcome["loaded"] if name.startswith("cl_mcp.tools.")]  # the package itself holds ToolSpec
    assert outcome["tools"] == len(tool_definitions())  # the first tools/list builds them all


def test_initialize_is_answered_before_the_session_is_made() -> None:
    # The session's modules (the image, the link, the Swank client, the
    # s-expression codec) load when the session is first needed.
    loaded = set(initialize_in_fresh_process()["loaded"])
    assert not loaded & {"cl_mcp.lisp.session", "cl_mcp.lisp.link", "cl_mcp.lisp.image", "cl_mcp.lisp.swank.connection",
                         "cl_mcp.wire.sexp"}, sorted(loaded)


def test_re2_waits_for_the_first_search() -> None:
    outcome = initialize_in_fresh_process()
    assert "cl_mcp.tools.output" in outcome["listed"]  # read-output is built...
    assert "re2" not in outcome["listed"]  # ...without the engine of its patterns
