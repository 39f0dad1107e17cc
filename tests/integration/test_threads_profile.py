"""The threads and profile tools on real threads and real code, in an image
cl-mcp owns and in a programmer's image it attaches to: a user's thread
listed, its backtrace, stopped by interrupt, looked at and continued, and
killed; cl-mcp's own threads refused; a CPU profile whose known callee
holds most samples (also after an evaluation went to the background,
which once left the lane's thread with SIGPROF blocked), and an
allocation profile of code that conses."""

from __future__ import annotations

import re
import time

import pytest

from tests.integration.devtools import MODES, checked_call, cl_mcp_in

WORK = """
(defun tp-callee (n)
  (declare (fixnum n) (optimize speed (safety 0)))  ; inline arithmetic: its time is its own
  (let ((s 0))
    (declare (fixnum s))
    (dotimes (i n s) (setf s (logand #xffffff (+ s (logxor i (ash s -3))))))))
(defun tp-work (seconds)
  (loop with end = (+ (get-internal-real-time) (* seconds internal-time-units-per-second))
        while (< (get-internal-real-time) end) sum (tp-callee 100000)))
(defun tp-consing (n) (loop repeat n collect (make-array 1000)))
(defvar *tp-counts* (make-hash-table :test 'equal :synchronized t))
(defun tp-loop (name) (loop (incf (gethash name *tp-counts* 0)) (sleep 0.05)))
"""


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param, defining=WORK) as process:
        yield process


def thread_list(lisp) -> list[dict]:
    return checked_call(lisp, "threads", action="list")["structuredContent"]["threads"]


def start_thread(lisp, name: str) -> int:
    text, is_error = lisp.eval(f'(sb-thread:make-thread #\'tp-loop :name "{name}" :arguments \'("{name}"))')
    assert not is_error, text
    for _ in range(50):  # a thread just made gets its Linux id when it starts
        [thread] = [t for t in thread_list(lisp) if t["name"] == name]
        if thread["id"]:
            break
        time.sleep(0.02)
    assert thread["owner"] == "user" and thread["id"], thread
    return thread["id"]


def counter(lisp, name: str) -> int:
    text, is_error = lisp.eval(f'(gethash "{name}" *tp-counts*)')
    assert not is_error, text
    return int(text.split("\n")[0].removeprefix("=> "))


def test_list_says_whose_each_thread_is(lisp):
    threads = thread_list(lisp)
    owners = {t["owner"] for t in threads}
    assert {"cl-mcp", "swank"} <= owners, threads
    sleeper = start_thread(lisp, "tp-sleeper")
    # It sleeps 50 ms between increments: seen sleeping within a few looks.
    states = [next(t for t in thread_list(lisp) if t["id"] == sleeper)["state"] for _ in range(10)]
    assert "sleeping" in states, states


def waiting_entry(lisp, name: str) -> tuple[dict, list[dict]]:
    """Thread NAME's list entry once it is waiting, and the list."""
    for _ in range(100):
        threads = thread_list(lisp)
        [entry] = [t for t in threads if t["name"] == name]
        if entry["state"] == "waiting":
            return entry, threads
        time.sleep(0.05)
    raise AssertionError(f"{name} never waited: {entry}")


def test_list_is_by_id_and_a_backtrace_heading_agrees_with_it(lisp):
    """The heading's state is the thread's before the interrupt that asks
    for its frames (answering it, the thread runs)."""
    text, is_error = lisp.eval('(sb-thread:make-thread (lambda () (let ((lock (sb-thread:make-mutex)) '
                               '(queue (sb-thread:make-waitqueue))) (sb-thread:with-mutex (lock) '
                               '(loop (sb-thread:condition-wait queue lock))))) :name "tp-waiter")')
    assert not is_error, text
    waiter, threads = waiting_entry(lisp, "tp-waiter")
    assert [t["id"] for t in threads] == sorted(t["id"] for t in threads), threads
    for _ in range(40):  # the heading was taken after the interrupt: "running", now and then
        waiting_entry(lisp, "tp-waiter")
        traced = checked_call(lisp, "threads", action="backtrace", thread=waiter["id"], count=5)
        assert traced["structuredContent"]["threads"][0]["state"] == "waiting", traced
    assert not lisp.call("threads", action="kill", thread=waiter["id"])["isError"]


def test_backtrace_of_a_user_thread(lisp):
    thread = start_thread(lisp, "tp-traced")
    result = checked_call(lisp, "threads", action="backtrace", thread=thread, count=10)
    assert not result["isError"], result
    frames = result["structuredContent"]["frames"]
    assert any("TP-LOOP" in frame for frame in frames), frames
    assert "[Backtrace]" in result["content"][0]["text"]


