"""TaskRegistry alone: a task's outcome whatever its job does, how long a
task stays known, and stopping tasks (cl_mcp/server/tasks.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cl_mcp.errors import INTERNAL_ERROR, INVALID_PARAMS, JsonRpcError
from cl_mcp.server.eager import start_eagerly
from cl_mcp.server.tasks import Task, TaskRegistry

REVISION = "2025-11-25"


def registry(changed: list[tuple[str, str]] | None = None) -> TaskRegistry:
    notes = changed if changed is not None else []
    return TaskRegistry(start_eagerly, lambda task: notes.append((task.task_id, task.status)))


def test_a_job_that_raises_fails_its_task_with_the_error():
    async def body() -> None:
        tasks = registry()

        async def broken(task: Task) -> dict[str, Any]:
            await asyncio.sleep(0)
            raise RuntimeError("a bug in the job")

        task = tasks.create("evaluate-lisp", REVISION, None)
        await tasks.run(task, broken)
        assert task.status == "failed" and task.finished.is_set()
        assert task.error == {"code": INTERNAL_ERROR, "message": "Internal error",
                              "data": {"detail": "a bug in the job"}}
    asyncio.run(body())


def test_a_job_closed_before_its_end_leaves_no_task_working():
    async def body() -> None:
        tasks = registry()
        gate = asyncio.Event()

        async def waits(task: Task) -> dict[str, Any]:
            await gate.wait()
            return {"content": [], "isError": False}

        task = tasks.create("evaluate-lisp", REVISION, None)
        job = tasks._run(task, waits)
        job.send(None)  # suspended at the gate
        job.close()  # GeneratorExit, as when a loop is torn down
        assert task.status == "failed" and task.finished.is_set()
    asyncio.run(body())


def test_a_working_task_outlives_its_ttl_and_an_ended_one_does_not():
    async def body() -> None:
        tasks = registry()
        gate = asyncio.Event()

        async def waits(task: Task) -> dict[str, Any]:
            await gate.wait()
            return {"content": [], "isError": False}

        task = tasks.create("evaluate-lisp", REVISION, 0)
        runner = tasks.run(task, waits)
        await asyncio.sleep(0.01)
        assert tasks.get(task.task_id) is task  # ttl 0, still working: still known
        assert [t.task_id for t in tasks.page(None)[0]] == [task.task_id]
        tasks.cancel(task)
        await asyncio.wait({runner})
        assert task.status == "cancelled"
        with pytest.raises(JsonRpcError) as unknown:
            tasks.get(task.task_id)
        assert unknown.value.code == INVALID_PARAMS
    asyncio.run(body())


def test_stop_all_cancels_every_working_task_and_returns_their_runners():
    async def body() -> None:
        changed: list[tuple[str, str]] = []
        tasks = registry(changed)

        async def waits(task: Task) -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        async def quick(task: Task) -> dict[str, Any]:
            return {"content": [], "isError": False}

        done = tasks.create("evaluate-lisp", REVISION, None)
        tasks.run(done, quick)
        working = tasks.create("evaluate-lisp", REVISION, None)
        tasks.run(working, waits)
        runners = tasks.stop_all("stopped for a test")
        assert runners == [working.runner]
        await asyncio.wait(runners)
        assert (working.status, working.message) == ("cancelled", "stopped for a test")
        assert done.status == "completed"
        assert changed == [(done.task_id, "completed"), (working.task_id, "cancelled")]
    asyncio.run(body())
