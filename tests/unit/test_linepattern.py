"""LinePattern: RE2 finds the lines Python's MULTILINE search finds; a
pattern anchored at line starts, searched by its newline, finds the lines
the plain search finds; a pattern that backtracking makes exponential
takes linear time; a pattern RE2 refuses says why."""

from __future__ import annotations

import bisect
import re
import time

import pytest
from hypothesis import assume, example, given, strategies as st

from cl_mcp.results.linepattern import LinePattern, PatternError, Shape, compiled, shape
from cl_mcp.results.outputs import Lines
from cl_mcp.tools.output import search

# Atoms that never match a newline, so that no match spans lines and both
# ways of searching must give the same lines.
ATOMS = ["a", "|", "b", "[ab]", "a*", "b+", "(a|b)", "(?:ab|b)", ".", "$", "^", "a?", r"\w", "[|]"]
# RE2's own syntax, where a scan for the top-level "|" could go wrong.
RE2_ATOMS = [*ATOMS, r"\Q(|\E", r"\Qa", "[[:alpha:](|]", "[[:alpha:]]", "[a[]", "[[:a]", "[]|(]", "[^]|]",
             "(", ")", "(?i)", "(?i:a|B)", r"\|", "*", "{2}", r"[\]|]", r"\z"]


def plain_lines(pattern: str, text: str) -> list[int]:
    """PATTERN's lines in TEXT by Python's re (an empty TEXT has none, and
    no line starts past a final newline)."""
    lines = Lines(text)
    found = [bisect.bisect_right(lines.starts, match.start()) for match in re.finditer(pattern, text, re.MULTILINE)
             if text and not (match.start() == len(text) and text.endswith("\n"))]
    return sorted(set(found))


def fast_lines(pattern: str, text: str) -> list[int]:
    return list(LinePattern(pattern).lines(text))


def unanchored_lines(pattern: str, text: str) -> list[int]:
    """PATTERN's lines in TEXT, searched as written, never by its newline."""
    plain = LinePattern(pattern)
    plain.after_newline = None
    return list(plain.lines(text))


@given(st.lists(st.sampled_from(ATOMS), max_size=4).map("".join),
       st.text(alphabet="ab\n", max_size=40))
def test_an_anchored_pattern_finds_the_lines_the_plain_search_finds(rest: str, text: str) -> None:
    pattern = "^" + rest
    assert fast_lines(pattern, text) == plain_lines(pattern, text)


@given(st.lists(st.sampled_from(ATOMS), max_size=4).map("".join),
       st.text(alphabet="ab\n", max_size=40))
def test_any_pattern_finds_the_lines_pythons_search_finds(pattern: str, text: str) -> None:
    assert fast_lines(pattern, text) == plain_lines(pattern, text)


@given(st.lists(st.sampled_from(RE2_ATOMS), max_size=5).map("".join),
       st.text(alphabet="ab|(]\nA", max_size=40))
@example(r"\Q(\E|b", "ab\nab")
@example("[[:alpha:](]|b", "ab\nab")
@example(r"\Qa|b", "a|b\nab")
@example("\\Qa\\", "a\\\nab")
def test_searched_by_its_newline_or_as_written_the_lines_are_the_same(rest: str, text: str) -> None:
    """Every pattern RE2 takes as written is taken, and found the same
    lines whichever way it is searched."""
    pattern = "^" + rest
    try:
        compiled(f"(?m){pattern}")
    except PatternError:
        assume(False)
    assert fast_lines(pattern, text) == unanchored_lines(pattern, text)


def test_an_exponential_pattern_for_backtracking_takes_linear_time() -> None:
    text = ("a" * 100_000 + "!\n") * 10
    started = time.perf_counter()
    assert fast_lines("(a+)+$", text) == []
    assert time.perf_counter() - started < 1.0  # Python's re: 2.6 s for 25 a's, doubling with each


@pytest.mark.parametrize("pattern, reason", [
    (r"(a)\1", r"invalid escape sequence: \1"),
    ("a(?=b)", "invalid perl operator: (?="),
    ("(?<=a)b", "invalid perl operator: (?<="),
    ("(", "missing ): ("),
])
def test_a_pattern_re2_refuses_says_why(pattern: str, reason: str) -> None:
    with pytest.raises(PatternError) as refused:
        LinePattern(pattern)
    assert str(refused.value) == reason


def test_an_anchored_pattern_is_searched_by_its_newline() -> None:
    assert LinePattern("^ERROR").after_newline is not None
    assert LinePattern("^(a|b)c").after_newline is not None
    assert LinePattern("^[|]x").after_newline is not None


def test_a_pattern_that_anchors_only_its_first_branch_is_searched_as_written() -> None:
    pattern = LinePattern("^a|b")
    assert pattern.after_newline is None
    assert fast_lines("^a|b", "xb\na\nc") == [1, 2]


def test_shape_skips_groups_classes_escapes_and_quotes() -> None:
    assert shape("a|b").branches
    assert not shape("(a|b)").branches
    assert not shape("[|]").branches
    assert not shape("[]|]").branches
    assert not shape("[^]|]").branches
    assert not shape(r"a\|b").branches
    assert shape(r"\Qa|b\E") == Shape(False, False)
    assert shape(r"\Q(\E|b").branches
    assert shape("[[:alpha:](]|b").branches
    assert shape(r"\Qa|b") == Shape(False, True)


def test_line_one_and_the_last_line_are_found() -> None:
    text = "ERROR first\nfine\nERROR last"
    assert fast_lines("^ERROR", text) == [1, 3]


def test_search_shows_matches_with_context_and_counts_them() -> None:
    lines = Lines("".join(f"line {i}\n" for i in range(1, 101)) + "marker here\n")
    shown, count, more = search(lines, LinePattern("^marker"), 10_000)
    assert (count, more) == (1, None)
    assert shown == ["    100- line 100", "    101: marker here"]


def test_an_empty_line_pattern_does_not_count_the_end_of_a_final_newline() -> None:
    lines = Lines("a\n\nb\n")
    shown, count, _ = search(lines, LinePattern("^$"), 10_000)
    assert count == 1
    assert "      2: " in shown


def test_non_ascii_text_and_a_lone_surrogate_keep_their_line_numbers() -> None:
    text = "é\ud800\nλ b\n日本 b\n"
    assert fast_lines("b", text) == [2, 3]
    assert fast_lines("^λ", text) == [2]
    assert fast_lines("^.$", "é\nab\nλ") == [1, 3]
