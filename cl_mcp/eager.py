"""Start a coroutine now, in the caller, rather than one event-loop
iteration later.

`asyncio.ensure_future` only schedules a coroutine's first step.  For a
request that never has to wait (`ping`, `tools/list`, a cached answer) or
whose wait is already over when it looks (an evaluation the image answered
within the Swank connection's answer window), that costs a pass through the
event loop per request for nothing.  Python 3.12's `eager_task_factory`
does this for every task; cl-mcp supports 3.11, so it does it here for the
requests it serves.

The first step runs outside any task: `asyncio.current_task()` is None
there, so code that needs its task (`asyncio.timeout`) must not run before
the coroutine's first real wait.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, Generator, TypeVar

T = TypeVar("T")


def start_eagerly(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """Run CORO until it first waits.  A future with its outcome when it did
    not have to; else a task that carries on from where it stopped."""
    loop = asyncio.get_running_loop()
    try:
        awaited = coro.send(None)
    except StopIteration as stop:
        done: asyncio.Future[T] = loop.create_future()
        done.set_result(stop.value)
        return done
    except Exception as error:
        failed: asyncio.Future[T] = loop.create_future()
        failed.set_exception(error)
        return failed
    return loop.create_task(_carry_on(coro, awaited))


async def _carry_on(coro: Coroutine[Any, Any, T], awaited: Any) -> T:
    return await _Resumed(coro, awaited)


class _Resumed:
    """Hands what CORO waits on to the task driving it, and the outcome (a
    value, or an exception such as a cancellation) back to CORO: the task
    then drives CORO as if it had started it."""

    __slots__ = ("_coro", "_awaited")

    def __init__(self, coro: Coroutine[Any, Any, Any], awaited: Any) -> None:
        self._coro = coro
        self._awaited = awaited

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, awaited = self._coro, self._awaited
        while True:
            try:
                try:
                    value = yield awaited
                except BaseException as error:
                    awaited = coro.throw(error)
                else:
                    awaited = coro.send(value)
            except StopIteration as stop:
                return stop.value
