"""One exception tree for cl-mcp, and the JSON-RPC error codes."""

from __future__ import annotations

import asyncio
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNSUPPORTED_PROTOCOL_VERSION = -32022  # 2026-07-28
# Implementation-defined server error (-32000 to -32099): too many calls are
# queued for the session; the client may try again later.
SERVER_BUSY = -32000


class ClMcpError(Exception):
    """Base of every error cl-mcp raises on purpose."""


class ProtocolError(ClMcpError):
    """A peer sent bytes that cannot be parsed (a bad frame, a bad s-expression)."""


class JsonRpcError(ClMcpError):
    """A JSON-RPC error: raised by a server handler and serialised at one
    boundary, or (client.py) the error a server answered a request with."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message
        self.data = data


class SwankError(ClMcpError):
    """The Swank connection failed: lost, refused, or the request was invalid."""


class ImageError(ClMcpError):
    """The Lisp image could not be started or died."""


class SessionError(ClMcpError):
    """The session could not run a request (the image was lost, is not
    connected, did not answer); KIND names it for the tool's error result,
    MESSAGE says why and what happens next."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class CancelledWithAnswer(asyncio.CancelledError):
    """A call was cancelled once it had done work a cancel cannot undo (an
    edit written): ANSWER is the agent's reply that says what stands."""

    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer
