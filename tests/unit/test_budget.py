"""The result budget's pure layer: cuts that keep a text's start and end
within a budget, and structured content that stays within it too."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from cl_mcp.results.budget import MARKER_ROOM, cut_middle, fit_parts, fit_structure, fit_text, json_size, shares
from cl_mcp.results.outputs import Kept, Lines, NotKept, OutputStore


def how(line, lines):
    return f"read {line}+{lines}"


def test_a_text_that_fits_is_left_alone():
    assert cut_middle("short", 10, how) == "short"


def test_a_cut_keeps_whole_lines_from_both_ends_and_counts_what_it_left_out():
    text = "".join(f"line {i}\n" for i in range(1000))
    cut = cut_middle(text, 200, how)
    head, marker, tail = cut.partition("\n… [")
    assert head.startswith("line 0\nline 1\n") and tail.endswith("line 999\n")
    first_left_out = head.count("\n") + 2
    shown = (head + "\n").count("\n") + tail.partition("]\n")[2].count("\n")
    assert f"left out: read {first_left_out}+{1000 - shown}]" in cut
    left_out = int(cut.split("… [")[1].split(" characters")[0].replace(",", ""))
    assert left_out == len(text) - len(head) - 1 - len(tail.partition("]\n")[2])


@settings(max_examples=200)
@given(st.text(), st.integers(min_value=0, max_value=500))
def test_a_cut_never_exceeds_its_room_plus_one_marker(text, room):
    cut = cut_middle(text, room, how)
    if len(text) <= room:
        assert cut == text
    else:
        assert len(cut) <= room + 1 + len("… [999,999 characters in 999,999 lines left out: read 999999+999999]\n")


def test_shares_give_short_parts_all_they_need():
    assert shares({"a": 10, "b": 1000, "c": 1000}, 610) == {"a": 10, "b": 300, "c": 300}


@settings(max_examples=100)
@given(st.dictionaries(st.sampled_from(["stdout", "stderr", "v"]), st.text(min_size=0, max_size=3000)),
       st.integers(min_value=1000, max_value=4000))
def test_parts_fit_a_budget_to_the_character(parts, budget):
    def size(cut):
        return len("\n\n".join(f"[{name}]\n{text}" for name, text in cut.items()))
    fitted = fit_parts(parts, size, budget, lambda name, line, lines: f"read {name} {line}")
    assert size(fitted) <= budget
    for name, text in parts.items():
        if len(text) < 100:
            assert fitted[name] == text


@settings(max_examples=100)
@given(st.text(max_size=50_000), st.integers(min_value=1000, max_value=20_000))
def test_any_text_fits(text, budget):
    assert len(fit_text(text, budget)) <= budget


def test_structured_content_fits_with_its_shape_kept():
    structure = {"success": True, "stdout": "x\n" * 30_000, "values": ["\"" + "a" * 40_000 + "\""],
                 "symbols": [{"name": f"S{i}", "kinds": ["function"]} for i in range(5000)]}
    fitted = fit_structure(structure, 5000)
    assert len(json.dumps(fitted, ensure_ascii=False)) <= 5000
    assert set(fitted) == set(structure) and isinstance(fitted["values"][0], str)
    assert fitted["stdout"].startswith("x\n") and fitted["stdout"].endswith("x\n")
    assert all(set(item) == {"name", "kinds"} for item in fitted["symbols"])


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=300),
    lambda children: st.lists(children, max_size=300) | st.dictionaries(st.sampled_from("abc"), children),
    max_leaves=400)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(["list", "name", "more"]), JSON_VALUES, min_size=1),
       st.integers(min_value=200, max_value=3000))
def test_any_structure_fits_with_its_shape_kept(structure, size):
    fitted = fit_structure(structure, size)
    if json_size(least(structure)) <= size // 2:
        assert json_size(fitted) <= size
    assert same_shape(fitted, structure)


def least(value):
    """Less than this fit_structure cannot make: every list down to its
    first item, a short string whole (it is never cut), and a long one in
    the room its marker takes."""
    if isinstance(value, dict):
        return {key: least(item) for key, item in value.items()}
    if isinstance(value, list):
        return [least(item) for item in value[:1]]
    if isinstance(value, str) and len(value) > MARKER_ROOM:
        return "x" * MARKER_ROOM
    return value


def same_shape(fitted, original):
    """FITTED has ORIGINAL's keys, types, and a prefix of each list."""
    if isinstance(original, dict):
        return (isinstance(fitted, dict) and fitted.keys() == original.keys()
                and all(same_shape(fitted[key], original[key]) for key in original))
    if isinstance(original, list):
        return (isinstance(fitted, list) and len(fitted) <= len(original) and (len(fitted) > 0) == (len(original) > 0)
                and all(same_shape(item, each) for item, each in zip(fitted, original)))
    return type(fitted) is type(original) and (isinstance(original, str) or fitted == original)


def test_a_long_listing_keeps_the_halving_of_it_that_fits():
    listing = {"definitions": [{"name": f"BENCH-FN-{i}", "package": "COMMON-LISP-USER", "type": "function"}
                               for i in range(10_000)], "total": 10_000}
    fitted = fit_structure(listing, 20_000)
    # 10,000 halved to 156 entries is more than half the budget; 78 is not.
    assert fitted["definitions"] == listing["definitions"][:78] and fitted["total"] == 10_000


def test_the_store_drops_the_oldest_evaluations_first():
    store = OutputStore(limit=100)
    store.keep(1, Kept("a" * 60, "", ""))
    store.keep(2, Kept("b" * 60, "", ""))
    assert store.get(2).stdout == "b" * 60
    try:
        store.get(1)
        raise AssertionError("evaluation 1 should have been dropped")
    except NotKept as reason:
        assert "no longer kept" in str(reason)
    try:
        store.get(7)
        raise AssertionError("evaluation 7 was never kept")
    except NotKept as reason:
        assert "No output of evaluation 7" in str(reason)


def test_an_evaluation_that_goes_on_adds_to_its_output():
    store = OutputStore(limit=1000)
    assert store.keep(3, Kept("one\ntwo\n", "", "")) == {"stdout": 0, "stderr": 0, "values": 0}
    assert store.keep(3, Kept("three\n", "", "=> 3")) == {"stdout": 2, "stderr": 0, "values": 0}
    lines = store.lines(3, "stdout")
    assert [lines.line(i) for i in range(1, len(lines) + 1)] == ["one", "two", "three"]
    assert store.get(3).values == "=> 3"


def test_lines_index_where_each_line_starts():
    lines = Lines("a\nbb\n\nccc")
    assert len(lines) == 4 and lines.line(4) == "ccc" and lines.line(3) == ""
    assert list(lines.starts) == [0, 2, 5, 6]