def test_interrupt_stops_a_thread_where_the_debugger_tools_reach_it(lisp):
    thread = start_thread(lisp, "tp-stopped")
    result = checked_call(lisp, "threads", action="interrupt", thread=thread)
    assert not result["isError"], result
    number = result["structuredContent"]["evaluation"]
    assert f"Evaluation {number} is waiting" in result["content"][0]["text"], result
    assert result["content"][0]["text"].startswith("[ERROR] CL-MCP-AGENT::THREAD-INTERRUPTED\n"), result
    [entry] = [t for t in thread_list(lisp) if t["id"] == thread]
    assert (entry["state"], entry["evaluation"]) == ("stopped-at-error", number)
    stopped = counter(lisp, "tp-stopped")
    time.sleep(0.3)
    assert counter(lisp, "tp-stopped") == stopped  # it waits
    frames = lisp.call("backtrace", evaluation=number)
    assert "TP-LOOP" in frames["content"][0]["text"], frames
    local = lisp.call("eval-in-frame", evaluation=number, frame=0,
                      code="(sb-thread:thread-name sb-thread:*current-thread*)")
    assert '"tp-stopped"' in local["content"][0]["text"], local
    again = checked_call(lisp, "threads", action="interrupt", thread=thread)
    assert again["isError"] and "STOPPED-AT-ERROR" in again["content"][0]["text"], again
    continued = lisp.call("invoke-restart", evaluation=number, restart="continue")
    assert not continued["isError"], continued
    time.sleep(0.3)
    assert counter(lisp, "tp-stopped") > stopped  # back at its work
    [entry] = [t for t in thread_list(lisp) if t["id"] == thread]
    assert entry["state"] != "stopped-at-error", entry


def test_a_thread_interrupted_while_it_prints_holds_up_no_reply(lisp):
    """A thread that prints all the time is mostly inside the lock that keeps
    its output for the [threads] notice; interrupted there, it must not wait
    at its stop holding that lock, which every reply to cl-mcp takes first."""
    text, is_error = lisp.eval('(sb-thread:make-thread (lambda () (loop (princ "x"))) :name "tp-printer")')
    assert not is_error, text
    for _ in range(50):
        ids = [t["id"] for t in thread_list(lisp) if t["name"] == "tp-printer"]
        if ids and ids[0]:
            break
        time.sleep(0.02)
    [thread] = ids
    for _ in range(5):
        stopped = lisp.call("threads", wait=20, action="interrupt", thread=thread)
        # Once, in a loaded suite, the image was lost here: its log says why.
        assert not stopped["isError"], (stopped, "".join(lisp.stderr_lines[-40:]))
        text, is_error = lisp.eval("(+ 1 2)")
        assert not is_error and text.startswith("=> 3"), text
        continued = lisp.call("invoke-restart", wait=20, evaluation=stopped["structuredContent"]["evaluation"],
                              restart="continue")
        assert not continued["isError"], continued
    assert not lisp.call("threads", action="kill", thread=thread)["isError"]


def test_a_thread_waiting_at_an_error_is_not_interrupted_again(lisp):
    """A second stop nested in the first once left the image unresponsive
    (embedded, cl-mcp then restarted it and the session was lost)."""
    text, is_error = lisp.eval('(sb-thread:make-thread (lambda () (error "tp fails")) :name "tp-failed")')
    assert not is_error, text
    deadline = time.monotonic() + 10
    while not (stopped := [t for t in thread_list(lisp)
                           if t["name"] == "tp-failed" and t["state"] == "stopped-at-error"]):
        assert time.monotonic() < deadline, thread_list(lisp)
        time.sleep(0.05)
    [entry] = stopped
    refused = checked_call(lisp, "threads", action="interrupt", thread=entry["id"])
    assert refused["isError"], refused
    assert "STOPPED-AT-ERROR" in refused["content"][0]["text"], refused
    assert f"evaluation {entry['evaluation']}" in refused["content"][0]["text"], refused
    assert lisp.eval("(+ 1 2)") == ("=> 3", False)
    killed = checked_call(lisp, "threads", action="kill", thread=entry["id"])
    assert not killed["isError"], killed


