"""The test-results oracle: a library's tests run in a plain `sbcl
--non-interactive` (`asdf:test-system`, the framework's own runner), what
the framework prints read back, and run-tests' answer for the same system
compared with it, total by total and failed test by failed test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tests.integration.conftest import McpProcess
from tests.truth.corpus import Library, loaded
from tests.truth.places import Tally

# FiveAM's run! (explain!), and RT's and SB-RT's do-tests.
FIVEAM_TOTALS = re.compile(r"Did (\d+) checks?\.\s+Pass: (\d+) .*?\s+Skip: (\d+) .*?\s+Fail: (\d+)", re.S)
FIVEAM_FAILED = re.compile(r"^ -{32}\n (\S+) .*: *$", re.M)
RT_FAILED = re.compile(r"(\d+) out of (\d+) total tests failed: (.*?)\.\n", re.S)
RT_TOTAL = re.compile(r"Doing (\d+) pending tests? of (\d+) tests? total\.")
# After a run's failures, when it has an *expected-failures* list.
RT_UNEXPECTED = re.compile(r"(\d+) unexpected failures: (.*?)\.(?=[\s;]|$)", re.S)


@dataclass
class Printed:
    """What a framework printed of one run: its name, its totals (FiveAM's
    checks, RT's tests) and each failed test's name (bare, upper-case) as
    often as it failed."""

    framework: str | None
    totals: dict[str, int] = field(default_factory=dict)
    failed: Counter[str] = field(default_factory=Counter)
    expected: Counter[str] = field(default_factory=Counter)


def bare(name: str) -> str:
    """NAME without its package, upper-case."""
    return name.rsplit(":", 1)[-1].strip().upper()


def parse(text: str) -> Printed:
    """The framework's printout TEXT read back; framework None when neither
    FiveAM's nor RT's summary is in it (a runner of the library's own)."""
    # FiveAM's self-tests run inner suites and print their summaries
    # first: the outermost run's summary is the last.
    totals = FIVEAM_TOTALS.findall(text)
    if totals:
        checks, passed, skipped, failed = map(int, totals[-1])
        details = text[text.rfind("Did "):] if failed else ""
        return Printed("FiveAM", {"checks": checks, "passed": passed, "skipped": skipped, "failed": failed},
                       Counter(bare(name) for name in FIVEAM_FAILED.findall(details)))
    # RT's do-tests may run more than once (alexandria's: interpreted, then
    # compiled): each run's tests and failures count.
    runs = RT_TOTAL.findall(text)
    if not runs:
        return Printed(None)
    ran = sum(int(total) for _, total in runs)
    names: list[str] = []
    expected: Counter[str] = Counter()
    for failures in RT_FAILED.finditer(text):
        failed = [bare(name) for name in re.split(r",\s*", failures.group(3))]
        names += failed
        # With an *expected-failures* list, RT says which were unexpected
        # (or that none was); without one, none was expected.
        after = text[failures.end():]
        if after.startswith("No unexpected failures."):
            expected.update(failed)
        elif unexpected := RT_UNEXPECTED.match(after):
            new = {bare(name) for name in re.split(r",\s*", unexpected.group(2))}
            expected.update(name for name in failed if name not in new)
    return Printed("RT", {"tests": ran, "passed": ran - len(names), "failed": len(names),
                          "expected to fail": sum(expected.values())}, Counter(names), expected)


def framework_run(library: Library, copy: Path, timeout: float = 600) -> str | None:
    """What `asdf:test-system` of LIBRARY's system prints in a plain SBCL,
    with COPY registered first, as cl-mcp's image has it; None when it
    does not end within TIMEOUT seconds (bordeaux-threads' suite can hang
    in CONDITION-VARIABLE)."""
    forms = ["(require :asdf)", f'(push #p"{copy}/" asdf:*central-registry*)',
             f'(asdf:test-system "{library.system}")']
    try:
        done = subprocess.run(["sbcl", "--non-interactive", "--no-userinit",
                               *(argument for form in forms for argument in ("--eval", form))],
                              capture_output=True, text=True, timeout=timeout, env=os.environ.copy())
    except subprocess.TimeoutExpired:
        return None
    return done.stdout + done.stderr


def answered(tests: dict) -> Printed:
    """run-tests' structured `tests` in the oracle's terms."""
    problems = tests.get("problems", [])
    failed = Counter(bare(p["test"]) for p in problems)
    expected = Counter(bare(p["test"]) for p in problems if p.get("expectedToFail"))
    framework = tests["frameworks"][0] if tests.get("frameworks") else None
    totals = {"passed": tests.get("passed", 0), "skipped": tests.get("skipped", 0),
              "failed": tests.get("failed", 0) + tests.get("errored", 0)}
    if framework == "FiveAM":
        totals["checks"] = sum(totals.values())
    elif framework:
        totals["tests"] = totals["passed"] + totals["failed"]
        totals["expected to fail"] = tests.get("expectedFailures", 0)
        del totals["skipped"]
    return Printed(framework, totals, failed, expected)


def compare(tally: Tally, printed: Printed, got: Printed) -> None:
    """Count run-tests' answer GOT against the framework's PRINTED one: each
    total, and each test the framework printed as failed (or run-tests
    did), right when both say the same."""
    if printed.framework is None:
        tally.count("test results", "framework", None if got.framework is None else
                    f"run-tests recognised {got.framework} where the library runs its own tests")
        return
    tally.count("test results", "framework", None if got.framework == printed.framework else
                f"framework {got.framework}, printed {printed.framework}")
    for total, value in printed.totals.items():
        tally.count("test results", "total", None if got.totals.get(total) == value else
                    f"{total}: run-tests {got.totals.get(total)}, the framework {value}")
    for name in sorted(set(printed.failed) | set(got.failed)):
        wrong = []
        if printed.failed[name] != got.failed[name]:
            wrong.append(f"failed {got.failed[name]} times, the framework says {printed.failed[name]}")
        if printed.expected[name] != got.expected[name]:
            wrong.append(f"expected {got.expected[name]}, the framework says {printed.expected[name]}")
        tally.count("test results", "failed test", f"{name}: {'; '.join(wrong)}" if wrong else None)


def check_tests(process: McpProcess, library: Library, copy: Path, tally: Tally) -> None:
    """run-tests of LIBRARY (loaded from COPY in PROCESS) against the
    framework's printout of the same run in a plain SBCL."""
    printout = framework_run(library, copy)
    if printout is None:
        print(f"  {library.system}: its tests did not end in a plain SBCL: not checked", file=sys.stderr)
        return
    printed = parse(printout)
    result = process.call("run-tests", wait=1000, system=library.system, timeout=900, **{"answer-within": 900})
    tests = (result.get("structuredContent") or {}).get("tests")
    if tests is None:
        tally.count("test results", "run", f"no results: {result['content'][0]['text'][:300]}")
        return
    compare(tally, printed, answered(tests))


def check_library_tests(library: Library, tally: Tally, env: dict[str, str] | None = None) -> None:
    """The test results of LIBRARY, in a fresh cl-mcp (embedded, in ENV
    beside ours) that loads a fresh copy of it, counted in TALLY; none when
    its suite can hang."""
    if library.untested:
        print(f"  {library.system}: tests not checked: {library.untested}", file=sys.stderr)
        return
    with loaded(library, env=env) as (process, copy):
        check_tests(process, library, copy, tally)
