"""Where an evaluation's time goes inside the image: SBCL's statistical
profiler (sb-sprof, every thread, CPU mode) over 5,000 evaluate calls sent
the way cl-mcp sends them.

    .venv/bin/python bench/profile_lisp.py [--calls N] [--output FILE]

Prints the wall time per call and the image's CPU time per call, then the
flat report (also written to FILE, default /tmp/cl-mcp-sprof.txt).  On the
2-core VMs this was written on, the image spends ~10 µs of CPU per call out
of ~250 µs of wall time: the rest is waiting for threads to be woken.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import RawSwank  # noqa: E402  (bench/harness.py, beside this file)

from cl_mcp.wire.sexp import Keyword, Symbol, dumps  # noqa: E402


def lisp(code: str) -> list:
    return [Symbol("cl:eval"), [Symbol("cl:read-from-string"), code]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--output", default="/tmp/cl-mcp-sprof.txt")
    parser.add_argument("--swank-as-shipped", action="store_true",
                        help="without the agent's pruning of Swank's mailboxes (shows the leak)")
    args = parser.parse_args()
    swank = RawSwank(as_shipped=args.swank_as_shipped)
    try:
        swank.call(lisp("(progn (require :sb-sprof) nil)"))
        swank.call(lisp("(progn (sb-sprof:start-profiling :max-samples 200000 :mode :cpu "
                        ":sample-interval 0.0002 :threads :all) nil)"))
        form = [Symbol("cl-mcp-agent:evaluate"), "(+ 1 2)", Keyword("timeout"), 30, Keyword("tag"), 1]
        started = time.perf_counter()
        for _ in range(args.calls):
            swank.call(form)
        wall = (time.perf_counter() - started) / args.calls
        swank.call(lisp(
            "(progn (sb-sprof:stop-profiling)"
            f" (with-open-file (s {dumps(args.output)} :direction :output :if-exists :supersede)"
            "   (sb-sprof:report :type :flat :max 30 :stream s)) nil)"))
    finally:
        swank.close()
    report = Path(args.output).read_text()
    sampled = next(line for line in report.splitlines() if line.startswith("Total sampling time"))
    cpu = float(sampled.split(":")[1].split()[0]) / args.calls
    print(f"{args.calls} calls: {wall * 1e6:.0f} µs wall per call, {cpu * 1e6:.1f} µs of image CPU per call")
    print(report[report.index("           Self"):])


if __name__ == "__main__":
    main()
