"""LinePattern: a pattern anchored at line starts, searched by its newline,
finds the lines the plain MULTILINE search finds."""

from __future__ import annotations

import re

from hypothesis import given, strategies as st

from cl_mcp.linepattern import LinePattern, branches_at_top
from cl_mcp.outputs import Lines
from cl_mcp.tools.output import search

# Atoms that never match a newline, so that no match spans lines and both
# ways of searching must give the same lines.
ATOMS = ["a", "|", "b", "[ab]", "a*", "b+", "(a|b)", "(?:ab|b)", ".", "$", "^", "a?", r"\w", "[|]", "(?#|)"]


def plain_lines(pattern: str, text: str) -> list[int]:
    lines = Lines(text)
    found = [lines.line_at(match.start()) for match in re.finditer(pattern, text, re.MULTILINE)
             if not (match.start() == len(text) and text)]
    return sorted(set(found))


def fast_lines(pattern: str, text: str) -> list[int]:
    lines = Lines(text)
    return sorted({lines.line_at(start) for start in LinePattern(pattern).starts(text)
                   if not (start == len(text) and text)})


@given(st.lists(st.sampled_from(ATOMS), max_size=4).map("".join),
       st.text(alphabet="ab\n", max_size=40))
def test_an_anchored_pattern_finds_the_lines_the_plain_search_finds(rest: str, text: str) -> None:
    pattern = "^" + rest
    assert fast_lines(pattern, text) == plain_lines(pattern, text)


def test_an_anchored_pattern_is_searched_by_its_newline() -> None:
    assert LinePattern("^ERROR").after_newline is not None
    assert LinePattern("^(a|b)c").after_newline is not None
    assert LinePattern("^[|]x").after_newline is not None


def test_a_pattern_that_anchors_only_its_first_branch_is_searched_as_written() -> None:
    pattern = LinePattern("^a|b")
    assert pattern.after_newline is None
    assert fast_lines("^a|b", "xb\na\nc") == [1, 2]


def test_branches_at_top_skips_groups_classes_escapes_and_comments() -> None:
    assert branches_at_top("a|b")
    assert not branches_at_top("(a|b)")
    assert not branches_at_top("[|]")
    assert not branches_at_top("[]|]")
    assert not branches_at_top("[^]|]")
    assert not branches_at_top(r"a\|b")
    assert not branches_at_top("(?#(|)x")
    assert branches_at_top("(?#()a|b")


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
