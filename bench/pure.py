"""Micro-benchmarks of the pure layers, each alternative measured in the
same run: the s-expression reader's fast path against the general reader,
on the replies cl-mcp reads; cl-mcp's compiled schema checks against
fastjsonschema, on the checks it runs per message and at start-up.

    .venv/bin/python bench/pure.py [--quick]    (bench/run.py adds its rows to docs/performance.md)

Each figure is the median, over alternating rounds (A, then B, and again),
of the mean time per call within a round, so that both sides of a ratio see
the same moments of a noisy shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import fastjsonschema

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cl_mcp.wire import sexp  # noqa: E402
from cl_mcp.wire.contracts import Schema, params_schema, shared_type, tool_definitions, tool_schema  # noqa: E402

Row = tuple[str, str, str, str]  # what, ours, the alternative, the ratio

# Replies as the image writes them (captured from cl-mcp-agent:evaluate):
# a quick evaluation; one with output and warnings; 1 MB of output (what
# --max-output keeps); a 1 MB string value (printed with its quotes, so it
# holds two escapes); a string value with 20,000 quotes and backslashes in
# it (80,000 escapes once printed twice).
REPLIES = {
    "the (+ 1 2) reply": '(:return (:ok (:status :ok :package "COMMON-LISP-USER" :values ("3"))) 42)',
    "a reply with output and warnings": (
        '(:return (:ok (:warnings (("SIMPLE-WARNING" "careful: \\"x\\"") ("SIMPLE-WARNING" '
        '"undefined variable: COMMON-LISP-USER::Y")) :stdout "hello\nworld λ\n" :status :ok '
        ':package "COMMON-LISP-USER" :values ("1" "2.5d0" "1/3" "1267650600228229401496703205376"))) 2)'),
    "1 MB of output": ('(:return (:ok (:stdout ' + sexp.dumps(("x" * 99 + "\n") * 10_000)
                       + ' :stdout-dropped 9000000 :status :ok :package "COMMON-LISP-USER" :values ("NIL"))) 5)'),
    "a 1 MB string value": ('(:return (:ok (:status :ok :package "COMMON-LISP-USER" :values ('
                            + sexp.dumps(sexp.dumps("x" * 1_000_000)) + '))) 3)'),
    "a string value with 80,000 escapes": ('(:return (:ok (:status :ok :package "COMMON-LISP-USER" :values ('
                                           + sexp.dumps(sexp.dumps('a"b\\c' * 20_000)) + '))) 4)'),
}


def per_call(call: Callable[[Any], object], argument: Any, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call(argument)
    return (time.perf_counter() - started) / calls


def alternating(first: Callable[[Any], object], second: Callable[[Any], object], argument: Any,
                rounds: int, calls: int) -> tuple[float, float]:
    """Median seconds per call of FIRST and SECOND on ARGUMENT."""
    firsts, seconds = [], []
    for _ in range(rounds):
        firsts.append(per_call(first, argument, calls))
        seconds.append(per_call(second, argument, calls))
    return statistics.median(firsts), statistics.median(seconds)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs"


def calls_per_round(text: str) -> int:
    """Enough calls for a round of about a millisecond or more."""
    return max(1, 1000 // max(1, len(text) // 100))


def reader_rows(rounds: int) -> list[Row]:
    """`sexp.loads` (the fast path, the general reader when it declines)
    against the general reader alone, per reply."""
    rows = []
    for what, text in REPLIES.items():
        assert repr(sexp.loads(text)) == repr(sexp._loads_any(text)), what
        ours, general = alternating(sexp.loads, sexp._loads_any, text, rounds, calls_per_round(text))
        rows.append((f"sexp.loads, {what} ({len(text.encode()):,} B)", us(ours),
                     f"general reader alone {us(general)}", f"{ours / general:.2f}×"))
    return rows


def fastjsonschema_check(schema: dict[str, Any]) -> Callable[[Any], bool]:
    """fastjsonschema's verdict as a predicate.  use_default=False: by
    default it writes schema defaults into the instance."""
    validate = fastjsonschema.compile(schema, use_default=False)

    def is_valid(instance: Any) -> bool:
        try:
            validate(instance)
        except fastjsonschema.JsonSchemaValueException:
            return False
        return True
    return is_valid


def per_message_checks() -> list[tuple[str, Schema, Any, bool]]:
    """The checks a tools/call of evaluate-lisp passes, each with a valid
    instance and an invalid one."""
    request = shared_type("JsonRpcRequest")
    call = params_schema("tools-call-params")
    evaluate = tool_schema(next(tool["inputSchema"] for tool in tool_definitions()
                                if tool["name"] == "evaluate-lisp"))
    arguments = {"code": "(+ 1 2)"}
    return [
        ("JsonRpcRequest", request, {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                                     "params": {"name": "evaluate-lisp", "arguments": arguments}}, True),
        ("JsonRpcRequest", request, {"jsonrpc": "2.0", "id": True, "method": "tools/call"}, False),
        ("tools-call-params", call, {"name": "evaluate-lisp", "arguments": arguments}, True),
        ("tools-call-params", call, {"name": "evaluate-lisp", "arguments": []}, False),
        ("evaluate-lisp arguments", evaluate, arguments, True),
        ("evaluate-lisp arguments", evaluate, {**arguments, "timeout": 0}, False),
    ]


def schema_rows(rounds: int) -> list[Row]:
    rows = []
    for what, schema, instance, valid in per_message_checks():
        theirs = fastjsonschema_check(schema.schema)
        assert schema.is_valid(instance) is theirs(instance) is valid, (what, instance)
        ours, other = alternating(schema.is_valid, theirs, instance, rounds, 1000)
        rows.append((f"schema check, {what}, {'valid' if valid else 'invalid'}", us(ours),
                     f"fastjsonschema {us(other)}", f"{ours / other:.2f}×"))
    return rows


# The checks cl-mcp builds before it answers initialize: every tool's
# arguments, JsonRpcRequest and initialize-params.  Timed in a fresh
# process that has imported what cl-mcp has by then, from the checker's
# import on.
_STARTUP = """
import json, sys, time
from importlib import resources
import cl_mcp.cli.main

