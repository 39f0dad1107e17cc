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
import collections.abc
from typing import Any, Coroutine, TypeVar

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
    return loop.create_task(_Resumed(coro, awaited))  # type: ignore[arg-type]


class _Resumed:
    """CORO, already started, for a task to drive as if it had started it.

    The task's first step gets what CORO waits on; every later value or
    exception goes to CORO itself.  That includes a cancellation that comes
    before the task's first step (a `notifications/cancelled` in the same
    read as its request): it is thrown into CORO where CORO waits, so CORO's
    handlers run (an evaluation is aborted in the image, a lock is released).
    A wrapper coroutine would take such a cancellation at its own start,
    before it ever reached CORO, and leave CORO suspended for good."""

    __slots__ = ("_coro", "_awaited", "_started")

    def __init__(self, coro: Coroutine[Any, Any, Any], awaited: Any) -> None:
        self._coro = coro
        self._awaited = awaited
        self._started = False

    def send(self, value: Any) -> Any:
        if not self._started:
            self._started = True
            return self._awaited
        return self._coro.send(value)

    def throw(self, error: BaseException, *rest: Any) -> Any:
        self._started = True
        return self._coro.throw(error, *rest)

    def close(self) -> None:
        self._coro.close()


# asyncio drives any registered Coroutine through send, throw and close.
collections.abc.Coroutine.register(_Resumed)
