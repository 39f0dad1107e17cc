"""The backtraces oracle (tests/truth/backtraces.py, issue 37) on part of
its corpus, in `make test` (`make truth` runs all of it): every exported
function of cl-ppcre (whose methods specialise on (EQL ...)),
named-readtables and lparallel, called with wrong arguments in a thread
that stops at the error, has each frame `sb-debug:list-backtrace` showed
at the signal in backtrace's answer and in threads' backtrace, and called
in an evaluation, in its error result's [Backtrace]."""

from __future__ import annotations

import pytest

from tests.truth.backtraces import ANSWERS, check_backtraces, missing
from tests.truth.corpus import CORPUS, loaded
from tests.truth.places import Tally

LIBRARIES = {library.directory: library for library in CORPUS}


@pytest.mark.parametrize("name", ["cl-ppcre", "named-readtables", "lparallel"])
def test_each_frame_of_the_oracle_is_in_cl_mcps_backtraces(name):
    tally = Tally()
    with loaded(LIBRARIES[name]) as (process, copy):
        check_backtraces(process, tally, copy, LIBRARIES[name].system, log=lambda text: None)
    assert all(tally.right.get((answer, "call"), 0) >= 8 for answer in ANSWERS), tally.right
    assert tally.failures == []


def test_a_frame_appears_only_under_its_own_name_and_in_order():
    calls = ["(ERROR \"x\")", "(FOO-BAR 1)", "((LAMBDA ()))", "(FOO)"]
    assert missing(["ERROR", "FOO-BAR", "(LAMBDA NIL)", "FOO"], calls) is None
    assert missing(["FOO-BAR", "ERROR"], calls) is not None
    assert missing(["FOO-B"], calls) is not None