def test_kill_ends_a_user_thread_and_refuses_cl_mcps_own(lisp):
    thread = start_thread(lisp, "tp-killed")
    killed = checked_call(lisp, "threads", action="kill", thread=thread)
    assert not killed["isError"], killed
    assert thread not in [t["id"] for t in thread_list(lisp)]
    for owner in ("cl-mcp", "swank"):
        own = next(t for t in thread_list(lisp) if t["owner"] == owner)
        refused = checked_call(lisp, "threads", action="kill", thread=own["id"])
        assert refused["isError"], refused
        assert "NOT-A-USER-THREAD" in refused["content"][0]["text"]
        assert own["id"] in [t["id"] for t in thread_list(lisp)]
    missing = checked_call(lisp, "threads", action="interrupt", thread=1)
    assert missing["isError"] and "NO-SUCH-THREAD" in missing["content"][0]["text"]


def cpu_profile(lisp) -> dict:
    result = checked_call(lisp, "profile", code="(tp-work 0.5)", mode="cpu", **{"max-rows": 5})
    assert not result["isError"], result
    return result["structuredContent"]


def test_cpu_profile_finds_the_callee(lisp):
    profile = cpu_profile(lisp)
    assert profile["samples"] >= 5, profile  # 50 on an idle CPU; the machine may be shared
    callee = next(row for row in profile["rows"] if row["function"] == "TP-CALLEE")
    assert callee["selfPercent"] >= 50, profile
    assert len(profile["rows"]) <= 5


def test_the_profiler_cl_mcp_loaded_is_not_the_session_s_definitions(lisp):
    """list-definitions listed 162 SB-SPROF symbols once a profile had run
    (issue 43)."""
    cpu_profile(lisp)
    listed = lisp.call("list-definitions")["content"][0]["text"]
    assert "TP-CALLEE" in listed and "SB-SPROF::" not in listed, listed[:2000]


def test_cpu_profile_after_an_evaluation_went_to_the_background(lisp):
    """The lane's next thread is made inside the window's interrupt, where
    SIGPROF is blocked: it had no samples at all ("Sampled threads:
    finalizer" in sb-sprof's own report)."""
    running = lisp.call("evaluate-lisp", code="(sleep 1.5)", **{"answer-within": 0.5})
    assert "[running]" in running["content"][0]["text"], running
    profile = cpu_profile(lisp)
    callee = next(row for row in profile["rows"] if row["function"] == "TP-CALLEE")
    assert callee["selfPercent"] >= 50, profile
    time.sleep(1.2)
    # Reset after: profile refuses samples that are not its own.
    text, is_error = lisp.eval("""(progn (require :sb-sprof)
      (prog1 (with-output-to-string (*standard-output*)
               (sb-sprof:with-profiling (:mode :cpu :report :flat) (tp-work 0.3)))
        (sb-sprof:reset)))""")
    assert not is_error and "TP-CALLEE" in text, text


def test_alloc_profile_of_consing_code(lisp):
    result = checked_call(lisp, "profile", code="(length (tp-consing 20000))", mode="alloc",
                           **{"max-rows": 200})
    assert not result["isError"], result
    profile = result["structuredContent"]
    assert profile["samples"] > 0 and profile["value"] == "20000", profile
    consing = next(row for row in profile["rows"] if row["function"] == "TP-CONSING")
    assert consing["cumulativePercent"] >= 50, profile


def test_profile_errors(lisp):
    failed = checked_call(lisp, "profile", code="(car 5)")
    assert failed["isError"] and "TYPE-ERROR" in failed["content"][0]["text"], failed
    unknown = checked_call(lisp, "profile", code="1", package="NO-SUCH-PACKAGE")
    assert unknown["isError"] and "PACKAGE-ERROR" in unknown["content"][0]["text"], unknown


@pytest.mark.parametrize("mode", ["cpu", "alloc"])
def test_a_profile_lists_the_codes_own_functions_not_cl_mcps(lisp, mode):
    """cl-mcp's, Swank's and the evaluator's frames under the code are in
    every sample: they filled the top rows, pushing the user's out (issue
    44, item 13).  Left out, the user's functions lead the first rows, and
    the text says how many were left out."""
    code = "(tp-work 0.5)" if mode == "cpu" else "(length (tp-consing 20000))"
    result = checked_call(lisp, "profile", code=code, mode=mode, **{"max-rows": 200})
    assert not result["isError"], result
    rows = [row["function"] for row in result["structuredContent"]["rows"]]
    assert not [row for row in rows if "CL-MCP-AGENT:" in row or "SWANK" in row
                or row in ("EVAL", "SB-INT:SIMPLE-EVAL-IN-LEXENV", "SB-THREAD::CALL-WITH-MUTEX")], rows
    ours = "TP-WORK" if mode == "cpu" else "TP-CONSING"
    assert ours in rows[:6], rows
    assert re.search(r"\n\(\d+ functions of cl-mcp's, Swank's and SBCL's, under the code, left out\)",
                     result["content"][0]["text"]), result
