"""The MCP stdio transport: lines in from stdin, messages out on stdout.

Why stdout is taken over: the MCP stream must carry nothing but MCP
messages.  `claim_stdout` moves the real stdout to a private descriptor and
points fd 1 at stderr, so a stray print() (ours or a library's) lands in
the log instead of corrupting the stream.  One writer owns that descriptor,
so concurrent handlers can never interleave partial lines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import threading
from collections import deque
from typing import Callable, Iterator

from cl_mcp.wire.jsonrpc import LineSplitter, OversizedLine

log = logging.getLogger("cl_mcp.stdio")

CHUNK = 1 << 16
OUTPUT_BACKLOG = 4 << 20  # bytes of unread answers before reading pauses


def claim_stdout() -> int:
    """A private duplicate of stdout for MCP messages; fd 1 becomes stderr."""
    private = os.dup(1)
    os.dup2(2, 1)
    return private


def reopen_closed_stdin() -> None:
    """Put /dev/null on fd 0 if it is closed.  Its input is then simply
    empty, and no descriptor opened later (the private stdout, a socket) can
    land on fd 0 and be read as stdin."""
    try:
        os.fstat(0)
    except OSError:
        null = os.open(os.devnull, os.O_RDONLY)
        if null != 0:
            os.dup2(null, 0)
            os.close(null)


def _loop_can_watch(loop: asyncio.AbstractEventLoop, fd: int) -> bool:
    """True when LOOP can watch FD: a pipe, a socket or a terminal.  False
    for a regular file (always 'ready'), a closed descriptor, and a
    character device that epoll refuses (/dev/null: EPERM)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)):
        return False
    # Only registering tells: asyncio's pipe transports register FD later,
    # in a callback, where a refusal is only logged and input never comes.
    try:
        loop.add_reader(fd, lambda: None)
    except OSError:
        return False
    loop.remove_reader(fd)
    return True


