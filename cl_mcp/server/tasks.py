"""MCP tasks: a tools/call whose result is fetched later, by polling.

A task is a tool call running as an asyncio task of its own, under a
server-made id.  For evaluate-lisp it follows an evaluation that runs in
the background in the image (cl_mcp/tools/background.py), so a task and a
background evaluation are one thing, stopped the one way: aborting the
evaluation.  Two revisions shape it differently on the wire (docs/tools.md,
"Tasks"): 2025-11-25's experimental tasks (`task` in the call's params,
`tasks/get`, `tasks/result`, `tasks/list`, `tasks/cancel`, ttl and
pollInterval) and 2026-07-28's `io.modelcontextprotocol/tasks` extension
(the server decides, `resultType: "task"`, the outcome inline in
`tasks/get`, ttlMs and pollIntervalMs).  This module keeps the state and
says how it looks in each; cl_mcp/server/task_calls.py makes tasks of tool calls
and answers the methods.

A task's ttl counts from its creation, but only an ended task is forgotten
for it: one still working stays visible and cancellable until it ends.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Coroutine

from cl_mcp.errors import INTERNAL_ERROR, INVALID_PARAMS, JsonRpcError

log = logging.getLogger("cl_mcp.tasks")

EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK = "io.modelcontextprotocol/related-task"
EXTENSION_VERSION = "2026-07-28"  # the revision that has tasks as an extension

POLL_INTERVAL_MS = 1_000
DEFAULT_TTL_MS = 3_600_000  # an hour, from creation
MAX_TTL_MS = 86_400_000
MAX_FINISHED = 100  # finished tasks kept for their results, the oldest dropped first
PAGE_SIZE = 50  # tasks/list

TERMINAL = ("completed", "failed", "cancelled")


def _timestamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


@dataclass(eq=False)
class Task:
    task_id: str
    tool: str
    revision: str  # the protocol revision it was created under
    ttl_ms: int
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    status: str = "working"
    message: str | None = None
    result: dict[str, Any] | None = None  # the CallToolResult, once done
    error: dict[str, Any] | None = None  # a JSON-RPC error object, when it failed
    runner: asyncio.Future[Any] | None = None
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def expired(self, now: float) -> bool:
        """An ended task whose ttl has run out; a working one never expires."""
        return self.terminal and now > self.created + self.ttl_ms / 1000

    def shape(self) -> dict[str, Any]:
        """The Task object as the task's revision names its fields."""
        modern = self.revision >= EXTENSION_VERSION
        task: dict[str, Any] = {"taskId": self.task_id, "status": self.status}
        if self.message:
            task["statusMessage"] = self.message
        task["createdAt"] = _timestamp(self.created)
        task["lastUpdatedAt"] = _timestamp(self.updated)
        task["ttlMs" if modern else "ttl"] = self.ttl_ms
        task["pollIntervalMs" if modern else "pollInterval"] = POLL_INTERVAL_MS
        return task

    def call_result(self) -> dict[str, Any]:
        """The CallToolResult the task's call answers: its own, or, for a
        task cancelled before it had one, a tool error saying so."""
        if self.result is not None:
            return self.result
        return {"content": [{"type": "text", "text": "[ERROR] CL-MCP:CANCELLED\n"
                             + (self.message or "The task was cancelled.")}], "isError": True}

    def detailed(self) -> dict[str, Any]:
        """2026-07-28's tasks/get: the Task with its outcome inline."""
        task = self.shape()
        if self.status == "completed" and self.result is not None:
            task["result"] = self.result
        elif self.status == "failed" and self.error is not None:
            task["error"] = self.error
        return task


# The coroutine that carries a task's tool call out: its CallToolResult.
TaskJob = Callable[["Task"], Coroutine[Any, Any, dict[str, Any]]]


