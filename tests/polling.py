"""Helpers for the tests of cl-mcp's polling (the event loop's, the answer
window's, the lane's): CPUs to run on, and input timed to a poll's yields.

Polling pays only with a CPU to spare, so cl-mcp polls only where it may run
on several; a test of that rule runs both ways, pinned to one CPU and on all
of them, whatever CPUs pytest itself was given."""

import contextlib
import os
import socket
from collections.abc import Iterable, Iterator

import pytest


@contextlib.contextmanager
def cpus_set(cpus: Iterable[int]) -> Iterator[None]:
    """This thread (and what it starts) on CPUS, as far as the machine allows."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def one_cpu() -> contextlib.AbstractContextManager[None]:
    """This thread (and what it starts) on one CPU."""
    return cpus_set({min(os.sched_getaffinity(0))})


def all_cpus() -> contextlib.AbstractContextManager[None]:
    """This thread (and what it starts) on every CPU it may use, also when
    the tests run pinned (`taskset -c 0 pytest`): the kernel keeps those of
    the machine's CPUs the process's cpuset allows."""
    return cpus_set(range(os.cpu_count() or 1))


def several_cpus() -> bool:
    """Whether this thread may run on more than one CPU now."""
    return len(os.sched_getaffinity(0)) > 1


def input_at_yield(monkeypatch: pytest.MonkeyPatch, sender: socket.socket, number: int,
                   data: bytes = b"x") -> list[int]:
    """SENDER sends DATA during a poll, at its NUMBERth `os.sched_yield`;
    the list returned counts the yields."""
    yields: list[int] = []
    real_yield = os.sched_yield

    def yield_then_send() -> None:
        yields.append(1)
        if len(yields) == number:
            sender.sendall(data)
        real_yield()

    monkeypatch.setattr(os, "sched_yield", yield_then_send)
    return yields
