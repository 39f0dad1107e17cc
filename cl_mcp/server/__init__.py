"""The MCP server: its methods, the intake of tool calls, MCP tasks, and the
one boundary where exceptions become JSON-RPC errors.  It dispatches to the
tools (cl_mcp/tools/)."""
