"""The contract schemas, loaded from the package and compiled once.

Why once, and why two validators: building a validator walks the whole
schema, and jsonschema's general machinery costs more per message than the
rest of a ping.  Each schema is compiled into a fast yes/no check
(schema_check.py); only a message that fails it is handed to jsonschema
(imported then, not at start-up) to say which rule failed and where.
"""

from __future__ import annotations

import json
import logging
from functools import cache
import os
from typing import TYPE_CHECKING, Any

from cl_mcp.wire.schema_check import compile_schema

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

log = logging.getLogger("cl_mcp.contracts")

MAX_PROBLEMS = 10  # lines of Schema.problems
MAX_REASON = 300  # characters of one problem's reason
MAX_VALUE = 80  # characters of a value quoted in a reason
SCHEMAS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "schemas")  # cl_mcp/schemas


def load_schema(name: str) -> Any:
    """A JSON file of cl_mcp/schemas."""
    # In the package, as pip installs it; importlib.resources would cost
    # ~10 ms of imports before initialize is answered.
    with open(os.path.join(SCHEMAS, name), encoding="utf-8") as schema:
        return json.load(schema)


class Schema:
    """One compiled schema: a fast check, and jsonschema for the details."""

    def __init__(self, schema: dict[str, Any], dialect: str) -> None:
        self.schema = schema
        self.is_valid = compile_schema(schema)
        self._dialect = dialect
        self._validator: Any = None

    def first_error(self, instance: Any) -> ValidationError | None:
        """The most relevant violation of INSTANCE, or None when it is valid.
        Raises RecursionError for an instance nested too deeply to walk."""
        if self.is_valid(instance):
            return None
        from jsonschema.exceptions import best_match

        error = best_match(self.validator.iter_errors(instance))
        if error is None:
            log.error("the fast schema check and jsonschema disagree about %.200r", instance)
        return error

    def problems(self, instance: Any, limit: int = MAX_PROBLEMS) -> list[str]:
        """Every violation of INSTANCE, one line each (`at POINTER: REASON`),
        in the schema's order; at most LIMIT, then a line saying there are
        more.  Empty when INSTANCE is valid.  For a tool error the model
        reads, so it can correct every argument at once (SEP-1303).  Raises
        RecursionError for an instance nested too deeply to walk."""
        if self.is_valid(instance):
            return []
        from jsonschema.exceptions import best_match

        lines: dict[str, None] = {}  # in order, without repeats
        for error in self.validator.iter_errors(instance):
            error = best_match([error])  # oneOf/anyOf: the branch that came closest
            for line in _problem_lines(error):
                lines[line] = None
            if len(lines) > limit:
                return [*list(lines)[:limit], "(more problems not listed)"]
        if not lines:
            log.error("the fast schema check and jsonschema disagree about %.200r", instance)
            return ["at /: does not match the inputSchema"]
        return list(lines)

    @property
    def validator(self) -> Any:
        if self._validator is None:
            import jsonschema

            cls = jsonschema.Draft7Validator if self._dialect == "draft7" else jsonschema.Draft202012Validator
            self._validator = cls(self.schema)
        return self._validator


@cache
def shared_type(name: str) -> Schema:
    """A shared type of the user's contract (shared-types.json, JSON Schema draft 7)."""
    document = load_schema("shared-types.json")
    return Schema({"$ref": f"#/definitions/{name}", "definitions": document["definitions"]}, "draft7")


@cache
def params_schema(name: str) -> Schema:
    """A method's params schema (tools-call-params.json, ...)."""
    return Schema(load_schema(f"{name}.json"), "draft7")


def tool_schema(input_schema: dict[str, Any]) -> Schema:
    """A tool's arguments schema (JSON Schema 2020-12, MCP's default)."""
    return Schema(input_schema, "2020-12")


