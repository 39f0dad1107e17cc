"""What a tool result is made of: rendered text, the result budget, the
session's kept output and the line patterns that search it.  Pure: no I/O."""
