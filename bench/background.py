"""What an evaluation running in the background costs the calls beside it
(issue 21): the p50 of evaluate-lisp (+ 1 2) while another evaluation spins
in `(loop)` in the background, beside its usual p50, measured through a
cl-mcp over stdio as bench/run.py's other rows are.

The two are taken in alternating batches (a `(loop)` sent to the background
with an answer window of 0.1 s, a batch of calls, the loop stopped with
await-evaluation's abort, a batch without it), so that both see the same
moments of the shared machine.  On a 2-core VM the loop takes one core for
itself, which the lane's thread and cl-mcp then share.

    .venv/bin/python bench/background.py [--quick]   (bench/run.py adds its rows to docs/performance.md)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Iterator, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from harness import CL_MCP, Server, timed  # noqa: E402  (bench/harness.py, beside this file)

Row = tuple[str, str, str, str]  # what, the p50 beside the loop, the usual p50, the ratio
EVAL = {"name": "evaluate-lisp", "arguments": {"code": "(+ 1 2)"}}


class Client(Protocol):
    """What these rows need of `Server` (bench/harness.py)."""

    def call(self, method: str, params: dict | None = None) -> dict: ...


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def start_loop(client: Client) -> int:
    """Send `(loop)` to the background; its evaluation's number."""
    result = client.call("tools/call", {"name": "evaluate-lisp", "arguments": {
        "code": "(loop)", "answer-within": 0.1, "timeout": 600}})["result"]
    structure = result["structuredContent"]
    assert structure.get("running"), result
    return structure["number"]


def stop_loop(client: Client, number: int) -> None:
    result = client.call("tools/call", {"name": "await-evaluation",
                                        "arguments": {"evaluation": number, "abort": True}})["result"]
    assert result["structuredContent"].get("aborted"), result


def rows(client: Client, quick: bool) -> Iterator[Row]:
    rounds, batch = (5, 50) if quick else (20, 100)

    def evaluate() -> None:
        client.call("tools/call", EVAL)

    timed(evaluate, batch)  # warm up
    beside, usual = [], []
    for _ in range(rounds):
        number = start_loop(client)
        beside += timed(evaluate, batch)
        stop_loop(client, number)
        usual += timed(evaluate, batch)
    ours, theirs = statistics.median(beside), statistics.median(usual)
    yield ("evaluate-lisp (+ 1 2), p50, while (loop) runs in the background", us(ours),
           f"usual p50 {us(theirs)}", f"{ours / theirs:.2f}×")


def main() -> None:
    """Print the rows alone."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    server = Server(CL_MCP)
    server.initialize()
    try:
        for what, ours, theirs, ratio in rows(server, parser.parse_args().quick):
            print(f"{what:70} {ours:>10} {theirs:>24} {ratio:>6}", flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
