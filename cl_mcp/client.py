"""An MCP client for any stdio server: the client side of tool calling
as docs/client.md describes it, in Python.

    async with McpClient(["cl-mcp"]) as client:
        tools = await client.list_tools()
        result = await client.call_tool("evaluate-lisp", {"code": "(+ 1 2)"})
        print(result.text)          # => 3

Discovery follows `nextCursor` to the end and is cached; the cache is
refreshed when the server sends `notifications/tools/list_changed`.  Calls
are validated against the tool's `inputSchema` before they are sent, have a
timeout (after which the request is cancelled), and are written to an audit
log.  Errors are distinct types: `JsonRpcError` (a JSON-RPC error),
`ToolExecutionError` (a result with `isError`, when asked to raise),
`ToolTimeoutError`, `ToolValidationError`, and `ServerError` (the server
could not be started or went away).  Shutdown follows the spec: close
stdin, wait, then terminate, then kill.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from cl_mcp import __version__
from cl_mcp.errors import ClMcpError, JsonRpcError
from cl_mcp.wire.jsonrpc import LineSplitter, OversizedLine, encode

log = logging.getLogger("cl_mcp.client")
audit = logging.getLogger("cl_mcp.client.audit")

LATEST_PROTOCOL = "2025-11-25"
SHUTDOWN_GRACE = 2.0

ProgressCallback = Callable[[float, float | None, str | None], Any]


class ClientError(ClMcpError):
    """Base of the client's own errors (a JSON-RPC error the server answers
    is the `JsonRpcError` of cl-mcp's one exception tree)."""


class ServerError(ClientError):
    """The server could not be started, or it exited or closed its output."""


class ToolExecutionError(ClientError):
    """A tool's result had `isError: true` (raised only when asked to)."""

    def __init__(self, name: str, result: ToolResult) -> None:
        super().__init__(f"tool {name} failed: {result.text[:500]}")
        self.result = result


class ToolTimeoutError(ClientError):
    """A tool call took longer than its timeout; it was cancelled."""


class ToolValidationError(ClientError):
    """The arguments do not match the tool's inputSchema (nothing was sent)."""

    def __init__(self, name: str, message: str, path: str) -> None:
        super().__init__(f"invalid arguments for {name} at {path}: {message}")
        self.path = path


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A tool's result.  Content blocks of every type (text, image, audio,
    resource, resource_link) are kept as the server sent them."""

    content: list[dict[str, Any]]
    is_error: bool = False
    structured_content: Any = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The text blocks, joined."""
        return "\n".join(block.get("text", "") for block in self.content if block.get("type") == "text")


