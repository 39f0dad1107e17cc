"""An asyncio connection to Swank.

The protocol's receive callback reads each message: it matches `:return`s
to the futures of pending requests by id, and answers everything Swank may
be waiting for (`:ping`, `:read-string`, `:y-or-n-p`, `:eval`, ...) at once,
because a Swank thread that asks is blocked until it hears back.

No thread is ever left in Swank's debugger: a `:debug` event is answered by
leaving the debugger (`throw-to-toplevel` in that thread), and the request
it interrupted fails with the debugger's condition text.  cl-mcp's agent
catches user errors before they reach the debugger, so this is the safety
net, not the normal path.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import select
import time
from typing import Callable, Iterator

from cl_mcp.errors import ProtocolError, SwankError
from cl_mcp.lisp.swank.framing import FrameDecoder, encode_frame
from cl_mcp.wire import sexp
from cl_mcp.wire.sexp import Keyword, SExp, Symbol

log = logging.getLogger("cl_mcp.swank")

# The package requests are read in, and a fresh session's current package.
DEFAULT_PACKAGE = "COMMON-LISP-USER"
READ_CHUNK = 1 << 16
_TRAILING_ID = re.compile(r"(\d+)\)\s*$")
_OK = Keyword("ok")
_NEWS = Keyword("cl-mcp-threads")  # the agent's news of the user's threads, on a channel


def _time_out(future: asyncio.Future[SExp]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _read_soon(fd: int, spin: float, window: float) -> bytes | None:
    """What FD (non-blocking) has to read within WINDOW seconds, or None.

    For the first SPIN seconds it polls instead of sleeping: a process that
    sleeps lets its CPU go idle, and waking an idle CPU again (an
    inter-processor interrupt; on a virtual machine, a trip through the
    hypervisor) cost more than a quick evaluation takes.  It yields between
    polls, so an image that shares this CPU still runs."""
    clock = time.perf_counter
    spin_until = clock() + spin
    while True:
        try:
            return os.read(fd, READ_CHUNK)
        except BlockingIOError:
            pass
        if clock() >= spin_until:
            break
        os.sched_yield()
    if select.select([fd], [], [], max(0.0, window - spin))[0]:
        return os.read(fd, READ_CHUNK)
    return None


class RexAborted(SwankError):
    """A request ended with `(:abort ...)`: it was unwound, usually because it
    entered the debugger and was thrown out of it."""

    def __init__(self, message: str, condition: str | None = None) -> None:
        super().__init__(message)
        self.condition = condition


class _SwankProtocol(asyncio.Protocol):
    """Bytes from the socket, decoded and dispatched in the callback that
    received them: no reader task wakes up in between (one event-loop
    iteration less per request)."""

    def __init__(self) -> None:
        self.connection: SwankConnection | None = None
        self.transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        assert self.connection is not None
        try:
            self._decoder.feed(data)
            while (payload := self._decoder.next_payload()) is not None:
                self.connection._dispatch(sexp.loads(payload))
        except ProtocolError as error:
            reason = f"Swank sent an unreadable message: {error}"
            log.error(reason)
            self.connection._lose(reason)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        if self.connection is not None:
            reason = "connection to the Lisp image was lost"
            self.connection._lose(f"{reason} ({exc})" if exc else reason)


class SwankConnection:
    """A connection to one Swank server.  Use `open`, then `rex`."""

    def __init__(
        self,
        transport: asyncio.Transport,
        protocol: _SwankProtocol,
        *,
        on_output: Callable[[str], None] | None = None,
        ids: Iterator[int] | None = None,
        answer_window: float = 0.0,
        answer_spin: float = 0.0,
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self._answer_window = answer_window
        self._answer_spin = answer_spin
        socket = transport.get_extra_info("socket")
        self._fd = socket.fileno() if socket is not None else -1  # what `_read_now` reads
        self._on_output = on_output or (lambda text: log.info("lisp output: %s", text.rstrip()))
        self._pending: dict[int, asyncio.Future[SExp]] = {}
        # Who hears the agent's `:cl-mcp-threads` events: what the user's
        # threads did, sent just before a reply (cl_mcp/lisp/thread_news.py).
        self.on_news: Callable[[SExp], None] | None = None
        self._debug_conditions: dict[int, str] = {}
        # Request ids; connections to one image share them (see `open`).
        self.ids = ids or itertools.count(1)
        self._closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        protocol.connection = self

    @classmethod
    async def open(
        cls,
        host: str,
        port: int | None,
        *,
        secret: str | None = None,
        on_output: Callable[[str], None] | None = None,
        timeout: float = 10.0,
        ids: Iterator[int] | None = None,
        answer_window: float = 0.0,
        answer_spin: float = 0.0,
    ) -> SwankConnection:
        """Connect to Swank at HOST:PORT, or with PORT None at the Unix-domain
        socket HOST (an abstract one when HOST starts with a NUL), presenting
        SECRET first if given.

        Pass IDS, another connection's `ids`, for a second connection to the
        same image: a request's late duplicate `:return` may come back on the
        other connection, and must not match a request pending there.

        With an ANSWER_WINDOW (seconds), `rex` waits that long for the answer
        right after sending, and takes it in at once (see `_read_now`); for
        the first ANSWER_SPIN seconds of it without sleeping."""
        loop = asyncio.get_running_loop()
        connecting = (loop.create_unix_connection(_SwankProtocol, host) if port is None
                      else loop.create_connection(_SwankProtocol, host, port))
        try:
            transport, protocol = await asyncio.wait_for(connecting, timeout)
        except (OSError, asyncio.TimeoutError) as error:
            where = repr(host.lstrip("\0")) if port is None else f"{host}:{port}"
            raise SwankError(f"cannot connect to Swank at {where}: {error}") from error
        # asyncio sets TCP_NODELAY on TCP transports (Swank does not on its
        # end; the agent does), so a request leaves at once.  Its 256 KiB
        # reads cost two page faults each (malloc maps and unmaps a buffer
        # that large); 64 KiB reads come from the heap.
        transport.max_size = READ_CHUNK  # type: ignore[attr-defined]
        if secret is not None:
            # Swank reads the secret as a raw payload, not as an s-expression.
            transport.write(encode_frame(secret))
        return cls(transport, protocol, on_output=on_output, ids=ids,
                   answer_window=answer_window, answer_spin=answer_spin)

    # ------------------------------------------------------------ requests

    async def rex(
        self, form: SExp, package: str = DEFAULT_PACKAGE, thread: SExp = True,
        *, deadline: float | None = None,
    ) -> SExp:
        """Evaluate FORM in the image (`:emacs-rex`) and return its value.

        Raises `RexAborted` when the request was unwound, `SwankError` when
        the connection is lost or Swank rejects the request, and
        `TimeoutError` when no answer came within DEADLINE seconds."""
        if self._closed.done():
            raise SwankError(self._closed.result())
        request_id = next(self.ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SExp] = loop.create_future()
        self._pending[request_id] = future
        timer = None
        try:
            # Written here, not as a list for `_send`: a rex goes out on every call.
            self._send_text(f"(:emacs-rex {sexp.dumps(form)} {sexp.dumps(package)} "
                            f"{sexp.dumps(thread)} {request_id})")
            if self._answer_window:
                self._read_now()
            if deadline is not None and not future.done():
                # A timer, not asyncio.timeout: the request may start outside
                # any task (see server/eager.py).  Only when the answer is not in
                # yet: the answer window is far shorter than any deadline.
                timer = loop.call_later(deadline, _time_out, future)
            return await future
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(request_id, None)
            self._debug_conditions.pop(request_id, None)

    def _read_now(self) -> None:
        """Wait up to the answer window for the image to answer and take the
        answer in at once.  A quick answer (most evaluations are quick) then
        completes the request without a pass through the event loop, which
        costs more than the wait; a slow one arrives the usual way.  Nothing
        else is served meanwhile, so the window is short."""
        if self._transport.is_closing():  # its descriptor may be closed, or another's
            return
        try:
            data = _read_soon(self._fd, self._answer_spin, self._answer_window)
        except OSError:
            return  # the transport meets the same trouble and reports it
        if data:  # at end of file, the transport sees it too
            self._protocol.data_received(data)

    def interrupt(self, thread: SExp) -> None:
        """Break into THREAD (`:emacs-interrupt`)."""
        self._send([Keyword("emacs-interrupt"), thread])

    @property
    def closed(self) -> bool:
        return self._closed.done()

    async def wait_closed(self) -> str:
        """Wait until the connection is lost; return why."""
        return await asyncio.shield(self._closed)

    async def close(self) -> None:
        """Close the connection; pending requests fail."""
        self._lose("connection closed by cl-mcp")

    # ------------------------------------------------------------ internals

    def _send(self, message: SExp) -> None:
        self._send_text(sexp.dumps(message))

    def _send_text(self, text: str) -> None:
        if self._closed.done():
            raise SwankError(self._closed.result())
        self._transport.write(encode_frame(text))

    def _lose(self, reason: str) -> None:
        """Mark the connection lost and fail every pending request."""
        if not self._closed.done():
            self._closed.set_result(reason)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(SwankError(reason))
        self._pending.clear()
        self._transport.close()

    def _dispatch(self, event: SExp) -> None:
        if not isinstance(event, list) or not event or not isinstance(event[0], Keyword):
            log.warning("ignoring malformed Swank event %.200r", event)
            return
        kind, args = event[0].name, event[1:]
        handler = _HANDLERS.get(kind)
        if handler is None:
            log.debug("ignoring Swank event :%s", kind)
            return
        try:
            handler(self, args)
        except (IndexError, TypeError, ValueError) as error:
            log.warning("ignoring malformed Swank event %.200r (%s)", event, error)

    def _on_return(self, args: list[SExp]) -> None:
        (status, *value), request_id = args[0], args[1]
        future = self._pending.get(request_id)  # type: ignore[arg-type]
        if future is None or future.done():
            return
        if status == _OK:
            future.set_result(value[0] if value else [])
        else:
            condition = self._debug_conditions.get(request_id)  # type: ignore[arg-type]
            text = value[0] if value and isinstance(value[0], str) else "aborted"
            future.set_exception(RexAborted(condition or text, condition))

    def _on_ping(self, args: list[SExp]) -> None:
        thread, tag = args
        self._send([Keyword("emacs-pong"), thread, tag])

    def _on_debug(self, args: list[SExp]) -> None:
        thread, level, condition, _restarts, _frames, continuations = args[:6]
        message = condition[0] if isinstance(condition, list) and condition else "debugger entered"
        ours = [c for c in continuations or [] if c in self._pending]  # type: ignore[union-attr]
        for request_id in ours:
            self._debug_conditions[request_id] = str(message)  # type: ignore[index]
        if ours:
            log.warning("request %s entered the debugger: %s; leaving it", ours, message)
        else:
            log.warning("thread %s entered the debugger: %s; aborting it", thread, message)
        # Leave the debugger at once, in that thread.  The reply is of no
        # interest; the interrupted request fails with the condition above.
        self._send([Keyword("emacs-rex"), [Symbol("swank:throw-to-toplevel")],
                    DEFAULT_PACKAGE, thread, next(self.ids)])

    def _on_write_string(self, args: list[SExp]) -> None:
        if args and isinstance(args[0], str):
            self._on_output(args[0])
        if len(args) >= 3 and args[2]:
            self._send([Keyword("write-done"), args[2]])

    def _on_channel_send(self, args: list[SExp]) -> None:
        _channel, message = args[0], args[1]
        if not (isinstance(message, list) and message and message[0] == _NEWS):
            log.debug("ignoring a message on Swank channel %r", _channel)
        elif self.on_news is not None:
            self.on_news(message[1])
        else:
            log.info("thread news with nobody to hear it: %.300r", message[1])

    def _on_read_string(self, args: list[SExp]) -> None:
        # Nothing can type into the image's standard input: break the read,
        # which lands in the debugger and is left from there.
        thread = args[0]
        log.warning("thread %s asked for input; interrupting it", thread)
        self.interrupt(thread)

    def _on_emacs_question(self, args: list[SExp]) -> None:
        thread, tag = args[0], args[1]
        self._send([Keyword("emacs-return"), thread, tag, []])

    def _on_editor_rpc(self, args: list[SExp]) -> None:
        thread, tag = args[0], args[1]
        self._send([Keyword("emacs-return"), thread, tag, [Keyword("abort")]])

    def _on_inspect(self, args: list[SExp]) -> None:
        if len(args) >= 3 and args[1] and args[2]:
            self._send([Keyword("emacs-return"), args[1], args[2], []])

    def _on_invalid_rpc(self, args: list[SExp]) -> None:
        request_id, message = args[0], args[1] if len(args) > 1 else "invalid RPC"
        self._fail(request_id, f"Swank rejected the request: {message}")

    def _on_reader_error(self, args: list[SExp]) -> None:
        packet, message = (list(args) + ["", ""])[:2]
        match = _TRAILING_ID.search(str(packet))
        if match:
            self._fail(int(match.group(1)), f"Swank could not read the request: {message}")
        else:
            log.error("Swank could not read a message: %s", message)

    def _fail(self, request_id: SExp, message: str) -> None:
        future = self._pending.get(request_id)  # type: ignore[arg-type]
        if future is not None and not future.done():
            future.set_exception(SwankError(message))


_HANDLERS: dict[str, Callable[[SwankConnection, list[SExp]], None]] = {
    "return": SwankConnection._on_return,
    "ping": SwankConnection._on_ping,
    "debug": SwankConnection._on_debug,
    "write-string": SwankConnection._on_write_string,
    "channel-send": SwankConnection._on_channel_send,
    "read-string": SwankConnection._on_read_string,
    "y-or-n-p": SwankConnection._on_emacs_question,
    "read-from-minibuffer": SwankConnection._on_emacs_question,
    "eval": SwankConnection._on_editor_rpc,
    "ed-rpc": SwankConnection._on_editor_rpc,
    "inspect": SwankConnection._on_inspect,
    "invalid-rpc": SwankConnection._on_invalid_rpc,
    "reader-error": SwankConnection._on_reader_error,
}
