"""The one rule for arguments a schema types "integer": within +/-LIMIT,
and an int where they came as an integral float.

JSON Schema calls 1.0 an integer, so the argument checks let it through,
but a handler that counts lines with it or sends it to the image must get
1: Lisp's (eql 1 1.0) is false, and range() refuses a float.  orjson also
reads an integer beyond 64 bits as a float, and cannot write one: the
bound (`bounded`, in the validator) refuses both before a handler sees
them, and within it every integral float is an int exactly.  Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Callable

Normalize = Callable[[Any], Any]

# The largest integer argument: every integer up to it is exact as a float
# (I-JSON's interoperable range, RFC 7493), far past any line, count or
# evaluation number.
LIMIT = 2**53 - 1


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type", ())
    return {kind} if isinstance(kind, str) else set(kind)


def _followable(schema: dict[str, Any]) -> None:
    for keyword in ("anyOf", "oneOf", "allOf", "$ref"):
        if keyword in schema:  # which branch a value took is not known here
            raise ValueError(f"integers.py does not follow {keyword}")


def bounded(schema: dict[str, Any]) -> dict[str, Any]:
    """SCHEMA with every value it types as an integer (where `integers_of`
    looks) kept within +/-LIMIT, a tighter bound of its own kept: the
    schema a tool's arguments are validated against."""
    _followable(schema)
    copy = dict(schema)
    if "integer" in _types(schema):
        copy["minimum"] = max(schema.get("minimum", -LIMIT), -LIMIT)
        copy["maximum"] = min(schema.get("maximum", LIMIT), LIMIT)
    if "properties" in schema:
        copy["properties"] = {name: bounded(sub) for name, sub in schema["properties"].items()}
    for keyword in ("additionalProperties", "items"):
        if isinstance(schema.get(keyword), dict):
            copy[keyword] = bounded(schema[keyword])
    return copy


def integers_of(schema: dict[str, Any]) -> Normalize | None:
    """A function that returns its argument, valid against SCHEMA, with
    every value SCHEMA types as an integer (at the top, under
    `properties`, `additionalProperties` or `items`, at any depth) an int
    where it was an integral float; None when SCHEMA types none."""
    _followable(schema)
    whole = "integer" in _types(schema)
    declared = schema.get("properties", {})
    named = {name: found for name, sub in declared.items() if (found := integers_of(sub)) is not None}
    extra, items = schema.get("additionalProperties"), schema.get("items")
    others = integers_of(extra) if isinstance(extra, dict) else None
    each = integers_of(items) if isinstance(items, dict) else None
    if not (whole or named or others or each):
        return None

    def field(key: str) -> Normalize | None:
        return named.get(key) if key in declared else others

    def normalize(value: Any) -> Any:
        if whole and isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, dict) and (named or others):
            return {key: (found(item) if (found := field(key)) else item) for key, item in value.items()}
        if isinstance(value, list) and each:
            return [each(item) for item in value]
        return value
    return normalize