def argument_digest(arguments: dict[str, Any]) -> str:
    """A short, stable fingerprint of a call's arguments for the audit log
    (the arguments themselves may be large or private)."""
    canonical = json.dumps(arguments, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


class McpClient:
    """A client session with one MCP server launched as a subprocess."""

    def __init__(
        self,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        protocol_version: str = LATEST_PROTOCOL,
        client_name: str = "cl-mcp-client",
        timeout: float = 60.0,
        stderr: int | None = None,
        on_log: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.command = command
        self._env = env
        self._cwd = cwd
        self._protocol_version = protocol_version
        self._client_name = client_name
        self.timeout = timeout
        self._stderr = stderr
        self._on_log = on_log
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._progress: dict[str, ProgressCallback] = {}
        self._ids = itertools.count(1)
        self._tools: list[dict[str, Any]] | None = None
        self._validators: dict[str, Draft202012Validator] = {}
        self._refresh: asyncio.Task[Any] | None = None
        self.server_info: dict[str, Any] = {}
        self.server_capabilities: dict[str, Any] = {}
        self.protocol_version: str | None = None

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> McpClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Launch the server and initialize the session."""
        try:
            # A session of its own: a Ctrl-C meant for the caller (a person at
            # `cl-mcp repl`) must not reach the server.
            self._process = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=self._stderr, env=self._env, cwd=self._cwd, start_new_session=True)
        except OSError as error:
            raise ServerError(f"cannot start {self.command[0]}: {error}") from None
        self._reader = asyncio.create_task(self._read_loop(), name="mcp-client-reader")
        try:
            result = await self.request("initialize", {
                "protocolVersion": self._protocol_version,
                "capabilities": {},
                "clientInfo": {"name": self._client_name, "version": __version__},
            })
        except BaseException:
            await self.close()
            raise
        self.protocol_version = result.get("protocolVersion")
        self.server_info = result.get("serverInfo") or {}
        self.server_capabilities = result.get("capabilities") or {}
        self.notify("notifications/initialized")

    async def close(self) -> None:
        """Shut the server down as the spec says: close its stdin, wait, then
        terminate, then kill."""
        process = self._process
        if process is None:
            return
        if process.stdin and not process.stdin.is_closing():
            process.stdin.close()
        for step in (None, process.terminate, process.kill):
            if step is not None and process.returncode is None:
                step()
            try:
                await asyncio.wait_for(process.wait(), SHUTDOWN_GRACE)
                break
            except asyncio.TimeoutError:
                continue
        for task in (self._reader, self._refresh):
            if task is not None:
                task.cancel()
        self._fail_pending(ServerError("the client closed the session"))

    # ------------------------------------------------------------ messages

    def _write(self, message: dict[str, Any]) -> None:
        if self._process is None or self._process.stdin is None or self._process.stdin.is_closing():
            raise ServerError("the server is not running")
        self._process.stdin.write(encode(message))

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._write(message)

    async def request(self, method: str, params: dict[str, Any] | None = None,
                      timeout: float | None = None) -> dict[str, Any]:
        """Send a request; its result, or `JsonRpcError`.  On timeout the
        request is cancelled (notifications/cancelled) and
        `ToolTimeoutError` raised."""
        request_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        try:
            self._write(message)
            response = await asyncio.wait_for(future, timeout or self.timeout)
        except asyncio.TimeoutError:
            self._cancel(request_id, "timeout")
            raise ToolTimeoutError(f"{method} timed out after {timeout or self.timeout:g} s") from None
        except asyncio.CancelledError:
            self._cancel(request_id, "cancelled by the client")
            raise
        finally:
            self._pending.pop(request_id, None)
        if "error" in response:
            error = response["error"]
            raise JsonRpcError(error.get("code", 0), error.get("message", ""), error.get("data"))
        return response.get("result") or {}

    def _cancel(self, request_id: int, reason: str) -> None:
        """Tell the server to stop a request we no longer wait for."""
        try:
            self.notify("notifications/cancelled", {"requestId": request_id, "reason": reason})
        except ServerError:
            pass

    async def _read_loop(self) -> None:
        assert self._process and self._process.stdout
        splitter = LineSplitter()
        reason = "the server closed its output"
        try:
            while True:
                chunk = await self._process.stdout.read(1 << 16)
                if not chunk:
                    break
                for line in splitter.feed(chunk):
                    if isinstance(line, OversizedLine):
                        continue
                    try:
                        self._dispatch(line)
                    except Exception:  # one odd message must not stop the reader
                        log.exception("could not handle a message from the server: %.200r", line)
        except (ConnectionError, OSError) as error:
            reason = f"reading from the server failed: {error}"
        finally:
            self._fail_pending(ServerError(reason))

    def _fail_pending(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    def _dispatch(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            log.warning("server wrote a line that is not JSON: %.200r", line)
            return
        for item in message if isinstance(message, list) else [message]:
            if not isinstance(item, dict):
                continue
            if "method" in item:
                self._on_server_message(item)
            elif isinstance(item.get("id"), int) and item["id"] in self._pending:
                future = self._pending[item["id"]]
                if not future.done():
                    future.set_result(item)

    def _on_server_message(self, message: dict[str, Any]) -> None:
        method, params = message["method"], message.get("params") or {}
        if "id" in message:  # a request from the server: ping, or nothing we offer
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
            if method == "ping":
                reply["result"] = {}
            else:
                reply["error"] = {"code": -32601, "message": f"Method not found: {method}"}
            self._write(reply)
        elif method == "notifications/tools/list_changed":
            self._tools = None
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.ensure_future(self.list_tools())
            self._refresh.add_done_callback(self._log_callback_failure)
        elif method == "notifications/progress":
            callback = self._progress.get(str(params.get("progressToken")))
            if callback is not None:
                self._call_back(callback, params.get("progress", 0), params.get("total"),
                                params.get("message"))
        elif method == "notifications/message":
            if self._on_log is not None:
                self._call_back(self._on_log, params)
            else:
                log.info("server log [%s] %s", params.get("level"), params.get("data"))

    def _call_back(self, callback: Callable[..., Any], *arguments: Any) -> None:
        """Run a caller's callback (plain or async); its failure is logged,
        never allowed to stop the reader."""
        try:
            outcome = callback(*arguments)
            if asyncio.iscoroutine(outcome):
                task = asyncio.ensure_future(outcome)
                task.add_done_callback(self._log_callback_failure)
        except Exception:
            log.exception("a client callback failed")

    @staticmethod
    def _log_callback_failure(task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("a client callback failed: %s", task.exception())

    # ------------------------------------------------------------ tools

    async def list_tools(self) -> list[dict[str, Any]]:
        """Every tool of the server, following `nextCursor` to the end."""
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            result = await self.request("tools/list", {"cursor": cursor} if cursor else None)
            tools += result.get("tools") or []
            cursor = result.get("nextCursor")
            if not cursor:
                break
        self._tools = tools
        self._validators = {}
        return tools

    async def tools(self) -> list[dict[str, Any]]:
        """The cached tool list (fetched when missing or invalidated)."""
        if self._tools is None:
            await self.list_tools()
        return self._tools or []

    async def available_tools(self) -> bool:
        """True when the server offers at least one tool."""
        return bool(self.server_capabilities.get("tools") is not None and await self.tools())

    async def _validator(self, name: str) -> Draft202012Validator | None:
        if name not in self._validators:
            tool = next((t for t in await self.tools() if t.get("name") == name), None)
            if tool is None:
                return None
            self._validators[name] = Draft202012Validator(tool.get("inputSchema") or {"type": "object"})
        return self._validators[name]

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        raise_on_error: bool = False,
        progress: ProgressCallback | None = None,
    ) -> ToolResult:
        """Call a tool.  Arguments are checked against its inputSchema first
        (an unknown tool is left for the server to refuse)."""
        arguments = arguments or {}
        validator = await self._validator(name)
        if validator is not None:
            error = best_match(validator.iter_errors(arguments))
            if error is not None:
                path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
                self._audit(name, arguments, 0.0, "invalid-arguments")
                raise ToolValidationError(name, error.message, path)
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        token = None
        if progress is not None:
            token = f"progress-{next(self._ids)}"
            params["_meta"] = {"progressToken": token}
            self._progress[token] = progress
        started = time.monotonic()
        outcome = "error"
        try:
            result = await self.request("tools/call", params, timeout)
            tool_result = ToolResult(content=list(result.get("content") or []),
                                     is_error=bool(result.get("isError")),
                                     structured_content=result.get("structuredContent"),
                                     meta=result.get("_meta") or {})
            outcome = "tool-error" if tool_result.is_error else "ok"
        except ToolTimeoutError:
            outcome = "timeout"
            raise
        except JsonRpcError as error:
            outcome = f"protocol-error:{error.code}"
            raise
        finally:
            if token is not None:
                self._progress.pop(token, None)
            self._audit(name, arguments, time.monotonic() - started, outcome)
        if tool_result.is_error and raise_on_error:
            raise ToolExecutionError(name, tool_result)
        return tool_result

    async def outcome(self, result: ToolResult, *, progress: ProgressCallback | None = None) -> ToolResult:
        """The outcome of the evaluation RESULT reports, however long it
        takes: RESULT itself, unless it says the evaluation is still
        running in the background; then await-evaluation's, called until it
        has one.  PROGRESS hears (seconds so far, None, its latest output
        line) after each still-running answer.  Cancelled, it stops the
        evaluation."""
        while isinstance(result.structured_content, dict) and result.structured_content.get("running"):
            running = result.structured_content
            if progress is not None:
                latest = running.get("stdout", "").rstrip("\n").rpartition("\n")[2]
                seconds = running.get("elapsedMs", 0) / 1000
                self._call_back(progress, seconds, None,
                                f"evaluation {running['number']} running for {seconds:.0f} s"
                                + (f"; latest output: {latest[:200]}" if latest else ""))
            try:
                result = await self.call_tool("await-evaluation", {"evaluation": running["number"]})
            except asyncio.CancelledError:
                await asyncio.shield(self.call_tool("await-evaluation",
                                                    {"evaluation": running["number"], "abort": True}))
                raise
        return result

    async def offers_task(self, name: str) -> bool:
        """True when the server runs tool NAME as an MCP task (2025-11-25:
        the tasks capability for tools/call, and the tool's taskSupport)."""
        requests = (self.server_capabilities.get("tasks") or {}).get("requests") or {}
        if "call" not in (requests.get("tools") or {}):
            return False
        tool = next((each for each in await self.tools() if each.get("name") == name), None)
        return (tool or {}).get("execution", {}).get("taskSupport") in ("optional", "required")

    async def call_tool_as_task(self, name: str, arguments: dict[str, Any] | None = None, *,
                                ttl_ms: int | None = None,
                                on_status: Callable[[dict[str, Any]], Any] | None = None) -> ToolResult:
        """Run tool NAME as an MCP task and return its result once it has one:
        `tasks/get` every `pollInterval` (ON_STATUS hears each Task), then
        `tasks/result`.  Cancelled, it cancels the task (`tasks/cancel`).
        The server must offer the tool as a task (`offers_task`)."""
        if not await self.offers_task(name):
            raise ClientError(f"the server does not run {name} as a task")
        params: dict[str, Any] = {"name": name, "arguments": arguments or {},
                                  "task": {} if ttl_ms is None else {"ttl": ttl_ms}}
        task = (await self.request("tools/call", params))["task"]
        task_id = task["taskId"]
        try:
            while task["status"] in ("working", "input_required"):
                if on_status is not None:
                    self._call_back(on_status, task)
                await asyncio.sleep((task.get("pollInterval") or 1000) / 1000)
                task = await self.request("tasks/get", {"taskId": task_id})
            result = await self.request("tasks/result", {"taskId": task_id})
        except asyncio.CancelledError:
            await asyncio.shield(self._cancel_task(task_id))
            raise
        return ToolResult(content=list(result.get("content") or []), is_error=bool(result.get("isError")),
                          structured_content=result.get("structuredContent"), meta=result.get("_meta") or {})

    async def _cancel_task(self, task_id: str) -> None:
        try:
            await self.request("tasks/cancel", {"taskId": task_id})
        except JsonRpcError:
            pass  # it ended meanwhile

    def _audit(self, name: str, arguments: dict[str, Any], seconds: float, outcome: str) -> None:
        audit.info("tool=%s args=%s duration_ms=%.1f outcome=%s",
                   name, argument_digest(arguments), seconds * 1000, outcome)


def audit_to_file(path: str) -> logging.Handler:
    """Send the audit log (one line per tool call) to PATH as well."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    audit.addHandler(handler)
    audit.setLevel(logging.INFO)
    return handler


__all__ = [
    "McpClient", "ToolResult", "ClientError", "ServerError", "JsonRpcError",
    "ToolExecutionError", "ToolTimeoutError", "ToolValidationError", "audit_to_file",
    "argument_digest",
]