class _ReadProtocol(asyncio.Protocol):
    def __init__(self, transport: StdioTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._transport._feed(data)

    def eof_received(self) -> bool:
        self._transport._feed(b"")
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport._feed(b"")


class _WriteProtocol(asyncio.Protocol):
    """Flow control: while answers pile up unread on stdout, stop reading
    requests, so a client that writes without reading cannot make cl-mcp
    hold an unbounded backlog of answers."""

    def __init__(self, transport: StdioTransport) -> None:
        self._transport = transport

    def pause_writing(self) -> None:
        self._transport._set_reading(False)

    def resume_writing(self) -> None:
        self._transport._set_reading(True)

    def connection_lost(self, exc: Exception | None) -> None:
        # The reader is gone, possibly while reading was paused: nothing will
        # resume it, so end the input here.
        self._transport._output_lost()


class StdioTransport:
    """Reads lines from IN_FD and writes messages to OUT_FD.

    Each complete line is handed to ON_LINE as soon as its bytes arrive, in
    the callback that read them: no queue and no reader task stand between
    stdin and the server (each would cost an event-loop iteration per
    request)."""

    def __init__(self, on_line: Callable[[bytes | OversizedLine], None],
                 in_fd: int = 0, out_fd: int = 1) -> None:
        self.on_line = on_line
        self._in_fd = in_fd
        self._out_fd = out_fd
        self._splitter = LineSplitter()
        # Lines read and not yet handed on (iterators over them), while
        # answers wait unread (`_held`): see `_hand_on`.
        self._waiting: deque[Iterator[bytes | OversizedLine]] = deque()
        self._held = False
        self._at_end = False
        self._out: asyncio.WriteTransport | None = None
        self._in: asyncio.BaseTransport | None = None
        self._input_ended: asyncio.Future[None] | None = None
        self._output_broken: asyncio.Future[None] | None = None
        self.broken = False
        # Whether stdin is watched by the event loop (a pipe, a socket, a
        # terminal): its end means the client has gone.  Otherwise (a file,
        # /dev/null) a thread reads it to its end.
        self.input_is_live = False

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._input_ended = loop.create_future()
        self._output_broken = loop.create_future()
        # The writer first: a request read while it is being set up would be
        # answered by plain os.write on a descriptor asyncio has already made
        # non-blocking, which fails (EAGAIN) for an answer larger than the
        # pipe's 64 KiB (tools/list is 77 KB).
        if _loop_can_watch(loop, self._out_fd):
            self._out, _ = await loop.connect_write_pipe(
                lambda: _WriteProtocol(self), os.fdopen(self._out_fd, "wb", 0, closefd=False)
            )
            self._out.set_write_buffer_limits(high=OUTPUT_BACKLOG)
        self.input_is_live = _loop_can_watch(loop, self._in_fd)
        if self.input_is_live:
            self._in, _ = await loop.connect_read_pipe(
                lambda: _ReadProtocol(self), os.fdopen(self._in_fd, "rb", 0, closefd=False)
            )
            # asyncio reads a pipe 256 KiB at a time.  A buffer that large is
            # mmapped and unmapped by malloc on every read: two page faults
            # per request, ~8 µs here, where a 64 KiB read costs 0.5 µs.
            self._in.max_size = CHUNK  # type: ignore[attr-defined]
        else:
            threading.Thread(target=self._read_blocking, args=(loop,), daemon=True).start()

    def _read_blocking(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            try:
                data = os.read(self._in_fd, CHUNK)
            except OSError:
                data = b""
            loop.call_soon_threadsafe(self._feed, data)
            if not data:
                return

    def _set_reading(self, on: bool) -> None:
        self._held = not on
        if isinstance(self._in, asyncio.ReadTransport) and not self._in.is_closing():
            if on:
                self._in.resume_reading()
            else:
                self._in.pause_reading()
        if on and self._waiting:
            asyncio.get_running_loop().call_soon(self._hand_on)

    def _feed(self, data: bytes) -> None:
        """Hand on the lines DATA completes; empty DATA is the end of input."""
        assert self._input_ended is not None
        if self._input_ended.done():
            return
        # Split now, whole: the splitter keeps a partial line for the next
        # read, which a half-consumed generator would not have left yet.
        self._waiting.append(iter(self._splitter.feed(data) if data else list(self._splitter.finish())))
        self._at_end = not data
        self._hand_on()

    def _hand_on(self) -> None:
        """Hand the lines read so far to the server, until answers pile up
        unread: one read holds up to 64 KiB of requests (1,300 tools/list
        calls, 100 MB of answers), so the pause must also stop the lines
        already read, which wait here until the answers drain."""
        assert self._input_ended is not None
        while self._waiting and not self._held and not self.broken:
            for line in self._waiting[0]:
                self.on_line(line)
                if self._held or self.broken:
                    break
            else:
                self._waiting.popleft()
        if self.broken or (self._at_end and not self._waiting):
            if not self._input_ended.done():
                self._input_ended.set_result(None)

    def _output_lost(self) -> None:
        self._note_broken()
        if self._input_ended is not None and not self._input_ended.done():
            self._input_ended.set_result(None)

    def _note_broken(self) -> None:
        if not self.broken:
            self.broken = True
            log.info("stdout closed by the client")
        if self._output_broken is not None and not self._output_broken.done():
            self._output_broken.set_result(None)

    async def input_ended(self) -> None:
        """Wait until stdin ends (or stdout breaks, which ends reading too)."""
        assert self._input_ended is not None
        await asyncio.shield(self._input_ended)

    async def output_lost(self) -> None:
        """Wait until nobody reads stdout any more: no answer can arrive."""
        assert self._output_broken is not None
        await asyncio.shield(self._output_broken)

    def write(self, data: bytes) -> None:
        """Send one encoded message.  A vanished reader is noted, not raised."""
        if self.broken:
            return
        try:
            if self._out is not None:
                if self._out.is_closing():
                    raise BrokenPipeError
                self._out.write(data)
            else:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._out_fd, view):]
        except (BrokenPipeError, ConnectionResetError):
            self._note_broken()

    async def drain(self, timeout: float = 2.0) -> None:
        """Wait (bounded) until everything written has left the process."""
        if self._out is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._out.get_write_buffer_size() and not self._out.is_closing():
            if loop.time() > deadline:
                return
            await asyncio.sleep(0.01)

    def close(self) -> None:
        if self._in is not None:
            self._in.close()
        if self._out is not None:
            self._out.close()
