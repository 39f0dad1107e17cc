"""The test-results oracle's reading of a framework's printout
(tests/truth/tests_oracle.py: parse), on printouts the frameworks wrote:
FiveAM's run! of tests/fixtures/lisp/run-tests-fixture (a failed check, an
error, a skip) and SB-RT's do-tests of iterate's suite (expected failures),
cut to their summaries."""

from __future__ import annotations

from collections import Counter

from tests.truth.tests_oracle import parse

FIVEAM = """Running test suite RUN-TESTS-FIXTURE
 Running test DOUBLES-SMALL-NUMBERS ..
 Running test DOUBLES-WRONGLY f
 Running test SIGNALS-AN-ERROR X
 Running test SKIPS-ONE ss
 Did 5 checks.
    Pass: 2 (40%)
    Skip: 1 (20%)
    Fail: 2 (40%)

 Failure Details:
 --------------------------------
 SIGNALS-AN-ERROR in RUN-TESTS-FIXTURE []:
      Unexpected Error: #<SB-INT:SIMPLE-PARSE-ERROR "junk in string ~S" {1002A11C73}>
junk in string "not a number".
 --------------------------------
 --------------------------------
 DOUBLES-WRONGLY in RUN-TESTS-FIXTURE []:

(DOUBLE 2)

 evaluated to

4

 which is not

=

 to

5


 --------------------------------

 Skip Details:
 SKIPS-ONE []:
     not ready

"""

RT = """Doing 271 pending tests of 271 tests total.
 ITERATE.TEST::DSETQ.1 ITERATE.TEST::DSETQ.2
Test ITERATE.TEST::ALWAYS.FINALLY failed
Form: (WITH-OUTPUT-TO-STRING (*STANDARD-OUTPUT*) (ITERATE:ITER (ITERATE:REPEAT 1)))
Expected value: "42"
Actual value: "".
 ITERATE.TEST::WALK.TAGBODY.2
2 out of 271 total tests failed: ITERATE.TEST::ALWAYS.FINALLY,
   ITERATE.TEST::BUG/COLLECT-AT-BEGINNING.
No unexpected failures.
DO-TESTS returned NIL unexpected failures and NIL unexpected successes
"""


def test_fiveams_totals_and_failed_tests():
    printed = parse(FIVEAM)
    assert (printed.framework, printed.totals) == (
        "FiveAM", {"checks": 5, "passed": 2, "skipped": 1, "failed": 2})
    assert printed.failed == Counter({"SIGNALS-AN-ERROR": 1, "DOUBLES-WRONGLY": 1})


def test_rts_totals_failed_tests_and_expected_failures():
    printed = parse(RT)
    assert (printed.framework, printed.totals) == (
        "RT", {"tests": 271, "passed": 269, "failed": 2, "expected to fail": 2})
    assert printed.failed == printed.expected == Counter({"ALWAYS.FINALLY": 1, "BUG/COLLECT-AT-BEGINNING": 1})


def test_a_runner_of_its_own_is_no_framework():
    assert parse("Test: Simple tests from file \"simple\"\n.......\nAll tests passed.\n").framework is None


# cffi's two runs (interpreted, then compiled): some failures expected, one not.
RT_UNEXPECTED = """Doing 332 pending tests of 332 tests total.
4 out of 332 total tests failed: FSBV.WFO, FSBV.MAKEPAIR.1, FSBV.MAKEPAIR.2, 
   TEST-STATIC-PROGRAM.
1 unexpected failures: TEST-STATIC-PROGRAM.
;;; running tests (compiled)
Doing 332 pending tests of 332 tests total.
3 out of 332 total tests failed: FSBV.WFO, FSBV.MAKEPAIR.1, TEST-STATIC-PROGRAM.
1 unexpected failures: TEST-STATIC-PROGRAM.; 
; compilation unit finished
"""


def test_rts_failures_not_named_unexpected_are_expected_ones():
    """An oracle that read only "No unexpected failures." took cffi's expected
    failures for unexpected ones, and run-tests' right answer for wrong."""
    printed = parse(RT_UNEXPECTED)
    assert printed.totals == {"tests": 664, "passed": 657, "failed": 7, "expected to fail": 5}
    assert printed.expected == Counter({"FSBV.WFO": 2, "FSBV.MAKEPAIR.1": 2, "FSBV.MAKEPAIR.2": 1})
    assert printed.failed["TEST-STATIC-PROGRAM"] == 2


def test_rt_without_an_expected_failures_list_expects_none():
    printed = parse("Doing 2 pending tests of 2 tests total.\n1 out of 2 total tests failed: FOO.1.\n")
    assert printed.totals["expected to fail"] == 0 and not printed.expected
