"""Intake accounting: the tools/calls that wait for the session or hold it,
and the limits on them.

A queued call keeps its whole request in memory until it has run, so a
client that sends calls faster than the image runs them would grow cl-mcp
without limit: 400 calls of 200 KB behind one evaluation took it to 104 MiB.
The bytes bound the large requests; the count bounds the small ones (each
holds a task, its coroutine frames and a lock waiter: about 5 KiB) and
leaves room for a burst of quick calls sent in one go
(tests/integration/test_load.py sends 750).  Past either bound a call is
refused at once; a call is always admitted when none is queued, whatever
its size up to jsonrpc.MAX_LINE_BYTES.  Task calls count the same way,
until their work leaves the session (cl_mcp/server/task_calls.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cl_mcp.errors import SERVER_BUSY, JsonRpcError

MAX_QUEUED_CALLS = 1024
MAX_QUEUED_BYTES = 32 * 2**20
# Calls that wait beside the session's turn: each holds a task until it
# answers, and an await-evaluation or read-output a thread in the image.
MAX_WAITING_BESIDE = 32


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


@dataclass(eq=False, slots=True)
class QueuedCall:
    """A tools/call from its admission until it is done with the session:
    waiting for it, then holding it."""

    request_id: Any
    tool: str
    size: int  # bytes of the line that carried it
    arrived: float  # event-loop time
    started: float | None = None  # when it took the session
    # A task call's work outlives its request: the task ends the call, not
    # the request's answer.
    in_task: bool = False

    def running_for(self, now: float) -> float:
        return now - self.started if self.started is not None else 0.0


class CallQueue:
    """The tools/calls that wait for the session or hold it, oldest first.

    Its order is the session's: every tools/call is admitted as its line is
    read and reaches the session's FIFO lock in its first step, which runs
    at once (eager.py), so the oldest call here holds the session and the
    others wait in this order.  A call leaves the moment it is done with the
    session (one refused by validation leaves in its first step).  Pure
    bookkeeping: the caller gives the time."""

    def __init__(self) -> None:
        self._calls: dict[QueuedCall, None] = {}  # in arrival order
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._calls)

    def refusal(self, size: int) -> JsonRpcError | None:
        """The busy error for a call of SIZE bytes, or None to admit it."""
        count = len(self._calls)
        if count >= MAX_QUEUED_CALLS:
            reason = f"{count} calls are queued (the limit)"
        elif count and self.bytes + size > MAX_QUEUED_BYTES:
            reason = (f"{count} queued calls hold {_mib(self.bytes)} of requests and this one "
                      f"{_mib(size)}, past the limit of {_mib(MAX_QUEUED_BYTES)}")
        else:
            return None
        return JsonRpcError(
            SERVER_BUSY, f"Server busy: {reason}; try again when earlier calls have finished",
            {"queuedCalls": count, "queuedBytes": self.bytes, "requestBytes": size,
             "maxQueuedCalls": MAX_QUEUED_CALLS, "maxQueuedBytes": MAX_QUEUED_BYTES})

    def add(self, call: QueuedCall, now: float) -> None:
        """CALL was admitted: it goes to the session's lock now."""
        self._calls[call] = None
        self.bytes += call.size
        if call.started is None and next(iter(self._calls)) is call:
            call.started = now

    def remove(self, call: QueuedCall, now: float) -> None:
        """CALL is done with the session; the next one takes it.  Removing
        a call twice is harmless."""
        if call not in self._calls:
            return
        del self._calls[call]
        self.bytes -= call.size
        following = next(iter(self._calls), None)
        if following is not None and following.started is None:
            following.started = now

    def ahead_of(self, call: QueuedCall) -> list[QueuedCall]:
        """The calls before CALL, oldest (the running one) first; none once
        CALL has left."""
        if call not in self._calls:
            return []
        ahead = []
        for other in self._calls:
            if other is call:
                break
            ahead.append(other)
        return ahead


class WaitingBeside:
    """The calls that wait beside the session's turn, never queued for it:
    read-output, await-evaluation, and a 2025-11-25 tasks/result.  Counted
    apart from the queue and bounded low: 1,000 concurrent
    `await-evaluation {wait: 20}` took the image from 9 to 1,009 threads."""

    def __init__(self) -> None:
        self.count = 0

    def refusal(self, in_image: int) -> JsonRpcError | None:
        """The busy error for one more such call, or None to admit it.
        IN_IMAGE counts the image threads such calls hold, a cancelled
        call's included until the image answers it."""
        waiting = max(self.count, in_image)
        if waiting < MAX_WAITING_BESIDE:
            return None
        return JsonRpcError(
            SERVER_BUSY, f"Server busy: {waiting} calls wait beside the session's turn "
            "(read-output, await-evaluation, tasks/result: the limit); try again when one has answered",
            {"waitingCalls": waiting, "maxWaitingCalls": MAX_WAITING_BESIDE})
