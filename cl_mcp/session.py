"""The one Lisp session the tools talk to.

It owns the image (started in the background so `initialize` is answered at
once), the Swank connection, and the session's current package.  Work in
the image runs one request at a time, in arrival order: an asyncio.Lock is
FIFO, and callers take it before their first await.

When the image dies, the call in flight fails with a clear error, a line is
logged, and the next call starts a fresh image.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import Any

from cl_mcp import sexp
from cl_mcp.errors import ImageError, SwankError
from cl_mcp.image import ImageConfig, LispImage
from cl_mcp.sexp import Keyword, SExp, Symbol
from cl_mcp.swank.client import SwankConnection

log = logging.getLogger("cl_mcp.session")

DEFAULT_PACKAGE = "COMMON-LISP-USER"
# How long past its own deadline an evaluation may take to come back (the
# image interrupts it itself) before cl-mcp gives up on the image.
DEADLINE_GRACE = 5.0


@dataclass(frozen=True, slots=True)
class SessionConfig:
    image: ImageConfig = ImageConfig()
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
        self._image: LispImage | None = None
        self._connection: SwankConnection | None = None
        self._starting: asyncio.Task[SwankConnection] | None = None
        # Set when the image died between calls; the next result says so.
        self.lost_state: str | None = None
        # The tag of the call running in the image (calls run one at a time).
        self._tags = itertools.count(1)
        self.running_tag: int | None = None

    # ------------------------------------------------------------ lifecycle

    def start_in_background(self) -> None:
        """Begin starting the image now, so the first call waits less."""
        if self._starting is None:
            self._starting = asyncio.create_task(self._start_image(), name="image-start")

    async def _start_image(self) -> SwankConnection:
        image = LispImage(self.config.image)
        self._image = image
        port = await image.start()
        connection = await SwankConnection.open("127.0.0.1", port, secret=image.secret)
        await connection.rex([Symbol("cl-mcp-agent:set-connection-nodelay")])
        await connection.rex([Symbol("cl-mcp-agent:configure"),
                              Keyword("max-suspended"), self.config.max_suspended,
                              Keyword("suspend-seconds"), float(self.config.suspend_timeout)])
        log.info("Lisp image ready (pid %s, port %s)", image.pid, port)
        self._connection = connection
        return connection

    async def _connection_ready(self) -> SwankConnection:
        """The live connection, starting a fresh image when there is none."""
        if self._connection is not None and not self._connection.closed:
            return self._connection
        if self._connection is not None:
            exit_code = await self._discard_image("the Lisp image exited")
            self.lost_state = (
                f"The Lisp image had exited ({exit_text(exit_code)}) since the last call, so this "
                "call ran in a fresh image: earlier definitions and loaded systems are gone.")
        if self._starting is None or (self._starting.done() and self._starting.exception()):
            if self._starting is not None:
                self._starting.exception()  # retrieved; a new attempt follows
            self._starting = asyncio.create_task(self._start_image(), name="image-start")
        try:
            return await asyncio.shield(self._starting)
        except (ImageError, SwankError) as error:
            self._starting = None
            raise SessionError("CL-MCP:IMAGE-START-FAILED", str(error)) from None

    async def _discard_image(self, reason: str, *, lost: bool = True) -> int | None:
        """Forget the current image (stopping it if it still runs) and return
        its exit code.  LOST says the user did not ask for this, so it is
        logged as a warning."""
        image, connection = self._image, self._connection
        self._image = self._connection = self._starting = None
        self.package = DEFAULT_PACKAGE
        if connection is not None:
            await connection.close()
        if image is not None:
            await image.stop(grace=0.5)
            exit_code = image.returncode
            if lost:
                log.warning("%s (%s); the session's state was lost, the next "
                            "call starts a fresh image", reason, exit_text(exit_code))
            else:
                log.info("%s: image (pid %s) stopped", reason, image.pid)
            return exit_code
        return None

    async def close(self) -> None:
        """Stop the image.  Safe to call more than once."""
        if self._starting is not None and not self._starting.done():
            self._starting.cancel()
            try:
                await self._starting
            except (asyncio.CancelledError, Exception):
                pass
        if self._connection is not None:
            await self._connection.close()
        if self._image is not None:
            await self._image.stop()
        self._image = self._connection = self._starting = None

    # ------------------------------------------------------------ requests

    async def _call(self, form: SExp, deadline: float, tag: int | None = None) -> SExp:
        """Run FORM in the image.  A dead image or one that misses DEADLINE
        becomes a `SessionError`, and the next call gets a fresh image.  When
        the caller is cancelled, the work tagged TAG is aborted in the image
        before the cancellation goes on (so the next call never overlaps it)."""
        connection = await self._connection_ready()
        self.running_tag = tag
        try:
            return await asyncio.wait_for(connection.rex(form), deadline)
        except asyncio.CancelledError:
            if tag is not None and not connection.closed:
                await asyncio.shield(self._abort_in_image(connection, tag))
            raise
        except asyncio.TimeoutError:
            await self._discard_image("the Lisp image did not respond")
            raise SessionError(
                "CL-MCP:IMAGE-UNRESPONSIVE",
                f"The Lisp image did not answer within {deadline:g} seconds, so it was "
                "restarted. The session's definitions were lost.",
            ) from None
        except SwankError as error:
            if connection.closed:
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
            form = [
                Symbol("cl-mcp-agent:evaluate"), code,
                Keyword("package"), package or self.package,
                Keyword("explicit-package"), package is not None,
                Keyword("capture-time"), capture_time,
                Keyword("timeout"), float(timeout),
                Keyword("max-output"), self.config.max_output,
                Keyword("tag"), tag := next(self._tags),
            ]
            result = _result_dict(await self._call(form, timeout + DEADLINE_GRACE, tag))
            self._follow_package(result, explicit=package is not None)
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
        """A fresh image: nothing of the old session survives."""
        async with self._lock:
            await self._discard_image("session reset", lost=False)
            await self._connection_ready()
            self.lost_state = None

    def take_lost_state(self) -> str | None:
        """The notice that state was lost since the last call, once."""
        notice, self.lost_state = self.lost_state, None
        return notice
