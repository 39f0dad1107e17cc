"""The tool budget of issue 38: at most 22 tools, each description under
1 KB and all of them under 18 KB, as tools/list advertises them."""

from __future__ import annotations

from cl_mcp.wire.contracts import tool_definitions


def test_the_tools_fit_their_budget():
    tools = tool_definitions()
    sizes = {tool["name"]: len(tool["description"].encode()) for tool in tools}
    assert len(tools) <= 22, sorted(sizes)
    assert max(sizes.values()) < 1024, sizes
    assert sum(sizes.values()) < 18 * 1024, sizes