def load(name):
    return json.loads(resources.files("cl_mcp.schemas").joinpath(name).read_text("utf-8"))

shared = load("shared-types.json")
schemas = [tool["inputSchema"] for tool in load("tools.json")] + [
    {"$ref": "#/definitions/JsonRpcRequest", "definitions": shared["definitions"]},
    load("initialize-params.json")]
started = time.perf_counter()
if sys.argv[1] == "fastjsonschema":
    import fastjsonschema
    checks = [fastjsonschema.compile(schema, use_default=False) for schema in schemas]
else:
    from cl_mcp.wire.schema_check import compile_schema
    checks = [compile_schema(schema) for schema in schemas]
print(time.perf_counter() - started)
"""


def startup_seconds(checker: str) -> float:
    result = subprocess.run([sys.executable, "-c", _STARTUP, checker], cwd=ROOT, check=True,
                            capture_output=True, text=True)
    return float(result.stdout)


def startup_row(rounds: int) -> Row:
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(startup_seconds("schema_check"))
        theirs.append(startup_seconds("fastjsonschema"))
    mine, other = statistics.median(ours), statistics.median(theirs)
    return ("schema checks built at start-up (import and compile)", f"{mine * 1e3:.1f} ms",
            f"fastjsonschema {other * 1e3:.1f} ms", f"{mine / other:.2f}×")


def rows(quick: bool = False) -> list[Row]:
    rounds = 7 if quick else 31
    return [*reader_rows(rounds), *schema_rows(rounds), startup_row(3 if quick else 11)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    for what, ours, other, ratio in rows(parser.parse_args().quick):
        print(f"{what:62} {ours:>14} {other:>36} {ratio:>8}", flush=True)


if __name__ == "__main__":
    main()
