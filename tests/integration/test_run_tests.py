"""run-tests against a real SBCL, embedded and attached: the fixture suites
(tests/fixtures/lisp/run-tests-fixture/: FiveAM, Fiasco, RT, a test-op no
framework runs, and a FiveAM suite that outlasts a 1 s answer window), split-sequence's FiveAM suite and alexandria's RT suite
(Debian's, nobody here wrote them), their totals compared with the counts
the framework gives when the same suite runs directly; a test broken in a
copy of split-sequence; debug: true waiting at the failed check, and
continued to the run's end."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.integration.devtools import FIXTURES, MODES, checked_call, cl_mcp_in, registered_copy

SUITES = FIXTURES / "run-tests-fixture"
SPLIT_SEQUENCE = Path("/usr/share/common-lisp/source/cl-split-sequence")
CL_PPCRE = Path("/usr/share/common-lisp/source/cl-ppcre")


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param) as process:
        # Loaded here, so that a test run by name finds it in any test order.
        text, is_error = process.eval(f'(asdf:load-asd "{SUITES}/run-tests-fixture.asd")'
                                      '(asdf:load-system "run-tests-fixture")')
        assert not is_error, text
        yield process


def run(process, **arguments) -> tuple[dict, str]:
    result = checked_call(process, "run-tests", **arguments)
    return result["structuredContent"], result["content"][0]["text"]


def totals(tests: dict) -> tuple[int, int, int, int]:
    return tests["passed"], tests["failed"], tests["errored"], tests["skipped"]


def test_a_fiveam_suite_gives_its_checks_failures_at_their_tests_and_errors(lisp):
    structure, text = run(lisp, system="run-tests-fixture")
    tests = structure["tests"]
    assert (tests["frameworks"], tests["counts"], totals(tests)) == (["FiveAM"], "checks", (2, 1, 1, 1))
    failure, error = tests["problems"]
    assert (failure["kind"], failure["test"], failure["form"]) == (
        "failure", "RUN-TESTS-FIXTURE::DOUBLES-WRONGLY", "(= 5 (RUN-TESTS-FIXTURE::DOUBLE 2))")
    assert "evaluated to" in failure["reason"] and "4" in failure["reason"]
    suite = str(SUITES / "fiveam-suite.lisp")
    assert (failure["place"]["file"], failure["place"]["line"]) == (suite, 15)
    assert (error["kind"], error["type"], error["place"]["line"]) == ("error", "SB-INT:SIMPLE-PARSE-ERROR", 18)
    assert structure["success"] is False and text.startswith("[tests] FiveAM: 2 passed, 1 failed")
    # FiveAM's own printout is kept for read-output.
    printout = lisp.call("read-output", evaluation=structure["number"])["content"][0]["text"]
    assert "Did 5 checks." in printout


def test_an_rt_suite_gives_expected_and_actual_values_and_the_error(lisp):
    structure, text = run(lisp, system="run-tests-fixture/rt")
    # RT's printout ends without a newline: its lines are counted as
    # read-output counts them (ironclad's 415 were "414 lines").
    printout = lisp.call("read-output", evaluation=structure["number"])
    total = printout["structuredContent"]["totalLines"]
    assert f"The framework's printout ({total} lines): read-output" in text, text
    tests = structure["tests"]
    assert (tests["frameworks"], tests["counts"], totals(tests)) == (["RT"], "tests", (2, 1, 1, 0))
    failure, error = tests["problems"]
    assert (failure["test"], failure["expected"], failure["actual"], failure["place"]["line"]) == (
        "RUN-TESTS-FIXTURE/RT::ADDS.2", "5", "4", 8)
    assert (error["test"], error["type"], error["place"]["line"]) == (
        "RUN-TESTS-FIXTURE/RT::DIVIDES.1", "DIVISION-BY-ZERO", 10)


def test_a_fiasco_suite_counts_tests_as_its_printout_marks_them(lisp):
    structure, text = run(lisp, system="run-tests-fixture/fiasco")
    tests = structure["tests"]
    # Fiasco's printout: one [ OK ], two [FAIL] (a failed IS, an error), one [SKIP].
    assert (tests["frameworks"], tests["counts"], totals(tests)) == (["Fiasco"], "tests", (1, 1, 1, 1))
    failure, error = tests["problems"]
    suite = str(SUITES / "fiasco-suite.lisp")
    assert (failure["test"], failure["form"], failure["place"]["file"], failure["place"]["line"]) == (
        "RUN-TESTS-FIXTURE/FIASCO::TRIPLES-WRONGLY", "(FIASCO:IS (= 7 (RUN-TESTS-FIXTURE/FIASCO::TRIPLE 2)))", suite, 14)
    assert "y: (RUN-TESTS-FIXTURE/FIASCO::TRIPLE 2) => 6" in failure["reason"]
    assert (error["type"], error["place"]["line"]) == ("DIVISION-BY-ZERO", 17)
    assert text.startswith("[tests] Fiasco: 1 passed, 1 failed, 1 errored, 1 skipped (tests)")


def test_debug_stops_at_fiascos_failed_assertion_with_its_restarts(lisp):
    lisp.eval('(asdf:load-system "run-tests-fixture/fiasco")')
    result = checked_call(lisp, "run-tests", test="run-tests-fixture/fiasco::triples-wrongly", debug=True)
    structure = result["structuredContent"]
    assert result["isError"] and structure["error"]["type"] == "FIASCO::FAILED-ASSERTION", structure
    restarts = [restart["name"] for restart in structure["restarts"]]
    assert {"CONTINUE", "RETEST", "ABORT"} <= set(restarts), restarts
    done = checked_call(lisp, "invoke-restart", evaluation=structure["evaluation"], restart="CONTINUE")
    assert totals(done["structuredContent"]["tests"]) == (0, 1, 0, 0), done


def test_an_unrecognised_framework_gives_no_counts_but_its_output_and_error(lisp):
    structure, text = run(lisp, system="run-tests-fixture/unknown")
    tests = structure["tests"]
    assert tests["recognised"] is False and "passed" not in tests
    assert tests["signalled"]["message"] == "the second thing is wrong"
    assert "checking 3 things by hand" in text and "no test framework recognised" in text


def test_a_system_whose_test_op_runs_nothing_says_so(lisp):
    # Fiasco's own system defines no test-op: asdf:test-system returns T.
    # (Loaded first: compiling it would print.)
    assert not lisp.eval('(asdf:load-system "fiasco")')[1]
    structure, text = run(lisp, system="fiasco")
    assert structure["tests"]["recognised"] is False and structure["success"] is True
    assert "The test-op printed nothing and signalled nothing" in text and "\n=> T\n" in text, text
    assert "TEST-RUN" not in text


def test_one_test_by_name(lisp):
    structure, _ = run(lisp, test="doubles-small-numbers", package="RUN-TESTS-FIXTURE")
    assert (totals(structure["tests"]), structure["success"]) == ((2, 0, 0, 0), True)


def test_debug_stops_at_the_failed_check_with_fiveams_restarts(lisp):
    result = lisp.call("run-tests", test="run-tests-fixture::doubles-wrongly", debug=True)
    structure = result["structuredContent"]
    assert result["isError"] and structure["error"]["type"].endswith("CHECK-FAILURE")
    restarts = [restart["name"] for restart in structure["restarts"]]
    assert {"IGNORE-FAILURE", "RETEST", "ABORT"} <= set(restarts), restarts
    # The backtrace starts where the check failed, in FiveAM running the test.
    frames = lisp.call("backtrace", evaluation=structure["evaluation"])
    assert not frames["isError"], frames
    text = frames["content"][0]["text"]
    assert "PROCESS-FAILURE (= 5 (RUN-TESTS-FIXTURE::DOUBLE 2))" in text and "TEST-CASE RUN-TESTS-FIXTURE::DOUBLES-WRONGLY" in text, text
    # Going on past the failure finishes the run, nothing waits any more,
    # and the run's end is run-tests' result.
    done = checked_call(lisp, "invoke-restart", evaluation=structure["evaluation"], restart="IGNORE-FAILURE")
    tests = done["structuredContent"]["tests"]
    assert "evaluation" not in done["structuredContent"], done
    assert (tests["frameworks"], totals(tests)) == (["FiveAM"], (0, 1, 0, 0)), tests
    assert tests["problems"][0]["place"]["line"] == 15
    assert done["isError"] and done["content"][0]["text"].startswith("[tests] FiveAM: 0 passed, 1 failed")


def framework_count(process, code: str) -> list[int]:
    text, is_error = process.eval(code)
    assert not is_error, text
    value = next(line for line in text.splitlines() if line.startswith("=> ("))
    return [int(number) for number in value.removeprefix("=> ").strip("()").split()]


def test_split_sequences_fiveam_suite_counts_as_fiveam_does(lisp):
    structure, _ = run(lisp, system="split-sequence")
    tests = structure["tests"]
    passed, failed = framework_count(lisp, """
      (let ((results (5am:run :split-sequence)))
        (list (count-if (lambda (r) (typep r '5am::test-passed)) results)
              (count-if (lambda (r) (typep r '5am::test-failure)) results)))""")
    assert (tests["passed"], tests["failed"] + tests["errored"]) == (passed, failed)
    assert passed > 100


def test_a_broken_split_sequence_test_is_placed_at_its_definition(lisp, tmp_path):
    copy = tmp_path / "split-sequence"
    shutil.copytree(SPLIT_SEQUENCE, copy)
    tests_file = copy / "tests.lisp"
    text = tests_file.read_text()
    old = '(define-test split-sequence.1 (:input (input "a;;b;c")\n'
    assert text.count(old) == 1
    tests_file.write_text(text.replace(old, '(define-test split-sequence.1 (:input (input "a;;b;;c")\n'))
    line = next(number for number, each in enumerate(tests_file.read_text().splitlines(), 1)
                if each.startswith("(define-test split-sequence.1 "))
    loaded, is_error = lisp.eval(f'(push #p"{copy}/" asdf:*central-registry*)'
                                 '(asdf:load-system "split-sequence/tests" :force t)')
    assert not is_error, loaded
    structure, _ = run(lisp, system="split-sequence")
    places = {(problem["place"].get("file"), problem["place"].get("line"))
              for problem in structure["tests"]["problems"]}
    assert places == {(str(tests_file), line)}, structure["tests"]["problems"]
    lisp.eval(f'(setf asdf:*central-registry* (remove #p"{copy}/" asdf:*central-registry* :test #\'equal))'
              '(asdf:clear-system "split-sequence") (asdf:clear-system "split-sequence/tests")')


def test_a_run_leaves_out_the_redefinition_warnings_of_its_load(lisp, tmp_path):
    """As load-system leaves them out: ASDF compiles cl-ppcre's files, then
    loads them, each macro "redefined"."""
    copy = registered_copy(lisp, CL_PPCRE, tmp_path / "cl-ppcre")
    try:
        result = checked_call(lisp, "run-tests", system="cl-ppcre", timeout=300)
        # The copy was compiled, then loaded (a long stdout keeps its start).
        assert f'compiling file "{copy}/' in result["structuredContent"]["stdout"], result
        warnings = [w for w in result["structuredContent"]["warnings"] if "redefining" in w["message"]]
        assert warnings == [], warnings
        assert "redefining" not in result["content"][0]["text"]
    finally:
        lisp.eval(f'(setf asdf:*central-registry* (remove #p"{copy}/" asdf:*central-registry* :test #\'equal))'
                  '(asdf:clear-system "cl-ppcre") (asdf:clear-system "cl-ppcre-tests")')


def test_alexandrias_rt_suite_counts_as_rt_does(lisp):
    structure, _ = run(lisp, system="alexandria-tests")
    tests = structure["tests"]
    # Its test-op runs the suite twice: interpreted, then compiled.
    entries, pending = framework_count(lisp, """
      (progn (sb-rt:do-tests (make-broadcast-stream))
             (list (length (cdr sb-rt::*entries*)) (length (sb-rt::pending-tests))))""")
    assert tests["passed"] + tests["failed"] + tests["errored"] == 2 * entries
    assert entries > 100 and tests["passed"] >= 2 * (entries - pending) - pending


@pytest.mark.parametrize("mode", MODES)
def test_what_a_run_loads_is_a_librarys_not_the_sessions(mode):
    # As after load-system: split-sequence and its tests' system, loaded by
    # the run in a fresh session, are not the session's definitions.
    with cl_mcp_in(mode) as fresh:
        structure, _ = run(fresh, system="split-sequence")
        assert structure["tests"]["passed"] > 100
        listed = fresh.call("list-definitions", type="functions")["content"][0]["text"]
        assert "SPLIT-SEQUENCE" not in listed, listed


def test_cancelling_the_call_stops_the_run(lisp):
    """notifications/cancelled aborts a run in the image, as it aborts an
    evaluation, and frees the session at once (its slow test sleeps 6 s)."""
    request_id = lisp.start_request("tools/call", {"name": "run-tests",
                                                   "arguments": {"system": "run-tests-fixture/slow"}})
    time.sleep(0.5)
    lisp.notify("notifications/cancelled", {"requestId": request_id, "reason": "test"})
    started = time.monotonic()
    assert lisp.eval("(+ 1 2)") == ("=> 3", False)
    assert time.monotonic() - started < 4  # not after the suite's 6 s


def test_a_long_run_answers_still_running_then_await_gives_its_results(lisp):
    structure, text = run(lisp, system="run-tests-fixture/slow", **{"answer-within": 1})
    assert structure["running"] is True and "tests" not in structure, structure
    number = structure["number"]
    assert text.startswith(f"[running] Test run {number} is still running"), text
    outcome = checked_call(lisp, "await-evaluation", evaluation=number, wait=30)
    tests = outcome["structuredContent"]["tests"]
    assert (tests["frameworks"], totals(tests)) == (["FiveAM"], (1, 1, 0, 0)), outcome
    failure, = tests["problems"]
    assert (failure["test"], failure["place"]["line"]) == ("RUN-TESTS-FIXTURE/SLOW::FAILS-AFTER-THE-SLEEP", 16)
    assert outcome["isError"] and outcome["content"][0]["text"].startswith("[tests] FiveAM: 1 passed, 1 failed")
    assert outcome["structuredContent"]["number"] == number
