"""The output oracle (tests/truth/output.py, issue 37) in `make test`, three
seeded rounds of its scenarios (`make truth` runs more): each character
bordeaux-threads' threads and lparallel's kernel workers write, while
their evaluation runs or after it ended, reaches the model through a
result, a [threads] notice or read-output, as the writer counted it."""

from __future__ import annotations

import pytest

from tests.truth.corpus import CORPUS, loaded
from tests.truth.output import SCENARIOS, check_output
from tests.truth.places import Tally

LIBRARIES = {library.directory: library for library in CORPUS}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_every_character_a_thread_writes_reaches_the_model(name):
    tally = Tally()
    with loaded(LIBRARIES[name]) as (process, _):
        check_output(process, tally, name, rounds=3, seed=37, log=lambda text: None)
    assert tally.right.get(("output", "writer"), 0) >= 3 * len(SCENARIOS[name]), tally.right
    assert tally.failures == []
