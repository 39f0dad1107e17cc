"""The session's record of its background work: each outcome handed out
once, and what the image forgot forgotten here too."""

from cl_mcp.lisp.unclaimed import Unclaimed


def test_the_first_claim_keeps_the_outcome_and_the_others_are_refused():
    record: Unclaimed[str] = Unclaimed()
    record.add(7, "evaluation")
    first, second = record.stint(7), record.stint(7)
    assert record.claim(7, first)
    assert not record.claim(7, second)  # while the first keeps it
    assert record.handed_out(7, second)
    record.kept(7, first)
    assert not record.claim(7, second)  # and after
    assert 7 not in record and record.work(7, "default") == "default"
    assert record.handed_out(7, second)  # a late await is told where the outcome went


def test_only_a_kept_stint_counts_as_handed_out():
    record: Unclaimed[str] = Unclaimed()
    record.add(7, "evaluation")
    stint = record.stint(7)
    assert not record.handed_out(7, stint) and not record.handed_out(7, None)
    record.discard(7)  # the image has no outcome for anyone
    assert not record.handed_out(7, stint)
    record.add(8, "evaluation")
    kept = record.stint(8)
    record.kept(8, kept)
    record.clear()  # a reset: nothing is anyone's any more
    assert not record.handed_out(8, kept)


def test_a_claim_that_could_not_be_kept_is_released():
    record: Unclaimed[str] = Unclaimed()
    record.add(7, "evaluation")
    stint = record.stint(7)
    assert record.claim(7, stint)
    record.release(7, stint)
    assert record.claim(7, stint)


def test_an_await_begun_before_a_restart_cannot_claim_the_continuation():
    record: Unclaimed[str] = Unclaimed()
    record.add(7, "evaluation")
    early, late = record.stint(7), record.stint(7)
    assert record.claim(7, early)
    record.kept(7, early)  # the error it stopped at
    record.add(7, "evaluation")  # continued through a restart, in the background again
    assert not record.claim(7, late)
    assert record.claim(7, record.stint(7))


def test_work_it_never_recorded_is_the_callers_to_keep():
    record: Unclaimed[str] = Unclaimed()
    assert record.stint(9) is None and record.claim(9, None)


def test_what_the_image_forgot_is_forgotten_and_nothing_else():
    record: Unclaimed[str] = Unclaimed()
    for number in range(1, 20):
        record.add(number, "evaluation", forgotten=[number - 16] if number > 16 else [])
    assert len(record) == 16 and 3 not in record and 4 in record
    record.discard(4)
    claimed = record.stint(5)
    assert record.claim(5, claimed)
    record.discard(5)  # the image said so to another caller: the claim stands
    assert len(record) == 15 and 5 in record
    record.clear()
    assert len(record) == 0
