"""An event loop that polls briefly before it sleeps.

When the loop has nothing to do it blocks in epoll, and its CPU goes idle.
The next event then has to wake that CPU: an inter-processor interrupt, and
on a virtual machine a trip through the hypervisor, ≈25–30 µs on the VMs
measured (docs/performance.md) — more than cl-mcp's own work on a request.
A host that sends its next request as soon as it has read an answer (a
script, cl-mcp's own client, a batch of tool calls) would pay that on every
request.  So before sleeping, the loop polls its descriptors for a short
while, yielding the CPU between polls so that a process sharing it (the
host, the image) still runs.  The price is bounded: at most `IDLE_SPIN` of
CPU each time the loop runs out of work, so ≈0.3 ms per quick request, more
for one that keeps the loop waking (a slow evaluation's output, progress).

Polling only pays while other CPUs are free.  On a single CPU the host, the
image and cl-mcp take turns anyway, and where other work keeps the CPUs
busy a yield hands the CPU to it for a whole time slice (milliseconds, where
sleeping would have been woken at once): measured, both doubled a round
trip.  So there is no polling on a single CPU, and a yield that comes back
late stops the polling for `BACK_OFF` seconds.

Nor does it pay when requests come further apart than the poll lasts (an
assistant's, seconds apart): then every poll would spin to its end for
nothing.  So after `LONG_WAITS` waits in a row that each outlasted the poll,
the loop sleeps at once, until a wait ends within it (requests coming back
to back again).  One long wait is not enough: a call answered later than
the answer window (a slower evaluation, or a busy CPU) is waited for in the
loop, and the request after it still comes at once.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import time

IDLE_SPIN = 0.0003  # seconds; ~10× a wake-up, ~1/3000 of an assistant's turn
STOLEN = 0.0005  # a yield that took this long gave the CPU away for a time slice
BACK_OFF = 1.0  # seconds without polling after that
LONG_WAITS = 2  # waits in a row longer than the poll, after which it stops


def idle_spin() -> float:
    """How long to poll before sleeping here: `IDLE_SPIN`, or 0 when this
    process may run on one CPU only."""
    return IDLE_SPIN if len(os.sched_getaffinity(0)) > 1 else 0.0


class PollingSelector(selectors.DefaultSelector):  # type: ignore[misc, valid-type]
    """The platform's default selector, which polls for SPIN seconds before
    any wait that would block, unless a recent poll found the CPU busy or
    the last `LONG_WAITS` waits each outlasted SPIN."""

    def __init__(self, spin: float = IDLE_SPIN) -> None:
        super().__init__()
        self.spin = spin
        self.quiet_until = 0.0  # no polling before this perf_counter() time
        self.long_waits = 0  # the last waits in a row that outlasted SPIN

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self.spin <= 0:
            return super().select(timeout)  # an ordinary wait
        ready = super().select(0)
        if ready or (timeout is not None and timeout <= 0):
            return ready
        clock = time.perf_counter
        started = now = clock()
        if now >= self.quiet_until and self.long_waits < LONG_WAITS:
            spin_until = now + (self.spin if timeout is None else min(self.spin, timeout))
            while now < spin_until:
                os.sched_yield()
                yielded, now = now, clock()
                if now - yielded >= STOLEN:
                    self.quiet_until = now + BACK_OFF
                    break
                ready = super().select(0)
                if ready:
                    self.long_waits = 0
                    return ready
        if timeout is not None:
            timeout = max(0.0, timeout - (now - started))
        ready = super().select(timeout)
        self.long_waits = self.long_waits + 1 if clock() - started > self.spin else 0
        return ready


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A selector event loop whose idle waits poll first, when that pays."""
    return asyncio.SelectorEventLoop(PollingSelector(idle_spin()))
