"""The event loop's selector: polls before it sleeps, and keeps its timeouts."""

import asyncio
import selectors
import socket
import time
from collections.abc import Callable

import pytest

from cl_mcp.cli import main as cli
from cl_mcp.wire import idle_poll
from cl_mcp.wire.idle_poll import PollingSelector, new_event_loop
from tests.polling import all_cpus, input_at_yield, one_cpu, several_cpus


class _Recording(selectors.DefaultSelector):  # type: ignore[misc, valid-type]
    """Records the timeout of every wait PollingSelector makes, and can have
    input arrive at the moment it blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float | None] = []
        self.on_block: Callable[[], None] | None = None

    def select(self, timeout=None):
        self.timeouts.append(timeout)
        if timeout is None and self.on_block:
            self.on_block()
        return super().select(timeout)


class RecordingPollingSelector(PollingSelector, _Recording):
    pass


@pytest.fixture(autouse=True)
def no_yield_is_late(monkeypatch):
    """On a busy machine a real yield can take a time slice and stop the
    poll; only the back-off's own test wants that."""
    monkeypatch.setattr(idle_poll, "STOLEN", 3600.0)


def _watched_pair(spin: float):
    ours, theirs = socket.socketpair()
    selector = RecordingPollingSelector(spin)
    selector.register(ours, selectors.EVENT_READ)
    return selector, ours, theirs


def _ready(selector) -> bool:
    """Whether a blocking SELECT reports input."""
    return any(mask & selectors.EVENT_READ for _key, mask in selector.select(None))


def test_what_is_ready_already_costs_one_poll():
    selector, ours, theirs = _watched_pair(spin=0.5)
    with selector, ours, theirs:
        theirs.sendall(b"x")
        assert _ready(selector)
        assert selector.timeouts == [0]


def test_without_polling_it_sleeps_at_once():
    # On one CPU (spin 0) the wait is an ordinary one: it used to return the
    # first look's empty answer, and the loop spun at 100 % of that CPU.
    selector, ours, theirs = _watched_pair(spin=0.0)
    with selector, ours, theirs:
        selector.on_block = lambda: theirs.sendall(b"x")  # arrives only if it blocks
        assert _ready(selector)
        assert selector.timeouts == [None]


def test_a_loop_with_work_to_do_never_spins():
    selector, ours, theirs = _watched_pair(spin=0.5)
    with selector, ours, theirs:
        assert selector.select(0) == []
        assert selector.timeouts == [0]


def test_what_arrives_while_polling_is_taken_without_sleeping(monkeypatch):
    selector, ours, theirs = _watched_pair(spin=5.0)
    with selector, ours, theirs:
        input_at_yield(monkeypatch, theirs, 3)
        selector.on_block = lambda: theirs.sendall(b"x")  # without a poll: fail, not hang
        assert _ready(selector)
        assert selector.timeouts == [0, 0, 0, 0]  # a look before each yield and after the third


def test_after_polling_it_sleeps_until_something_comes():
    selector, ours, theirs = _watched_pair(spin=0.001)
    with selector, ours, theirs:
        selector.on_block = lambda: theirs.sendall(b"x")
        assert _ready(selector)
        assert len(selector.timeouts) > 2  # it looked, polled,
        assert set(selector.timeouts[:-1]) == {0}
        assert selector.timeouts[-1] is None  # then slept


def test_a_timeout_counts_the_polling_and_a_short_one_caps_it():
    selector, ours, theirs = _watched_pair(spin=0.001)
    with selector, ours, theirs:
        assert selector.select(0.05) == []
        assert 0 <= selector.timeouts[-1] < 0.05
        selector.spin = 5.0
        selector.long_waits = 0  # as after a request that came at once
        selector.timeouts.clear()
        started = time.perf_counter()
        assert selector.select(0.01) == []
        assert time.perf_counter() - started < 2.5  # at its timeout, not after the 5 s spin
        assert all(timeout is not None and timeout < 0.01 for timeout in selector.timeouts)


