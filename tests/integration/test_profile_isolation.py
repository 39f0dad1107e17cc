"""profile and the image's profilers: the programmer's SB-SPROF profile
(running, or its samples not reported yet) is refused and left as it was,
in a programmer's image cl-mcp attaches to; two profile calls at once (two
cl-mcps attached to one image) run one after the other, each reporting
only its own code, and a call waits within its own time limit; and what a
report leaves out is said."""

from __future__ import annotations

import re
import time
from typing import Iterator

import pytest

from tests.integration.attach_fixtures import SwankServer, temporary_home
from tests.integration.conftest import McpProcess
from tests.integration.devtools import MODES, checked_call, cl_mcp_in

SPIN = """
(defun pi-spin (seconds)
  (let ((end (+ (get-internal-real-time) (* seconds internal-time-units-per-second))))
    (loop until (> (get-internal-real-time) end))))
(defun pi-spin-a (seconds) (pi-spin seconds) :a)
(defun pi-spin-b (seconds) (pi-spin seconds) :b)
(defun pi-leaf (x) (* x 2))
(defun pi-counted (n) (loop for i below n sum (pi-leaf i)))
"""

TIMEOUT = 6  # --eval-timeout of the calls at once


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[SwankServer, McpProcess]]:
    home = temporary_home()
    server = SwankServer(home)
    process = McpProcess("--connect", str(server.port), "--eval-timeout", "20",
                         env={"HOME": str(home)})
    try:
        process.initialize()
        assert server.client_eval(f"(progn {SPIN} (require :sb-sprof) t)") == "T"
        yield server, process
    finally:
        process.close()
        server.stop()


def programmers_report(programmer: SwankServer) -> str:
    """SB-SPROF's flat report, as the programmer reads it (which stops the
    profiler)."""
    return programmer.client_eval("(with-output-to-string (s) (sb-sprof:report :type :flat :stream s))")


def refused(process: McpProcess) -> str:
    result = checked_call(process, "profile", code="(pi-spin-b 0.3)")
    text = result["content"][0]["text"]
    assert result["isError"] and text.startswith("[ERROR] CL-MCP:PROFILER-IN-USE\n"), result
    return text


def test_the_programmers_running_profile_is_refused_and_left_running(shared):
    programmer, process = shared
    assert programmer.client_eval("(progn (sb-sprof:start-profiling :threads :all) (pi-spin-a 0.5) t)") == "T"
    try:
        text = refused(process)
        assert "SB-SPROF is profiling already (mode cpu), started outside cl-mcp" in text, text
        assert programmer.client_eval("sb-sprof::*profiling*") == ":CPU"
    finally:
        report = programmers_report(programmer)
        programmer.client_eval("(sb-sprof:reset)")
    # Their samples (wherever the signal fell: all threads are sampled),
    # none of cl-mcp's code.
    assert samples_in(report) > 0 and "PI-SPIN-B" not in report, report


def samples_in(report: str) -> int:
    match = re.search(r"Number of samples: +(\d+)", report)
    assert match, report
    return int(match.group(1))


def test_the_programmers_samples_are_refused_and_kept(shared):
    programmer, process = shared
    assert programmer.client_eval("(progn (sb-sprof:start-profiling :threads :all) (pi-spin-a 0.5)"
                           " (sb-sprof:stop-profiling) t)") == "T"
    try:
        samples = int(programmer.client_eval("(sb-sprof::samples-trace-count sb-sprof::*samples*)"))
        assert samples > 0
        text = refused(process)
        assert f"SB-SPROF holds {samples} samples of a profile taken outside cl-mcp" in text, text
    finally:
        report = programmers_report(programmer)
        programmer.client_eval("(sb-sprof:reset)")
    assert samples_in(report) == samples and "PI-SPIN-B" not in report, report
    # cl-mcp's own profile leaves SB-SPROF empty, so that it refuses nothing
    # of its own next time.
    assert not checked_call(process, "profile", code="(pi-spin-b 0.1)")["isError"]
    assert programmer.client_eval("(list sb-sprof::*profiling* sb-sprof::*samples*)") == "(NIL NIL)"
    assert not checked_call(process, "profile", code="(pi-spin-b 0.1)")["isError"]


@pytest.fixture(scope="module")
def two_sessions() -> Iterator[tuple[McpProcess, McpProcess]]:
    """Two cl-mcps attached to one programmer's image: their calls run at
    once there (one cl-mcp's calls are answered one at a time)."""
    home = temporary_home()
    server = SwankServer(home)
    processes = [McpProcess("--connect", str(server.port), "--eval-timeout", str(TIMEOUT),
                            env={"HOME": str(home)}) for _ in range(2)]
    try:
        for process in processes:
            process.initialize()
        text, is_error = processes[0].eval(SPIN)
        assert not is_error, text
        yield processes[0], processes[1]
    finally:
        for process in processes:
            process.close()
        server.stop()


