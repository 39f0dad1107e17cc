"""JSON-RPC 2.0 over newline-delimited JSON.  Pure: no I/O.

Why split on b"\\n" only: JSON strings may carry U+2028, U+2029 and U+0085
raw, and str.splitlines() would cut a message there.  Why no readline():
asyncio's StreamReader.readline() stops at 64 KiB, and a 10 MB `code`
argument is a legitimate request.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import orjson

from cl_mcp.errors import PARSE_ERROR, JsonRpcError

MAX_LINE_BYTES = 64 * 2**20


class OversizedLine:
    """Stands for a line longer than the limit; its bytes were dropped."""

    def __init__(self, size: int) -> None:
        self.size = size


class LineSplitter:
    """Bytes in, complete lines out (without the newline or a trailing CR)."""

    def __init__(self, max_line: int = MAX_LINE_BYTES) -> None:
        self._buffer = bytearray()
        self._max_line = max_line
        self._discarding = 0  # bytes dropped so far of an oversized line

    def feed(self, data: bytes) -> list[bytes | OversizedLine]:
        """The lines DATA completes (blank ones left out); its tail waits
        for the next."""
        *complete, rest = data.split(b"\n")
        lines: list[bytes | OversizedLine] = []
        for chunk in complete:
            line = self._take(chunk)
            if isinstance(line, OversizedLine) or line.strip():
                lines.append(line)
        self._keep(rest)
        return lines

    def _keep(self, chunk: bytes) -> None:
        if self._discarding:
            self._discarding += len(chunk)
        elif len(self._buffer) + len(chunk) > self._max_line:
            self._discarding = len(self._buffer) + len(chunk)
            self._buffer.clear()
        else:
            self._buffer += chunk

    def _take(self, tail: bytes) -> bytes | OversizedLine:
        if self._discarding or len(self._buffer) + len(tail) > self._max_line:
            size = self._discarding + len(self._buffer) + len(tail)
            self._discarding = 0
            self._buffer.clear()
            return OversizedLine(size)
        line = bytes(self._buffer) + tail if self._buffer else tail
        self._buffer.clear()
        return line[:-1] if line.endswith(b"\r") else line

    def finish(self) -> Iterator[bytes | OversizedLine]:
        """The last line, when the input ends without a newline."""
        if self._discarding or self._buffer.strip():
            yield self._take(b"")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _float_id(message: Any) -> bool:
    """Whether MESSAGE (or a batch of them) has a float where an id goes:
    its id, a cancellation's requestId, a progressToken."""
    if isinstance(message, list):
        return any(_float_id(each) for each in message)
    if not isinstance(message, dict):
        return False
    if type(message.get("id")) is float:
        return True
    params = message.get("params")
    return isinstance(params, dict) and (type(params.get("requestId")) is float
                                         or type(params_meta(params).get("progressToken")) is float)


def params_meta(params: Any) -> dict[str, Any]:
    """The `_meta` of a request's PARAMS, whatever they are: the one reader
    of it, so that a malformed one is read as none everywhere alike."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta if isinstance(meta, dict) else {}


def _exact(line: bytes) -> Any:
    """LINE read by the json module, which keeps every integer exact;
    raises ValueError (lone surrogates included), UnicodeError or
    RecursionError."""
    value = json.loads(line.decode("utf-8"), parse_constant=_reject_constant)
    json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate raises here
    return value


def parse(line: bytes) -> Any:
    """The JSON value of LINE; raises JsonRpcError(PARSE_ERROR).

    orjson reads an integer past 64 bits as a float, and an id must be
    answered exactly as sent: a message with a float where an id goes (an
    id that is truly a float is invalid anyway) is read again by the json
    module.  Other such numbers may stay floats: arguments typed "integer"
    are bounded well within 64 bits (integers.py)."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        # orjson refuses lone surrogates ("\ud800"), which stay refused, and
        # whatever else is not JSON.
        detail = str(error)
    else:
        if not _float_id(value):
            return value
        detail = ""
    try:
        return _exact(line)
    except (ValueError, UnicodeError, RecursionError) as error:
        raise JsonRpcError(PARSE_ERROR, "Parse error", {"detail": detail or str(error)}) from None


def encode(message: dict[str, Any] | list[dict[str, Any]]) -> bytes:
    """MESSAGE as one line of UTF-8 JSON (never an embedded newline)."""
    try:
        return orjson.dumps(message, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # an integer beyond 64 bits, echoed from a request id
        return json.dumps(message, separators=(",", ":"),
                          default=_encoded_value).encode("ascii") + b"\n"


# Values that never change (the tool list) are encoded once: `preencoded`
# returns an orjson.Fragment, which orjson copies into a message as it is.
# The json module cannot read a Fragment, so the value is kept beside it.
_PREENCODED: dict[int, tuple[orjson.Fragment, Any]] = {}


def preencoded(value: Any) -> orjson.Fragment:
    """VALUE encoded once, for messages that include it again and again.
    For values that live as long as the process: they are never freed."""
    fragment = orjson.Fragment(orjson.dumps(value))
    _PREENCODED[id(fragment)] = (fragment, value)
    return fragment


def _encoded_value(item: Any) -> Any:
    if isinstance(item, orjson.Fragment) and id(item) in _PREENCODED:
        return _PREENCODED[id(item)][1]
    raise TypeError(f"{type(item).__name__} is not JSON")


def result_message(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_message(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def notification(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}
