"""Each planted fault of `make truth` (tests/truth/mutants.py) still finds
the code it changes: a fault whose text the code no longer has would stop
`make truth` at its first mutant, found only by its 30-minute run."""

from __future__ import annotations

import pytest

from tests.truth.mutants import MUTANTS, ROOT, Mutant


@pytest.mark.parametrize("mutant", MUTANTS, ids=[mutant.name for mutant in MUTANTS])
def test_each_planted_fault_changes_one_place_of_the_code(mutant: Mutant):
    text = (ROOT / mutant.file).read_text(encoding="utf-8")
    assert text.count(mutant.old) == 1, f"{mutant.old!r} is in {mutant.file} {text.count(mutant.old)} times"
    assert mutant.check in ("places", "running", "tests")


def test_there_are_at_least_fifteen_and_their_names_differ():
    assert len(MUTANTS) >= 15
    assert len({mutant.name for mutant in MUTANTS}) == len(MUTANTS)
