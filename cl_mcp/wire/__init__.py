"""What goes over the wire and how: JSON-RPC lines, stdio, the event loop
that reads them, the contract schemas and their checks, and s-expressions.
Pure but for stdio.py and idle_poll.py."""