def test_after_waits_longer_than_the_poll_the_next_wait_sleeps_at_once(monkeypatch):
    """Requests further apart than the poll lasts (an assistant's) would
    have every poll spin to its end for nothing; back to back, it polls.
    One long wait (a late answer) does not stop it."""
    selector, ours, theirs = _watched_pair(spin=0.001)
    with selector, ours, theirs:
        assert selector.select(0.05) == []  # nothing came within the poll
        selector.timeouts.clear()
        assert selector.select(0.05) == []
        assert len(selector.timeouts) > 2  # after one long wait it still polled
        selector.timeouts.clear()
        # Judged against a long poll from here on: the wait that the input
        # ends at once is short however late this process gets to run.
        selector.spin = 5.0
        selector.on_block = lambda: theirs.sendall(b"x")
        assert _ready(selector)
        assert selector.timeouts == [0, None]  # after two: one look, then sleep
        ours.recv(1)
        selector.on_block = None
        selector.timeouts.clear()
        input_at_yield(monkeypatch, theirs, 3)
        assert _ready(selector)  # that wait was short: polling again
        assert selector.timeouts == [0, 0, 0, 0]


def test_the_loop_runs_pipes_timers_and_subprocesses():
    async def main() -> bytes:
        process = await asyncio.create_subprocess_exec(
            "sh", "-c", "sleep 0.01; echo done", stdout=asyncio.subprocess.PIPE)
        output, _ = await process.communicate()
        await asyncio.sleep(0.01)
        return output

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        assert runner.run(main()) == b"done\n"
        assert isinstance(runner.get_loop()._selector, PollingSelector)  # type: ignore[attr-defined]


def test_a_yield_that_comes_back_late_stops_the_polling_for_a_while(monkeypatch):
    """Other work had the CPU for a time slice: polling would only wait
    behind it again, where a sleeper is woken at once."""
    monkeypatch.setattr(idle_poll, "STOLEN", 0.0005)
    yields = []

    def slow_yield() -> None:
        yields.append(1)
        time.sleep(idle_poll.STOLEN * 2)

    monkeypatch.setattr(idle_poll.os, "sched_yield", slow_yield)
    selector, ours, theirs = _watched_pair(spin=5.0)
    with selector, ours, theirs:
        selector.on_block = lambda: theirs.sendall(b"x")
        assert _ready(selector)
        assert (len(yields), selector.timeouts) == (1, [0, None])  # one look, then sleep
        assert selector.quiet_until > time.perf_counter() + idle_poll.BACK_OFF / 2
        ours.recv(1)
        selector.timeouts.clear()
        assert _ready(selector)
        assert (len(yields), selector.timeouts) == (1, [0, None])  # no polling at all


@pytest.mark.parametrize("cpus", [all_cpus, one_cpu], ids=["all CPUs", "one CPU"])
def test_the_loop_polls_only_where_it_may_use_several_cpus(cpus):
    with cpus():
        expected = idle_poll.IDLE_SPIN if several_cpus() else 0.0
        assert idle_poll.idle_spin() == expected
        loop = new_event_loop()
    try:
        assert loop._selector.spin == expected  # type: ignore[attr-defined]
    finally:
        loop.close()


def test_the_server_runs_on_the_polling_loop(monkeypatch):
    selectors_seen = []

    async def serve(config, out_fd) -> int:
        selectors_seen.append(asyncio.get_running_loop()._selector)  # type: ignore[attr-defined]
        return 0

    monkeypatch.setattr(cli, "claim_stdout", lambda: 1)  # pytest's stdout stays where it is
    monkeypatch.setattr(cli, "serve", serve)
    assert cli.serve_main(["--log-level", "warning"]) == 0
    assert [type(selector) for selector in selectors_seen] == [PollingSelector]