def both(sessions: tuple[McpProcess, McpProcess], first: dict, second: dict) -> tuple[dict, dict]:
    """Two profile calls sent at once, one by each session: their results."""
    ids = [session.start_request("tools/call", {"name": "profile", "arguments": arguments})
           for session, arguments in zip(sessions, (first, second))]
    return tuple(session.response(request_id)["result"]  # type: ignore[return-value]
                 for session, request_id in zip(sessions, ids))


def test_two_cpu_profiles_at_once_each_report_their_own_code(two_sessions):
    a, b = both(two_sessions, {"code": "(pi-spin-a 1.5)", "max-rows": 200},
                {"code": "(pi-spin-b 1.5)", "max-rows": 200})
    for result, mine, theirs in ((a, "PI-SPIN-A", "PI-SPIN-B"), (b, "PI-SPIN-B", "PI-SPIN-A")):
        assert not result["isError"], result
        profile = result["structuredContent"]
        functions = [row["function"] for row in profile["rows"]]
        assert mine in functions and theirs not in functions, profile
        assert profile["samples"] >= 5, profile  # 150 on an idle CPU; the machine may be shared


def test_two_deterministic_profiles_at_once_each_count_their_own_calls(two_sessions):
    spin = "(pi-spin 1)"
    a, b = both(two_sessions,
                {"code": f"(pi-counted 37) {spin}", "mode": "deterministic", "functions": ["pi-leaf"]},
                {"code": f"(pi-counted 41) {spin}", "mode": "deterministic", "functions": ["pi-leaf"]})
    for result, count in ((a, 37), (b, 41)):
        assert not result["isError"], result
        profile = result["structuredContent"]
        assert profile["alreadyProfiled"] == [], profile
        assert [(row["function"], row["calls"]) for row in profile["rows"]] == [("PI-LEAF", count)], profile
    assert two_sessions[0].eval("(sb-profile:profile)") == ("=> NIL", False)


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param, "--eval-timeout", str(TIMEOUT), defining=SPIN) as process:
        yield process


def test_a_profile_waits_within_its_own_time_limit(lisp):
    """A call waits while another holds the profilers, and its wait counts
    against its evaluation timeout (`TIMEOUT`): past it, it is refused as
    busy; a wait that leaves too little time times its code out."""
    holder = hold_profile_lock(lisp, 8)
    busy = checked_call(lisp, "profile", code="(pi-spin-b 0.1)")
    assert busy["isError"] and busy["content"][0]["text"].startswith(
        "[ERROR] CL-MCP:PROFILER-BUSY\nAnother profile call held the profilers for all of this call's "
        f"{TIMEOUT} seconds"), busy
    assert lisp.eval(f"(sb-thread:join-thread {holder})") == ("=> :HELD", False)
    holder = hold_profile_lock(lisp, 4)
    late = checked_call(lisp, "profile", code="(pi-spin-b 5)")
    assert late["isError"] and "TIMEOUT" in late["content"][0]["text"].upper(), late
    assert lisp.eval(f"(sb-thread:join-thread {holder})") == ("=> :HELD", False)


def hold_profile_lock(lisp: McpProcess, seconds: int) -> str:
    """A thread that holds cl-mcp's profile lock for SECONDS, once it holds
    it: a variable naming it."""
    text, is_error = lisp.eval(
        "(defparameter *pi-holder* (sb-thread:make-thread (lambda () (sb-thread:with-mutex"
        f" (cl-mcp-agent::*profile-lock*) (sleep {seconds}) :held))))")
    assert not is_error, text
    deadline = time.monotonic() + 30
    while lisp.eval("(sb-thread:mutex-owner cl-mcp-agent::*profile-lock*)") == ("=> NIL", False):
        assert time.monotonic() < deadline, "the thread never took the profile lock"
        time.sleep(0.05)
    return "*pi-holder*"


def test_fewer_rows_than_the_report_holds_are_said(lisp):
    result = checked_call(lisp, "profile", code="(pi-spin-a 0.5)", **{"max-rows": 1})
    profile = result["structuredContent"]
    assert len(profile["rows"]) == 1 and profile["sampledFunctions"] > 1, profile
    assert re.search(rf"^The 1 of {profile['sampledFunctions']} functions with the most samples of their own:$",
                     result["content"][0]["text"], re.M), result


def test_an_alloc_profile_says_its_samples_fell_in_the_trampolines(lisp):
    result = checked_call(lisp, "profile", mode="alloc",
                          code="(length (loop repeat 200000 collect (make-array 10)))")
    text = result["content"][0]["text"]
    assert not result["isError"], result
    assert "of the samples fell in SBCL's allocation trampolines (ALLOC-TRAMP, LIST-ALLOC-TRAMP)" in text, text
