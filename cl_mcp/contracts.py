"""The contract schemas, loaded from the package and compiled once.

Why once: building a validator walks the whole schema; doing it per request
costs more than the request itself.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft7Validator, Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match
from jsonschema.protocols import Validator


def load_schema(name: str) -> Any:
    """A JSON file of cl_mcp/schemas."""
    return json.loads(resources.files("cl_mcp.schemas").joinpath(name).read_text("utf-8"))


@cache
def shared_type(name: str) -> Validator:
    """A validator for one definition of contracts/shared-types.md."""
    document = load_schema("shared-types.json")
    return Draft7Validator({"$ref": f"#/definitions/{name}", "definitions": document["definitions"]})


@cache
def params_validator(name: str) -> Validator:
    """A validator for a method's params (tools-call-params.json, ...)."""
    return Draft7Validator(load_schema(f"{name}.json"))


def tool_validator(input_schema: dict[str, Any]) -> Validator:
    """A validator for a tool's arguments (JSON Schema 2020-12, MCP's default)."""
    return Draft202012Validator(input_schema)


@cache
def tool_definitions() -> list[dict[str, Any]]:
    """The tools of contracts/tools-list.md and cl-mcp's own, as advertised.
    An outputSchema given as a file name is that file's schema (several
    tools share evaluation-result.json)."""
    tools = load_schema("tools.json")
    for tool in tools:
        if isinstance(tool.get("outputSchema"), str):
            schema = load_schema(tool["outputSchema"])
            schema.pop("$comment", None)
            tool["outputSchema"] = schema
    return tools


def first_error(validator: Validator, instance: Any) -> ValidationError | None:
    """The most relevant schema violation of INSTANCE, or None.  Raises
    RecursionError for an instance nested too deeply to walk."""
    return best_match(validator.iter_errors(instance))


def error_location(error: ValidationError, prefix: str) -> dict[str, str]:
    """Where a violation is, for the `data` of a JSON-RPC error."""
    path = prefix + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path
    )
    schema_path = "#/" + "/".join(str(part) for part in error.absolute_schema_path)
    return {"path": path, "schemaPath": schema_path, "detail": error.message[:500]}
