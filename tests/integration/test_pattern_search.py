"""read-output's pattern cannot stall the server: a pattern that makes a
backtracking search exponential answers at once, and a search that takes
long over megabytes leaves ping and the other calls answered meanwhile."""

import json

import pytest

from tests.integration.conftest import McpProcess
from tests.integration.test_intake import resident_kib

QUICK = 10.0  # seconds: far beyond what these searches take, far below what backtracking takes


@pytest.fixture(scope="module")
def lisp():
    process = McpProcess()
    process.initialize()
    yield process
    process.proc.kill()  # before the fix, still searching
    process.proc.wait()


def output_of(lisp, code: str) -> int:
    result = lisp.call("evaluate-lisp", code=code)
    assert not result["isError"], result
    return result["structuredContent"]["number"]


def search_with_ping(lisp, number: int, pattern: str) -> tuple[dict, bool]:
    """read-output of PATTERN over NUMBER's output with a ping sent right
    after it: the search's result, and whether ping was answered first."""
    searching = lisp.start_request("tools/call", {"name": "read-output",
                                                  "arguments": {"evaluation": number, "pattern": pattern}})
    pinging = lisp.start_request("ping")
    assert lisp.response(pinging, QUICK)["result"] == {}
    result = lisp.response(searching, QUICK)["result"]
    answers = [json.loads(line).get("id") for line in lisp.raw_lines]
    return result, [each for each in answers if each in (searching, pinging)] == [pinging, searching]


def test_a_pattern_exponential_for_backtracking_answers_at_once(lisp):
    # Python's re took 2.6 s over 25 a's and a "!", doubling with each a.
    number = output_of(lisp, '(progn (write-string (make-string 100000 :initial-element #\\a)) '
                             '(write-line "!") (write-line "aaaa"))')
    result, _ = search_with_ping(lisp, number, "(a+)+$")
    assert not result["isError"], result
    assert result["structuredContent"]["matches"] == 1
    assert result["structuredContent"]["lines"][-1] == "      2: aaaa"


def test_ping_is_answered_while_a_long_search_runs(lisp):
    # 3 MB of random x and y: RE2's DFA cannot cache this pattern's states,
    # and its NFA takes about a second; the search runs beside the loop.
    number = output_of(lisp, '(let ((*random-state* (sb-ext:seed-random-state 7)) '
                             '(line (make-string 99))) '
                             '(dotimes (i 30000) (dotimes (j 99) (setf (char line j) (if (zerop (random 2)) #\\x #\\y))) '
                             '(write-line line)) :done)')
    result, ping_first = search_with_ping(lisp, number, "[xy]*x[xy]{30}z")
    assert ping_first, "the search answered before ping"
    assert not result["isError"], result
    assert result["structuredContent"]["matches"] == 0


def test_a_pattern_is_at_most_10000_characters(lisp):
    """A 20 MB pattern held ping up 1.4 s while RE2 compiled (and refused) it."""
    number = output_of(lisp, '(write-line "xx")')
    result = lisp.call("read-output", evaluation=number, pattern="x" * 10_001)
    assert result["isError"], result
    assert result["content"][0]["text"].endswith("at /pattern: must be at most 10000 characters long, not 10001")
    result = lisp.call("read-output", evaluation=number, pattern="x" * 10_000)
    assert not result["isError"] and result["structuredContent"]["matches"] == 0, result


def test_an_anchored_pattern_with_an_open_quote_is_searched(lisp):
    r"""RE2 takes ^\Qa|b (the quote runs to the end); the search by the
    newline before it refused it."""
    number = output_of(lisp, '(format t "a|b~%ab~%x a|b~%a|b c~%")')
    result = lisp.call("read-output", evaluation=number, pattern=r"^\Qa|b")
    assert not result["isError"], result
    assert result["structuredContent"]["matches"] == 2
    assert [line for line in result["structuredContent"]["lines"] if line[7] == ":"] == [
        "      1: a|b", "      4: a|b c"]


def test_the_line_index_of_millions_of_short_lines_stays_small(lisp):
    """8,000,000 lines of "a" (16 MB): reading 3 of them took cl-mcp from
    41 to 348 MiB (a list of ints, about 40 bytes a line); the index is 4
    bytes a line (31 MiB)."""
    result = lisp.call("evaluate-lisp", code='(dotimes (i 8000000) (write-line "a"))', wait=300)
    number = result["structuredContent"]["number"]
    before = resident_kib(lisp.proc.pid)
    read = lisp.call("read-output", evaluation=number, offset=2, length=3, wait=300)
    assert read["structuredContent"]["lines"] == ["      2: a", "      3: a", "      4: a"]
    searched = lisp.call("read-output", evaluation=number, pattern="^b", wait=300)
    assert searched["structuredContent"]["matches"] == 0
    growth = resident_kib(lisp.proc.pid) - before
    print(f"cl-mcp grew {growth} KiB")
    assert growth < 100 * 1024
