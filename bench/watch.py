"""What the programmer's watching Emacs costs cl-mcp's calls (issue 40): the
p50 of a call through a cl-mcp attached to an image whose Emacs loaded
emacs/cl-mcp.el and registered (its `*cl-mcp*` buffer open, each call
shown), beside the p50 of the same call while that Emacs is unregistered
(`cl-mcp-unregister`: the image tells it nothing, as an Emacs without the
package).

One image, a real Emacs with SLIME (tests/integration's harness) and a
cl-mcp over stdio; the calls are taken in alternating batches, the Emacs
registered for one and not for the next, so that both see the same moments
of the shared machine.

    .venv/bin/python bench/watch.py [--quick]   (bench/run.py adds its rows to docs/performance.md)
"""

from __future__ import annotations

import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harness import CL_MCP, Server, timed  # noqa: E402  (bench/harness.py, beside this file)
from tests.integration.attach_fixtures import Emacs, SwankServer, temporary_home  # noqa: E402

Row = tuple[str, str, str, str]  # what, the p50 watched, the p50 not, the ratio
PACKAGE = ROOT / "emacs" / "cl-mcp.el"
CALLS = {
    "evaluate-lisp (+ 1 2)": {"name": "evaluate-lisp", "arguments": {"code": "(+ 1 2)"}},
    "describe-symbol cl:car": {"name": "describe-symbol", "arguments": {"symbol": "cl:car"}},
}


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def registered(emacs: Emacs, wanted: bool) -> None:
    """Register EMACS with the image (or unregister it), and wait until done."""
    emacs.eval("(cl-mcp-register)" if wanted else "(cl-mcp-unregister)")
    deadline = time.monotonic() + 60
    while emacs.eval("(if (cl-mcp--registered) 1 0)") != ("1" if wanted else "0"):
        assert time.monotonic() < deadline, "the package did not (un)register"
        time.sleep(0.02)


def rows(server_of: Callable[[list[str]], object], quick: bool) -> Iterator[Row]:
    """One row per call: its p50 watched, and unwatched."""
    calls, batch = (200, 10) if quick else (1000, 10)
    with ExitStack() as stack:
        home = temporary_home()
        swank = SwankServer(home)
        stack.callback(swank.stop)
        emacs = Emacs(home)
        stack.callback(emacs.stop)
        emacs.connect(swank.port)
        server = server_of(["--connect", str(swank.port)])
        stack.callback(server.close)
        server.initialize()
        emacs.eval(f'(progn (load "{PACKAGE}") (cl-mcp-show) t)')
        for what, params in CALLS.items():
            call = server.caller("tools/call", params)
            timed(call, 100)  # warm up
            ours: list[float] = []
            theirs: list[float] = []
            for _ in range(calls // batch):
                registered(emacs, True)
                ours += timed(call, batch)
                registered(emacs, False)
                theirs += timed(call, batch)
            shown = int(emacs.eval('(with-current-buffer "*cl-mcp*" (count-lines (point-min) (point-max)))'))
            assert shown > 0, "the watching Emacs showed no call"
            mine, other = statistics.median(ours), statistics.median(theirs)
            yield (f"{what}, p50, {calls:,} calls, Emacs watching (emacs/cl-mcp.el), target ≤ 1.1×",
                   us(mine), f"Emacs not registered {us(other)}", f"{mine / other:.2f}×")


if __name__ == "__main__":
    for each in rows(lambda extra: Server(CL_MCP + extra), "--quick" in sys.argv):
        print(*each, sep=" | ")
