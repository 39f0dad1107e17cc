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
"""

from __future__ import annotations

import asyncio
import os
import selectors
import time

IDLE_SPIN = 0.0003  # seconds; ~10× a wake-up, ~1/3000 of an assistant's turn


class PollingSelector(selectors.DefaultSelector):  # type: ignore[misc, valid-type]
    """The platform's default selector, which polls for SPIN seconds before
    any wait that would block."""

    def __init__(self, spin: float = IDLE_SPIN) -> None:
        super().__init__()
        self.spin = spin

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or (timeout is not None and timeout <= 0) or self.spin <= 0:
            return ready
        clock = time.perf_counter
        started = clock()
        spin_until = started + (self.spin if timeout is None else min(self.spin, timeout))
        while clock() < spin_until:
            os.sched_yield()
            ready = super().select(0)
            if ready:
                return ready
        if timeout is not None:
            timeout = max(0.0, timeout - (clock() - started))
        return super().select(timeout)


def new_event_loop(spin: float = IDLE_SPIN) -> asyncio.AbstractEventLoop:
    """A selector event loop whose idle waits poll for SPIN seconds first."""
    return asyncio.SelectorEventLoop(PollingSelector(spin))
