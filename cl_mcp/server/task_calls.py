"""Tool calls as MCP tasks: making them, running them in arrival order, and
the tasks/* methods (docs/tools.md, "Tasks").

2025-11-25 makes a task when the call asks (`task` in its params) and
answers the CreateTaskResult at once; 2026-07-28 makes one when a call
whose client takes the io.modelcontextprotocol/tasks extension is still
running past its answer window.  Either way the task's job starts in the
call's first step, as its line is read, so it takes its place at the
session's FIFO lock in arrival order, like every other call, and counts
against the intake limits until it is done with the session (intake.py).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from cl_mcp.errors import INVALID_PARAMS, METHOD_NOT_FOUND, JsonRpcError
from cl_mcp.results.render import Rendered
from cl_mcp.server.eager import start_eagerly
from cl_mcp.server.intake import CallQueue
from cl_mcp.server.request import META_CAPABILITIES, Request, check_params
from cl_mcp.server.tasks import EXTENSION, RELATED_TASK, Task, TaskRegistry
from cl_mcp.wire import jsonrpc

if TYPE_CHECKING:  # the session and the tools load after initialize is answered
    from cl_mcp.lisp.session import LispSession
    from cl_mcp.tools import ToolSpec

# Tasks: 2025-11-25's experimental ones, asked for with `task` in a call's
# params; from 2026-07-28 on the io.modelcontextprotocol/tasks extension.
TASKS_VERSION = "2025-11-25"
TASK_TOOLS = frozenset({"evaluate-lisp", "load-system", "compile-file", "run-tests"})
# A 2025-11-25 task's work goes to the background after this long, so that
# the session's other calls need not wait for it (unless the call gives its
# own answer-within).
TASK_ANSWER_WITHIN = 1.0
# How long past its answer window a 2026-07-28 call waits for its outcome
# before it answers with a task: the image's window closes first.
TASK_GRACE = 1.0
# How long leaving cl-mcp waits for the stopped tasks to abort their work;
# stopping the image (or leaving it, aborting what runs there) follows.
STOP_WAIT = 1.0

Send = Callable[[Any], None]
# Then: what becomes of the rendered result of a call that has run (a task
# follows its evaluation to the outcome).
Then = Callable[[Rendered], Awaitable[Rendered]]
# The server's tool call: validation, the handler, THEN, the CallToolResult.
CallResult = Callable[[Request, "ToolSpec", dict[str, Any], Then | None], Awaitable[dict[str, Any]]]


class TaskCalls:
    """The session's tasks, wired to the server's tool calls: SEND writes a
    message, CALLS is the intake queue, CALL_RESULT runs one call."""

    def __init__(self, session: Callable[[], LispSession], send: Send, calls: CallQueue,
                 call_result: CallResult) -> None:
        self._session = session  # made on its first use
        self._send = send
        self._calls = calls
        self._call_result = call_result
        self._registry = TaskRegistry(start_eagerly, self._changed)

    def methods(self) -> dict[str, Callable[[Request], Awaitable[dict[str, Any]]]]:
        return {"tasks/get": self._get, "tasks/result": self._result, "tasks/list": self._list,
                "tasks/cancel": self._cancel, "tasks/update": self._update}

    # ------------------------------------------------------------ making tasks

    @staticmethod
    def takes_tasks(request: Request) -> bool:
        """A 2026-07-28 request whose client declared the tasks extension."""
        capabilities = request.meta.get(META_CAPABILITIES) or {}
        extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
        return isinstance(extensions, dict) and EXTENSION in extensions

    def requested(self, request: Request, spec: ToolSpec, arguments: dict[str, Any],
                  ttl_ms: int | None) -> dict[str, Any]:
        """2025-11-25, a call with `task`: the CreateTaskResult.  The job
        starts before it returns; the result shows the task as it was made,
        `working`, even when the job has already ended."""
        if spec.name not in TASK_TOOLS:  # its taskSupport is "forbidden"
            raise JsonRpcError(METHOD_NOT_FOUND, f"Tool {spec.name} cannot run as a task")
        task = self._registry.create(spec.name, request.version, ttl_ms)
        created = {"task": task.shape()}
        self._start(task, request, spec, {"answer-within": TASK_ANSWER_WITHIN, **arguments})
        return created

    async def call_or_task(self, request: Request, spec: ToolSpec,
                           arguments: dict[str, Any]) -> dict[str, Any]:
        """2026-07-28, the client taking tasks: the call's result when it
        comes within its answer window (its answer-within, else
        --answer-within), else a task that carries the work on (the server
        decides, as the extension has it).  A task cancelled meanwhile (a
        reset, cl-mcp ending) answers its cancelled result."""
        task = self._registry.create(spec.name, request.version, None)
        runner = self._start(task, request, spec, arguments)
        if not runner.done():
            # The window as the call asks it, whatever the work's deadline:
            # a call still queued past it becomes a task too.
            from cl_mcp.tools.window import answer_window
            window = answer_window(arguments.get("answer-within"), self._session().config.answer_within, None)
            try:
                await asyncio.wait({runner}, timeout=(window or 0) + TASK_GRACE)
            except asyncio.CancelledError:
                self._registry.cancel(task)
                self._registry.forget(task)
                raise
        if not task.terminal:
            return {**task.shape(), "resultType": "task"}
        self._registry.forget(task)
        if task.error is not None:
            raise JsonRpcError(task.error["code"], task.error["message"], task.error.get("data"))
        return task.call_result()

    def _start(self, task: Task, request: Request, spec: ToolSpec,
               arguments: dict[str, Any]) -> asyncio.Future[Any]:
        """Run TASK's job now, in the caller: its first step takes the
        session's lock (or its place in line) before the next line is read.
        The call's place in the intake queue passes to the job."""
        if request.queued is not None:
            request.queued.in_task = True
        return self._registry.run(task, lambda task: self._job(request, spec, arguments, task))

    async def _job(self, request: Request, spec: ToolSpec, arguments: dict[str, Any],
                   task: Task) -> dict[str, Any]:
        call = request.queued

        def leave_the_queue() -> None:
            if call is not None:
                self._calls.remove(call, asyncio.get_running_loop().time())

        async def follow(rendered: Rendered) -> Rendered:
            # Done with the session: an evaluation still running goes on in
            # the background (counted by --max-background), followed beside
            # the session's calls.
            leave_the_queue()
            from cl_mcp.tools.background import follow_to_outcome
            return await follow_to_outcome(self._session(), rendered,
                                           lambda message: self._registry.note(task, message))

        try:
            result = await self._call_result(request, spec, arguments, follow)
        finally:
            leave_the_queue()
        if request.version == TASKS_VERSION:
            result["_meta"] = {RELATED_TASK: {"taskId": task.task_id}}
        return result

    def _changed(self, task: Task) -> None:
        """notifications/tasks/status, for a 2025-11-25 task (2026-07-28's
        notifications/tasks need subscriptions/listen, which cl-mcp lacks).
        Sent one pass later: a job that ends in its first step has ended
        before its CreateTaskResult is written, and the status follows it."""
        if task.revision == TASKS_VERSION:
            asyncio.get_running_loop().call_soon(
                self._send, jsonrpc.notification("notifications/tasks/status", task.shape()))

    # ------------------------------------------------------------ stopping tasks

    def stop_for_reset(self) -> None:
        """reset-session has arrived: every task made before it belongs to
        the session it ends, and is cancelled now (a task still queued
        never runs, one in the background is aborted)."""
        self._registry.stop_all("The task was cancelled: the session was reset.")

    async def stop_all(self) -> None:
        """cl-mcp is ending: cancel every working task, and give each a
        moment to abort its work in the image."""
        runners = self._registry.stop_all("The task was cancelled: cl-mcp is shutting down.")
        if runners:
            await asyncio.wait(runners, timeout=STOP_WAIT)

    # ------------------------------------------------------------ tasks/*

    def _task_of(self, request: Request) -> Task:
        """The task REQUEST names; tasks exist from 2025-11-25 on."""
        if request.version < TASKS_VERSION:
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {request.method}")
        return self._registry.get(check_params("task-params", request.params)["taskId"])

    async def _get(self, request: Request) -> dict[str, Any]:
        task = self._task_of(request)
        return task.detailed() if request.modern else task.shape()

    async def _result(self, request: Request) -> dict[str, Any]:
        """2025-11-25: what the call would have answered, once it has."""
        if request.modern:
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {request.method}")
        task = self._task_of(request)
        await task.finished.wait()
        if task.error is not None:
            raise JsonRpcError(task.error["code"], task.error["message"], task.error.get("data"))
        return {**task.call_result(), "_meta": {RELATED_TASK: {"taskId": task.task_id}}}

    async def _list(self, request: Request) -> dict[str, Any]:
        if request.version != TASKS_VERSION:
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {request.method}")
        params = check_params("tools-list-params", request.params)
        tasks, cursor = self._registry.page(params.get("cursor"))
        return {"tasks": [task.shape() for task in tasks], **({"nextCursor": cursor} if cursor else {})}

    async def _cancel(self, request: Request) -> dict[str, Any]:
        task = self._task_of(request)
        if request.modern:  # an acknowledgement; cancelling is cooperative
            self._registry.cancel(task)
            return {}
        if task.terminal:
            raise JsonRpcError(INVALID_PARAMS, f"Task {task.task_id} has already ended ({task.status})",
                               {"taskId": task.task_id, "status": task.status})
        self._registry.cancel(task)
        return task.shape()

    async def _update(self, request: Request) -> dict[str, Any]:
        """2026-07-28: cl-mcp's tasks never ask for input; acknowledged."""
        if not request.modern:
            raise JsonRpcError(METHOD_NOT_FOUND, f"Method not found: {request.method}")
        self._task_of(request)
        return {}
