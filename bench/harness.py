"""What the benchmarks share: a stdio MCP server driven with blocking
reads, a raw Swank client on an image of its own, and timing.  bench/run.py
and every module of rows import it; it imports none of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Protocol

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cl_mcp.lisp.config import ImageConfig  # noqa: E402
from cl_mcp.lisp.image import LispImage  # noqa: E402
from cl_mcp.lisp.swank.framing import encode_frame, parse_header  # noqa: E402
from cl_mcp.wire import sexp  # noqa: E402

CL_MCP = [str(Path(sys.executable).parent / "cl-mcp"), "--log-level", "warning"]


def timed(call: Callable[[], object], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return samples


class Client(Protocol):
    """What a row needs of `Server`."""

    def call(self, method: str, params: dict | None = None) -> dict: ...


def tool(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    """The structured content of a successful call of tool NAME."""
    response = client.call("tools/call", {"name": name, "arguments": arguments})
    result = response.get("result")
    assert result is not None and not result["isError"], response
    return result["structuredContent"]


# ---------------------------------------------------------------- stdio servers

class Server:
    """A stdio MCP server process, driven with blocking reads."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
        self.ids = 0
        self._buffer = bytearray()  # stdout bytes read but not yet taken

    def _read_lines(self, count: int) -> list[bytes]:
        """The next COUNT lines of stdout, read in large chunks."""
        assert self.proc.stdout
        have = self._buffer.count(b"\n")
        while have < count:
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            if not chunk:
                raise EOFError("the server closed its stdout")
            self._buffer += chunk
            have += chunk.count(b"\n")
        *lines, rest = self._buffer.split(b"\n", count)
        self._buffer = bytearray(rest)
        return [bytes(line) for line in lines]

    def send(self, method: str, params: dict | None = None) -> int:
        self.ids += 1
        message = {"jsonrpc": "2.0", "id": self.ids, "method": method}
        if params is not None:
            message["params"] = params
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()
        return self.ids

    def receive(self) -> dict:
        while True:
            message = json.loads(self._read_lines(1)[0])
            if "id" in message:
                return message

    def call(self, method: str, params: dict | None = None) -> dict:
        self.send(method, params)
        return self.receive()

    def initialize(self) -> None:
        self.call("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                 "clientInfo": {"name": "bench", "version": "0"}})
        assert self.proc.stdin
        self.proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        self.proc.stdin.flush()

    def caller(self, method: str, params: dict | None) -> Callable[[], object]:
        def call() -> None:
            response = self.call(method, params)
            assert "result" in response, response
        return call

    def pipelined(self, method: str, params: dict | None, count: int) -> float:
        """Requests per second with COUNT requests written at once.

        The answers are counted as lines, and only the last is parsed: a
        client that parses every 12 KB tools/list answer with the json module
        (~90 µs each) would measure itself, not the server."""
        lines = b"".join(
            json.dumps({"jsonrpc": "2.0", "id": f"p{i}", "method": method,
                        **({"params": params} if params is not None else {})}).encode() + b"\n"
            for i in range(count))
        assert self.proc.stdin
        started = time.perf_counter()
        self.proc.stdin.write(lines)
        self.proc.stdin.flush()
        answers = self._read_lines(count)
        elapsed = time.perf_counter() - started
        assert all(answer.startswith(b"{") for answer in answers), "a line that is not JSON"
        for answer in (answers[0], answers[-1]):
            message = json.loads(answer)
            assert str(message.get("id")).startswith("p") and "result" in message, message
        return count / elapsed

    def resident_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait(10)


class RawSwank:
    """A minimal blocking Swank client on an image of its own, with Swank as
    shipped: the limit for anything built on Swank."""

    def __init__(self, as_shipped: bool = True) -> None:
        async def start() -> LispImage:
            image = LispImage(ImageConfig())
            await image.start()
            return image

        self._loop = asyncio.new_event_loop()
        self._image = self._loop.run_until_complete(start())
        self._sock = socket.create_connection(("127.0.0.1", self._image.port))
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(encode_frame(self._image.secret))
        self._reader = self._sock.makefile("rb")
        self._ids = 0
        if as_shipped:  # without the agent's pruning of Swank's mailboxes
            self.call([sexp.Symbol("cl:setf"), sexp.Symbol("swank::*pre-reply-hook*"),
                       [sexp.Symbol("cl:remove"),
                        [sexp.Symbol("cl:quote"), sexp.Symbol("cl-mcp-agent::prune-swank-mailboxes")],
                        sexp.Symbol("swank::*pre-reply-hook*")]])

    def call(self, form: sexp.SExp = (sexp.Symbol("cl:+"), 1, 2)) -> bytes:
        """One round trip, by default for (cl:+ 1 2); the `:return` message."""
        self._ids += 1
        message = [sexp.Keyword("emacs-rex"), form, "COMMON-LISP-USER", True, self._ids]
        self._sock.sendall(encode_frame(sexp.dumps(message)))
        while True:
            payload = self._reader.read(parse_header(self._reader.read(6)))
            if payload.startswith(b"(:return"):
                return payload
            if payload.startswith(b"(:ping"):  # Swank's flow control
                ping = sexp.loads(payload.decode())
                self._sock.sendall(encode_frame(sexp.dumps(
                    [sexp.Keyword("emacs-pong"), ping[1], ping[2]])))

    def relay(self, script: str = "relay.py") -> Server:
        """A minimal relay (bench/relay.py, or SCRIPT beside it) in front of
        a lane into this image."""
        reply = sexp.loads(self.call([sexp.Symbol("cl-mcp-agent:open-lane")]).decode())
        name = reply[1][1]  # (:return (:ok NAME) id)
        return Server([sys.executable, str(ROOT / "bench" / script), name, self._image.secret])

    def close(self) -> None:
        self._sock.close()
        self._loop.run_until_complete(self._image.stop())
        self._loop.close()
