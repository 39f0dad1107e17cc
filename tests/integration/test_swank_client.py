"""The Swank client against a real image: flow control, the debugger,
questions from Lisp, a lost connection, and the secret."""

import asyncio
import os
import select
import signal
import socket

import pytest

from cl_mcp.errors import SwankError
from cl_mcp.lisp.config import ImageConfig
from cl_mcp.lisp.image import LispImage
from cl_mcp.lisp.swank import connection as swank_connection
from cl_mcp.lisp.swank.connection import RexAborted, SwankConnection, _read_soon
from cl_mcp.lisp.swank.framing import encode_frame
from cl_mcp.wire import sexp
from cl_mcp.wire.sexp import Keyword, Symbol
from tests.integration.conftest import listening_ports
from tests.polling import input_at_yield


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 60))


async def with_connection(body):
    image = LispImage(ImageConfig())
    port = await image.start()
    connection = await SwankConnection.open("127.0.0.1", port, secret=image.secret)
    try:
        return await body(connection, image)
    finally:
        await connection.close()
        await image.stop()


def test_round_trip_and_non_ascii():
    async def body(connection, image):
        assert await connection.rex([Symbol("cl:+"), 1, 2]) == 3
        assert await connection.rex([Symbol("cl:identity"), "é€😀\n\"\\"]) == "é€😀\n\"\\"
        big = "λ" * 200_000
        assert await connection.rex([Symbol("cl:length"), big]) == 200_000
        assert await connection.rex([Symbol("cl:make-string"), 100_000, Keyword("initial-element"),
                                     [Symbol("cl:code-char"), 955]]) == big[:100_000]
    run(with_connection(body))


def test_more_than_a_hundred_messages_from_one_thread_are_answered_with_pongs():
    # Swank pings after 100 messages from one thread and blocks until the pong.
    form = [Symbol("cl:progn"),
            [Symbol("cl:dotimes"), [Symbol("cl-user::i"), 250],
             [Symbol("swank::send-to-emacs"), [Symbol("cl:list"), Keyword("write-string"), "x"]]],
            Keyword("done")]
    outputs = []

    async def body(connection, image):
        connection._on_output = outputs.append
        assert await connection.rex(form) == Keyword("done")
    run(with_connection(body))
    assert len(outputs) == 250


def test_a_request_that_enters_the_debugger_is_thrown_out_of_it():
    async def body(connection, image):
        with pytest.raises(RexAborted) as caught:
            await connection.rex([Symbol("cl:error"), "boom ~a", 42])
        assert caught.value.condition == "boom 42"
        # The thread was not left waiting: the image still answers.
        assert await connection.rex([Symbol("cl:+"), 2, 2]) == 4
    run(with_connection(body))


def test_questions_from_lisp_are_answered():
    async def body(connection, image):
        assert await connection.rex([Symbol("swank:y-or-n-p-in-emacs"), "Really?"]) == []
        with pytest.raises(RexAborted):
            await connection.rex([Symbol("swank:eval-in-emacs"), [Symbol("cl:quote"), [Symbol("cl:+"), 1, 2]]])
        assert await connection.rex([Symbol("cl:+"), 1, 1]) == 2
    run(with_connection(body))


def test_invalid_rpc_and_reader_error_fail_only_their_request():
    async def body(connection, image):
        with pytest.raises(SwankError, match="Thread not found"):
            await connection.rex([Symbol("cl:+"), 1, 2], thread=987654)
        with pytest.raises(SwankError, match="could not read"):
            await connection.rex([Symbol("no-such-package-xyz:foo")])
        assert await connection.rex([Symbol("cl:+"), 1, 2]) == 3
    run(with_connection(body))


def test_pending_requests_fail_when_the_image_dies():
    async def body(connection, image):
        pending = asyncio.ensure_future(connection.rex([Symbol("cl:sleep"), 30]))
        await asyncio.sleep(0.3)
        os.kill(image.pid, signal.SIGKILL)
        with pytest.raises(SwankError, match="lost"):
            await pending
        with pytest.raises(SwankError):
            await connection.rex([Symbol("cl:+"), 1, 2])
    run(with_connection(body))


def test_swank_listens_on_loopback_only():
    async def body():
        image = LispImage(ImageConfig())
        port = await image.start()
        try:
            assert listening_ports(image.pid) == [("127.0.0.1", port)]
        finally:
            await image.stop()
    run(body())


def test_a_connection_without_the_secret_gets_nothing():
    async def body():
        image = LispImage(ImageConfig())
        port = await image.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(encode_frame(sexp.dumps([Keyword("emacs-rex"), [Symbol("cl:+"), 1, 2], "CL-USER", True, 1])))
            assert await asyncio.wait_for(reader.read(1), 5) == b""  # closed, unanswered
            writer.close()
            # and the listener still waits for the client that knows it
            connection = await SwankConnection.open("127.0.0.1", port, secret=image.secret)
            assert await connection.rex([Symbol("cl:+"), 1, 2]) == 3
            await connection.close()
        finally:
            await image.stop()
    run(body())


def test_swank_mailboxes_of_finished_requests_are_dropped():
    """Swank's SBCL backend keeps a mailbox per worker thread forever and
    searches them linearly; the agent prunes the dead ones after each reply,
    so the thousandth request costs what the first did."""
    async def body(connection, image):
        for _ in range(60):
            assert await connection.rex([Symbol("cl:+"), 1, 2]) == 3
        return await connection.rex([Symbol("cl:length"), Symbol("swank/sbcl::*mailboxes*")])
    assert run(with_connection(body)) <= 20


def test_a_request_past_its_deadline_raises_timeout_error():
    async def body(connection, image):
        with pytest.raises(TimeoutError):
            await connection.rex([Symbol("cl:sleep"), 5], deadline=0.2)
        assert await connection.rex([Symbol("cl:+"), 1, 2]) == 3
    run(with_connection(body))


# ---------------------------------------------------------------- the answer window

def _socket_pair():
    ours, theirs = socket.socketpair()
    ours.setblocking(False)  # as asyncio leaves a transport's socket
    return ours, theirs


def test_the_answer_window_takes_an_answer_already_there_or_arriving_while_it_polls(monkeypatch):
    ours, theirs = _socket_pair()
    with ours, theirs:
        theirs.sendall(b"already")
        assert _read_soon(ours.fileno(), spin=0.001, window=0.002) == b"already"
        yields = input_at_yield(monkeypatch, theirs, 3, b"while polling")
        monkeypatch.setattr(swank_connection.select, "select", lambda *_: pytest.fail("slept instead of polling"))
        assert _read_soon(ours.fileno(), spin=30.0, window=60.0) == b"while polling"
        assert len(yields) == 3


def test_the_answer_window_sleeps_after_its_polling_and_gives_up_at_its_end(monkeypatch):
    ours, theirs = _socket_pair()
    real_select = select.select
    waits = []

    def answer_once_asleep(readers, writers, errors, timeout):
        waits.append(timeout)
        theirs.sendall(b"after polling")
        return real_select(readers, writers, errors, timeout)

    with ours, theirs:
        with monkeypatch.context() as patched:
            patched.setattr(swank_connection.select, "select", answer_once_asleep)
            assert _read_soon(ours.fileno(), spin=0.001, window=2.0) == b"after polling"
        assert len(waits) == 1 and 1.0 < waits[0] < 2.0  # the window's rest, after the poll
        assert _read_soon(ours.fileno(), spin=0.001, window=0.01) is None  # nothing came
        theirs.close()
        assert _read_soon(ours.fileno(), spin=0.001, window=0.01) == b""  # end of file
