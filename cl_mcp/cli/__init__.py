"""The command line: `cl-mcp` serving MCP on stdio (main.py), and the commands
for people built on the client library: eval, tools, call, repl, doctor."""