@cache
def tool_definitions() -> list[dict[str, Any]]:
    """Every tool cl-mcp offers (the four of the user's contract and cl-mcp's own), as advertised.
    An outputSchema given as a file name is that file's schema (several
    tools share evaluation-result.json); as a list of names, a result fits
    one of them (await-evaluation answers in its work's tool's shape)."""
    def schema_of(name: str) -> dict[str, Any]:
        schema = load_schema(name)
        schema.pop("$comment", None)
        return schema

    tools = load_schema("tools.json")
    for tool in tools:
        if isinstance(tool.get("outputSchema"), str):
            tool["outputSchema"] = schema_of(tool["outputSchema"])
        elif isinstance(tool.get("outputSchema"), list):
            tool["outputSchema"] = {"type": "object",
                                    "anyOf": [schema_of(name) for name in tool["outputSchema"]]}
    return tools


def first_error(schema: Schema, instance: Any) -> ValidationError | None:
    """The most relevant violation of INSTANCE against SCHEMA, or None."""
    return schema.first_error(instance)


def error_location(error: ValidationError, prefix: str) -> dict[str, str]:
    """Where a violation is, for the `data` of a JSON-RPC error."""
    path = prefix + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path
    )
    schema_path = "#/" + "/".join(str(part) for part in error.absolute_schema_path)
    return {"path": path, "schemaPath": schema_path, "detail": error.message[:500]}


# ---------------------------------------------------------------- problems, for the model to read

_TYPE_NAMES = {"string": "a string", "integer": "an integer", "number": "a number",
               "boolean": "a boolean", "object": "an object", "array": "an array", "null": "null"}


def json_pointer(path: Any) -> str:
    """PATH (keys and indices) as a JSON Pointer (RFC 6901), `/values/0`;
    the whole instance as `/`, which reads better than the empty pointer."""
    return "/" + "/".join(str(part).replace("~", "~0").replace("/", "~1") for part in path)


def json_text(value: Any, limit: int = MAX_VALUE) -> str:
    """VALUE as JSON (null, true, "text"), cut to about LIMIT characters."""
    if isinstance(value, str) and len(value) > limit:
        return json.dumps(value[:limit], ensure_ascii=False)[:-1] + "…\""
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[:limit] + "…"


def _one_line(text: str) -> str:
    """TEXT with every character that is not printable escaped (\\uXXXX)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


def _problem_lines(error: ValidationError) -> list[str]:
    """One violation as the lines of Schema.problems: one per missing
    property for `required`, else one."""
    path = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        return [_one_line(f"at {json_pointer([*path, name])}: required, but missing")
                for name in error.validator_value if name not in error.instance]
    reason = _reason(error)
    if len(reason) > MAX_REASON:
        reason = reason[:MAX_REASON] + "…"
    return [_one_line(f"at {json_pointer(path)}: {reason}")]


def _reason(error: ValidationError) -> str:
    """Why ERROR's value fails, in JSON's words (null, true; not Python's
    None, True); jsonschema's own message for the rarer keywords."""
    keyword, expected, value = error.validator, error.validator_value, error.instance
    if keyword == "type":
        names = expected if isinstance(expected, list) else [expected]
        wanted = " or ".join(_TYPE_NAMES.get(name, str(name)) for name in names)
        return f"expected {wanted}, got {json_text(value)}"
    if keyword == "enum":
        return f"{json_text(value)} is not one of {', '.join(json_text(item) for item in expected)}"
    if keyword == "const":
        return f"expected {json_text(expected)}, got {json_text(value)}"
    if keyword in _BOUNDS:
        return _BOUNDS[keyword].format(value=json_text(value), bound=json_text(expected))
    if keyword == "minLength" and isinstance(value, str):
        if expected == 1:
            return "must not be empty"
        return f"must be at least {expected} characters long, not {len(value)}"
    if keyword == "maxLength" and isinstance(value, str):
        return f"must be at most {expected} characters long, not {len(value)}"
    return str(error.message)


_BOUNDS = {
    "minimum": "{value} is less than the minimum of {bound}",
    "maximum": "{value} is greater than the maximum of {bound}",
    "exclusiveMinimum": "{value} is not greater than {bound}",
    "exclusiveMaximum": "{value} is not less than {bound}",
}
