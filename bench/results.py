"""Big results (issue 20), measured through a cl-mcp over stdio as
bench/run.py's other rows are:

- 10 MB and 5 MB of output, one evaluate-lisp call each, taken in
  alternation (median of 5 each, 2 with --quick), and the 5 MB call's time
  per byte against the 10 MB call's: a fixed cost per call would show as a
  ratio above 1 (target: at most 1.5).
- read-output over that 5 MB output: the first call on it (which indexes
  its lines), then the p50 of a 50-line slice and of two regular-expression
  searches (one matching a line near the start, one matching nothing), each
  beside the same work done in this process by cl-mcp's own functions, so
  that what the tool adds to the search itself shows.  Target: p50 ≤ 20 ms.
- The image's peak resident memory (VmHWM, reset through
  /proc/PID/clear_refs) while evaluate-lisp returns `(make-list 10000000)`,
  whose printed value the result budget bounds, beside the same list
  counted instead (`length`, nothing to print), each in a fresh image, in
  turn; with the bytes the image consed in that call and its heap.

cl-mcp keeps these outputs for read-output (90 MB written, 45 with
--quick; at most --keep-output's 64 MiB kept), so bench/run.py runs these
rows in a cl-mcp of their own, which its resident-memory row does not count.

    .venv/bin/python bench/results.py [--quick]   (bench/run.py adds its rows to docs/performance.md)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cl_mcp.results.linepattern import LinePattern  # noqa: E402
from cl_mcp.results.outputs import Lines  # noqa: E402
from cl_mcp.lisp.config import SessionConfig  # noqa: E402
from cl_mcp.tools.output import read_slice, search  # noqa: E402
from harness import CL_MCP, Server, timed, tool  # noqa: E402  (bench/harness.py, beside this file)

Row = tuple[str, str, str, str]  # what, cl-mcp's figure, its baseline, the ratio
LINE = 100  # bytes a line of output takes: 99 x's and a newline
MARKER_LINE = 18  # the one line that starts with "marker"
MB = 1_000_000
MIB = 1024 * 1024
READ_TARGET = "target ≤ 20 ms"
# Where read-output's own slice and search stop (the heading and the closing line take the rest).
READ_LIMIT = SessionConfig().max_result_chars - 400


class Client(Protocol):
    """What these rows need of `Server` (bench/harness.py)."""

    proc: subprocess.Popen[bytes]

    def call(self, method: str, params: dict | None = None) -> dict: ...


def output_code(lines: int) -> str:
    """Lisp that writes LINES lines of 99 x's to stdout, line MARKER_LINE
    starting with "marker" instead."""
    return ('(let ((line (make-string 99 :initial-element #\\x)) '
            '(marker (replace (make-string 99 :initial-element #\\x) "marker"))) '
            f'(dotimes (i {lines}) (write-line (if (= i {MARKER_LINE - 1}) marker line))))')


def output_text(lines: int) -> str:
    """What `output_code` writes, built here."""
    line, marker = "x" * 99 + "\n", "marker" + "x" * 93 + "\n"
    return line * (MARKER_LINE - 1) + marker + line * (lines - MARKER_LINE)


def evaluate(client: Client, code: str) -> tuple[float, dict[str, Any]]:
    """Seconds one evaluate-lisp call of CODE took, and its result."""
    started = time.perf_counter()
    response = client.call("tools/call", {"name": "evaluate-lisp", "arguments": {"code": code}})
    elapsed = time.perf_counter() - started
    result = response.get("result")
    assert result is not None and not result["isError"], response
    return elapsed, result


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def output_rows(client: Client, runs: int) -> Iterator[Row]:
    """The 10 MB and 5 MB rows, then the read-output rows over the last 5 MB output."""
    big, small = output_code(10 * MB // LINE), output_code(5 * MB // LINE)
    for code in (big, small):  # warm up: the first big output grows the heap
        evaluate(client, code)
    tens: list[float] = []
    fives: list[float] = []
    firsts: list[float] = []  # read-output's first call on each 5 MB output
    for _ in range(runs):
        elapsed, result = evaluate(client, big)
        tens.append(elapsed)
        back = len(result["content"][0]["text"])
        elapsed, result = evaluate(client, small)
        fives.append(elapsed)
        number = result["structuredContent"]["number"]
        firsts += timed(partial(tool, client, "read-output", evaluation=number, offset=25_000, length=50), 1)
    ten, five = statistics.median(tens), statistics.median(fives)
    per_ten, per_five = ten / 10, five / 5  # seconds per MB
    yield (f"10 MB of output (kept up to --max-output), median of {runs}", ms(ten), "target 2,000 ms",
           f"{back:,} chars back")
    yield (f"5 MB of output, median of {runs}, beside the 10 MB calls", f"{ms(five)}, {ms(per_five)}/MB",
           f"10 MB: {ms(per_ten)}/MB", f"{per_five / per_ten:.2f}× per byte (target ≤ 1.5×)")
    yield from read_rows(client, number, firsts, 5 * runs)


def read_rows(client: Client, number: int, firsts: list[float], count: int) -> Iterator[Row]:
    """read-output over 5 MB output NUMBER: its first call (median of
    FIRSTS), then the p50 of COUNT calls of each kind, taken in turn with
    the same work done here."""
    lines = Lines(output_text(5 * MB // LINE))
    reads = [
        ("a slice of 50 lines from line 25,000", {"offset": 25_000, "length": 50},
         lambda: read_slice(lines, 25_000, 25_049, READ_LIMIT)),
        (f"the pattern /^marker/ (line {MARKER_LINE} matches)", {"pattern": "^marker"},
         lambda: search(lines, LinePattern("^marker"), READ_LIMIT)),
        ("the pattern /^nomatch/ (no line matches)", {"pattern": "^nomatch"},
         lambda: search(lines, LinePattern("^nomatch"), READ_LIMIT)),
    ]
    yield (f"read-output, its first call on that 5 MB output (indexes its {len(lines):,} lines), median of "
           f"{len(firsts)}", ms(statistics.median(firsts)), "", "")
    samples: list[tuple[list[float], list[float]]] = [([], []) for _ in reads]
    for _ in range(count):
        for (_, arguments, here), (ours, theirs) in zip(reads, samples):
            ours += timed(partial(tool, client, "read-output", evaluation=number, **arguments), 1)
            theirs += timed(here, 1)
    for (what, _, _), (ours, theirs) in zip(reads, samples):
        mine, floor = statistics.median(ours), statistics.median(theirs)
        yield (f"read-output, {what} of that output, p50, {READ_TARGET}", ms(mine),
               f"the same in this process {ms(floor)}", f"{mine / floor:,.1f}×")


# ---------------------------------------------------------------- the image's memory

def image_pid(client: Client) -> int:
    """The SBCL child of CLIENT's cl-mcp."""
    for children in Path(f"/proc/{client.proc.pid}/task").glob("*/children"):
        for pid in children.read_text().split():
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sbcl":
                return int(pid)
    raise LookupError(f"cl-mcp {client.proc.pid} has no SBCL child")


