"""The answers about running code: backtraces (backtraces.py) and output
(output.py), checked in a fresh cl-mcp (embedded) that loads a fresh copy
of a library."""

from __future__ import annotations

from tests.truth.backtraces import check_backtraces
from tests.truth.corpus import Library, loaded
from tests.truth.output import check_output
from tests.truth.places import Tally


def check_library_threads(library: Library, tally: Tally, rounds: int, seed: int, log=print,
                          env: dict[str, str] | None = None) -> None:
    """LIBRARY's backtraces, and ROUNDS rounds of its output scenarios
    seeded with SEED, counted in TALLY; cl-mcp runs in ENV beside ours."""
    with loaded(library, env=env) as (process, copy):
        check_backtraces(process, tally, copy, library.system, log)
        check_output(process, tally, library.directory, rounds, seed, log)
