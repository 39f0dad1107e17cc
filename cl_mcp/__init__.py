"""cl-mcp: an MCP server that gives an AI assistant a live Common Lisp image."""

__version__ = "0.1.0"
