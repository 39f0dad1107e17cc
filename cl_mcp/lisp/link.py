"""How the session reaches an image: one it owns, or one it shares.

Everything that differs between the two lives here, behind one interface
(`Link`): getting the connections a call needs, what a call that misses
its deadline or loses its connection costs, a reset, and the end.

`EmbeddedLink` starts cl-mcp's own SBCL (see image.py) and may stop and
replace it; a call after the image was lost runs in a fresh one, and its
result says so.  `AttachedLink` connects to a Swank server the programmer
started (typically from Emacs) and must never stop, hang or disturb that
image: it only ever closes its own connection, and reconnects with backoff
when that drops.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
from pathlib import Path
from typing import Any, Awaitable, Callable, Protocol

from cl_mcp.errors import ImageError, SessionError, SwankError
from cl_mcp.lisp.config import ImageConfig
from cl_mcp.lisp.image import LispImage, agent_digest, agent_parts, find_bootstrap
from cl_mcp.lisp.swank.connection import SwankConnection
from cl_mcp.wire import idle_poll, sexp
from cl_mcp.wire.sexp import Keyword, SExp, Symbol

log = logging.getLogger("cl_mcp.link")

OPEN_TIMEOUT = 60.0  # loading the agent into a busy image may take a while
RECONNECT_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)  # then every 8 s
# How long a live image takes to answer (cl:values) when only one of its
# connections was lost, even while another thread of it is busy.
LIVENESS_TIMEOUT = 5.0
ABORT_TIMEOUT = 10.0  # cancel-evaluation waits up to 5 s in the image itself
# How long a request on the lane waits for its answer before it lets the
# event loop run (see SwankConnection._read_now): (+ 1 2) takes ~50 µs.
# For the first `idle_poll.idle_spin()` it polls rather than sleeps (see
# swank/connection.py's _read_soon): ≈60 µs less per quick evaluation on the VMs
# measured, but ≈30 % more on one CPU, where it only delays the image.
LANE_ANSWER_WINDOW = 0.001

# Loads the agent into a shared image from a string (the image may not see
# cl-mcp's files, and a file in a shared /tmp could be tampered with), as one
# compilation unit, with every message of the compiler kept out of the
# programmer's REPL.
LOAD_AGENT = """
(let ((noise (make-string-output-stream)))
  (let ((*standard-output* noise) (*error-output* noise) (*trace-output* noise)
        (*package* (find-package "COMMON-LISP-USER")))
    (handler-bind ((warning #'muffle-warning))
      (with-compilation-unit ()
        (load (make-string-input-stream @BOOTSTRAP@))
        (funcall (find-symbol "LOAD-PART-TEXTS" "CL-MCP-AGENT") '@PARTS@))))
  (setf (symbol-value (find-symbol "*LOADED-DIGEST*" "CL-MCP-AGENT")) @DIGEST@)
  t)
"""

# The digest of the agent source the image has loaded, or nil.
LOADED_DIGEST_FORM = """
(let* ((package (find-package "CL-MCP-AGENT"))
       (symbol (and package (find-symbol "*LOADED-DIGEST*" package))))
  (and symbol (boundp symbol) (symbol-value symbol)))
"""


def read_slime_secret(home: Path | None = None) -> str | None:
    """The first line of ~/.slime-secret, which Swank demands when it exists
    (read as slime.el reads it)."""
    try:
        text = ((home or Path.home()) / ".slime-secret").read_text("utf-8")
    except FileNotFoundError:
        return None
    return text.splitlines()[0] if text else ""


# Sets a fresh connection up for the session (the agent's `configure`).
SetUp = Callable[[SwankConnection], Awaitable[None]]


def exit_text(code: int | None) -> str:
    """How a process ended, in words: a negative code is a signal."""
    if code is None:
        return "exit status unknown"
    return f"killed by signal {-code}" if code < 0 else f"exit code {code}"


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel TASK if it still runs, and wait until it has stopped."""
    if task is None or task.done():
        return
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):
        pass


async def abort_in_image(connection: SwankConnection, tag: int) -> SExp | None:
    """Abort the call tagged TAG in the image (its caller gives up on it);
    the reply it kept past the cancel, if it did work a cancel cannot undo
    (an edit written), else None."""
    try:
        kept = await connection.rex([Symbol("cl-mcp-agent:cancel-evaluation"), tag],
                                    deadline=ABORT_TIMEOUT)
    except (SwankError, TimeoutError) as error:
        log.warning("could not cancel call %s in the image: %s", tag, error)
        return None
    return kept if isinstance(kept, list) and kept else None


async def answers(connection: SwankConnection) -> bool:
    """True when the image answers on CONNECTION within a few seconds: one
    socket closing says nothing about another, nor about the process."""
    try:
        await connection.rex([Symbol("cl:values")], deadline=LIVENESS_TIMEOUT)
    except (SwankError, TimeoutError):
        return False
    return True


class Link(Protocol):
    """What the session needs of an image, owned or shared."""

    shared: bool

    def describe(self) -> str: ...

    def start_in_background(self) -> None:
        """Begin connecting now, so that the first call waits less."""

    async def connections(self) -> tuple[SwankConnection, SwankConnection]:
        """The connection a call takes, and the control connection beside it
        (for aborting it); a `SessionError` when there are none."""

    async def unresponsive(self, control: SwankConnection, tag: int | None,
                           deadline: float) -> SessionError:
        """A call missed DEADLINE: what that costs, and the call's error."""

    async def lost(self, connection: SwankConnection, control: SwankConnection,
                   tag: int | None) -> SessionError:
        """CONNECTION closed during a call: what that costs, and the error."""

    async def image_exiting(self) -> None:
        """The user's code asked the image to exit (SB-EXT:EXIT)."""

    async def reset(self, call: Callable[[SExp], Awaitable[SExp]]) -> SExp | None:
        """Forget the session's state; CALL runs a form in the image.  What
        the agent says it removed and kept, or None for a fresh image."""

    def take_notice(self) -> str | None:
        """Once, the notice that the session's state was lost since the
        last call."""

    async def close(self) -> None: ...


def _eval_text(code: str) -> list:
    """A form that reads and evaluates CODE in the image."""
    return [Symbol("cl:eval"), [Symbol("cl:read-from-string"), code]]


class EmbeddedLink:
    """cl-mcp's own image, started anew whenever one is needed: at the first
    call, after it died, after it stopped answering, and on reset."""

    shared = False

    def __init__(self, config: ImageConfig, set_up: SetUp) -> None:
        self._config = config
        self._set_up = set_up
        self._image: LispImage | None = None
        self._control: SwankConnection | None = None
        # The faster connection the session's calls take (see `_open_lane`);
        # `_control` is kept for what runs alongside them.
        self._lane: SwankConnection | None = None
        self._starting: asyncio.Task[SwankConnection] | None = None
        self._notice: str | None = None
        # A notice for the call that will run in the next image (not the
        # call whose code made this one exit).
        self._next_image_notice: str | None = None

    def describe(self) -> str:
        return f"embedded SBCL (pid {self._image.pid})" if self._image else "embedded SBCL"

    def start_in_background(self) -> None:
        if self._starting is None:
            self._starting = asyncio.create_task(self._open(), name="image-start")

    async def connections(self) -> tuple[SwankConnection, SwankConnection]:
        control = await self._control_ready()
        if self._lane is not None and self._lane.closed:
            log.warning("the lane to the image was lost; opening a new one")
            self._lane = await self._open_lane(control)
        return self._lane or control, control

    async def _control_ready(self) -> SwankConnection:
        """The control connection; a fresh image when there is none."""
        if self._control is not None and not self._control.closed:
            return self._control
        if self._control is not None:
            exit_code = await self._discard("the Lisp image exited")
            self._notice = (
                f"The Lisp image had exited ({exit_text(exit_code)}) since the last call, so this "
                "call ran in a fresh image: earlier definitions and loaded systems are gone.")
        if self._next_image_notice is not None:
            self._notice, self._next_image_notice = self._next_image_notice, None
        if self._starting is None or (self._starting.done() and self._starting.exception()):
            self._starting = asyncio.create_task(self._open(), name="image-start")
        try:
            return await asyncio.shield(self._starting)
        except (ImageError, SwankError, OSError) as error:
            self._starting = None
            raise SessionError("CL-MCP:IMAGE-START-FAILED", str(error) or type(error).__name__) from None

    async def _open(self) -> SwankConnection:
        """Start an image, connect and set it up.  A start that fails after
        SBCL was spawned stops that SBCL before the error goes on, and a
        new image never replaces a running one: one at a time, none left
        behind."""
        await self._stop_image()
        image = LispImage(self._config)
        self._image = image
        try:
            port = await image.start()
            control = await SwankConnection.open("127.0.0.1", port, secret=image.secret)
            try:
                await control.rex([Symbol("cl-mcp-agent:set-connection-nodelay")],
                                  deadline=OPEN_TIMEOUT)
                await self._set_up(control)
            except BaseException:
                await control.close()
                raise
        except BaseException:
            await self._stop_image()
            raise
        log.info("Lisp image ready (pid %s, port %s)", image.pid, port)
        self._lane = await self._open_lane(control)
        self._control = control
        return control

    async def _open_lane(self, control: SwankConnection) -> SwankConnection | None:
        """A second connection to the image, for the session's calls: one
        image thread serves it, reading each request and answering it
        itself, where Swank's connection wakes three threads each way (see
        the agent's `open-lane`).  None when it cannot be had: calls then
        take CONTROL."""
        assert self._image is not None
        try:
            name = await control.rex([Symbol("cl-mcp-agent:open-lane")], deadline=OPEN_TIMEOUT)
            if not isinstance(name, str):
                raise SwankError(f"open-lane answered {name!r}, not a socket name")
            lane = await SwankConnection.open("\0" + name, None, secret=self._image.secret,
                                              ids=control.ids, answer_window=LANE_ANSWER_WINDOW,
                                              answer_spin=idle_poll.idle_spin())
            lane.on_news = control.on_news  # the session's, set at its set-up
            return lane
        except (SwankError, OSError) as error:
            log.warning("no lane to the image (%s); requests take Swank's connection", error)
            return None

    async def unresponsive(self, control: SwankConnection, tag: int | None,
                           deadline: float) -> SessionError:
        await self._discard("the Lisp image did not respond")
        return SessionError(
            "CL-MCP:IMAGE-UNRESPONSIVE",
            f"The Lisp image did not answer within {deadline:g} seconds, so it was "
            "restarted. The session's definitions were lost.")

    async def lost(self, connection: SwankConnection, control: SwankConnection,
                   tag: int | None) -> SessionError:
        if connection is not control and await answers(control):
            # Only the lane is gone: the image lives, and so does the
            # session.  This call's work is stopped (its answer could never
            # arrive) and the next call takes a new lane.
            if tag is not None:
                await abort_in_image(control, tag)
            return SessionError(
                "CL-MCP:CONNECTION-LOST",
                "The connection that carried this call to the image was lost, so the call "
                "was aborted and its result is unknown. The image and its definitions are "
                "kept; the next call takes a new connection.")
        await self._discard("the Lisp image exited")
        return SessionError(
            "CL-MCP:IMAGE-LOST",
            "The Lisp image exited or the connection to it was lost during this "
            "call. The next call starts a fresh image; the session's definitions "
            "were lost.")

    async def image_exiting(self) -> None:
        exit_code = await self._discard("the Lisp image exited (SB-EXT:EXIT)")
        self._next_image_notice = (f"The Lisp image exited ({exit_text(exit_code)}) at the "
                                   "previous call's request, so this call ran in a fresh image.")

    async def reset(self, call: Callable[[SExp], Awaitable[SExp]]) -> SExp | None:
        await self._discard("session reset", lost=False)
        self._notice = self._next_image_notice = None
        await self._control_ready()
        return None

    def take_notice(self) -> str | None:
        notice, self._notice = self._notice, None
        return notice

    async def _discard(self, reason: str, *, lost: bool = True, grace: float = 0.5) -> int | None:
        """Forget the current image (stopping it if it still runs, within
        GRACE seconds) and return its exit code.  LOST says the user did not
        ask for this, so it is logged as a warning."""
        control, starting, lane = self._control, self._starting, self._lane
        self._control = self._starting = self._lane = None
        await cancel_and_wait(starting)
        for each in (lane, control):
            if each is not None:
                await each.close()
        description = self.describe()
        exit_code = await self._stop_image(grace)
        if lost:
            log.warning("%s (%s); the session's state was lost, the next "
                        "call starts a fresh image", reason, exit_text(exit_code))
        else:
            log.info("%s: %s stopped", reason, description)
        return exit_code

    async def _stop_image(self, grace: float = 0.5) -> int | None:
        """Stop the image, if any; its exit code."""
        image, self._image = self._image, None
        if image is None:
            return None
        await image.stop(grace=grace)
        return image.returncode

    async def close(self) -> None:
        """Stop the image.  Safe to call more than once."""
        await self._discard("cl-mcp is stopping", lost=False, grace=2.0)


class AttachedLink:
    """A Swank server the programmer runs; shared, never stopped by cl-mcp.
    When the connection drops, calls fail at once with a clear error while
    cl-mcp reconnects in the background."""

    shared = True

    def __init__(self, host: str, port: int, set_up: SetUp, client: str = "") -> None:
        self.host = host
        self.port = port
        self._set_up = set_up
        # The host's name (MCP's clientInfo), which the programmer's Emacs
        # shows beside this cl-mcp's calls with its process id.
        self._client = client
        self._connection: SwankConnection | None = None
        self._starting: asyncio.Task[SwankConnection] | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._last_failure = ""
        self._notice: str | None = None

    def describe(self) -> str:
        return f"Swank at {self.host}:{self.port}"

    def start_in_background(self) -> None:
        if self._starting is None:
            self._starting = asyncio.create_task(self._open(), name="connect")

    async def connections(self) -> tuple[SwankConnection, SwankConnection]:
        if self._connection is not None and not self._connection.closed:
            return self._connection, self._connection
        if self._connection is not None:  # it dropped; the watcher has not run yet
            await self._connection.close()
            self._connection = None
            self._starting = None
        if self._starting is not None:
            starting, self._starting = self._starting, None
            try:
                connection = await asyncio.shield(starting)  # the first connection
                return connection, connection
            except (ImageError, SwankError, OSError):
                pass  # _open kept the reason
        self._start_reconnecting()
        raise SessionError(
            "CL-MCP:NOT-CONNECTED",
            f"Not connected to {self.describe()} ({self._last_failure or 'connection lost'}); "
            "cl-mcp keeps trying to reconnect in the background. Try again shortly.")

    async def _open(self) -> SwankConnection:
        try:
            connection = await self._connect()
        except (ImageError, SwankError, OSError) as error:
            self._last_failure = str(error) or type(error).__name__
            if isinstance(error.__cause__, ConnectionRefusedError):
                self._last_failure += (
                    f"; nothing listens on port {self.port}: M-x slime's own listener closes once "
                    "Emacs connects, so run M-x cl-mcp-share in Emacs (emacs/cl-mcp.el; then "
                    "--connect with no port finds its port), or evaluate (swank:create-server "
                    f":port {self.port} :dont-close t) in the image first (docs/attach.md)")
            raise
        self._connection = connection
        self._last_failure = ""
        # Start reconnecting as soon as the connection drops, not only when
        # the next call finds it gone.
        self._watcher = asyncio.create_task(self._watch(connection), name="watch-connection")
        return connection

    async def _connect(self) -> SwankConnection:
        connection = await SwankConnection.open(
            self.host, self.port, secret=read_slime_secret(), timeout=5.0)
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                await self._prepare(connection)
                await self._set_up(connection)
        except BaseException as error:
            await connection.close()
            if isinstance(error, (SwankError, ImageError, TimeoutError)):
                raise SwankError(f"could not prepare {self.describe()}: {error or 'timed out'}") from None
            raise
        log.info("attached to %s", self.describe())
        return connection

    async def _prepare(self, connection: SwankConnection) -> None:
        """Load the agent (once per version) and set up this connection."""
        bootstrap = find_bootstrap()
        digest = agent_digest(bootstrap)
        # Loaded once per version: attaching again changes nothing.
        if await connection.rex(_eval_text(LOADED_DIGEST_FORM)) != digest:
            parts = [[part.stem, part.read_text("utf-8")] for part in agent_parts(bootstrap)]
            # One pass, so nothing in the texts is taken for a slot.
            slots = {"DIGEST": sexp.dumps(digest), "PARTS": sexp.dumps(parts),
                     "BOOTSTRAP": sexp.dumps(bootstrap.read_text("utf-8"))}
            code = re.sub(r"@([A-Z]+)@", lambda match: slots[match[1]], LOAD_AGENT)
            await connection.rex(_eval_text(code))
            log.info("loaded the cl-mcp agent into %s", self.describe())
        await connection.rex([Symbol("cl-mcp-agent:prepare-attached-connection"),
                              Keyword("pid"), os.getpid(), Keyword("client"), self._client])

    async def _watch(self, connection: SwankConnection) -> None:
        reason = await connection.wait_closed()
        if self._connection is connection:
            self._last_failure = reason
            # The image ended this session's work with the connection
            # (the agent's `forget-connection`): the next result says so.
            self._notice = (
                f"The connection to {self.describe()} was lost ({reason}). The image ended this "
                "session's work with it: its evaluations that waited at an error or ran in the "
                "background were aborted (their numbers no longer answer), and its REPL variables "
                "(*, +, / ...) and its record of what it defined start afresh. The image and its "
                "definitions are as they were.")
            log.warning("the connection to %s was lost (%s); reconnecting", self.describe(), reason)
            self._connection = None
            self._starting = None
            self._start_reconnecting()

    def _start_reconnecting(self) -> None:
        if self._reconnecting is None or self._reconnecting.done():
            self._reconnecting = asyncio.create_task(self._reconnect(), name="reconnect")

    async def _reconnect(self) -> None:
        """Try to connect again, with growing pauses, until it works."""
        for attempt in itertools.count():
            await asyncio.sleep(RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)])
            try:
                await self._open()
            except (ImageError, SwankError, OSError) as error:
                log.info("reconnecting to %s failed: %s", self.describe(), error)
                continue
            log.warning("reconnected to %s", self.describe())
            return

    async def unresponsive(self, control: SwankConnection, tag: int | None,
                           deadline: float) -> SessionError:
        # Never the programmer's image: abort the work, keep the image.
        if tag is not None:
            await abort_in_image(control, tag)
        return SessionError(
            "CL-MCP:IMAGE-UNRESPONSIVE",
            f"The image did not answer within {deadline:g} seconds; cl-mcp asked it "
            "to abort the call.")

    async def lost(self, connection: SwankConnection, control: SwankConnection,
                   tag: int | None) -> SessionError:
        return SessionError(
            "CL-MCP:CONNECTION-LOST",
            f"The connection to {self.describe()} was lost during this call; "
            "cl-mcp is reconnecting. The image itself is not restarted.")

    async def image_exiting(self) -> None:
        """Nothing to do: the programmer's image is theirs to exit."""

    async def reset(self, call: Callable[[SExp], Awaitable[SExp]]) -> SExp | None:
        """A soft reset: only what the session created goes; the agent's
        plist of what went and what stayed.  An error report instead (the
        programmer holds the assistant from Emacs, agent/watch.lisp) is the
        call's error."""
        answer = await call([Symbol("cl-mcp-agent:soft-reset")])
        named = sexp.plist_named(answer) if isinstance(answer, list) else {}
        if named.get("status") == "error":
            error = sexp.plist_named(named.get("error") or [])
            raise SessionError(str(error.get("type")), str(error.get("message")))
        return answer

    def take_notice(self) -> str | None:
        notice, self._notice = self._notice, None
        return notice

    async def close(self) -> None:
        """Leave the image: close the connection, whose end ends this
        session's work there as a kill's would (the agent's
        `forget-connection`).  Safe to call more than once."""
        for task in (self._starting, self._reconnecting, self._watcher):
            await cancel_and_wait(task)
        self._starting = self._reconnecting = self._watcher = None
        connection, self._connection = self._connection, None
        if connection is not None and not connection.closed:
            await connection.close()
