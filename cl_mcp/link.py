"""How the session reaches an image: one it owns, or one it shares.

`EmbeddedLink` starts cl-mcp's own SBCL (see image.py) and may stop and
replace it.  `AttachedLink` connects to a Swank server the programmer
started (typically from Emacs) and must never stop, hang or disturb that
image: it only ever closes its own connection.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

from cl_mcp import idle_poll, sexp
from cl_mcp.errors import ImageError, SwankError
from cl_mcp.image import ImageConfig, LispImage, find_bootstrap
from cl_mcp.sexp import Symbol
from cl_mcp.swank.client import SwankConnection

log = logging.getLogger("cl_mcp.link")

OPEN_TIMEOUT = 60.0  # loading the agent into a busy image may take a while
# How long a request on the lane waits for its answer before it lets the
# event loop run (see SwankConnection._read_now): (+ 1 2) takes ~50 µs.
# For the first `idle_poll.idle_spin()` it polls rather than sleeps (see
# swank/client.py's _read_soon): ≈60 µs less per quick evaluation on the VMs
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
        (load (make-string-input-stream @SOURCE@)))))
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


def parse_address(text: str) -> tuple[str, int]:
    """`[HOST:]PORT` as (host, port); the host defaults to 127.0.0.1."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a [HOST:]PORT address: {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _eval_text(code: str) -> list:
    """A form that reads and evaluates CODE in the image."""
    return [Symbol("cl:eval"), [Symbol("cl:read-from-string"), code]]


class EmbeddedLink:
    """cl-mcp's own image, started anew whenever one is needed."""

    shared = False

    def __init__(self, config: ImageConfig) -> None:
        self._config = config
        self._image: LispImage | None = None

    def describe(self) -> str:
        return f"embedded SBCL (pid {self._image.pid})" if self._image else "embedded SBCL"

    async def open(self) -> SwankConnection:
        """A new image and the connection to it.  An image that was started
        but cannot be used (it will not connect, or dies on the way) is
        stopped before the error goes on, and so is any earlier image: one
        image at a time, and none left behind."""
        await self.close(grace=0.5)
        image = LispImage(self._config)
        self._image = image
        try:
            port = await image.start()
            connection = await SwankConnection.open("127.0.0.1", port, secret=image.secret)
            try:
                await connection.rex([Symbol("cl-mcp-agent:set-connection-nodelay")],
                                     deadline=OPEN_TIMEOUT)
            except BaseException:
                await connection.close()
                raise
        except BaseException:
            await self.close(grace=0.5)
            raise
        log.info("Lisp image ready (pid %s, port %s)", image.pid, port)
        return connection

    async def open_lane(self, connection: SwankConnection) -> SwankConnection:
        """A second connection to the image, for the session's requests: one
        image thread serves it, reading each request and answering it
        itself, where Swank's connection wakes three threads each way (see
        the agent's `open-lane`).  CONNECTION stays for what runs alongside
        them: cancelling, progress."""
        assert self._image is not None
        # Between requests the lane thread polls as long as cl-mcp's own event
        # loop does (idle_poll.py; the agent's `input-soon-p`), and so does
        # cl-mcp for the lane's answers: not at all on one CPU.
        spin = idle_poll.idle_spin()
        name = await connection.rex([Symbol("cl-mcp-agent:open-lane"), round(spin * 1_000_000)],
                                    deadline=OPEN_TIMEOUT)
        if not isinstance(name, str):
            raise SwankError(f"open-lane answered {name!r}, not a socket name")
        return await SwankConnection.open("\0" + name, None, secret=self._image.secret,
                                          ids=connection.ids, answer_window=LANE_ANSWER_WINDOW,
                                          answer_spin=spin)

    async def close(self, grace: float = 2.0) -> int | None:
        """Stop the image; its exit code."""
        image, self._image = self._image, None
        if image is None:
            return None
        await image.stop(grace=grace)
        return image.returncode


class AttachedLink:
    """A Swank server the programmer runs; shared, never stopped by cl-mcp."""

    shared = True

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port

    def describe(self) -> str:
        return f"Swank at {self.host}:{self.port}"

    async def open(self) -> SwankConnection:
        connection = await SwankConnection.open(
            self.host, self.port, secret=read_slime_secret(), timeout=5.0)
        try:
            async with asyncio.timeout(OPEN_TIMEOUT):
                await self._prepare(connection)
        except (SwankError, ImageError, TimeoutError) as error:
            await connection.close()
            raise SwankError(f"could not prepare {self.describe()}: {error or 'timed out'}") from None
        log.info("attached to %s", self.describe())
        return connection

    async def _prepare(self, connection: SwankConnection) -> None:
        """Load the agent (once per version) and set up this connection."""
        source = find_bootstrap().read_text("utf-8")
        digest = hashlib.sha256(source.encode("utf-8")).hexdigest()
        # Loaded once per version: attaching again changes nothing.
        if await connection.rex(_eval_text(LOADED_DIGEST_FORM)) != digest:
            # The source goes in last, so nothing in it is taken for a slot.
            code = LOAD_AGENT.replace("@DIGEST@", sexp.dumps(digest)).replace(
                "@SOURCE@", sexp.dumps(source))
            await connection.rex(_eval_text(code))
            log.info("loaded the cl-mcp agent into %s", self.describe())
        await connection.rex([Symbol("cl-mcp-agent:prepare-attached-connection")])

    async def open_lane(self, connection: SwankConnection) -> None:
        """None: the programmer's image gets no listener of cl-mcp's."""
        return None

    async def close(self, grace: float = 0.0) -> None:
        """Nothing to stop: the image is the programmer's."""
        return None
