"""Backtraces checked against an oracle: `sb-debug:list-backtrace`, taken
inside the same thread at the same point (a handler that declines, or a
function the thread calls while it waits).  Its frames, from the one that
signalled down to the user's outermost one, must all appear, in order, in
what cl-mcp shows: the backtrace of a user's thread stopped at its error
(its own (LAMBDA ()) included), of a run-tests debug stop (the test's
frames, not only the run's EVAL), and threads' backtrace of a thread
waiting in CONDITION-WAIT (its own frames, not only the last)."""

from __future__ import annotations

import time

import pytest

from tests.integration.devtools import MODES, cl_mcp_in
from tests.integration.test_thread_news import notices_until, start, waiting_evaluation

# The oracle, in plain Lisp: the names of the frames of list-backtrace
# below the last frame of the signalling (or the point START names), down
# to the user's outermost frame (the frame above SBCL's start of the
# thread, or above the evaluation's own EVAL), printed as cl-mcp prints a
# frame's call, foreign frames and SBCL's evaluator left out (cl-mcp hides
# the evaluator's frames on purpose: they say nothing of the code).
ORACLE = """
(defvar *bo-oracle* nil)
(defvar *bo-five* 5)
(defvar *bo-evaluator* '(sb-int:simple-eval-in-lexenv sb-impl::simple-eval-progn-body
                         sb-impl::%simple-eval sb-impl::eval-in-lexenv))
(defun bo-agent-p (name)
  (if (consp name)
      (or (bo-agent-p (car name)) (bo-agent-p (cdr name)))
      (and name (symbolp name) (eq (symbol-package name) (find-package "CL-MCP-AGENT")))))
(defun bo-frames (start)
  (let* ((names (mapcar #'first (sb-debug:list-backtrace :from :current-frame)))
         (from (1+ (or (position-if (lambda (name) (member name start :test #'equal)) names :from-end t)
                       (error "no ~S frame" start))))
         (to (or (position-if (lambda (name)
                                (or (eq name 'sb-thread::run)
                                    (and (consp name) (eq (car (last name)) 'sb-thread::run))
                                    (bo-agent-p name)))
                              names :start from)
                 (length names))))
    (let ((*package* (find-package "COMMON-LISP-USER")) (*print-pretty* nil)
          (*print-length* 10) (*print-level* 2))
      (loop for name in (subseq names from to)
            unless (or (stringp name) (member name *bo-evaluator*))
              collect (prin1-to-string name)))))
(defun bo-signalled () (bo-frames '(error sb-kernel:internal-error)))
"""


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param, defining=ORACLE) as process:
        yield process


def oracle(lisp) -> list[str]:
    """The frames the oracle kept (and forget them)."""
    result = lisp.call("evaluate-lisp", code="(format t \"~{~A~%~}\" (shiftf *bo-oracle* nil))")
    assert not result["isError"], result
    # SBCL prints an empty lambda list as NIL; a frame's call, as ().
    frames = result["structuredContent"]["stdout"].replace("(LAMBDA NIL", "(LAMBDA ()").splitlines()
    assert frames, result
    return frames


def all_appear(expected: list[str], calls: list[str]) -> None:
    """Each of EXPECTED begins one of CALLS, in order."""
    calls = [call.replace("(LAMBDA NIL", "(LAMBDA ()") for call in calls]
    position = 0
    for name in expected:
        found = next((i for i in range(position, len(calls)) if calls[i].startswith("(" + name)), None)
        assert found is not None, f"{name} missing after frame {position}: oracle {expected}, cl-mcp {calls}"
        position = found + 1


def frames_of(lisp, number: int) -> list[str]:
    """The calls of the backtrace of waiting evaluation NUMBER."""
    result = lisp.call("backtrace", evaluation=number, count=200)
    assert not result["isError"], result
    return [frame["call"] for frame in result["structuredContent"]["frames"]]


def test_a_stopped_thread_shows_its_own_lambda(lisp):
    notice = start(lisp, """(sb-thread:make-thread
  (lambda () (handler-bind ((error (lambda (c) (declare (ignore c)) (setf *bo-oracle* (bo-signalled)))))
               (car *bo-five*)))
  :name "bo-car")""")
    number = waiting_evaluation(notices_until(lisp, 'Thread "bo-car" stopped', notice), "bo-car")
    expected = oracle(lisp)
    assert expected[0].startswith("(LAMBDA ()"), expected
    all_appear(expected, frames_of(lisp, number))
    assert not lisp.call("invoke-restart", evaluation=number, restart="ABORT")["isError"]


TESTS = """
(asdf:load-system "fiveam")
(asdf:load-system "rt")
(defun bo-first-of-five () (car *bo-five*))
(fiveam:test bo-fiveam-car
  (handler-bind ((error (lambda (c) (declare (ignore c)) (setf *bo-oracle* (bo-signalled)))))
    (fiveam:is (= 5 (bo-first-of-five)))))
(rt:deftest bo-rt-car
  (handler-bind ((error (lambda (c) (declare (ignore c)) (setf *bo-oracle* (bo-signalled)))))
    (bo-first-of-five))
  5)
"""


