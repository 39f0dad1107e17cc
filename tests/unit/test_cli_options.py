"""The commands pass the server's options on, wherever they stand."""

import pytest

from cl_mcp.cli import build_parser
from cl_mcp.commands import SERVER_FLAGS, SERVER_OPTIONS, split_server_options


def test_every_passed_on_option_is_a_server_option():
    options = {option for action in build_parser()._actions for option in action.option_strings}
    assert set(SERVER_OPTIONS) | set(SERVER_FLAGS) <= options


@pytest.mark.parametrize("argv, own, server", [
    (["--eval-timeout", "5", "(+ 1 2)"], ["(+ 1 2)"], ["--eval-timeout", "5"]),
    (["(+ 1 2)", "--time", "--sbcl=/usr/bin/sbcl"], ["(+ 1 2)", "--time"], ["--sbcl=/usr/bin/sbcl"]),
    (["--package", "P", "x"], ["--package", "P", "x"], []),
    (["--no-saved-core", "(+ 1 2)"], ["(+ 1 2)"], ["--no-saved-core"]),
])
def test_split(argv, own, server):
    assert split_server_options(argv) == (own, server)
