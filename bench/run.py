"""cl-mcp's benchmarks, side by side with their baselines, in one run.

    make bench            (or: .venv/bin/python bench/run.py [--quick])

Writes docs/performance.md: each figure with the baseline measured in the
same run and the ratio between them.  Latencies are taken in alternating
batches of 100 (ours, then the baseline's), so that both see the same moments
of a noisy shared machine; throughputs are medians of several runs.
"""

from __future__ import annotations

import argparse
import compileall
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import attached  # noqa: E402  (bench/attached.py, beside this file)
import background  # noqa: E402  (bench/background.py, beside this file)
import devtools  # noqa: E402  (bench/devtools.py, beside this file)
import pure  # noqa: E402  (bench/pure.py, beside this file)
import results  # noqa: E402  (bench/results.py, beside this file)
import watch  # noqa: E402  (bench/watch.py, beside this file)
from harness import CL_MCP, RawSwank, Server, timed  # noqa: E402  (bench/harness.py, beside this file)

SDK_SERVER = [sys.executable, str(ROOT / "bench" / "sdk_server.py")]
STUB_SERVER = [sys.executable, str(ROOT / "bench" / "stub_server.py")]
LISP_SERVER = ["sbcl", "--script", str(ROOT / "bench" / "lisp_server.lisp")]


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f} µs"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms"


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process PID, all its threads, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_call(*servers: tuple[Server, Callable[[], object]], calls: int, batch: int = 500) -> list[float]:
    """CPU seconds each server's process spends per sequential call, over
    CALLS calls each, in alternating batches (the clock counts 10 ms ticks:
    a few thousand calls make it exact to a few per cent)."""
    spent = [0.0 for _ in servers]
    batches = max(1, calls // batch)
    for _ in range(batches):
        for index, (server, call) in enumerate(servers):
            before = cpu_seconds(server.proc.pid)
            timed(call, batch)
            spent[index] += cpu_seconds(server.proc.pid) - before
    return [each / (batches * batch) for each in spent]


def side_by_side(*calls: Callable[[], object], rounds: int, batch: int = 100) -> list[list[float]]:
    """Latency samples of each of CALLS, taken in alternating batches so that
    all see the same moments of this (noisy, shared) machine."""
    samples: list[list[float]] = [[] for _ in calls]
    for _ in range(max(1, rounds // batch)):
        for call, taken in zip(calls, samples):
            taken += timed(call, batch)
    return samples


EVAL = {"name": "evaluate-lisp", "arguments": {"code": "(+ 1 2)"}}


def startup(env: dict[str, str]) -> tuple[float, float, float]:
    """Seconds from spawn to the initialize response and to the first
    result; then the resident MiB after ten evaluations."""
    server = Server(CL_MCP, env)
    server.initialize()
    initialized = time.perf_counter() - server.started
    server.call("tools/call", EVAL)
    first = time.perf_counter() - server.started
    timed(server.caller("tools/call", EVAL), 10)
    resident = server.resident_mib()
    server.close()
    return initialized, first, resident


def stub_startup() -> float:
    """Seconds from spawn to the initialize response of bench/stub_server.py."""
    stub = Server(STUB_SERVER)
    stub.initialize()
    initialized = time.perf_counter() - stub.started
    stub.close()
    return initialized


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--output", default=str(ROOT / "docs" / "performance.md"))
    args = parser.parse_args()
    rounds = 200 if args.quick else 2000
    quick = args.quick
    rows: list[tuple[str, str, str, str]] = []

    def row(what: str, value: str, baseline: str = "", ratio: str = "") -> None:
        rows.append((what, value, baseline, ratio))
        print(f"{what:55} {value:>14} {baseline:>22} {ratio:>8}", flush=True)

    def p50_row(what: str, ours: list[float], baseline: str, theirs: list[float]) -> None:
        mine, other = statistics.median(ours), statistics.median(theirs)
        row(what, us(mine), f"{baseline} {us(other)}", f"{mine / other:.2f}×")

    for each in pure.rows(args.quick):  # first, while no server runs beside them
        row(*each)
    raw = RawSwank()
    server = Server(CL_MCP)
    server.initialize()
    evaluate = server.caller("tools/call", EVAL)
    timed(evaluate, 500)  # warm up
    # Swank at its fastest: its first calls, before its mailboxes pile up.
    early, fresh = side_by_side(evaluate, raw.call, rounds=200, batch=20)
    evals, raws = side_by_side(evaluate, raw.call, rounds=rounds)
    p50_row("evaluate-lisp (+ 1 2), p50", evals, "raw Swank", raws)
    row("evaluate-lisp (+ 1 2), p99", us(percentile(evals, 0.99)),
        f"raw Swank {us(percentile(raws, 0.99))}",
        f"{percentile(evals, 0.99) / percentile(raws, 0.99):.2f}×")
    p50_row("evaluate-lisp (+ 1 2), p50, against a fresh Swank", early, "raw Swank's first 200 calls", fresh)
    # And against a Swank that never slows down (the agent's pruning of its
    # mailboxes installed), the fairest floor; beside it, what any server in
    # a process of its own costs at least (a blocking relay that does
    # nothing but pass one request down a lane into the same image), and a
    # minimal MCP server written in Lisp, which evaluates in its own process.
    pruned = RawSwank(as_shipped=False)
    relay = pruned.relay()
    relay.initialize()
    # The same relay on cl-mcp's architecture (an asyncio loop, protocol
    # callbacks, the reply read at once): what the architecture costs
    # before cl-mcp does any of its work.
    async_relay = pruned.relay("async_relay.py")
    async_relay.initialize()
    native = Server(LISP_SERVER)
    native.initialize()
    relayed_call = relay.caller("tools/call", EVAL)
    async_relayed_call = async_relay.caller("tools/call", EVAL)
    evals_too, floors, relayed, async_relayed, natives = side_by_side(
        evaluate, pruned.call, relayed_call, async_relayed_call, native.caller("tools/call", EVAL),
        rounds=rounds)
    # The relays' CPU is their processes' own work: they block while they
    # wait.  cl-mcp's includes its polls (the answer window's and the event
    # loop's, docs/performance.md), which spin while the others work.
    cpu_calls = 1000 if quick else 3000
    our_cpu, relay_cpu, async_relay_cpu = cpu_per_call(
        (server, evaluate), (relay, relayed_call), (async_relay, async_relayed_call), calls=cpu_calls)
    for each in (relay, async_relay, native):
        each.close()
    pruned.close()
    p50_row("evaluate-lisp (+ 1 2), p50, against Swank with its leak fixed", evals_too, "raw Swank, pruned", floors)
    p50_row("a relay that only passes the call on (bench/relay.py), p50", relayed, "raw Swank, pruned", floors)
    p50_row("evaluate-lisp (+ 1 2), p50, against that relay", evals_too, "relay", relayed)
    p50_row("the same relay on asyncio (bench/async_relay.py), p50", async_relayed, "relay", relayed)
    p50_row("evaluate-lisp (+ 1 2), p50, against an MCP server in Lisp", evals_too, "Lisp server", natives)
    row(f"cl-mcp's CPU per sequential evaluate-lisp (+ 1 2), over {cpu_calls:,} calls, target ≤ 80 µs",
        us(our_cpu), f"relay {us(relay_cpu)}", f"{our_cpu / relay_cpu:.2f}×")
    row(f"the asyncio relay's CPU per call, over {cpu_calls:,} calls",
        us(async_relay_cpu), f"relay {us(relay_cpu)}", f"{async_relay_cpu / relay_cpu:.2f}×")
    throughput = statistics.median(server.pipelined("tools/call", EVAL, rounds) for _ in range(3))
    row("evaluate-lisp pipelined", f"{throughput:,.0f} req/s",
        f"raw Swank {1 / statistics.median(raws):,.0f} req/s sequential")
    # Swank alone slows down with every request it has served (its SBCL
    # backend keeps a mailbox per finished worker thread); cl-mcp's agent
    # prunes them.  Bring both to the same count of calls served, 10,000 on.
    timed(raw.call, 4 * rounds)  # what the pruned comparison and the pipelined runs gave cl-mcp
    for _ in range(5):
        timed(evaluate, 2000)
        timed(raw.call, 2000)
    served = 500 + 200 + 5 * rounds + 10_000 + rounds  # cl-mcp's count; the raw client's is 499 fewer
    evals, raws = side_by_side(evaluate, raw.call, rounds=rounds)
    p50_row(f"evaluate-lisp p50 after {served:,} calls", evals, "raw Swank", raws)
    raw.close()

    sdk = Server(SDK_SERVER)
    sdk.initialize()
    for method in ("ping", "tools/list"):
        ours, theirs = side_by_side(server.caller(method, None), sdk.caller(method, None), rounds=rounds)
        row(f"{method}, p50", us(statistics.median(ours)), f"SDK server {us(statistics.median(theirs))}",
            f"{statistics.median(theirs) / statistics.median(ours):.1f}× faster")
        rates = [(server.pipelined(method, None, rounds), sdk.pipelined(method, None, rounds))
                 for _ in range(5)]
        ours_rate = statistics.median(rate for rate, _ in rates)
        theirs_rate = statistics.median(rate for _, rate in rates)
        row(f"{method}, pipelined (median of 5)", f"{ours_rate:,.0f} req/s",
            f"SDK server {theirs_rate:,.0f} req/s", f"{ours_rate / theirs_rate:.1f}×")
    sdk_rss = sdk.resident_mib()
    sdk.close()

    # A cl-mcp of its own: the output it keeps for read-output (up to
    # 64 MiB) would swell this one's resident-memory row.
    big = Server(CL_MCP)
    big.initialize()
    for each in results.rows(big, args.quick):
        row(*each)
    big.close()

    server.call("tools/call", {"name": "evaluate-lisp", "arguments": {"code": (
        "(dotimes (i 10000) (setf (fdefinition (intern (format nil \"BENCH-FN-~D\" i))) "
        "(lambda (x) x)))")}})
    listings = timed(server.caller("tools/call", {"name": "list-definitions", "arguments": {}}), 5)
    row("list-definitions over 10,000 functions", ms(statistics.median(listings)), "target well under 1,000 ms")
    resets = timed(server.caller("tools/call", {"name": "reset-session", "arguments": {}}), 5)
    row("reset-session (a fresh image)", ms(statistics.median(resets)), "target 1,000 ms")
    for each in background.rows(server, args.quick):
        row(*each)
    tools = Server(CL_MCP)  # an image of their own, with alexandria and the fixture loaded
    tools.initialize()
    for each in devtools.rows(tools, args.quick):
        row(*each)
    tools.close()
    for each in watch.rows(lambda extra: Server(CL_MCP + extra), args.quick):
        row(*each)
    for each in attached.rows(args.quick, lambda options: Server(CL_MCP + options)):
        row(*each)
    row("cl-mcp resident memory", f"{server.resident_mib():.0f} MiB", f"SDK server {sdk_rss:.0f} MiB")
    server.close()

    # Byte-compiled, as pip installs a package: with PYTHONDONTWRITEBYTECODE
    # set, an editable install would compile its sources at every start.
    compileall.compile_dir(ROOT / "cl_mcp", quiet=1)
    warm, stubs = [], []
    for _ in range(5 if quick else 9):
        warm.append(startup({}))
        stubs.append(stub_startup())
    cold_dir = Path(tempfile.mkdtemp(prefix="cl-mcp-cold-"))
    cold = startup({"HOME": str(cold_dir), "XDG_CACHE_HOME": str(cold_dir / "cache")})
    shutil.rmtree(cold_dir, ignore_errors=True)
    initialized, stub = statistics.median(w[0] for w in warm), statistics.median(stubs)
    row("spawn → initialize answered (warm), target ≤ 1.5× the stub", ms(initialized),
        f"stdlib asyncio stub (bench/stub_server.py) {ms(stub)}", f"{initialized / stub:.2f}×")
    row("spawn → first evaluation result (warm)", ms(statistics.median(w[1] for w in warm)), "target 1,000 ms")
    row("cl-mcp resident memory after a warm start (initialize, 11 evaluations), target ≤ 32 MiB",
        f"{statistics.median(w[2] for w in warm):.1f} MiB")
    row("spawn → initialize answered (cold caches)", ms(cold[0]))
    row("spawn → first evaluation result (cold caches)", ms(cold[1]), "compiles Swank and the agent")

    write_report(Path(args.output), rows, rounds)


def write_report(path: Path, rows: list[tuple[str, str, str, str]], rounds: int) -> None:
    machine = (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
               f"{subprocess.run(['sbcl', '--version'], capture_output=True, text=True).stdout.strip()}")
    table = "\n".join(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows)
    marker = "<!-- bench:results -->"
    report = (f"{marker}\nMeasured {time.strftime('%Y-%m-%d')} on {machine}; {rounds} rounds per "
              f"latency figure; reproduce with `make bench`.\n\n"
              f"| measure | cl-mcp | baseline (same run) | ratio |\n|---|---|---|---|\n{table}\n{marker}\n")
    text = path.read_text() if path.exists() else ""
    if text.count(marker) == 2:
        before, _, rest = text.partition(marker)
        _, _, after = rest.partition(marker)
        text = before + report.strip("\n") + after
    else:
        text = f"# Performance\n\n{report}\n"
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
