"""The output store's line index: compact, counted against --keep-output,
and dropped with its output."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from hypothesis import given, strategies as st

from cl_mcp.results import outputs
from cl_mcp.results.outputs import Kept, Lines, NotKept, OutputStore, line_starts


def plain_starts(text: str) -> list[int]:
    """Where TEXT's lines start, found one newline at a time."""
    starts = [0] + [i + 1 for i, char in enumerate(text) if char == "\n"]
    if len(starts) > 1 and starts[-1] == len(text):
        starts.pop()
    return starts if text else []


@given(st.text(alphabet="ab\n\u2028é", max_size=60), st.integers(1, 8))
def test_line_starts_are_where_each_line_starts_whatever_the_chunks(text: str, chunk: int) -> None:
    original = outputs._CHUNK
    outputs._CHUNK = chunk
    try:
        assert list(line_starts(text)) == plain_starts(text)
    finally:
        outputs._CHUNK = original


def test_the_index_of_a_million_short_lines_costs_4_bytes_a_line() -> None:
    text = "a\n" * 1_000_000
    gc.collect()
    tracemalloc.start()
    try:
        lines = Lines(text)
        size, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(lines) == 1_000_000 and lines.index_size() == 4_000_000
    assert size < 4_100_000 and peak < 6_000_000  # a list of ints took ~40 MB


def test_the_index_counts_against_the_limit_and_goes_with_its_output() -> None:
    store = OutputStore(limit=1_000)
    store.keep(1, Kept("x\n" * 100, "", ""))  # 200 characters, 100 lines
    store.keep(2, Kept("y" * 300, "", ""))
    lines = store.lines(1, "stdout")
    assert lines.index_size() == 400
    assert store.lines(1, "stdout") is lines  # kept indexed
    store.keep(3, Kept("z" * 200, "", ""))  # 200 + 400 + 300 + 200 > 1,000: evaluation 1 goes
    with pytest.raises(NotKept):
        store.get(1)
    assert store._indexed is None and store._size == 500
    assert store.get(2).stdout == "y" * 300


def test_reading_an_older_output_past_the_limit_drops_the_others_oldest_first() -> None:
    store = OutputStore(limit=1_000)
    store.keep(1, Kept("x\n" * 200, "", ""))  # 400 characters, 200 lines: an index of 800
    store.keep(2, Kept("y" * 100, "", ""))
    assert len(store.lines(1, "stdout")) == 200
    with pytest.raises(NotKept):
        store.get(2)
    store.lines(1, "stderr")  # another stream's index replaces it
    assert store._size == 400
