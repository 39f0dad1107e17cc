"""MCP over JSON-RPC: methods in an explicit table, and the one boundary
where exceptions become wire errors.

Every request with an id gets exactly one response (unless the client
cancels it); notifications get none.  Each request starts at once, as its
line arrives, and goes on as a task of its own once it has to wait, so
`ping` and `tools/list` are answered while an evaluation runs; evaluations
queue in the session in arrival order, because parsing, validation and each
request's first step happen in the order lines arrive.  The calls queued
for the session are bounded in number and in bytes, and those that wait
beside it in number (intake.py): past the bounds a call is refused at
once with SERVER_BUSY.  Tool calls that become
MCP tasks are wired in task_calls.py.

Revisions: 2024-11-05 to 2025-11-25 open with `initialize` (the legacy
era); 2026-07-28 requests carry their version and client capabilities in
`params._meta` and are served statelessly (the modern era).  A field
appears only in the revisions that define it.  Arguments that fail a
tool's inputSchema are -32602 before 2025-11-25 and a tool error, which
the model sees, from 2025-11-25 on.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Coroutine

import orjson

from cl_mcp import __version__
from cl_mcp.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    UNSUPPORTED_PROTOCOL_VERSION,
    JsonRpcError,
)
from cl_mcp.lisp.config import SessionConfig
from cl_mcp.results import budget
from cl_mcp.results.render import Rendered, invalid_arguments
from cl_mcp.server.eager import start_eagerly
from cl_mcp.server.intake import CallQueue, QueuedCall, WaitingBeside
from cl_mcp.server.request import META_CAPABILITIES, Request, check_params
from cl_mcp.server.task_calls import TASK_TOOLS, TASKS_VERSION, TaskCalls, Then
from cl_mcp.server.tasks import EXTENSION, EXTENSION_VERSION
from cl_mcp.tools import ToolSpec, build_tools
from cl_mcp.wire import jsonrpc
from cl_mcp.wire.contracts import error_location, first_error, shared_type
from cl_mcp.wire.jsonrpc import OversizedLine, params_meta

if TYPE_CHECKING:  # made after initialize is answered (McpServer.session)
    from cl_mcp.lisp.session import LispSession

log = logging.getLogger("cl_mcp.server")

LEGACY_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_VERSIONS = ("2026-07-28",)
SUPPORTED_VERSIONS = LEGACY_VERSIONS + MODERN_VERSIONS
LATEST_LEGACY = LEGACY_VERSIONS[-1]
BATCH_VERSION = "2025-03-26"
# From this revision on, arguments that fail a tool's inputSchema are a tool
# error (isError), not -32602 (SEP-1303); 2026-07-28 keeps it.
ARGUMENT_ERRORS_VERSION = "2025-11-25"

META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_SERVER_INFO = "io.modelcontextprotocol/serverInfo"

# Its arrival stops every task made before it (task_calls.py).
RESET_TOOL = "reset-session"

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
PROGRESS_INTERVAL = 0.5  # seconds; the issue asks for at least one a second
TOOLS_TTL_MS = 3_600_000  # the tool list never changes while cl-mcp runs

INSTRUCTIONS = (
    "A live, persistent Common Lisp (SBCL) image. Use evaluate-lisp to run code; "
    "definitions persist between calls. An error lists its restarts and the "
    "evaluation waits there: invoke-restart continues it, backtrace and "
    "eval-in-frame inspect it. list-definitions shows what the session defined, "
    "load-system loads ASDF systems, run-tests runs a system's tests or one test, "
    "reset-session starts over. To work on code as SLIME does: find-definition, xref, "
    "describe-symbol, apropos, macroexpand, inspect, compile-file and compile-form (one "
    "top-level form of a file; compiler notes with their file, line and column). To change "
    "Lisp source, use edit-form (one top-level form by its name or line, read before it is "
    "written, then compiled) rather than text edits; read-lisp-file outlines or checks a file "
    "and reads one form. threads "
    "lists the image's threads and acts on one; profile runs code under a profiler. "
    "A long output or value shows its start and its end; the marker between them "
    "gives the read-output call that reads the rest, and (cl-mcp-agent:value N) "
    "is evaluation N's value. Work still running after the answer window (45 s "
    "unless set; evaluate-lisp's answer-within) answers that it is still running and "
    "goes on in the background: await-evaluation fetches its outcome or stops it. "
    "An evaluation is interrupted at its timeout (30 s unless set): give long work, "
    "such as a build or a test suite, a longer timeout."
)

Send = Callable[[Any], None]


def _now() -> float:
    return asyncio.get_running_loop().time()


def _valid_id(message: Any) -> Any:
    """The request's id when it is of a type a response may echo, else None."""
    if isinstance(message, dict):
        request_id = message.get("id")
        if isinstance(request_id, (str, int)) and not isinstance(request_id, bool):
            return request_id
    return None


