"""The one Lisp session the tools talk to: whose turn it is at the image,
and one way to run a form there.

Work in the image runs one call at a time, in arrival order: a tool takes
`turn()` (an asyncio.Lock, which is FIFO, taken before the tool's first
await) and runs its forms with `call`.  What differs between an image
cl-mcp owns and one it shares with the programmer (starting, reconnecting,
what a lost connection or a missed deadline costs, a reset) is the link's
business (link.py); each tool builds its own forms (cl_mcp/tools/).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from typing import Any

from cl_mcp.errors import CancelledWithAnswer, ProtocolError, SessionError, SwankError
from cl_mcp.lisp.config import SessionConfig
from cl_mcp.lisp.link import OPEN_TIMEOUT, AttachedLink, EmbeddedLink, Link, abort_in_image
from cl_mcp.lisp.swank.connection import DEFAULT_PACKAGE, SwankConnection
from cl_mcp.lisp.thread_news import NewsNotices, ThreadNews
from cl_mcp.lisp.unclaimed import Unclaimed
from cl_mcp.results.outputs import OutputStore
from cl_mcp.wire import idle_poll
from cl_mcp.wire.sexp import Keyword, SExp, Symbol

log = logging.getLogger("cl_mcp.session")


def call_failure(error: ProtocolError | SwankError, connection: SwankConnection) -> SessionError | None:
    """The error of a call on CONNECTION that failed with ERROR, or None
    when CONNECTION closed: what that costs is the link's to say."""
    if isinstance(error, ProtocolError):  # the request itself cannot be sent
        return SessionError("CL-MCP:REQUEST-TOO-LARGE", str(error))
    if not connection.closed:
        return SessionError("CL-MCP:SWANK-ERROR", str(error))
    return None


# The agent's `fitted-reply` (agent/guards.lisp) is the one place a call's
# reply is measured against Swank's 24-bit frame: a reply too large for it
# would drop the connection, so the agent answers this instead.
REPLY_TOO_LARGE = Keyword("cl-mcp-reply-too-large")


def fitted(form: SExp) -> SExp:
    """FORM, its value returned through the agent's `fitted-reply`."""
    return [Symbol("cl-mcp-agent::fitted-reply"), form]


def unfitted(value: SExp) -> SExp:
    """The value of a `fitted` form, or the error of a reply too large."""
    if isinstance(value, list) and len(value) == 2 and value[0] == REPLY_TOO_LARGE:
        raise SessionError("CL-MCP:REPLY-TOO-LARGE",
                           f"The answer was {value[1]:,} bytes, more than a Swank frame holds (16 MB),"
                           " so it was not sent; the connection and the image are as they were."
                           " Ask for less of it.")
    return value


