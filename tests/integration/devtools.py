"""What the development tools' tests share: a cl-mcp in either mode (its
own image, or attached to a Swank started as from Emacs), the fixture
system loaded (tests/fixtures/lisp/cl-mcp-fixture/), and each result's
structured content checked against the tool's outputSchema."""

from __future__ import annotations

import itertools
import shutil
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from jsonschema import Draft202012Validator

from tests.integration.attach_fixtures import Emacs, SwankServer, temporary_home
from tests.integration.conftest import McpProcess

FIXTURES = (Path(__file__).parents[1] / "fixtures" / "lisp").resolve()
FIXTURE = FIXTURES / "cl-mcp-fixture"
MODES = ["embedded", "attached"]


@contextmanager
def cl_mcp_in(mode: str, *options: str, defining: str = "") -> Iterator[McpProcess]:
    """An initialized cl-mcp, started with OPTIONS: embedded, or attached to
    a programmer's Swank; with DEFINING, Lisp code that a test's module
    needs, evaluated first."""
    swank = None
    if mode == "attached":
        home = temporary_home()
        swank = SwankServer(home)
        process = McpProcess("--connect", str(swank.port), *options, env={"HOME": str(home)})
    else:
        process = McpProcess(*options)
    process.mode = mode
    try:
        process.initialize()
        if defining:
            text, is_error = process.eval(defining)
            assert not is_error, text
        yield process
    finally:
        process.close()
        if swank:
            swank.stop()


@contextmanager
def shared_with_emacs() -> Iterator[tuple[SwankServer, Emacs, McpProcess, Path]]:
    """The programmer's image, Emacs connected to it with SLIME, and an
    initialized cl-mcp attached to the same image; and their HOME."""
    home = temporary_home()
    with ExitStack() as stack:
        server = SwankServer(home)
        stack.callback(server.stop)
        emacs = Emacs(home)
        stack.callback(emacs.stop)
        emacs.connect(server.port)
        process = McpProcess("--connect", str(server.port), env={"HOME": str(home)})
        stack.callback(process.close)
        process.initialize()
        yield server, emacs, process, home


def load_fixture(process: McpProcess) -> None:
    """Load the fixture system into PROCESS's image through load-system (so
    its packages count as a library's, not the session's own)."""
    text, is_error = process.eval(f'(asdf:load-asd "{FIXTURE}/cl-mcp-fixture.asd")')
    assert not is_error, text
    loaded = process.call("load-system", system="cl-mcp-fixture")
    assert not loaded["isError"], loaded


def output_schema(process: McpProcess, tool: str) -> Draft202012Validator:
    """TOOL's outputSchema, as PROCESS's tools/list gives it (asked once)."""
    if not hasattr(process, "output_schemas"):
        process.output_schemas = {each["name"]: Draft202012Validator(each["outputSchema"])
                                  for each in process.request("tools/list")["result"]["tools"]}
    return process.output_schemas[tool]


def checked_call(process: McpProcess, tool: str, **arguments) -> dict:
    """The result of TOOL, its structured content checked against TOOL's outputSchema."""
    result = process.call(tool, **arguments)
    errors = list(output_schema(process, tool).iter_errors(result["structuredContent"]))
    assert errors == [], (result["structuredContent"], errors)
    return result


def registered_copy(process: McpProcess, library: Path, directory: Path, ignore: Any = None) -> Path:
    """DIRECTORY made a copy of LIBRARY (one of Debian's cl-* sources) that
    ASDF finds before Debian's own (the central registry is searched before
    the source registry): a test may edit it, and ASDF compiles it afresh."""
    if not library.is_dir():
        pytest.fail(f"{library} is missing: run `make test`, which installs it")
    shutil.copytree(library, directory, ignore=ignore)
    text, is_error = process.eval(f'(push #p"{directory}/" asdf:*central-registry*)')
    assert not is_error, text
    return directory


_copies = itertools.count(1)


def loaded_copy(process: McpProcess, library: Path, system: str, tmp_path: Path) -> Path:
    """A fresh copy of LIBRARY under TMP_PATH (registered_copy), with its
    SYSTEM loaded from there."""
    directory = registered_copy(process, library, tmp_path / f"{library.name}-{next(_copies)}")
    loaded = process.call("load-system", system=system)
    assert not loaded["isError"], loaded
    return directory
