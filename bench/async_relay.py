"""bench/relay.py on cl-mcp's architecture: an asyncio event loop whose
stdin callback reads each JSON-RPC line, sends one fixed evaluate request
down an image's lane, reads the reply at once (blocking in `select`, as
cl-mcp's answer window does), and writes a fixed answer through asyncio's
pipe transport.  No validation, no rendering, no polling: what an asyncio
server costs before it does any of cl-mcp's work (issue 31's CPU row).

    python bench/async_relay.py NAME SECRET     (NAME: a lane opened by open-lane)
"""

from __future__ import annotations

import asyncio
import itertools
import os
import select
import socket
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cl_mcp.lisp.swank.framing import encode_frame  # noqa: E402
from relay import ANSWER, REQUEST  # noqa: E402  (bench/relay.py, beside this file)


class Relay(asyncio.Protocol):
    """Each complete line of stdin, answered in the callback that read it."""

    def __init__(self, lane: socket.socket, out: asyncio.WriteTransport, ended: asyncio.Future[None]) -> None:
        self.lane, self.out, self.ended = lane, out, ended
        self.pending = b""
        self.count = itertools.count(1)

    def data_received(self, data: bytes) -> None:
        *lines, self.pending = (self.pending + data).split(b"\n")
        for line in lines:
            message = orjson.loads(line)
            if "id" not in message:
                continue  # a notification
            result = {}  # initialize, ping
            if message.get("method") == "tools/call":
                self.lane.sendall(encode_frame(REQUEST.format(next(self.count))))
                reply = b""
                while len(reply) < 6 or len(reply) < 6 + int(reply[:6], 16):
                    select.select([self.lane], [], [])
                    reply += self.lane.recv(1 << 16)
                result = ANSWER
            self.out.write(orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result},
                                        option=orjson.OPT_APPEND_NEWLINE))

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended.set_result(None)


async def main() -> None:
    name, secret = sys.argv[1], sys.argv[2]
    lane = socket.socket(socket.AF_UNIX)
    lane.connect("\0" + name)  # an abstract Unix-domain socket
    lane.sendall(encode_frame(secret))
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(1, "wb", 0, closefd=False))
    transport, _ = await loop.connect_read_pipe(lambda: Relay(lane, out, ended),
                                                os.fdopen(0, "rb", 0, closefd=False))
    transport.max_size = 1 << 16  # type: ignore[attr-defined]  (as cl-mcp reads)
    await ended


if __name__ == "__main__":
    asyncio.run(main())
