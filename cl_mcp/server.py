"""MCP over JSON-RPC: methods in an explicit table, and the one boundary
where exceptions become wire errors.

Every request with an id gets exactly one response; notifications get none.
Each request runs as its own task, so `ping` and `tools/list` are answered
while an evaluation runs; evaluations queue in the session in arrival order.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from cl_mcp import __version__, jsonrpc
from cl_mcp.contracts import error_location, first_error, params_validator, shared_type
from cl_mcp.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    JsonRpcError,
)
from cl_mcp.jsonrpc import OversizedLine
from cl_mcp.session import LispSession
from cl_mcp.tools import ToolSpec, build_tools

log = logging.getLogger("cl_mcp.server")

SUPPORTED_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]
INSTRUCTIONS = (
    "A live, persistent Common Lisp (SBCL) image. Use evaluate-lisp to run code; "
    "definitions persist between calls. list-definitions shows what the session "
    "defined, load-system loads ASDF systems, reset-session starts over."
)

Send = Callable[[dict[str, Any]], None]
Method = Callable[[Any], Awaitable[dict[str, Any]]]


def _valid_id(message: Any) -> Any:
    """The request's id when it is of a type a response may echo, else None."""
    if isinstance(message, dict):
        request_id = message.get("id")
        if isinstance(request_id, (str, int)) and not isinstance(request_id, bool):
            return request_id
    return None


class McpServer:
    def __init__(self, session: LispSession, send: Send) -> None:
        self.session = session
        self._send = send
        self._tools: dict[str, ToolSpec] = build_tools()
        self._tasks: set[asyncio.Task[None]] = set()
        self.protocol_version = LATEST_VERSION
        self.client_info: dict[str, Any] = {}
        self._methods: dict[str, Method] = {
            "initialize": self._initialize,
            "ping": self._ping,
            "tools/list": self._tools_list,
            "tools/call": self._tools_call,
        }
        self._notifications: dict[str, Callable[[Any], None]] = {
            "notifications/initialized": lambda params: None,
            "notifications/cancelled": lambda params: None,
        }

    # ------------------------------------------------------------ dispatch

    def receive(self, line: bytes | OversizedLine) -> None:
        """Take one line of input.  Parsing and validation happen now, in
        arrival order; the work itself runs as a task."""
        if isinstance(line, OversizedLine):
            self._send(jsonrpc.error_message(
                None, INVALID_REQUEST,
                f"Request too large ({line.size} bytes; the limit is {jsonrpc.MAX_LINE_BYTES})"))
            return
        try:
            message = jsonrpc.parse(line)
        except JsonRpcError as error:
            self._send(jsonrpc.error_message(None, error.code, error.message, error.data))
            return
        if isinstance(message, list):
            self._send(jsonrpc.error_message(
                None, INVALID_REQUEST, "Invalid Request: batches are not supported"))
            return
        violation = first_error(shared_type("JsonRpcRequest"), message)
        if violation is not None:
            self._send(jsonrpc.error_message(
                _valid_id(message), INVALID_REQUEST, "Invalid Request",
                error_location(violation, "$")))
            return
        method, params = message["method"], message.get("params")
        if "id" not in message:
            handler = self._notifications.get(method)
            if handler is not None:
                handler(params)
            return
        self._spawn(self._respond(message["id"], method, params))

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _respond(self, request_id: Any, method: str, params: Any) -> None:
        """Run one request and send its one response."""
        try:
            handler = self._methods.get(method)
            if handler is None:
                raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
            response = jsonrpc.result_message(request_id, await handler(params))
        except JsonRpcError as error:
            response = jsonrpc.error_message(request_id, error.code, error.message, error.data)
        except asyncio.CancelledError:
            response = jsonrpc.error_message(request_id, INTERNAL_ERROR, "Server shutting down")
            self._send(response)
            raise
        except Exception as error:  # the one boundary: a bug must not kill the server
            log.exception("internal error in %s", method)
            response = jsonrpc.error_message(
                request_id, INTERNAL_ERROR, "Internal error", {"detail": str(error)[:500]})
        self._send(response)

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    async def finish(self, timeout: float) -> None:
        """Let running requests answer for up to TIMEOUT seconds, then cancel
        the rest (each still gets its one response)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=1.0)

    # ------------------------------------------------------------ methods

    def _check_params(self, schema: str, params: Any) -> dict[str, Any]:
        params = {} if params is None else params
        violation = first_error(params_validator(schema), params)
        if violation is not None:
            raise JsonRpcError(INVALID_PARAMS, "Invalid params", error_location(violation, "params"))
        return params

    async def _initialize(self, params: Any) -> dict[str, Any]:
        params = self._check_params("initialize-params", params)
        requested = params["protocolVersion"]
        self.protocol_version = requested if requested in SUPPORTED_VERSIONS else LATEST_VERSION
        self.client_info = params.get("clientInfo") or {}
        server_info: dict[str, Any] = {"name": "cl-mcp", "version": __version__}
        if self.protocol_version >= "2025-06-18":
            server_info["title"] = "Common Lisp REPL (SBCL via Swank)"
        log.info("initialized: protocol %s, client %s", self.protocol_version,
                 self.client_info.get("name", "unknown"))
        return {
            "protocolVersion": self.protocol_version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": server_info,
            "instructions": INSTRUCTIONS,
        }

    async def _ping(self, params: Any) -> dict[str, Any]:
        return {}

    async def _tools_list(self, params: Any) -> dict[str, Any]:
        params = self._check_params("tools-list-params", params)
        if "cursor" in params:
            # One page holds every tool, so no cursor was ever handed out.
            raise JsonRpcError(INVALID_PARAMS, "Invalid cursor", {"cursor": params["cursor"]})
        with_annotations = self.protocol_version >= "2025-03-26"
        tools = []
        for spec in self._tools.values():
            tool = dict(spec.definition)
            if not with_annotations:
                tool.pop("annotations", None)
            tools.append(tool)
        return {"tools": tools}

    async def _tools_call(self, params: Any) -> dict[str, Any]:
        if isinstance(params, dict) and "arguments" not in params:
            # MCP makes arguments optional; a tool without any is called so.
            params = {**params, "arguments": {}}
        params = self._check_params("tools-call-params", params)
        spec = self._tools.get(params["name"])
        if spec is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {params['name']}")
        arguments = params["arguments"]
        violation = first_error(spec.validator, arguments)
        if violation is not None:
            raise JsonRpcError(
                INVALID_PARAMS, f"Invalid arguments for tool {spec.name}: {violation.message[:200]}",
                error_location(violation, "params.arguments"))
        rendered = await spec.handler(self.session, arguments)
        text = rendered.text
        notice = self.session.take_lost_state()
        if notice:
            text += f"\n\n[session]\n{notice}"
        return {"content": [{"type": "text", "text": text}], "isError": rendered.is_error}

