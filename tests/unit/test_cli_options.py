"""The commands pass the server's options on, wherever they stand; a
--connect off this machine is warned about."""

import logging

import pytest

from cl_mcp.cli.commands import SERVER_FLAGS, SERVER_OPTIONS, split_server_options
from cl_mcp.cli.main import build_parser, is_loopback, warn_if_remote
from cl_mcp.lisp.config import ImageConfig, default_heap_size


def test_every_passed_on_option_is_a_server_option():
    options = {option for action in build_parser()._actions for option in action.option_strings}
    assert set(SERVER_OPTIONS) | set(SERVER_FLAGS) <= options


@pytest.mark.parametrize("argv, own, server", [
    (["--eval-timeout", "5", "(+ 1 2)"], ["(+ 1 2)"], ["--eval-timeout", "5"]),
    (["(+ 1 2)", "--time", "--sbcl=/usr/bin/sbcl"], ["(+ 1 2)", "--time"], ["--sbcl=/usr/bin/sbcl"]),
    (["--package", "P", "x"], ["--package", "P", "x"], []),
    (["--no-saved-core", "(+ 1 2)"], ["(+ 1 2)"], ["--no-saved-core"]),
    (["(+ 1 2)", "--heap-size", "2048"], ["(+ 1 2)"], ["--heap-size", "2048"]),
    (["--connect", "4005", "(+ 1 2)"], ["(+ 1 2)"], ["--connect", "4005"]),
    (["--connect", "(+ 1 2)"], ["(+ 1 2)"], ["--connect"]),  # bare: the saved port
    (["(+ 1 2)", "--connect"], ["(+ 1 2)"], ["--connect"]),
    (["--connect", "--sbcl", "s", "x"], ["x"], ["--connect", "--sbcl", "s"]),
])
def test_split(argv, own, server):
    assert split_server_options(argv) == (own, server)


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("localhost", True), ("LOCALHOST", True),
    ("10.0.0.5", False), ("0.0.0.0", False), ("::", False), ("::ffff:10.0.0.5", False),
    ("example.com", False), ("localhost.example.com", False), ("my-laptop", False),
])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_a_remote_connect_warns_once_with_a_tunnel_to_use(caplog):
    with caplog.at_level(logging.WARNING, logger="cl_mcp"):
        warn_if_remote(("lisp.example.com", 4006))
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "clear text" in record.getMessage()
    assert "ssh -L 4006:127.0.0.1:4006 lisp.example.com, then --connect 4006" in record.getMessage()


@pytest.mark.parametrize("connect", [None, ("127.0.0.1", 4005), ("localhost", 4005), ("::1", 4005)])
def test_a_local_connect_or_none_does_not_warn(connect, caplog):
    with caplog.at_level(logging.DEBUG, logger="cl_mcp"):
        warn_if_remote(connect)
    assert caplog.records == []


GiB = 2**30


@pytest.mark.parametrize("memory, heap", [
    (64 * GiB, 8192),        # capped at 8 GiB
    (24 * GiB, 6144),        # a quarter
    (16 * GiB + 4096, 4096),
    (2 * GiB, 1024),         # never less than SBCL's own 1 GiB
])
def test_the_default_heap_is_a_quarter_of_memory_within_bounds(memory, heap):
    assert default_heap_size(memory) == heap


def test_the_heap_size_is_a_runtime_option_in_mib():
    assert ImageConfig(heap_size=1536).runtime_options() == ["--dynamic-space-size", "1536MB"]
    assert build_parser({}).parse_args([]).heap_size is None
