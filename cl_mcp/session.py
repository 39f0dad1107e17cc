"""The one Lisp session the tools talk to.

It owns the link to the image (embedded: started in the background so
`initialize` is answered at once; attached: the programmer's Swank), the
Swank connection, and the session's current package.  Work in the image runs
one request at a time, in arrival order: an asyncio.Lock is FIFO, and
callers take it before their first await.

When an embedded image dies, the call in flight fails with a clear error, a
line is logged, and the next call starts a fresh image.  When the
connection to an attached image drops, calls fail at once with a clear
error while cl-mcp reconnects with backoff; the image itself is never
stopped or replaced.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from cl_mcp import sexp
from cl_mcp.errors import ImageError, ProtocolError, SwankError
from cl_mcp.image import ImageConfig
from cl_mcp.link import AttachedLink, EmbeddedLink
from cl_mcp.sexp import Keyword, SExp, Symbol
from cl_mcp.swank.client import SwankConnection

log = logging.getLogger("cl_mcp.session")

DEFAULT_PACKAGE = "COMMON-LISP-USER"
AGENT_MAX_OUTPUT = 1_000_000  # cl-mcp-agent:evaluate's default :max-output
# How long past its own deadline an evaluation may take to come back (the
# image interrupts it itself) before cl-mcp gives up on the image.
DEADLINE_GRACE = 5.0
RECONNECT_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # then every 8 s
# Setting up a new image or connection (configure) is quick; an image that
# does not answer by then will not.
OPEN_TIMEOUT = 60.0
# How long a live image takes to answer (cl:values) when only one of its
# connections was lost, even while another thread of it is busy.
LIVENESS_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class SessionConfig:
    image: ImageConfig = ImageConfig()
    connect: tuple[str, int] | None = None  # attach to this Swank instead
    eval_timeout: float = 30.0
    load_timeout: float = 300.0
    max_output: int = 1_000_000
    max_suspended: int = 8
    suspend_timeout: float = 600.0


class SessionError(Exception):
    """The session could not run the request; the text says why for the user."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


def exit_text(code: int | None) -> str:
    """How a process ended, in words: a negative code is a signal."""
    if code is None:
        return "exit status unknown"
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


