"""The test places oracle: every test of a library made to fail, and
run-tests' place of each failure checked against where its defining form
starts.

In a fresh copy of the library, each top-level form of its files that
defines a test (FiveAM's `test` and `def-test`, split-sequence's `define-test`, RT's
`deftest`) gets one more thing to check, written before its closing
parenthesis on the same line, so that no line moves: a FiveAM check that
fails, `(fiveam:is (eql :truth-harness nil))`, or one more value RT must
see, `:truth-harness`.  run-tests of the system then reports each of
those tests as failed (or errored, when an earlier check errs); each
report's place must be in the test's file, at the line its form starts.
A test the run does not report (a suite its test-op does not run, one past
the 200 problems run-tests lists) is not checked, nor is a test that
mentions circular lists: RT would print its failing value without end.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from tests.integration.conftest import McpProcess
from tests.truth.corpus import Library, copy_library, load_copy
from tests.truth.places import Tally, short
from tests.truth.xref import code_lines

ANSWER = "test places"
DEFINERS = {"test": " (fiveam:is (eql :truth-harness nil))",
            "def-test": " (fiveam:is (eql :truth-harness nil))",
            "define-test": " (fiveam:is (eql :truth-harness nil))",
            "deftest": " :truth-harness"}
OPENING = re.compile(r"\((test|def-test|define-test|deftest)\s+\(?([^\s()]+)", re.I)


def failing_everywhere(path: Path) -> dict[str, int]:
    """Make every test defined at the top level of PATH fail; each test's
    name (bare, upper-case) and the line its form starts."""
    text = path.read_text(encoding="utf-8")
    code = "\n".join(code_lines(text)).ljust(len(text))  # its last newline ends no line
    tests: dict[str, int] = {}
    inserts: list[tuple[int, str]] = []
    depth, start = 0, None
    for index, char in enumerate(code):
        if char == "(":
            if depth == 0:
                start = index
            depth += 1
        elif char == ")" and depth > 0:
            depth -= 1
            if depth == 0 and start is not None and (start == 0 or text[start - 1] == "\n"):
                opening = OPENING.match(text, start)
                # A failing test whose value is circular would have RT print
                # it without end (alexandria's, in a plain SBCL too).
                if opening and "circular" not in text[start:index].lower():
                    line = text.count("\n", 0, start) + 1
                    tests[opening.group(2).rsplit(":", 1)[-1].upper()] = line
                    inserts.append((index, DEFINERS[opening.group(1).lower()]))
    for index, addition in reversed(inserts):
        text = text[:index] + addition + text[index:]
    path.write_text(text, encoding="utf-8")
    return tests


def defined(name: str, expected: dict[str, tuple[str, int]]) -> str | None:
    """The name of the form that defined the test NAME: NAME, or NAME less
    its last parts (split-sequence's DEFINE-TEST FOO makes FOO.VECTOR and
    FOO.LIST); None when no form of EXPECTED did."""
    while name not in expected and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in expected else None


def check_test_places(library: Library, tally: Tally, log=print) -> None:
    """Every test of LIBRARY made to fail, in a fresh cl-mcp that loads a
    fresh copy, and the place of each failure run-tests reports checked."""
    with tempfile.TemporaryDirectory(prefix="cl-mcp-truth-test-places-") as scratch:
        copy = copy_library(library, Path(scratch))
        expected: dict[str, tuple[str, int]] = {}
        for path in sorted(copy.rglob("*.lisp")):
            for name, line in failing_everywhere(path).items():
                expected[name] = (str(path), line)
        if not expected:
            return
        process = McpProcess("--max-result-chars", "1000000")
        try:
            process.initialize()
            load_copy(process, library, copy)
            result = process.call("run-tests", wait=1000, system=library.system, timeout=900,
                                  **{"answer-within": 900})
        finally:
            process.close(60)
    tests = (result.get("structuredContent") or {}).get("tests")
    if tests is None:
        tally.count(ANSWER, "run", f"no results: {result['content'][0]['text'][:300]}")
        return
    seen = 0
    for problem in tests.get("problems", []):
        name = defined(problem["test"].rsplit(":", 1)[-1].upper(), expected)
        if name is None:
            continue
        seen += 1
        file, line = expected[name]
        place = problem.get("place") or {}
        got = (place.get("file"), place.get("line"))
        tally.count(ANSWER, "test", None if got == (file, line) else
                    f"{name}: placed at {got[0] and short(got[0])}:{got[1]}, its form starts at {short(file)}:{line}")
    log(f"  test places: {len(expected)} tests made to fail, {seen} reported")
