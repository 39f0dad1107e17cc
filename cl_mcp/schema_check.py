"""A fast yes/no check against a JSON schema.  Pure: no I/O.

Why: every message is validated, and jsonschema's general machinery costs
tens of microseconds per message (and about 100 ms to import).  This module
compiles the subset of JSON Schema that cl-mcp's schemas use into plain
closures, once; only when a message fails does cl-mcp ask jsonschema which
rule failed and where (see contracts.py).  A keyword outside the subset is
refused at compile time, so a schema can never be checked more loosely than
it says; tests/unit/test_schema_check.py checks the verdicts against
jsonschema's on generated instances.
"""

from __future__ import annotations

from typing import Any, Callable

Check = Callable[[Any], bool]

# Keywords that only document a schema.
ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "default", "examples"}


def _is_type(name: str) -> Check:
    return {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
        "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer()),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    }[name]


def _json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON means it: true is not 1, and 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def compile_schema(schema: Any, root: Any = None) -> Check:
    """A predicate that is true exactly when an instance is valid."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return lambda value: True
    if schema is False:
        return lambda value: False
    if "$ref" in schema:  # draft 7: siblings of $ref are ignored
        return _resolve(schema["$ref"], root)
    checks: list[Check] = []
    for keyword, argument in schema.items():
        if keyword in ANNOTATIONS or keyword == "definitions":
            continue
        checks.append(_keyword(keyword, argument, schema, root))
    if len(checks) == 1:
        return checks[0]
    return lambda value: all(check(value) for check in checks)


def _resolve(reference: str, root: Any) -> Check:
    if not reference.startswith("#/"):
        raise ValueError(f"only local references are supported: {reference}")
    target = root
    for part in reference[2:].split("/"):
        target = target[part]
    compiled: list[Check] = []

    def check(value: Any) -> bool:  # compiled on first use: references may recurse
        if not compiled:
            compiled.append(compile_schema(target, root))
        return compiled[0](value)
    return check


def _keyword(keyword: str, argument: Any, schema: dict[str, Any], root: Any) -> Check:
    if keyword == "type":
        names = argument if isinstance(argument, list) else [argument]
        tests = [_is_type(name) for name in names]
        return lambda value: any(test(value) for test in tests)
    if keyword == "const":
        return lambda value: _json_equal(value, argument)
    if keyword == "enum":
        return lambda value: any(_json_equal(value, item) for item in argument)
    if keyword == "required":
        return lambda value: not isinstance(value, dict) or all(key in value for key in argument)
    if keyword == "properties":
        checks = {name: compile_schema(sub, root) for name, sub in argument.items()}
        return lambda value: not isinstance(value, dict) or all(
            check(value[name]) for name, check in checks.items() if name in value)
    if keyword == "additionalProperties":
        known = set(schema.get("properties", {}))
        extra = compile_schema(argument, root)
        return lambda value: not isinstance(value, dict) or all(
            extra(item) for name, item in value.items() if name not in known)
    if keyword == "items":
        item_check = compile_schema(argument, root)
        return lambda value: not isinstance(value, list) or all(item_check(item) for item in value)
    if keyword == "oneOf":
        options = [compile_schema(sub, root) for sub in argument]
        return lambda value: sum(1 for option in options if option(value)) == 1
    if keyword == "anyOf":
        options = [compile_schema(sub, root) for sub in argument]
        return lambda value: any(option(value) for option in options)
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        compare = {"minimum": lambda v: v >= argument, "maximum": lambda v: v <= argument,
                   "exclusiveMinimum": lambda v: v > argument,
                   "exclusiveMaximum": lambda v: v < argument}[keyword]
        return lambda value: not _is_type("number")(value) or compare(value)
    if keyword in ("minLength", "maxLength"):
        bound = argument
        if keyword == "minLength":
            return lambda value: not isinstance(value, str) or len(value) >= bound
        return lambda value: not isinstance(value, str) or len(value) <= bound
    raise ValueError(f"schema keyword not supported by the fast check: {keyword}")
