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

ANSWER = "test places"
DEFINERS = {"test": " (fiveam:is (eql :truth-harness nil))",
            "def-test": " (fiveam:is (eql :truth-harness nil))",
            "define-test": " (fiveam:is (eql :truth-harness nil))",
            "deftest": " :truth-harness"}
OPENING = re.compile(r"\((test|def-test|define-test|deftest)\s+\(?([^\s()]+)", re.I)



def code_lines(text: str) -> list[str]:
    """TEXT's lines with its strings, comments and characters (`#\\x`)
    blanked, so that a parenthesis left in them opens a form."""
    out, i, depth = [], 0, 0
    state = "code"  # or "string", "line-comment", "block-comment", "bars"
    while i < len(text):
        c, pair = text[i], text[i:i + 2]
        if c == "\n":
            out.append(c)
            state = "code" if state == "line-comment" else state
            i += 1
            continue
        if state == "code":
            if c == ";":
                state = "line-comment"
            elif c == '"':
                state = "string"
            elif pair == "#|":
                state, depth = "block-comment", 1
                out.append("  ")
                i += 2
                continue
            elif pair == "#\\" and i + 2 < len(text):
                out.append("   ")
                i += 3
                continue
            elif c == "\\" and i + 1 < len(text):
                out.append(text[i:i + 2] if text[i + 1] != "\n" else " \n")
                i += 2
                continue
            elif c == "|":
                state = "bars"
            out.append(c if state in ("code", "bars") else " ")
        elif state == "string" or state == "bars":
            if c == "\\" and i + 1 < len(text):
                if text[i + 1] == "\n":  # the newline is counted as a line's end
                    out.append(" " if state == "string" else c)
                    i += 1
                else:
                    out.append("  " if state == "string" else text[i:i + 2])
                    i += 2
                continue
            closing = '"' if state == "string" else "|"
            if c == closing:
                out.append(c if state == "bars" else " ")
                state = "code"
            else:
                out.append(" " if state == "string" else c)
        elif state == "block-comment":
            if pair in ("#|", "|#"):
                depth += 1 if pair == "#|" else -1
                state = "code" if depth == 0 else state
                out.append("  ")
                i += 2
                continue
            out.append(" ")
        else:
            out.append(" ")
        i += 1
    return "".join(out).split("\n")


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


def check_test_places(library: Library, tally: Tally, log=print, env: dict[str, str] | None = None) -> None:
    """Every test of LIBRARY made to fail, in a fresh cl-mcp (in ENV beside
    ours) that loads a fresh copy, and the place of each failure run-tests
    reports checked."""
    with tempfile.TemporaryDirectory(prefix="cl-mcp-truth-test-places-") as scratch:
        copy = copy_library(library, Path(scratch))
        expected: dict[str, tuple[str, int]] = {}
        for path in sorted(copy.rglob("*.lisp")):
            for name, line in failing_everywhere(path).items():
                expected[name] = (str(path), line)
        if not expected:
            return
        process = McpProcess("--max-result-chars", "1000000", env=env)
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
