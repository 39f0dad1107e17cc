"""Integral floats made integers, where a schema types a value "integer".

JSON Schema calls 1.0 an integer, so the argument checks let it through,
but a handler that counts lines with it or sends it to the image must get
1: Lisp's (eql 1 1.0) is false, and range() refuses a float.  orjson also
reads an integer beyond 64 bits as a float.  Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Callable

Normalize = Callable[[Any], Any]


def _types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type", ())
    return {kind} if isinstance(kind, str) else set(kind)


def integers_of(schema: dict[str, Any]) -> Normalize | None:
    """A function that returns its argument, valid against SCHEMA, with
    every value SCHEMA types as an integer (at the top, under
    `properties`, `additionalProperties` or `items`, at any depth) an int
    where it was an integral float; None when SCHEMA types none."""
    for keyword in ("anyOf", "oneOf", "allOf", "$ref"):
        if keyword in schema:  # which branch a value took is not known here
            raise ValueError(f"integers_of does not follow {keyword}")
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
