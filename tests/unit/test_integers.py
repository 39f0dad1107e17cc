"""integers_of: what a schema types "integer" comes out an int, at any
depth, and nothing else changes; bounded: it is valid only within
+/-LIMIT."""

from __future__ import annotations

import pytest
from hypothesis import example, given, strategies as st

from cl_mcp.wire.contracts import tool_definitions, tool_schema
from cl_mcp.wire.integers import LIMIT, bounded, integers_of

SCHEMA = {
    "type": "object",
    "properties": {
        "count": {"type": "integer"},
        "either": {"type": ["integer", "string"]},
        "ratio": {"type": "number"},
        "name": {"type": "string"},
        "rows": {"type": "array", "items": {"type": "object", "properties": {"line": {"type": "integer"}}}},
        "plain": {"type": "object", "properties": {"x": {"type": "number"}}},
    },
    "additionalProperties": {"type": "integer"},
}


def test_integral_floats_typed_integer_become_ints_at_any_depth() -> None:
    normalized = integers_of(SCHEMA)({"count": 2.0, "either": 3.0, "ratio": 4.0, "name": "n",
                                      "rows": [{"line": 5.0}, {"line": 6}], "plain": {"x": 7.0},
                                      "extra": 8.0})
    assert normalized == {"count": 2, "either": 3, "ratio": 4.0, "name": "n",
                          "rows": [{"line": 5}, {"line": 6}], "plain": {"x": 7.0}, "extra": 8}
    assert [type(normalized[key]) for key in ("count", "either", "ratio", "extra")] == [int, int, float, int]
    assert type(normalized["rows"][0]["line"]) is int and type(normalized["plain"]["x"]) is float


def test_a_declared_property_never_takes_additional_properties_rule() -> None:
    assert type(integers_of(SCHEMA)({"ratio": 1.0})["ratio"]) is float


def test_bounded_adds_the_limit_and_keeps_tighter_bounds() -> None:
    schema = bounded({**SCHEMA, "properties": {**SCHEMA["properties"],
                                              "count": {"type": "integer", "minimum": 1, "maximum": 200}}})
    assert schema["properties"]["count"] == {"type": "integer", "minimum": 1, "maximum": 200}
    assert schema["properties"]["either"] == {"type": ["integer", "string"], "minimum": -LIMIT, "maximum": LIMIT}
    assert schema["properties"]["rows"]["items"]["properties"]["line"]["maximum"] == LIMIT
    assert schema["additionalProperties"] == {"type": "integer", "minimum": -LIMIT, "maximum": LIMIT}
    assert schema["properties"]["ratio"] == {"type": "number"}
    assert "maximum" not in SCHEMA["additionalProperties"]  # a copy


BOUNDED = tool_schema(bounded(SCHEMA))
NORMALIZE = integers_of(SCHEMA)


@given(st.integers() | st.integers().map(float))
@example(2**64 + 1)
@example(1e20)
@example(float(LIMIT + 1))
def test_an_integer_is_valid_within_the_limit_and_then_exact(number: int | float) -> None:
    valid = not BOUNDED.problems({"count": number})
    assert valid == (-LIMIT <= number <= LIMIT)
    if valid:
        count = NORMALIZE({"count": number})["count"]
        assert type(count) is int and count == number


def test_a_schema_without_integers_needs_nothing() -> None:
    assert integers_of({"type": "object", "properties": {"code": {"type": "string"}}}) is None


def test_branches_it_cannot_follow_are_refused_at_build_time() -> None:
    with pytest.raises(ValueError, match="anyOf"):
        integers_of({"anyOf": [{"type": "integer"}, {"type": "string"}]})


def test_every_tool_schema_is_followed() -> None:
    followed = {definition["name"] for definition in tool_definitions()
                if integers_of(definition["inputSchema"]) is not None}
    assert {"read-output", "await-evaluation", "backtrace", "inspect"} <= followed
