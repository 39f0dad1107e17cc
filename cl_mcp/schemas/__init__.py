"""JSON schemas shipped with cl-mcp (data only)."""