async def _cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel TASK if it still runs, and wait until it has stopped."""
    if task is None or task.done():
        return
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass


def _lisp_seconds(seconds: float) -> int | float:
    """Whole seconds as an integer: the Lisp reader reads one much faster
    than a double-float."""
    return int(seconds) if float(seconds).is_integer() else float(seconds)


def _name(value: SExp) -> SExp:
    return value.name if isinstance(value, Keyword) else value


def _result_dict(value: SExp) -> dict[str, Any]:
    """An agent plist with keyword values turned into their names."""
    result = {key: _name(item) for key, item in sexp.plist(value).items()}
    if isinstance(result.get("error"), list):
        result["error"] = {k: _name(v) for k, v in sexp.plist(result["error"]).items()}
    return result


class LispSession:
    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.package = DEFAULT_PACKAGE
        self._lock = asyncio.Lock()
        self._link: EmbeddedLink | AttachedLink = (
            AttachedLink(*config.connect) if config.connect else EmbeddedLink(config.image))
        self._connection: SwankConnection | None = None
        # Embedded only: the faster connection the session's requests take
        # (see EmbeddedLink.open_lane); `_connection` is kept for what runs
        # alongside them.
        self._lane: SwankConnection | None = None
        self._starting: asyncio.Task[SwankConnection] | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._last_failure = ""
        # Set when the image died between calls; the next result says so.
        self.lost_state: str | None = None
        # Tags name calls for cancel-evaluation and output-tail in the image.
        # A random start keeps two sessions attached to one image apart (and
        # stays a fixnum in SBCL).
        self._tags = itertools.count(secrets.randbits(40) << 16)
        # The tag of the call running in the image (calls run one at a time).
        self.running_tag: int | None = None

    @property
    def shared(self) -> bool:
        """True when the image is the programmer's (attach mode)."""
        return self._link.shared

    # ------------------------------------------------------------ lifecycle

    def start_in_background(self) -> None:
        """Begin starting (or connecting to) the image now, so the first call
        waits less."""
        if self._starting is None:
            self._starting = asyncio.create_task(self._open(), name="image-start")

    async def _open(self) -> SwankConnection:
        """Open the link and set the image up.  A start that fails half-way
        stops what it started (the link does so for its own steps)."""
        try:
            connection = await self._link.open()
        except (ImageError, SwankError, OSError) as error:
            self._last_failure = str(error) or type(error).__name__
            raise
        try:
            await connection.rex([Symbol("cl-mcp-agent:configure"),
                                  Keyword("max-suspended"), self.config.max_suspended,
                                  Keyword("suspend-seconds"), float(self.config.suspend_timeout)],
                                 deadline=OPEN_TIMEOUT)
        except BaseException as error:
            self._last_failure = str(error) or type(error).__name__
            await connection.close()
            await self._link.close(grace=0.5)
            raise
        self._lane = await self._open_lane(connection)
        self._connection = connection
        self._last_failure = ""
        if self._link.shared:
            # Start reconnecting as soon as the connection drops, not only
            # when the next call finds it gone.
            self._watcher = asyncio.create_task(self._watch(connection), name="watch-connection")
        return connection

    async def _watch(self, connection: SwankConnection) -> None:
        reason = await connection.wait_closed()
        if self._connection is connection:
            self._last_failure = reason
            log.warning("the connection to %s was lost (%s); reconnecting",
                        self._link.describe(), reason)
            self._connection = None
            self._starting = None
            self._start_reconnecting()

    def _start_reconnecting(self) -> None:
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.create_task(self._reconnect(), name="reconnect")

    async def _connection_ready(self) -> SwankConnection:
        """The live connection.  Embedded: a fresh image when there is none.
        Attached: a clear error at once while reconnecting."""
        if self._connection is not None and not self._connection.closed:
            return self._connection
        if self._link.shared:
            return await self._attached_connection()
        if self._connection is not None:
            exit_code = await self._discard_image("the Lisp image exited")
            self.lost_state = (
                f"The Lisp image had exited ({exit_text(exit_code)}) since the last call, so this "
                "call ran in a fresh image: earlier definitions and loaded systems are gone.")
        if self._starting is None or (self._starting.done() and self._starting.exception()):
            if self._starting is not None:
                self._starting.exception()  # retrieved; a new attempt follows
            self._starting = asyncio.create_task(self._open(), name="image-start")
        try:
            return await asyncio.shield(self._starting)
        except (ImageError, SwankError, OSError) as error:
            self._starting = None
            raise SessionError("CL-MCP:IMAGE-START-FAILED", str(error)) from None

    async def _attached_connection(self) -> SwankConnection:
        if self._connection is not None:  # it dropped; the watcher has not run yet
            await self._connection.close()
            self._connection = None
            self._starting = None
        if self._starting is not None:
            starting, self._starting = self._starting, None
            try:
                return await asyncio.shield(starting)  # the first connection
            except (ImageError, SwankError, OSError):
                pass  # _open kept the reason
        self._start_reconnecting()
        raise SessionError(
            "CL-MCP:NOT-CONNECTED",
            f"Not connected to {self._link.describe()} ({self._last_failure or 'connection lost'}); "
            "cl-mcp keeps trying to reconnect in the background. Try again shortly.")

    async def _reconnect(self) -> None:
        """Try to connect again, with growing pauses, until it works."""
        for attempt in itertools.count():
            delay = RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)]
            await asyncio.sleep(delay)
            try:
                await self._open()
            except (ImageError, SwankError, OSError) as error:
                log.info("reconnecting to %s failed: %s", self._link.describe(), error)
                continue
            log.warning("reconnected to %s", self._link.describe())
            return

    async def _discard_image(self, reason: str, *, lost: bool = True) -> int | None:
        """Forget the current embedded image (stopping it if it still runs)
        and return its exit code.  LOST says the user did not ask for this,
        so it is logged as a warning."""
        connection, starting, lane = self._connection, self._starting, self._lane
        self._connection = self._starting = self._lane = None
        self.package = DEFAULT_PACKAGE
        await _cancel_and_wait(starting)
        for each in (lane, connection):
            if each is not None:
                await each.close()
        description = self._link.describe()
        exit_code = await self._link.close(grace=0.5)
        if lost:
            log.warning("%s (%s); the session's state was lost, the next "
                        "call starts a fresh image", reason, exit_text(exit_code))
        else:
            log.info("%s: %s stopped", reason, description)
        return exit_code

    async def close(self) -> None:
        """Stop the embedded image, or leave the attached one.  Safe to call
        more than once."""
        for task in (self._starting, self._reconnecting, self._watcher):
            await _cancel_and_wait(task)
        if self._lane is not None:
            await self._lane.close()
            self._lane = None
        if self._connection is not None:
            if self._link.shared:
                await self._leave_shared_image(self._connection)
            await self._connection.close()
        await self._link.close()
        self._connection = self._starting = self._reconnecting = self._watcher = None

    async def _leave_shared_image(self, connection: SwankConnection) -> None:
        """Abort the evaluations still waiting at an error in the
        programmer's image: nobody is left to continue them."""
        if connection.closed:
            return
        try:
            await asyncio.wait_for(connection.rex([Symbol("cl-mcp-agent:abort-all")]), 2)
        except (SwankError, asyncio.TimeoutError):
            pass

    # ------------------------------------------------------------ requests

    async def _call(self, form: SExp, deadline: float, tag: int | None = None) -> SExp:
        """Run FORM in the image.  A dead image or one that misses DEADLINE
        becomes a `SessionError`, and the next call gets a fresh image.  When
        the caller is cancelled, the work tagged TAG is aborted in the image
        before the cancellation goes on (so the next call never overlaps it)."""
        control = await self._connection_ready()
        connection = await self._lane_or(control)
        self.running_tag = tag
        try:
            return await connection.rex(form, deadline=deadline)
        except ProtocolError as error:  # the request itself cannot be sent
            raise SessionError("CL-MCP:REQUEST-TOO-LARGE", str(error)) from None
        except asyncio.CancelledError:
            if tag is not None and not control.closed:
                await asyncio.shield(self._abort_in_image(control, tag))
            raise
        except asyncio.TimeoutError:
            if self._link.shared:
                # Never the programmer's image: abort the work, keep the image.
                if tag is not None:
                    await self._abort_in_image(control, tag)
                raise SessionError(
                    "CL-MCP:IMAGE-UNRESPONSIVE",
                    f"The image did not answer within {deadline:g} seconds; cl-mcp asked it "
                    "to abort the call.") from None
            await self._discard_image("the Lisp image did not respond")
            raise SessionError(
                "CL-MCP:IMAGE-UNRESPONSIVE",
                f"The Lisp image did not answer within {deadline:g} seconds, so it was "
                "restarted. The session's definitions were lost.",
            ) from None
        except SwankError as error:
            if connection.closed and connection is not control and await self._answers(control):
                # Only the lane is gone: the image lives, and so does the
                # session.  This call's work is stopped (its answer could
                # never arrive) and the next call takes a new lane.
                if tag is not None:
                    await self._abort_in_image(control, tag)
                raise SessionError(
                    "CL-MCP:CONNECTION-LOST",
                    "The connection that carried this call to the image was lost, so the call "
                    "was aborted and its result is unknown. The image and its definitions are "
                    "kept; the next call takes a new connection.") from None
            if connection.closed:
                if self._link.shared:
                    raise SessionError(
                        "CL-MCP:CONNECTION-LOST",
                        f"The connection to {self._link.describe()} was lost during this call; "
                        "cl-mcp is reconnecting. The image itself is not restarted.") from None
                await self._discard_image("the Lisp image exited")
                raise SessionError(
                    "CL-MCP:IMAGE-LOST",
                    "The Lisp image exited or the connection to it was lost during this "
                    "call. The next call starts a fresh image; the session's definitions "
                    "were lost.",
                ) from None
            raise SessionError("CL-MCP:SWANK-ERROR", str(error)) from None
        finally:
            self.running_tag = None

    async def _open_lane(self, control: SwankConnection) -> SwankConnection | None:
        """A lane to the image (embedded only), or None when it cannot have
        one: requests then take CONTROL."""
        try:
            return await self._link.open_lane(control)
        except (SwankError, OSError) as error:
            log.warning("no lane to the image (%s); requests take Swank's connection", error)
            return None

    async def _lane_or(self, control: SwankConnection) -> SwankConnection:
        """The lane, opened anew if it was lost while the image lives; else
        CONTROL."""
        if self._lane is not None and self._lane.closed:
            log.warning("the lane to the image was lost; opening a new one")
            self._lane = await self._open_lane(control)
        return self._lane or control

    async def _answers(self, connection: SwankConnection) -> bool:
        """True when the image answers on CONNECTION within a few seconds:
        one socket closing says nothing about the other, nor the process."""
        try:
            await connection.rex([Symbol("cl:values")], deadline=LIVENESS_TIMEOUT)
        except (SwankError, TimeoutError):
            return False
        return True

    async def _abort_in_image(self, connection: SwankConnection, tag: int) -> None:
        try:
            await asyncio.wait_for(
                connection.rex([Symbol("cl-mcp-agent:cancel-evaluation"), tag]), 10)
        except (SwankError, asyncio.TimeoutError) as error:
            log.warning("could not cancel call %s in the image: %s", tag, error)

    async def output_tail(self) -> str | None:
        """The latest line of output of the call running now, if any."""
        tag, connection = self.running_tag, self._connection
        if tag is None or connection is None or connection.closed:
            return None
        try:
            line = await asyncio.wait_for(
                connection.rex([Symbol("cl-mcp-agent:output-tail"), tag]), 2)
        except (SwankError, asyncio.TimeoutError):
            return None
        return line if isinstance(line, str) and line else None

    async def evaluate(
        self,
        code: str,
        package: str | None = None,
        capture_time: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Evaluate CODE; return the agent's result plist as a dict."""
        timeout = timeout or self.config.eval_timeout
        async with self._lock:
            # Only what differs from the agent's defaults: Swank reads every
            # request, and each keyword (a float most of all) costs microseconds.
            form: list[SExp] = [Symbol("cl-mcp-agent:evaluate"), code,
                                Keyword("timeout"), _lisp_seconds(timeout),
                                Keyword("tag"), tag := next(self._tags)]
            if (package or self.package) != DEFAULT_PACKAGE:
                form += [Keyword("package"), package or self.package]
            if package is not None:
                form += [Keyword("explicit-package"), True]
            if capture_time:
                form += [Keyword("capture-time"), True]
            if self.config.max_output != AGENT_MAX_OUTPUT:
                form += [Keyword("max-output"), self.config.max_output]
            result = _result_dict(await self._call(form, timeout + DEADLINE_GRACE, tag))
            self._follow_package(result, explicit=package is not None)
            if (result.get("error") or {}).get("type") == "CL-MCP:IMAGE-EXITING" and not self.shared:
                # The code asked the image to exit: let it, before the next call.
                exit_code = await self._discard_image("the Lisp image exited (SB-EXT:EXIT)")
                self.lost_state = (f"The Lisp image exited ({exit_text(exit_code)}) at the previous "
                                   "call's request, so this call ran in a fresh image.")
            return result

    def _follow_package(self, result: dict[str, Any], explicit: bool) -> None:
        """An explicit package is for one call only, unless the code itself
        moved to another package (IN-PACKAGE sticks)."""
        if isinstance(result.get("package"), str) and (not explicit or result.get("package-changed")):
            self.package = result["package"]

    async def invoke_restart(
        self, restart: int | str, evaluation: int | None = None,
        values: list[str] | None = None, timeout: float | None = None,
    ) -> dict[str, Any]:
        """Continue a waiting evaluation through one of its restarts; its new
        outcome, as `evaluate` returns it."""
        timeout = timeout or self.config.eval_timeout
        async with self._lock:
            form = [Symbol("cl-mcp-agent:invoke-restart-of"), evaluation, restart,
                    Keyword("values"), [Symbol("cl:quote"), values or []],
                    Keyword("timeout"), float(timeout), Keyword("tag"), tag := next(self._tags)]
            result = _result_dict(await self._call(form, timeout + DEADLINE_GRACE, tag))
            self._follow_package(result, explicit=True)
            return result

    async def backtrace(self, evaluation: int | None = None, count: int = 20) -> dict[str, Any]:
        """The frames and their locals of a waiting evaluation."""
        async with self._lock:
            form = [Symbol("cl-mcp-agent:backtrace-of"), evaluation, Keyword("count"), count]
            return _result_dict(await self._call(form, self.config.eval_timeout + DEADLINE_GRACE))

    async def eval_in_frame(self, frame: int, code: str, evaluation: int | None = None) -> dict[str, Any]:
        """Evaluate CODE in a frame of a waiting evaluation."""
        async with self._lock:
            form = [Symbol("cl-mcp-agent:eval-in-frame-of"), evaluation, frame, code,
                    Keyword("timeout"), float(self.config.eval_timeout)]
            return _result_dict(await self._call(form, self.config.eval_timeout + DEADLINE_GRACE))

    async def list_definitions(self, kind: str = "all") -> list[tuple[str, str, str]]:
        async with self._lock:
            form = [Symbol("cl-mcp-agent:list-definitions"), Keyword("type"), kind]
            entries = await self._call(form, self.config.eval_timeout + DEADLINE_GRACE)
        return [(_name(k), name, detail) for k, name, detail in entries]  # type: ignore[misc]

    async def load_system(self, name: str) -> dict[str, Any]:
        async with self._lock:
            form = [Symbol("cl-mcp-agent:load-system"), name, Keyword("tag"), tag := next(self._tags)]
            return _result_dict(await self._call(form, self.config.load_timeout, tag))

    async def reset(self) -> None:
        """Embedded: a fresh image, nothing of the old session survives.
        Attached: only what the session created goes (soft reset)."""
        async with self._lock:
            if self._link.shared:
                await self._call([Symbol("cl-mcp-agent:soft-reset")], self.config.eval_timeout)
            else:
                await self._discard_image("session reset", lost=False)
                await self._connection_ready()
            self.package = DEFAULT_PACKAGE
            self.lost_state = None

    def take_lost_state(self) -> str | None:
        """The notice that state was lost since the last call, once."""
        notice, self.lost_state = self.lost_state, None
        return notice