class LispSession:
    def __init__(self, config: SessionConfig, client: str = "") -> None:
        # CLIENT: the host's name (MCP's clientInfo), which a programmer who
        # watches the calls in a shared image sees beside them.
        self.config = config
        # The package a call without one runs in: where the last evaluation
        # left *package* (IN-PACKAGE sticks), CL-USER in a fresh image.
        self.package = DEFAULT_PACKAGE
        self._turns = asyncio.Lock()
        self._link: Link = (AttachedLink(*config.connect, self._set_up, client) if config.connect
                            else EmbeddedLink(config.image, self._set_up))
        # Tags name calls for cancel-evaluation and output-tail in the image.
        # A random start keeps two sessions attached to one image apart (and
        # stays a fixnum in SBCL).
        self._tags = itertools.count(secrets.randbits(40) << 16)
        # The tag of the call running in the image (calls run one at a time).
        self.running_tag: int | None = None
        self._control: SwankConnection | None = None
        # Evaluations' whole output, by their numbers in the image.
        self.outputs = OutputStore(config.keep_output)
        # The work sent to the background whose outcome has not been kept
        # yet, by number: how its tool shows it (cl_mcp/tools/evaluate.py's
        # `Work`), and who keeps its outcome.
        self.background: Unclaimed[Any] = Unclaimed()
        # What the user's threads did, for the next tool result's notice.
        self.news = NewsNotices()
        # Forms sent by call_beside that the image has not answered yet,
        # their callers cancelled or not: each holds a thread there.
        self.beside_in_image = 0

    @property
    def shared(self) -> bool:
        """True when the image is the programmer's (attach mode)."""
        return self._link.shared

    def start_in_background(self) -> None:
        """Begin starting (or connecting to) the image now, so the first call
        waits less."""
        self._link.start_in_background()

    async def _set_up(self, connection: SwankConnection) -> None:
        """Configure a fresh connection's image for this session.  The link
        calls it while it opens CONNECTION, before it hands out any, so it
        sends its form with `rex` itself: `call` would wait for the link."""
        connection.on_news = self._hear_news
        def microseconds(seconds: float) -> int:
            return round(seconds * 1_000_000)

        await connection.rex([Symbol("cl-mcp-agent:configure"),
                              Keyword("max-suspended"), self.config.max_suspended,
                              Keyword("suspend-seconds"), float(self.config.suspend_timeout),
                              Keyword("max-background"), self.config.max_background,
                              # The lane polls between requests with cl-mcp's own event
                              # loop's spin and back-off (wire/idle_poll.py); its stop after
                              # long waits is the agent's `*lane-long-waits-limit*'.
                              Keyword("idle-poll-microseconds"), microseconds(idle_poll.idle_spin()),
                              Keyword("poll-stolen-microseconds"), microseconds(idle_poll.STOLEN),
                              Keyword("poll-back-off-microseconds"), microseconds(idle_poll.BACK_OFF)],
                             deadline=OPEN_TIMEOUT)
        if not self.shared:
            self.package = DEFAULT_PACKAGE  # a fresh image
            self.outputs.clear()  # whose evaluations are numbered afresh
            self.background.clear()
            self.news.clear()

    # ------------------------------------------------------------ calling

    def turn(self) -> asyncio.Lock:
        """`async with session.turn():` around a tool's calls."""
        return self._turns

    def new_tag(self) -> int:
        return next(self._tags)

    async def call(self, form: SExp, deadline: float, tag: int | None = None) -> SExp:
        """Run FORM in the image (the caller has the turn) and return its
        value.  A lost image or connection, or one that misses DEADLINE,
        becomes a `SessionError` (the link says what it cost).  When the
        caller is cancelled, the work tagged TAG is aborted in the image
        before the cancellation goes on, so the next call never overlaps it;
        when that work did what a cancel cannot undo, the cancellation is a
        `CancelledWithAnswer` carrying the reply that says so."""
        connection, control = await self._link.connections()
        self._control = control
        self.running_tag = tag
        try:
            return unfitted(await connection.rex(fitted(form), deadline=deadline))
        except asyncio.CancelledError:
            if tag is not None and not control.closed:
                kept = await asyncio.shield(abort_in_image(control, tag))
                if kept is not None:
                    raise CancelledWithAnswer(kept) from None
            raise
        except TimeoutError:
            raise await self._link.unresponsive(control, tag, deadline) from None
        except (ProtocolError, SwankError) as error:
            if (failed := call_failure(error, connection)) is not None:
                raise failed from None
            raise await self._link.lost(connection, control, tag) from None
        finally:
            self.running_tag = None

    async def call_beside(self, form: SExp, deadline: float) -> SExp:
        """Run FORM in a thread of its own in the image, beside the call that
        has the turn (no turn needed): await-evaluation waits there for a
        background evaluation without holding up the session's other calls.
        A cancelled caller leaves FORM to finish on its own, still counted
        in `beside_in_image` until the image answers (intake.WaitingBeside).

        Its failures are `call`'s but for two, which it reports without
        asking the link what they cost: a call beside holds no turn, so
        it must not decide the image's fate (another call owns the image
        meanwhile, and a discard from here could stop the image the next
        call has just started); the call with the turn, or the next one,
        meets the same failure and the link acts then."""
        _, control = await self._link.connections()
        rex = asyncio.ensure_future(control.rex(fitted(form), deadline=deadline))
        self.beside_in_image += 1
        rex.add_done_callback(self._answered_beside)
        try:
            return unfitted(await asyncio.shield(rex))
        except TimeoutError:
            raise SessionError("CL-MCP:TIMEOUT",
                               f"The image did not answer within {deadline:g} s.") from None
        except (ProtocolError, SwankError) as error:
            raise call_failure(error, control) or SessionError(
                "CL-MCP:CONNECTION-LOST", "The connection to the image was lost during this call.") from None

    def _answered_beside(self, rex: asyncio.Future[SExp]) -> None:
        self.beside_in_image -= 1
        if not rex.cancelled():
            rex.exception()  # its caller may be gone: retrieved, so never logged as lost

    async def output_tail(self) -> str | None:
        """The latest line of output of the call running now, if any: a
        progress line, asked beside the call (`rex` on the control
        connection, neither `call` nor `call_beside`), whose failure costs
        nothing but the line."""
        tag, control = self.running_tag, self._control
        if tag is None or control is None or control.closed:
            return None
        try:
            line = await control.rex([Symbol("cl-mcp-agent:output-tail"), tag], deadline=2)
        except (SwankError, TimeoutError):
            return None
        return line if isinstance(line, str) and line else None

    # ------------------------------------------------------------ the session as a whole

    async def image_exiting(self) -> None:
        """The last call's code asked the image to exit: let it, before the
        next call (the caller has the turn)."""
        await self._link.image_exiting()

    async def reset(self) -> SExp | None:
        """Embedded: a fresh image, nothing of the old session survives.
        Attached: only what the session created goes (soft reset); what the
        agent says went and stayed is returned."""
        async with self._turns:
            done = await self._link.reset(lambda form: self.call(form, self.config.eval_timeout))
            self.package = DEFAULT_PACKAGE
            self.outputs.clear()
            self.background.clear()
            self.news.clear()
            return done

    def _hear_news(self, value: SExp) -> None:
        """The image's news of the user's threads: keep their output for
        read-output, and the notice for the next tool result."""
        try:
            news = ThreadNews.from_plist(value)
        except (ProtocolError, TypeError, ValueError) as error:
            log.warning("ignoring malformed thread news (%s): %.300r", error, value)
            return
        if news.number is not None:
            self.outputs.keep(news.number, news.kept())
        for evaluation, kept in news.stopped_kept().items():
            self.outputs.keep(evaluation, kept)
        for stop in news.stop_summaries():
            log.warning("A user's %s", stop)
        self.news.hear(news)

    def stopped_meanwhile(self) -> list[str]:
        """A line for each user's thread that stopped at its error since the
        last `[threads]` notice (the progress messages of a call under way
        tell them)."""
        return list(self.news.stops)

    def take_notices(self) -> list[tuple[str, str]]:
        """The notices for the next tool result, once, each (title, text):
        state lost since the last call, and what the user's threads did."""
        notices = [("session", self._link.take_notice()), ("threads", self.news.take())]
        return [(title, text) for title, text in notices if text]

    async def close(self) -> None:
        """Stop the embedded image, or leave the attached one.  Safe to call
        more than once."""
        await self._link.close()
