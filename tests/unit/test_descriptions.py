"""What cl-mcp tells a host names what it offers: the instructions name
every tool, and the `task` parameter every tool that can run as a task."""

from __future__ import annotations

import re

from cl_mcp.server.server import INSTRUCTIONS
from cl_mcp.server.task_calls import TASK_TOOLS
from cl_mcp.wire.contracts import load_schema, tool_definitions


def named(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def test_the_instructions_name_every_tool() -> None:
    missing = [tool["name"] for tool in tool_definitions() if not named(INSTRUCTIONS, tool["name"])]
    assert missing == []


def test_the_task_parameter_names_every_tool_that_takes_it() -> None:
    description = load_schema("tools-call-params.json")["properties"]["task"]["description"]
    assert [name for name in sorted(TASK_TOOLS) if not named(description, name)] == []
