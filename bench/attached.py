"""What an attached cl-mcp costs the programmer's own work (issue 36): a
consing workload in the programmer's image, timed in that image, while an
evaluation that conses too runs every 0.3 s through an attached cl-mcp
(idle between), against the same in an image no cl-mcp ever attached to,
where those evaluations come over a plain Swank connection.

Both images are SBCL running Swank as `M-x slime` leaves it (the attach
tests' `SwankServer`), with 1 GiB of heap, 480 MB of it the programmer's
live data: the heap is more than half full, where kept values give way.
The workload, sent by a Swank client standing in for Emacs, makes forty
lists of 2,000,000 conses (32 MB each) and returns the seconds it took; the
evaluations beside it make one such list each.
Rounds alternate between the two images, so that both see the same moments
of the shared machine.

    .venv/bin/python bench/attached.py [--quick]   (bench/run.py adds its row to docs/performance.md)
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
from pathlib import Path
from typing import Awaitable, Callable, Iterator, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cl_mcp.lisp.link import _eval_text as lisp  # noqa: E402  (Swank reads a request in a package of its own)
from cl_mcp.lisp.swank.connection import SwankConnection  # noqa: E402
from harness import CL_MCP, Server  # noqa: E402  (bench/harness.py, beside this file)
from tests.integration.attach_fixtures import SwankServer, temporary_home  # noqa: E402

Row = tuple[str, str, str, str]


class Client(Protocol):
    """What this row needs of `Server` (bench/harness.py)."""

    def initialize(self) -> None: ...
    def call(self, method: str, params: dict | None = None) -> dict: ...
    def close(self) -> None: ...


HEAP_MIB = 1024
LIVE = "(progn (defvar *live* (make-array 60000000 :element-type 'double-float)) nil)"  # 480 MB
WORKLOAD = """(let ((start (get-internal-real-time)) (conses 0))
                (dotimes (i 40) (incf conses (length (make-list 2000000))))
                (round (* 1000000 (- (get-internal-real-time) start)) internal-time-units-per-second))"""
SIDE = "(length (make-list 2000000))"
CALL_EVERY = 0.3  # seconds: cl-mcp idles between its calls


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms"


async def workload(emacs: SwankConnection, side: Callable[[], Awaitable[object]] | None) -> float:
    """The workload's seconds in the image; SIDE, if given, is awaited every
    `CALL_EVERY` seconds meanwhile."""
    running = asyncio.ensure_future(emacs.rex(lisp(WORKLOAD), deadline=600))
    while not running.done():
        if side is not None:
            await side()
        await asyncio.wait([running], timeout=CALL_EVERY)
    return int(running.result()) / 1e6


def rows(quick: bool, spawn: Callable[[list[str]], Client]) -> Iterator[Row]:
    """The row; SPAWN starts cl-mcp with the given arguments."""
    rounds = 3 if quick else 7
    homes = [temporary_home(), temporary_home()]
    attached, alone = (SwankServer(home, heap_mib=HEAP_MIB) for home in homes)
    cl_mcp = None
    try:
        cl_mcp = spawn(["--connect", f"127.0.0.1:{attached.port}"])
        cl_mcp.initialize()

        async def through_cl_mcp() -> None:
            await asyncio.to_thread(cl_mcp.call, "tools/call",  # a blocking client
                                    {"name": "evaluate-lisp", "arguments": {"code": SIDE}})

        async def measure() -> tuple[list[float], list[float]]:
            emacs = [await SwankConnection.open("127.0.0.1", server.port) for server in (attached, alone)]
            try:
                for connection in emacs:
                    await connection.rex(lisp(LIVE), deadline=120)
                    await workload(connection, None)  # warm up
                await through_cl_mcp()  # the agent is loaded

                async def through_swank() -> None:
                    await emacs[1].rex(lisp(SIDE), deadline=60)

                withs, withouts = [], []
                for _ in range(rounds):
                    withs.append(await workload(emacs[0], through_cl_mcp))
                    withouts.append(await workload(emacs[1], through_swank))
                return withs, withouts
            finally:
                for connection in emacs:
                    await connection.close()

        withs, withouts = asyncio.run(measure())
    finally:
        if cl_mcp is not None:
            cl_mcp.close()
        for server in (attached, alone):
            server.stop()
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)
    ours, theirs = statistics.median(withs), statistics.median(withouts)
    yield ("a consing workload in an attached image (480 MB live in 1 GiB, 40 × 32 MB), "
           f"beside a 32 MB evaluation through cl-mcp every {CALL_EVERY:g} s, median of {rounds}, "
           "target ≤ 1.05×", ms(ours), f"the same through Swank, no cl-mcp, {ms(theirs)}",
           f"{ours / theirs:.2f}×")


def main() -> None:
    """Print the row alone."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    for what, ours, theirs, ratio in rows(parser.parse_args().quick, lambda args: Server(CL_MCP + args)):
        print(f"{what}\n  {ours} against {theirs}: {ratio}", flush=True)


if __name__ == "__main__":
    main()
