"""The tools cl-mcp offers: each a frozen ToolSpec of data plus one handler.

Definitions (name, description, inputSchema, annotations) come from
cl_mcp/schemas/tools.json; the handlers live beside this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from cl_mcp.contracts import Schema, tool_definitions, tool_schema
from cl_mcp.render import Rendered
from cl_mcp.session import LispSession

Handler = Callable[[LispSession, dict[str, Any]], Awaitable[Rendered]]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    definition: dict[str, Any]
    validator: Schema
    handler: Handler


def build_tools() -> dict[str, ToolSpec]:
    """Every tool, by name, with its argument validator compiled once."""
    from cl_mcp.tools import definitions, evaluate, restarts, systems
    from cl_mcp.tools import code
    from cl_mcp.tools import browse, inspector
    from cl_mcp.tools import names

    handlers: dict[str, Handler] = {
        "evaluate-lisp": evaluate.evaluate_lisp,
        "list-definitions": definitions.list_definitions,
        "reset-session": systems.reset_session,
        "load-system": systems.load_system,
        "invoke-restart": restarts.invoke_restart,
        "backtrace": restarts.backtrace,
        "eval-in-frame": restarts.eval_in_frame,
        "xref": code.xref,
        "compile-file": code.compile_file,
        "apropos": browse.apropos,
        "macroexpand": browse.macroexpand,
        "inspect": inspector.inspect,
        "find-definition": names.find_definition,
        "describe-symbol": names.describe_symbol,
    }
    tools = {}
    for definition in tool_definitions():
        name = definition["name"]
        tools[name] = ToolSpec(name, definition, tool_schema(definition["inputSchema"]), handlers[name])
    return tools