def memory(pid: int) -> dict[str, float]:
    """PID's VmRSS and VmHWM (its peak), in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {name: int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "VmHWM")}


def reset_peak(pid: int) -> bool:
    """Set PID's VmHWM to its VmRSS (Linux ≥ 4.0); whether the kernel took it."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def value(client: Client, code: str) -> int:
    return int(evaluate(client, code)[1]["structuredContent"]["values"][0])


PRINTED = "(make-list 10000000)"
COUNTED = "(length (make-list 10000000))"  # the same list, its value not printed


def peak_growth(client: Client, code: str) -> tuple[float, float, bool]:
    """In a fresh image: the MiB its VmHWM rose by in evaluate-lisp of
    CODE, the MiB it consed there, and whether VmHWM was reset first."""
    tool(client, "reset-session")
    pid = image_pid(client)
    before = value(client, "(sb-ext:get-bytes-consed)")
    reset = reset_peak(pid)
    # From VmHWM, not VmRSS: a VmHWM just reset can read a few KiB above
    # VmRSS (24 KiB seen here).
    start = memory(pid)["VmHWM"]
    evaluate(client, code)
    growth = memory(pid)["VmHWM"] - start
    return growth, (value(client, "(sb-ext:get-bytes-consed)") - before) / MIB, reset


def memory_row(client: Client, runs: int) -> Row:
    """The image's peak RSS growth while evaluate-lisp returns a list of
    ten million elements, beside the same list counted instead, median of
    RUNS fresh images each, in turn."""
    printed: list[tuple[float, float, bool]] = []
    counted: list[tuple[float, float, bool]] = []
    for _ in range(runs):
        printed.append(peak_growth(client, PRINTED))
        counted.append(peak_growth(client, COUNTED))
    tool(client, "reset-session")  # the fresh image's heap, for scale
    heap, in_use = value(client, "(sb-ext:dynamic-space-size)"), value(client, "(sb-kernel:dynamic-usage)")
    ours = statistics.median(growth for growth, _, _ in printed)
    theirs = statistics.median(growth for growth, _, _ in counted)
    consed = statistics.median(each for _, each, _ in printed)
    peak = "peak RSS" if all(reset for *_, reset in printed + counted) else "VmHWM (not resettable here)"
    return (f"evaluate-lisp {PRINTED}, its value printed within the budget: the image's {peak} growth, "
            f"median of {runs} fresh images ({consed:,.0f} MiB consed; a fresh image's heap: "
            f"{in_use / MIB:,.0f} MiB in use of {heap / MIB:,.0f} MiB)", f"{ours:,.0f} MiB",
            f"{COUNTED}, nothing printed: {theirs:,.0f} MiB", f"{ours / theirs:.2f}×")


def rows(client: Client, quick: bool = False) -> Iterator[Row]:
    """The rows, in CLIENT's cl-mcp, which must be initialized and otherwise
    idle; its image is replaced by fresh ones at the end."""
    yield from output_rows(client, 2 if quick else 5)
    yield memory_row(client, 1 if quick else 3)


def main() -> None:
    """Print the rows alone."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    server = Server(CL_MCP)
    server.initialize()
    try:
        for what, ours, theirs, ratio in rows(server, parser.parse_args().quick):
            print(f"{what:110} {ours:>22} {theirs:>50} {ratio:>26}", flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