def _tool_name(params: Any) -> str:
    """The name a tools/call asks for, before validation has looked at it."""
    name = params.get("name") if isinstance(params, dict) else None
    return name if isinstance(name, str) else "?"


class McpServer:
    def __init__(self, config: SessionConfig, make_session: Callable[[], LispSession], send: Send) -> None:
        self.config = config
        self._make_session = make_session
        self._send = send
        self._tasks: set[asyncio.Future[Any]] = set()
        self._inflight: dict[Any, tuple[str, asyncio.Future[Any]]] = {}
        self._cancelled: set[Any] = set()
        self._calls = CallQueue()
        self._beside = WaitingBeside()
        self._task_calls = TaskCalls(lambda: self.session, send, self._calls, self._call_result)
        self.protocol_version = LATEST_LEGACY
        self.initialized = False
        self.client_info: dict[str, Any] = {}
        self.log_level = "warning"
        self._methods: dict[str, Callable[[Request], Awaitable[dict[str, Any]]]] = {
            "initialize": self._initialize,
            "server/discover": self._discover,
            "ping": self._ping,
            "logging/setLevel": self._set_level,
            "tools/list": self._tools_list,
            "tools/call": self._tools_call,
            **self._task_calls.methods(),
        }
        self._notifications: dict[str, Callable[[Any], None]] = {
            "notifications/initialized": lambda params: None,
            "notifications/cancelled": self._cancel,
        }

    @functools.cached_property
    def session(self) -> LispSession:
        """Made on its first use, after initialize is answered: the session's
        modules (the image, the link, the Swank client) take ~25 ms to load,
        which a host starting cl-mcp would wait for."""
        return self._make_session()

    @property
    def has_session(self) -> bool:
        return "session" in self.__dict__

    @functools.cached_property
    def _tools(self) -> dict[str, ToolSpec]:
        """Built on the first tools/list or tools/call, not before
        initialize is answered: the tools' modules and their compiled
        schemas take ~20 ms to load, which a host would wait for."""
        return build_tools(self.config.max_result_chars)

    # ------------------------------------------------------------ input

    def receive(self, line: bytes | OversizedLine) -> None:
        """Take one line of input.  Parsing and validation happen now, in
        arrival order; the work itself runs as a task.  Nothing a line holds
        may stop the server from reading the next one."""
        try:
            self._receive(line)
        except Exception as error:  # a bug; the line gets an error, the server goes on
            log.exception("internal error while reading a message")
            self._send(jsonrpc.error_message(None, INTERNAL_ERROR, "Internal error",
                                             {"detail": str(error)[:500]}))

    def _receive(self, line: bytes | OversizedLine) -> None:
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
            self._receive_batch(message, len(line))
            return
        work = self._accept(message, in_batch=False)
        if isinstance(work, Request):
            work = self._start(work, len(line), self._answer)
        if isinstance(work, dict):
            self._send(work)

    def _receive_batch(self, messages: list[Any], size: int) -> None:
        if self.protocol_version != BATCH_VERSION or not self.initialized:
            self._send(jsonrpc.error_message(
                None, INVALID_REQUEST,
                f"Invalid Request: batches are accepted only under protocol {BATCH_VERSION}"))
            return
        if not messages:
            self._send(jsonrpc.error_message(None, INVALID_REQUEST, "Invalid Request: empty batch"))
            return
        # The line's bytes are shared among its calls: each share is freed
        # when its call ends.
        call_count = sum(1 for m in messages if isinstance(m, dict) and m.get("method") == "tools/call")
        share = size // max(call_count, 1)
        parts: list[Any] = []
        for message in messages:
            work = self._accept(message, in_batch=True)
            if isinstance(work, Request):
                work = self._start(work, share, self._respond)
            if work is not None:
                parts.append(work)
        if parts:
            self._spawn(self._send_batch(parts))

    async def _send_batch(self, parts: list[Any]) -> None:
        responses = []
        for part in parts:
            if isinstance(part, dict):
                responses.append(part)
                continue
            try:
                response = await part
            except asyncio.CancelledError:
                if not part.cancelled():
                    raise
                response = None  # cancelled by the client before it started
            if response is not None:
                responses.append(response)
        if responses:
            self._send(responses)

    def _accept(self, message: Any, in_batch: bool) -> Request | dict[str, Any] | None:
        """Validate one message.  A request to run, an error response to
        send, or None (a notification, handled here)."""
        try:
            violation = first_error(shared_type("JsonRpcRequest"), message)
        except RecursionError:
            return jsonrpc.error_message(_valid_id(message), INVALID_REQUEST,
                                         "Invalid Request: nested too deeply to validate")
        if violation is not None:
            return jsonrpc.error_message(_valid_id(message), INVALID_REQUEST, "Invalid Request",
                                         error_location(violation, "$"))
        method, params = message["method"], message.get("params")
        if "id" not in message:
            handler = self._notifications.get(method)
            if handler is not None:
                handler(params)
            return None
        request_id = message["id"]
        if in_batch and method == "initialize":
            return jsonrpc.error_message(request_id, INVALID_REQUEST,
                                         "Invalid Request: initialize must not be part of a batch")
        try:
            version, modern = self._revision(method, params)
        except JsonRpcError as error:
            return jsonrpc.error_message(request_id, error.code, error.message, error.data)
        return Request(request_id, method, params, version, modern)

    def _revision(self, method: str, params: Any) -> tuple[str, bool]:
        """The revision a request is served under: its own, when it carries
        one in `_meta` (2026-07-28), else the one `initialize` negotiated."""
        meta = params_meta(params)
        requested = meta.get(META_VERSION)
        if requested is None:
            if method == "server/discover":
                return MODERN_VERSIONS[-1], True
            return self.protocol_version, False
        if requested not in MODERN_VERSIONS:
            raise JsonRpcError(UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version",
                               {"supported": list(SUPPORTED_VERSIONS), "requested": requested})
        if not isinstance(meta.get(META_CAPABILITIES), dict):
            raise JsonRpcError(INVALID_PARAMS, f"Missing _meta key {META_CAPABILITIES}",
                               {"path": f"params._meta.{META_CAPABILITIES}"})
        return requested, True

    def _start(self, request: Request, size: int,
               run: Callable[[Request], Coroutine[Any, Any, Any]],
               ) -> asyncio.Future[Any] | dict[str, Any]:
        """Start REQUEST (SIZE bytes) with RUN: its task, or the busy error
        when it is a tools/call past the intake limits or a call that waits
        beside the session past theirs.  Nothing of a refused request is
        kept."""
        name = _tool_name(request.params) if request.method == "tools/call" else None
        spec = self._tools.get(name) if name is not None else None
        if spec is not None and spec.beside or request.method == "tasks/result":
            busy = self._beside.refusal(self.session.beside_in_image if self.has_session else 0)
            if busy is not None:
                return jsonrpc.error_message(request.id, busy.code, busy.message, busy.data)
            request.beside = True
            self._beside.count += 1
        elif name is not None:
            busy = self._calls.refusal(size)
            if busy is not None:
                return jsonrpc.error_message(request.id, busy.code, busy.message, busy.data)
            now = _now()
            # Admitted before its first step, which reaches the session's lock.
            request.queued = QueuedCall(request.id, name, size, now)
            self._calls.add(request.queued, now)
        return self._track(request, self._spawn(run(request)))

    def _track(self, request: Request, task: asyncio.Future[Any]) -> asyncio.Future[Any]:
        """Make the request cancellable from the moment it is accepted, even
        before its task first runs.  One answered already is left alone: a
        done callback would cost a pass through the event loop for nothing."""
        if task.done():
            return task
        self._inflight[request.id] = (request.method, task)
        task.add_done_callback(lambda done: self._forget(request.id, done))
        return task

    def _forget(self, request_id: Any, task: asyncio.Future[Any]) -> None:
        entry = self._inflight.get(request_id)
        if entry is not None and entry[1] is task:
            del self._inflight[request_id]
            self._cancelled.discard(request_id)

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        """Start WORK now: a request that need not wait is answered before
        this returns (see eager.py)."""
        task = start_eagerly(work)
        if not task.done():
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------ one request

    async def _answer(self, request: Request) -> None:
        response = await self._respond(request)
        if response is not None:
            self._send(response)

    async def _respond(self, request: Request) -> dict[str, Any] | None:
        """Run one request; its one response, or None when it was cancelled."""
        call = request.queued
        ticker = None
        if request.progress_token is not None and call is not None:
            ticker = asyncio.ensure_future(self._report_progress(request, call))
        try:
            handler = self._methods.get(request.method)
            if handler is None:
                raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {request.method}")
            result = await handler(request)
            if request.modern:
                # A task's CreateTaskResult has a resultType of its own.
                result = {"resultType": "complete", **result,
                          "_meta": {**result.get("_meta", {}),
                                    META_SERVER_INFO: self._server_info(request.version)}}
            return jsonrpc.result_message(request.id, result)
        except JsonRpcError as error:
            return jsonrpc.error_message(request.id, error.code, error.message, error.data)
        except asyncio.CancelledError:
            if request.id in self._cancelled:
                log.info("request %r cancelled by the client", request.id)
                return None
            return jsonrpc.error_message(request.id, INTERNAL_ERROR, "Server shutting down")
        except Exception as error:  # the one boundary: a bug must not kill the server
            log.exception("internal error in %s", request.method)
            return jsonrpc.error_message(
                request.id, INTERNAL_ERROR, "Internal error", {"detail": str(error)[:500]})
        finally:
            # Progress stops before the response goes out: none may follow it.
            if ticker is not None:
                ticker.cancel()
            if call is not None and not call.in_task:
                self._calls.remove(call, _now())
            if request.beside:
                self._beside.count -= 1

    def _cancel(self, params: Any) -> None:
        """notifications/cancelled: stop the request it names; unknown and
        finished ids are ignored, and so is initialize."""
        if not isinstance(params, dict):
            return
        request_id = params.get("requestId")
        entry = self._inflight.get(request_id) if isinstance(request_id, (str, int)) else None
        if entry is None or entry[0] == "initialize" or entry[1].done():
            return
        task = entry[1]
        self._cancelled.add(request_id)
        task.cancel()

    async def _report_progress(self, request: Request, call: QueuedCall) -> None:
        with_message = request.version >= "2025-03-26"
        for step in range(1, 1 << 62):
            await asyncio.sleep(PROGRESS_INTERVAL)
            params: dict[str, Any] = {"progressToken": request.progress_token, "progress": step}
            if with_message:
                params["message"] = await self._progress_message(call)
            self._send(jsonrpc.notification("notifications/progress", params))

    async def _progress_message(self, call: QueuedCall) -> str:
        """Where CALL stands.  Queued: behind which call, for how long, from
        the server's own bookkeeping (the image would report the running
        call's output, not this one's).  Running: for how long, its latest
        output, and the user's threads that stopped meanwhile."""
        ahead = self._calls.ahead_of(call)
        if ahead:
            now, running = _now(), ahead[0]
            return (f"queued for {now - call.arrived:.1f} s behind request "
                    f"{json.dumps(running.request_id)} ({running.tool}, running for "
                    f"{running.running_for(now):.1f} s); "
                    f"{len(ahead)} call{'s' if len(ahead) > 1 else ''} ahead")
        tail = await self.session.output_tail()  # its reply brings the image's news
        text = f"running for {call.running_for(_now()):.1f} s"
        text += f"; latest output: {tail}" if tail else ""
        return "; ".join([text, *self.session.stopped_meanwhile()])

    async def finish(self, timeout: float | None) -> None:
        """Let the requests under way answer, for up to TIMEOUT seconds (None:
        each within its own deadline), then stop every task and cancel the
        requests left (each still gets its one response)."""
        if self._tasks and timeout != 0:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        await self._task_calls.stop_all()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=1.0)

    # ------------------------------------------------------------ logging

    def log_to_client(self, level: str, logger: str, data: Any) -> None:
        """notifications/message, for legacy sessions that asked (or by
        default from warnings up).  Modern requests carry their own level,
        and without it nothing may be sent."""
        if not self.initialized or self.protocol_version not in LEGACY_VERSIONS:
            return
        if LOG_LEVELS.index(level) < LOG_LEVELS.index(self.log_level):
            return
        self._send(jsonrpc.notification("notifications/message",
                                        {"level": level, "logger": logger, "data": data}))

    # ------------------------------------------------------------ methods

    def _server_info(self, version: str) -> dict[str, Any]:
        info: dict[str, Any] = {"name": "cl-mcp", "version": __version__}
        if version >= "2025-06-18":
            info["title"] = "Common Lisp REPL (SBCL via Swank)"
        return info

    def _capabilities(self, version: str) -> dict[str, Any]:
        """What cl-mcp offers under VERSION: tasks differ by revision."""
        capabilities: dict[str, Any] = {"tools": {"listChanged": False}, "logging": {}}
        if version == TASKS_VERSION:
            capabilities["tasks"] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
        elif version >= EXTENSION_VERSION:
            capabilities["extensions"] = {EXTENSION: {}}
        return capabilities

    async def _initialize(self, request: Request) -> dict[str, Any]:
        params = check_params("initialize-params", request.params)
        requested = params["protocolVersion"]
        self.protocol_version = requested if requested in LEGACY_VERSIONS else LATEST_LEGACY
        self.client_info = params.get("clientInfo") or {}
        self.initialized = True
        log.info("initialized: protocol %s, client %s", self.protocol_version,
                 self.client_info.get("name", "unknown"))
        return {
            "protocolVersion": self.protocol_version,
            "capabilities": self._capabilities(self.protocol_version),
            "serverInfo": self._server_info(self.protocol_version),
            "instructions": INSTRUCTIONS,
        }

    async def _discover(self, request: Request) -> dict[str, Any]:
        return {
            "supportedVersions": list(SUPPORTED_VERSIONS),
            "capabilities": self._capabilities(request.version),
            "instructions": INSTRUCTIONS,
            "ttlMs": TOOLS_TTL_MS,
            "cacheScope": "public",
        }

    async def _ping(self, request: Request) -> dict[str, Any]:
        return {}

    async def _set_level(self, request: Request) -> dict[str, Any]:
        params = check_params("set-level-params", request.params)
        if params["level"] not in LOG_LEVELS:
            raise JsonRpcError(INVALID_PARAMS, f"Invalid log level: {params['level']}",
                               {"path": "params.level", "allowed": list(LOG_LEVELS)})
        self.log_level = params["level"]
        return {}

    async def _tools_list(self, request: Request) -> dict[str, Any]:
        params = check_params("tools-list-params", request.params)
        if "cursor" in params:
            # One page holds every tool, so no cursor was ever handed out.
            raise JsonRpcError(INVALID_PARAMS, "Invalid cursor", {"cursor": params["cursor"]})
        result: dict[str, Any] = {"tools": self._tool_list(request.version)}
        if request.modern:
            result.update(ttlMs=TOOLS_TTL_MS, cacheScope="public")
        return result

    @functools.lru_cache(maxsize=8)
    def _tool_list(self, version: str) -> orjson.Fragment:
        """The tool definitions with the fields VERSION defines, built and
        encoded once per revision: the list never changes, and encoding its
        ~12 KB took a third of a tools/list call."""
        tools = []
        for spec in self._tools.values():
            tool = dict(spec.definition)
            if version < "2025-03-26":
                tool.pop("annotations", None)
            if version < "2025-06-18":
                tool.pop("outputSchema", None)
            if version == TASKS_VERSION and spec.name in TASK_TOOLS:
                tool["execution"] = {"taskSupport": "optional"}
            tools.append(tool)
        return jsonrpc.preencoded(tools)

    async def _tools_call(self, request: Request) -> dict[str, Any]:
        params = request.params
        if isinstance(params, dict) and "arguments" not in params:
            # MCP makes arguments optional; a tool without any is called so.
            params = {**params, "arguments": {}}
        params = check_params("tools-call-params", params)
        spec = self._tools.get(params["name"])
        if spec is None:
            raise JsonRpcError(INVALID_PARAMS, f"Unknown tool: {params['name']}")
        arguments = params["arguments"]
        if request.version == TASKS_VERSION and "task" in params:
            return self._task_calls.requested(request, spec, arguments, params["task"].get("ttl"))
        if request.modern and spec.name in TASK_TOOLS and self._task_calls.takes_tasks(request):
            return await self._task_calls.call_or_task(request, spec, arguments)
        return await self._call_result(request, spec, arguments)

    async def _call_result(self, request: Request, spec: ToolSpec, arguments: dict[str, Any],
                           then: Then | None = None) -> dict[str, Any]:
        """The CallToolResult of SPEC called with ARGUMENTS; THEN, when
        given, makes the final result of the rendered one (a task follows
        an evaluation that went on in the background to its outcome)."""
        if request.version >= ARGUMENT_ERRORS_VERSION:
            invalid = self._argument_problems(spec, arguments)
            if invalid is not None:
                return self._tool_result(request, invalid, invalid.text)
        else:
            self._check_arguments(spec, arguments)
        if spec.name == RESET_TOOL:
            self._task_calls.stop_for_reset()
        rendered = await spec.handler(self.session, arguments)
        if then is not None:
            rendered = await then(rendered)
        text = rendered.text
        # The notice goes with a call that ran in the image, never with one
        # refused before it got there.
        notices = self.session.take_notices()
        if notices:
            text = budget.fit_text("\n\n".join([text, *(f"[{title}]\n{notice}" for title, notice in notices)]),
                                   self.config.max_result_chars)
        return self._tool_result(request, rendered, text)

    @staticmethod
    def _argument_problems(spec: ToolSpec, arguments: dict[str, Any]) -> Rendered | None:
        """From 2025-11-25 on: arguments that fail the inputSchema make a
        tool error listing every problem, which hosts show the model (a
        JSON-RPC error they do not), so it can correct the call (SEP-1303)."""
        try:
            problems = spec.validator.problems(arguments)
        except RecursionError:
            problems = ["at /: nested too deeply to check"]
        return invalid_arguments(spec.name, problems) if problems else None

    @staticmethod
    def _check_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> None:
        """Before 2025-11-25: arguments that fail the inputSchema are a
        protocol error, -32602, as those revisions say."""
        try:
            violation = first_error(spec.validator, arguments)
        except RecursionError:
            raise JsonRpcError(INVALID_PARAMS, "Invalid arguments: nested too deeply to validate") from None
        if violation is not None:
            raise JsonRpcError(
                INVALID_PARAMS, f"Invalid arguments for tool {spec.name}: {violation.message[:200]}",
                error_location(violation, "params.arguments"))

    @staticmethod
    def _tool_result(request: Request, rendered: Rendered, text: str) -> dict[str, Any]:
        """A CallToolResult: TEXT, and the structured content when the
        revision defines it and the tool has some."""
        result: dict[str, Any] = {"content": [{"type": "text", "text": text}],
                                  "isError": rendered.is_error}
        if request.version >= "2025-06-18" and rendered.structured is not None:
            result["structuredContent"] = rendered.structured
        return result
