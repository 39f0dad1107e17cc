"""Other local processes that reach the image's listeners first (Swank's
loopback port and the lane's socket) neither lock cl-mcp out nor stall it;
another user's connection is closed at once, unread."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time

import pytest

from cl_mcp.lisp.config import ImageConfig
from cl_mcp.lisp.image import LispImage
from cl_mcp.lisp.swank.connection import SwankConnection
from cl_mcp.lisp.swank.framing import encode_frame
from cl_mcp.wire.sexp import Symbol
from tests.integration.conftest import listening_ports
from tests.integration.test_swank_client import run, with_connection

NOBODY = 65534

# Connects as another user and reports how long the connection stayed open
# (it sends nothing, as a squatter that only holds the connection would).
OTHER_USER_SQUATTER = """
import socket, sys, time
family = socket.AF_UNIX if sys.argv[1] == "unix" else socket.AF_INET
address = "\\0" + sys.argv[2] if sys.argv[1] == "unix" else ("127.0.0.1", int(sys.argv[2]))
with socket.socket(family) as squatter:
    squatter.settimeout(10)
    squatter.connect(address)
    started = time.monotonic()
    print("connected", flush=True)
    closed = squatter.recv(1) == b""
    print("closed" if closed else "answered", round(time.monotonic() - started, 3), flush=True)
"""


def system_python() -> str:
    """A Python another user may run (this one may live in root's home)."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.fail("no /usr/bin/python3 to run a squatter as another user")
    return python


def other_user_squatter(kind: str, address: str) -> subprocess.Popen[str]:
    """A squatter that runs as another user (this test runs as root, as CI does)."""
    process = subprocess.Popen([system_python(), "-c", OTHER_USER_SQUATTER, kind, address],
                               user=NOBODY, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "connected", process.stderr.read()  # type: ignore[union-attr]
    return process


def closed_at_once(process: subprocess.Popen[str]) -> bool:
    """The squatter's verdict, read from the stream its "connected" line
    was (both lines may come in one read: communicate() would miss the
    second), closed well within its 10 s wait."""
    assert process.stdout is not None
    verdict, seconds = process.stdout.readline().split()
    process.wait(timeout=15)
    return verdict == "closed" and float(seconds) < 5


def silent_squatter(family: int, address) -> socket.socket:
    squatter = socket.socket(family)
    squatter.connect(address)
    return squatter


def wrong_secret_squatter(family: int, address) -> socket.socket:
    squatter = socket.socket(family)
    squatter.connect(address)
    squatter.sendall(encode_frame("not the secret"))
    return squatter


requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="another user's process needs root to start")


def test_squatters_on_swanks_port_neither_lock_cl_mcp_out_nor_stall_it():
    async def body():
        image = LispImage(ImageConfig())
        port = await image.start()
        squatters = [silent_squatter(socket.AF_INET, ("127.0.0.1", port)),
                     wrong_secret_squatter(socket.AF_INET, ("127.0.0.1", port))]
        try:
            started = time.monotonic()
            connection = await SwankConnection.open("127.0.0.1", port, secret=image.secret)
            assert await connection.rex([Symbol("cl:+"), 1, 2]) == 3
            assert time.monotonic() - started < 10  # Swank alone waited 20 s for the silent one
            deadline = time.monotonic() + 5
            while listening_ports(image.pid):  # closed once cl-mcp is in
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            await connection.close()
        finally:
            for squatter in squatters:
                squatter.close()
            await image.stop()
    run(body())


@requires_root
def test_another_users_connection_to_swanks_port_is_closed_at_once():
    async def body():
        image = LispImage(ImageConfig())
        port = await image.start()
        try:
            squatter = await asyncio.to_thread(other_user_squatter, "tcp", str(port))
            assert await asyncio.to_thread(closed_at_once, squatter)
            connection = await SwankConnection.open("127.0.0.1", port, secret=image.secret)
            assert await connection.rex([Symbol("cl:+"), 1, 2]) == 3
            await connection.close()
        finally:
            await image.stop()
    run(body())


def test_squatters_on_the_lane_neither_lock_cl_mcp_out_nor_stall_it():
    async def body(control, image):
        name = await control.rex([Symbol("cl-mcp-agent:open-lane")])
        squatters = [silent_squatter(socket.AF_UNIX, "\0" + name),
                     wrong_secret_squatter(socket.AF_UNIX, "\0" + name)]
        try:
            started = time.monotonic()
            lane = await SwankConnection.open("\0" + name, None, secret=image.secret, ids=control.ids)
            assert await lane.rex([Symbol("cl:+"), 2, 2]) == 4
            assert time.monotonic() - started < 10  # a silent squatter would hold it 20 s
            await lane.close()
            await asyncio.sleep(0.5)  # the listener closes once the lane is served
            with socket.socket(socket.AF_UNIX) as late, pytest.raises(ConnectionRefusedError):
                late.connect("\0" + name)
        finally:
            for squatter in squatters:
                squatter.close()
    run(with_connection(body))


@requires_root
def test_another_users_connection_to_the_lane_is_closed_at_once():
    async def body(control, image):
        name = await control.rex([Symbol("cl-mcp-agent:open-lane")])
        squatter = await asyncio.to_thread(other_user_squatter, "unix", name)
        assert await asyncio.to_thread(closed_at_once, squatter)
        lane = await SwankConnection.open("\0" + name, None, secret=image.secret, ids=control.ids)
        assert await lane.rex([Symbol("cl:+"), 2, 2]) == 4
        await lane.close()
    run(with_connection(body))
