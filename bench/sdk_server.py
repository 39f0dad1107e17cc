"""The baseline for protocol cost: a minimal server on the official MCP
Python SDK, with one tool."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench-sdk-server")


@server.tool()
def echo(text: str) -> str:
    """Return the text."""
    return text


if __name__ == "__main__":
    server.run()