class TaskRegistry:
    """The session's tasks, by id.  NOTIFY hears each task whose status
    changed (notifications/tasks/status)."""

    def __init__(self, spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Future[Any]],
                 notify: Callable[[Task], None]) -> None:
        self._spawn = spawn
        self._notify = notify
        self._tasks: dict[str, Task] = {}  # in creation order
        self._ids = itertools.count(1)

    def create(self, tool: str, revision: str, ttl_ms: int | None) -> Task:
        """A new task, `working`; `run` starts its job."""
        self._prune()
        task = Task(f"{next(self._ids)}-{os.urandom(8).hex()}", tool, revision,
                    min(ttl_ms, MAX_TTL_MS) if ttl_ms is not None else DEFAULT_TTL_MS)
        self._tasks[task.task_id] = task
        return task

    def run(self, task: Task, job: TaskJob) -> asyncio.Future[Any]:
        """Start JOB, which returns TASK's CallToolResult; its runner."""
        task.runner = self._spawn(self._run(task, job))
        return task.runner

    async def _run(self, task: Task, job: TaskJob) -> None:
        """Carry JOB out and settle TASK with its outcome, whatever it is."""
        try:
            result = await job(task)
        except asyncio.CancelledError:
            self.settle(task, "cancelled", "The task was cancelled.")
            raise
        except JsonRpcError as error:
            self._fail(task, error)
        except Exception as error:  # a bug: the task fails with it rather than work forever
            log.exception("internal error in task %s (%s)", task.task_id, task.tool)
            self._fail(task, JsonRpcError(INTERNAL_ERROR, "Internal error", {"detail": str(error)[:500]}))
        else:
            task.result = result
            # 2025-11-25 counts a tool error as a failed task, 2026-07-28 as completed.
            failed = bool(result.get("isError")) and task.revision < EXTENSION_VERSION
            self.settle(task, "failed" if failed else "completed", None)
        finally:
            # Whatever else ends the job (GeneratorExit, SystemExit) ends the task too.
            self.settle(task, "failed", "The task ended without an outcome.")

    def _fail(self, task: Task, error: JsonRpcError) -> None:
        task.error = {"code": error.code, "message": error.message,
                      **({"data": error.data} if error.data is not None else {})}
        self.settle(task, "failed", error.message)

    def note(self, task: Task, message: str) -> None:
        """A working TASK's status message (how far it is)."""
        if not task.terminal and message != task.message:
            task.message = message
            task.updated = time.time()

    def settle(self, task: Task, status: str, message: str | None) -> None:
        """TASK ends with STATUS; a task that has ended stays as it ended."""
        if task.terminal:
            return
        task.status, task.updated, task.message = status, time.time(), message
        task.finished.set()
        self._notify(task)

    def forget(self, task: Task) -> None:
        """TASK was answered as an ordinary call after all: no task exists."""
        self._tasks.pop(task.task_id, None)

    def get(self, task_id: Any) -> Task:
        task = self._tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None or task.expired(time.time()):
            raise JsonRpcError(INVALID_PARAMS, f"Unknown task: {task_id}", {"taskId": task_id})
        return task

    def page(self, cursor: str | None) -> tuple[list[Task], str | None]:
        """A page of the live tasks, oldest first, and the next page's cursor."""
        self._prune()
        tasks = list(self._tasks.values())
        start = 0
        if cursor is not None:
            try:
                start = int(cursor)
            except ValueError:
                raise JsonRpcError(INVALID_PARAMS, "Invalid cursor", {"cursor": cursor}) from None
        end = start + PAGE_SIZE
        return tasks[start:end], (str(end) if end < len(tasks) else None)

    def cancel(self, task: Task, message: str = "The task was cancelled by request.") -> None:
        """Stop TASK's work; it is cancelled from now on, saying MESSAGE."""
        self.settle(task, "cancelled", message)
        if task.runner is not None and not task.runner.done():
            task.runner.cancel()

    def stop_all(self, message: str) -> list[asyncio.Future[Any]]:
        """The session is being reset or is ending: cancel every working
        task, saying MESSAGE; their runners, still unwinding."""
        stopped = [task for task in self._tasks.values() if not task.terminal]
        for task in stopped:
            self.cancel(task, message)
        return [task.runner for task in stopped if task.runner is not None and not task.runner.done()]

    def _prune(self) -> None:
        now = time.time()
        for task_id, task in list(self._tasks.items()):
            if task.expired(now):
                del self._tasks[task_id]
        finished = [task_id for task_id, task in self._tasks.items() if task.terminal]
        for task_id in finished[:max(0, len(finished) - MAX_FINISHED)]:
            del self._tasks[task_id]