@pytest.mark.parametrize("test", ["bo-fiveam-car", "bo-rt-car"])
def test_a_debug_stop_of_run_tests_shows_the_tests_frames(lisp, test):
    text, is_error = lisp.eval(TESTS)
    assert not is_error, text
    result = lisp.call("run-tests", test=test, package="CL-USER", debug=True)
    structure = result["structuredContent"]
    assert result["isError"] and structure["error"]["type"] == "TYPE-ERROR", result
    expected = oracle(lisp)
    assert expected[0] == "BO-FIRST-OF-FIVE", expected
    all_appear(expected, frames_of(lisp, structure["evaluation"]))
    # Its thread waits at the error in CONDITION-WAIT: the threads tool's
    # backtrace of it, taken by an interrupt, shows the same frames.
    [thread] = [entry["id"] for entry in lisp.call("threads", action="list")["structuredContent"]["threads"]
                if entry.get("evaluation") == structure["evaluation"]]
    result = lisp.call("threads", action="backtrace", thread=thread, count=200)
    assert not result["isError"], result
    all_appear(expected, result["structuredContent"]["frames"])
    assert not lisp.call("invoke-restart", evaluation=structure["evaluation"], restart="ABORT")["isError"]


WAITER = """
(define-condition bo-note (condition) ())
(defvar *bo-lock* (sb-thread:make-mutex))
(defvar *bo-queue* (sb-thread:make-waitqueue))
(defun bo-here () (declare (optimize (debug 3))) (bo-frames '(bo-here)))
(defun bo-wait ()
  (setf *bo-oracle* (bo-here))
  (sb-thread:with-mutex (*bo-lock*) (loop (sb-thread:condition-wait *bo-queue* *bo-lock*))))
(sb-thread:make-thread
 (lambda () (handler-bind ((bo-note (lambda (c) (declare (ignore c)) (bo-wait)))) (signal 'bo-note)))
 :name "bo-waiter")
"""


def test_threads_backtrace_of_a_thread_waiting_inside_a_handler_shows_its_frames(lisp):
    text, is_error = lisp.eval(WAITER)
    assert not is_error, text
    for _ in range(100):  # the thread sets the oracle before it waits
        if not lisp.eval("*bo-oracle*")[0].startswith("=> NIL"):
            break
        time.sleep(0.05)
    expected = oracle(lisp)
    assert expected[0] == "BO-WAIT", expected
    [thread] = [entry["id"] for entry in lisp.call("threads", action="list")["structuredContent"]["threads"]
                if entry["name"] == "bo-waiter"]
    # Waiting is where the thread stays: once its backtrace shows the wait,
    # it is there.
    for _ in range(100):
        result = lisp.call("threads", action="backtrace", thread=thread, count=200)
        assert not result["isError"], result
        if any("CONDITION-WAIT" in frame for frame in result["structuredContent"]["frames"]):
            break
        time.sleep(0.05)
    all_appear(expected, result["structuredContent"]["frames"])
    text, is_error = lisp.eval("(sb-thread:terminate-thread (find \"bo-waiter\" (sb-thread:list-all-threads) "
                               ":key #'sb-thread:thread-name :test #'equal))")
    assert not is_error, text


def test_a_timeouts_backtrace_begins_below_the_signal_handler(lisp):
    result = lisp.call("evaluate-lisp", code="(defun bo-spin () (loop)) (bo-spin)", timeout=1)
    structure = result["structuredContent"]
    assert structure["error"]["type"] == "SB-EXT:TIMEOUT", result
    calls = frames_of(lisp, structure["evaluation"])
    assert calls[0].startswith("(BO-SPIN)") and not any("RUN-HANDLER" in call for call in calls), calls
    assert not lisp.call("invoke-restart", evaluation=structure["evaluation"], restart="ABORT")["isError"]


TRANSLATED = """(progn
  (define-condition bo-outer-error (error) ())
  (defun bo-inner () (error "bo inner"))
  (defun bo-translating ()
    (handler-bind ((simple-error (lambda (c) (declare (ignore c)) (error 'bo-outer-error))))
      (bo-inner))))"""


def test_a_condition_a_handler_signalled_begins_where_it_was_signalled(lisp):
    """A handler that signals a condition of its own (usocket's turns
    SB-BSD-SOCKETS' HOST-NOT-FOUND-ERROR into its NS-HOST-NOT-FOUND-ERROR):
    the backtrace of the condition reported began below the first
    condition's signal, without the frame that signalled this one or the
    handler that did."""
    assert not lisp.call("evaluate-lisp", code=TRANSLATED)["isError"]
    result = lisp.call("evaluate-lisp", code="(bo-translating)")
    assert result["isError"] and "BO-OUTER-ERROR" in result["content"][0]["text"], result
    calls = frames_of(lisp, result["structuredContent"]["number"])
    assert calls[0].startswith("(ERROR BO-OUTER-ERROR"), calls
    all_appear(['(FLET "H0" :IN BO-TRANSLATING)', "SB-KERNEL::%SIGNAL", "ERROR", "BO-INNER", "BO-TRANSLATING"], calls)
    assert not lisp.call("invoke-restart", restart="ABORT")["isError"]
