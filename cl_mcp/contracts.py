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
from importlib import resources
from typing import TYPE_CHECKING, Any

from cl_mcp.schema_check import compile_schema

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

log = logging.getLogger("cl_mcp.contracts")


def load_schema(name: str) -> Any:
    """A JSON file of cl_mcp/schemas."""
    return json.loads(resources.files("cl_mcp.schemas").joinpath(name).read_text("utf-8"))


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
    tools share evaluation-result.json)."""
    tools = load_schema("tools.json")
    for tool in tools:
        if isinstance(tool.get("outputSchema"), str):
            schema = load_schema(tool["outputSchema"])
            schema.pop("$comment", None)
            tool["outputSchema"] = schema
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
