"""The development tools' latencies (issue 19): one p50 per tool, measured
through a cl-mcp over stdio as bench/run.py's other rows are, with
alexandria and the fixture system (tests/fixtures/lisp/cl-mcp-fixture/)
loaded through load-system, as tests/integration/devtools.py loads them.

Beside each, its baseline in the same run: the agent's entry point that the
tool calls (`cl-mcp-agent:apropos-of`, …), called with the same arguments
and timed inside the image (CLOCK_MONOTONIC), in an evaluate-lisp call of
its own.  What the tool takes beyond it is cl-mcp, the pipes, and the
reply's printing, reading and rendering.  The two are taken in alternating
batches, so that both see the same moments of the shared machine.

run-tests' row compares a run of split-sequence's FiveAM suite through
run-tests with `asdf:test-system` of the same system timed in the image.

compile-form and compile-file come last: they redefine what they compile
(compile-file the fixture's classes and methods) under the other tools.
They compile a copy of the fixture's shapes.lisp in a temporary directory,
because compile-file writes the fasl beside the source; compile-form
compiles its one defun, TWICE.  edit-form replaces a defun of a copy of
iterate.lisp (3,650 lines) with its own text and compiles it (issue 38).

    .venv/bin/python bench/devtools.py [--quick]   (bench/run.py adds its rows to docs/performance.md)
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cl_mcp.wire import sexp  # noqa: E402
from cl_mcp.wire.sexp import Keyword, Symbol  # noqa: E402
from harness import CL_MCP, Client, Server, timed, tool  # noqa: E402  (bench/harness.py, beside this file)

FIXTURE = ROOT / "tests" / "fixtures" / "lisp" / "cl-mcp-fixture"
TARGET = "target < 50 ms"
PACKAGE = "COMMON-LISP-USER"  # the session's package, which the tools pass

Row = tuple[str, str, str, str]  # what, the tool's p50, the entry point's p50, the ratio


@dataclass(frozen=True, slots=True)
class Query:
    """One tool call, the agent's entry point it makes, and how its row
    names the answer."""
    label: Callable[[dict[str, Any]], str]  # the row's text, given the structured content
    tool: str
    arguments: dict[str, Any]
    entry: sexp.SExp  # the form the tool sends the agent


def evaluate(client: Client, form: sexp.SExp) -> str:
    """The printed value of FORM, evaluated through evaluate-lisp."""
    return tool(client, "evaluate-lisp", code=sexp.dumps(form))["values"][0]


def prepare(client: Client) -> int:
    """Load alexandria and the fixture system into CLIENT's image; the
    number of symbols apropos then looks at (those present in every package
    but KEYWORD, as Swank's `apropos-symbols` with an empty pattern finds)."""
    evaluate(client, [Symbol("asdf:load-asd"), str(FIXTURE / "cl-mcp-fixture.asd")])
    for system in ("alexandria", "cl-mcp-fixture"):
        assert tool(client, "load-system", system=system)["loaded"] is True
    return int(evaluate(client, [Symbol("length"), [Symbol("swank::apropos-symbols"), "", None, None, None]]))


def in_image(client: Client, form: sexp.SExp, count: int) -> list[float]:
    """Seconds each of COUNT evaluations of FORM took, timed in the image
    (`sb-unix::clock-gettime` 1, CLOCK_MONOTONIC: SBCL's internal real time
    moves in 4 ms ticks here) within one evaluate-lisp call."""
    s = Symbol
    timer = [s("let"), [[s("samples"), None]],
             [s("dotimes"), [s("i"), count, [s("nreverse"), s("samples")]],
              [s("multiple-value-bind"), [s("s0"), s("n0")], [s("sb-unix::clock-gettime"), 1],
               form,
               [s("multiple-value-bind"), [s("s1"), s("n1")], [s("sb-unix::clock-gettime"), 1],
                [s("push"), [s("+"), [s("*"), [s("-"), s("s1"), s("s0")], 1_000_000_000],
                             [s("-"), s("n1"), s("n0")]],
                 s("samples")]]]]]
    return [int(ns) / 1e9 for ns in evaluate(client, timer).strip("()").split()]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def measure(client: Client, query: Query, batches: int, batch: int, target: str = TARGET,
            baseline: str = "its entry point in the image") -> Row:
    """QUERY's row: its p50 through cl-mcp and its entry point's (or
    BASELINE's) in the image, in alternating batches after a few calls of
    each to warm up (the first xref call compiles)."""
    def call() -> dict[str, Any]:
        return tool(client, query.tool, **query.arguments)

    answer = call()
    timed(call, 3)
    in_image(client, query.entry, 3)
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(batches):
        ours += timed(call, batch)
        theirs += in_image(client, query.entry, batch)
    mine, floor = statistics.median(ours), statistics.median(theirs)
    return (f"{query.label(answer)}, p50, {target}", ms(mine), f"{baseline} {ms(floor)}",
            f"{mine / floor:.2f}×")


def about(symbol: str) -> dict[str, Any]:
    return {"symbol": symbol}


def rows(client: Client, quick: bool = False) -> Iterator[Row]:
    """One row per development tool, each p50 over 100 calls (15 with
    QUICK), in CLIENT's cl-mcp, which must be initialized and otherwise idle."""
    symbols = prepare(client)
    batches, batch = (3, 5) if quick else (10, 10)
    agent, package = "cl-mcp-agent:", [Keyword("package"), PACKAGE]
    queries = [
        Query(lambda r: f'apropos "flatten" over {symbols:,} symbols ({r["total"]:,} matches)',
              "apropos", {"pattern": "flatten"}, [Symbol(agent + "apropos-of"), "flatten"]),
        Query(lambda r: f'apropos "a" over {symbols:,} symbols ({r["total"]:,} matches, '
                        f'{len(r["symbols"])} listed)',
              "apropos", {"pattern": "a"}, [Symbol(agent + "apropos-of"), "a"]),
        Query(lambda r: f"xref calls of the fixture's GREET ({len(r['references'])} callers)",
              "xref", {**about("cl-mcp-fixture:greet"), "relation": "calls"},
              [Symbol(agent + "xref-of"), "cl-mcp-fixture:greet", Keyword("calls"), *package]),
        Query(lambda r: f"find-definition of the fixture's AREA ({len(r['definitions'])} definitions)",
              "find-definition", about("cl-mcp-fixture:area"),
              [Symbol(agent + "find-definition-of"), "cl-mcp-fixture:area", *package]),
        Query(lambda r: f"describe-symbol of the fixture's AREA ({len(r.get('methods', []))} methods)",
              "describe-symbol", about("cl-mcp-fixture:area"),
              [Symbol(agent + "describe-symbol-of"), "cl-mcp-fixture:area", *package]),
    ]
    for query in queries:
        yield measure(client, query, batches, batch)
    # The baseline is the same suite run directly, as its test-op runs it:
    # what run-tests adds is its hooks, the report and cl-mcp.  The suite
    # itself takes ~2.8 s (it conses 2.4 GB), hence fewer runs.
    suite_batches = 2 if quick else 3
    yield measure(client, Query(
        lambda r: (f"run-tests of split-sequence's FiveAM suite (system split-sequence, "
                   f"{r['tests']['passed']} checks passed)"),
        "run-tests", {"system": "split-sequence"}, [Symbol("asdf:test-system"), "split-sequence"]),
        suite_batches, 3, "target ≤ 1.2×", "asdf:test-system in the image")

    directory = Path(tempfile.mkdtemp(prefix="cl-mcp-bench-"))
    try:
        source = directory / "shapes.lisp"
        shutil.copy(FIXTURE / "shapes.lisp", source)
        text = source.read_text()
        lines = len(text.splitlines())
        twice = next(number for number, line in enumerate(text.splitlines(), 1)
                     if line.startswith("(defun twice "))
        yield measure(client, Query(
            lambda r: (f"compile-form of one defun (the fixture's TWICE, line {twice} of shapes.lisp) "
                       f"as C-c C-c ({len(r['notes'])} notes, defined: {', '.join(r['defined'])})"),
            "compile-form", {"path": str(source), "line": twice},
            [Symbol(agent + "compile-form-of"), str(source), twice]), batches, batch, "target < 30 ms")
        yield measure(client, Query(
            lambda r: (f"compile-file of the fixture's shapes.lisp ({lines} lines), load true as C-c C-k "
                       f"({len(r['notes'])} notes, loaded: {'yes' if r['loaded'] else 'no'})"),
            "compile-file", {"path": str(source), "load": True},
            [Symbol(agent + "compile-file-of"), str(source), Keyword("load"), True]), batches, batch)
        yield edit_row(client, directory, batches, batch)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


ITERATE = Path("/usr/share/common-lisp/source/iterate/iterate.lisp")


def edit_row(client: Client, directory: Path, batches: int, batch: int) -> Row:
    """edit-form replacing GENVAR in a copy of iterate.lisp with its own
    text, and compiling it."""
    assert tool(client, "load-system", system="iterate")["loaded"] is True
    source = directory / "iterate.lisp"
    shutil.copy(ITERATE, source)
    lines = len(source.read_text().splitlines())
    genvar = tool(client, "read-lisp-file", path=str(source), mode="form", form="defun genvar")["forms"][0]["text"]
    return measure(client, Query(
        lambda r: (f"edit-form replacing one defun (iterate's GENVAR) in iterate.lisp ({lines} lines), "
                   f"compiled ({len(r['compiled']['notes'])} notes)"),
        "edit-form", {"path": str(source), "form": "defun genvar", "text": genvar},
        [Symbol("cl-mcp-agent:edit-form-of"), str(source), Keyword("target"), "defun genvar",
         Keyword("text"), genvar]), batches, batch)


def main() -> None:
    """Print the rows alone."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer calls")
    server = Server(CL_MCP)
    server.initialize()
    try:
        for what, ours, theirs, ratio in rows(server, parser.parse_args().quick):
            print(f"{what:110} {ours:>10} {theirs:>36} {ratio:>6}", flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
