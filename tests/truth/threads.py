"""The answers about running code: backtraces (backtraces.py) and output
(output.py), checked in a fresh cl-mcp (embedded) that loads a fresh copy
of a library."""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.integration.conftest import McpProcess
from tests.truth.backtraces import check_backtraces
from tests.truth.corpus import Library, copy_library, load_copy
from tests.truth.output import check_output
from tests.truth.places import Tally


@contextmanager
def loaded(library: Library) -> Iterator[tuple[McpProcess, Path]]:
    """A fresh cl-mcp that loaded a fresh copy of LIBRARY, and the copy."""
    with tempfile.TemporaryDirectory(prefix="cl-mcp-truth-threads-") as scratch:
        copy = copy_library(library, Path(scratch))
        process = McpProcess()
        try:
            process.initialize()
            load_copy(process, library, copy)
            yield process, copy
        finally:
            process.close(60)


def check_library_threads(library: Library, tally: Tally, rounds: int, seed: int, log=print) -> None:
    """LIBRARY's backtraces, and ROUNDS rounds of its output scenarios
    seeded with SEED, counted in TALLY."""
    with loaded(library) as (process, copy):
        check_backtraces(process, tally, copy, library.system, log)
        check_output(process, tally, library.directory, rounds, seed, log)
