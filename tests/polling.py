"""Helpers for the tests of cl-mcp's polling (the event loop's, the answer
window's, the lane's): CPUs to run on, and input timed to a poll's yields."""

import contextlib
import os
import socket

import pytest


@contextlib.contextmanager
def one_cpu():
    """This thread (and what it starts) on one CPU."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, cpus)


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
