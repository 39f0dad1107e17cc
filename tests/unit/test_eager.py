"""start_eagerly: a coroutine's first step runs in the caller; what follows
runs in a task exactly as if the task had started it."""

import asyncio

import pytest

from cl_mcp.server.eager import start_eagerly


def run(body):
    return asyncio.run(body())


def test_a_coroutine_that_never_waits_is_done_at_once():
    steps = []

    async def quick():
        steps.append("ran")
        return 42

    async def body():
        future = start_eagerly(quick())
        assert steps == ["ran"] and future.done()
        assert await future == 42
    run(body)


def test_an_error_before_the_first_wait_is_the_futures():
    async def failing():
        raise ValueError("no")

    async def body():
        future = start_eagerly(failing())
        assert future.done()
        with pytest.raises(ValueError):
            await future
    run(body)


def test_a_coroutine_that_waits_carries_on_in_a_task_with_each_value_and_error():
    async def body():
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        seen = []

        async def waiter():
            seen.append("started")
            seen.append(await first)
            try:
                await second
            except KeyError as error:
                seen.append(f"caught {error}")
            await asyncio.sleep(0)
            assert asyncio.current_task() is not None
            return "finished"

        future = start_eagerly(waiter())
        assert seen == ["started"] and not future.done()
        first.set_result("one")
        await asyncio.sleep(0)
        second.set_exception(KeyError("two"))
        assert await future == "finished"
        assert seen == ["started", "one", "caught 'two'"]
    run(body)


def test_cancelling_the_task_reaches_the_coroutine():
    async def body():
        loop = asyncio.get_running_loop()
        never = loop.create_future()
        cleaned = []

        async def waiter():
            try:
                await never
            finally:
                cleaned.append(True)

        future = start_eagerly(waiter())
        await asyncio.sleep(0)
        future.cancel()
        with pytest.raises(asyncio.CancelledError):
            await future
        assert cleaned == [True] and never.cancelled()
    run(body)


def test_a_cancellation_before_the_tasks_first_step_reaches_the_coroutine():
    """The request and its notifications/cancelled arrive in one read: the
    task is cancelled before it ever ran.  The coroutine must still hear it
    where it waits, and release what it holds."""
    async def body():
        loop = asyncio.get_running_loop()
        lock = asyncio.Lock()
        answer = loop.create_future()
        seen = []

        async def call():
            async with lock:
                try:
                    await answer
                except asyncio.CancelledError:
                    seen.append("aborted in the image")
                    raise

        future = start_eagerly(call())
        assert lock.locked() and not future.done()
        future.cancel()  # before the task's first step
        with pytest.raises(asyncio.CancelledError):
            await future
        assert seen == ["aborted in the image"]
        assert not lock.locked()
    run(body)


def test_a_coroutine_may_wait_again_while_it_handles_an_early_cancellation():
    async def body():
        loop = asyncio.get_running_loop()
        answer, cleanup = loop.create_future(), loop.create_future()

        async def call():
            try:
                await answer
            except asyncio.CancelledError:
                await cleanup  # e.g. asking the image to abort
                return "cleaned up"

        future = start_eagerly(call())
        future.cancel()
        await asyncio.sleep(0)
        assert not future.done()
        cleanup.set_result(None)
        assert await future == "cleaned up"
    run(body)
