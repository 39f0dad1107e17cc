"""Swank's wire format: a 6-hex-digit length, then one UTF-8 s-expression.
Pure: no I/O.

Why bytes: the length counts bytes of the UTF-8 payload, not characters;
counting characters breaks on the first non-ASCII string.  The length field
has 24 bits, so a payload is at most 0xFFFFFF bytes; Swank closes the
connection on anything larger, so we refuse to send it.
"""

from __future__ import annotations

import re

from cl_mcp.errors import ProtocolError

HEADER_LENGTH = 6
MAX_PAYLOAD = 0xFFFFFF
_HEADER = re.compile(rb"[0-9a-fA-F]{6}")


def encode_frame(payload: str) -> bytes:
    """PAYLOAD framed for Swank."""
    data = payload.encode("utf-8")
    if len(data) > MAX_PAYLOAD:
        raise ProtocolError(f"message of {len(data)} bytes exceeds Swank's limit of {MAX_PAYLOAD}")
    return b"%06x" % len(data) + data


def parse_header(header: bytes) -> int:
    """The payload length a 6-byte header announces."""
    if len(header) != HEADER_LENGTH:
        raise ProtocolError(f"short frame header {header!r}")
    if not _HEADER.fullmatch(header):  # int() alone would take " +1_f0" too
        raise ProtocolError(f"bad frame header {header!r}")
    return int(header, 16)


class FrameDecoder:
    """Accumulates bytes and yields complete payloads (h11 style: feed, then
    pull until there is nothing more)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_payload(self) -> str | None:
        """The next complete payload, decoded, or None if more bytes are needed."""
        buffer = self._buffer
        if len(buffer) < HEADER_LENGTH:
            return None
        end = HEADER_LENGTH + parse_header(buffer[:HEADER_LENGTH])
        if len(buffer) < end:
            return None
        if len(buffer) == end:  # the usual read: one whole message, no copy kept
            data, self._buffer = buffer, bytearray()
        else:
            data = buffer[:end]
            del buffer[:end]
        try:
            return data[HEADER_LENGTH:].decode("utf-8")
        except UnicodeDecodeError as error:
            raise ProtocolError(f"frame payload is not UTF-8: {error}") from None

    @property
    def pending(self) -> int:
        """Bytes received but not yet returned."""
        return len(self._buffer)
