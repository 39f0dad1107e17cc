"""Evaluations that outlive their answer window: answered "still running",
run on in the background, and fetched, stopped or followed with
await-evaluation and read-output, in both modes; the session keeps serving
meanwhile."""

import time

import pytest

from tests.integration.attach_fixtures import Emacs, SwankServer, temporary_home
from tests.integration.conftest import McpProcess
from tests.integration.devtools import MODES, checked_call, cl_mcp_in, output_schema


@pytest.fixture(scope="module", params=MODES)
def lisp(request):
    with cl_mcp_in(request.param) as process:
        yield process


def start(process, code, **arguments):
    """Evaluate CODE with an answer window of 1 s: it must still be running
    then; its number."""
    result = checked_call(process, "evaluate-lisp", code=code, **{"answer-within": 1, **arguments})
    structure = result["structuredContent"]
    assert not result["isError"] and structure["running"], result
    assert result["content"][0]["text"].startswith(f"[running] Evaluation {structure['number']} ")
    return structure["number"]


def awaited(process, number, **arguments):
    """await-evaluation's result (the test client's own `call` takes `wait`
    for itself)."""
    response = process.request("tools/call", {"name": "await-evaluation",
                                              "arguments": {"evaluation": number, **arguments}})
    result = response["result"]
    errors = list(output_schema(process, "await-evaluation").iter_errors(result["structuredContent"]))
    assert errors == [], (result["structuredContent"], errors)
    return result


def wait_for(process, number, **arguments):
    return awaited(process, number, wait=30, **arguments)


def test_a_long_evaluation_answers_running_and_its_outcome_follows(lisp):
    number = start(lisp, '(progn (write-line "started") (sleep 5) (write-line "done") nil)')
    result = wait_for(lisp, number)
    assert not result["isError"]
    assert result["content"][0]["text"] == f"[stdout]\nstarted\ndone\n\n=> NIL\n\n; Evaluation {number}"
    assert result["structuredContent"]["number"] == number
    # The outcome is taken once; its output stays readable.
    again = awaited(lisp, number)
    assert again["isError"] and "NO-SUCH-EVALUATION" in again["content"][0]["text"]
    output = lisp.call("read-output", evaluation=number)
    assert output["structuredContent"]["lines"] == ["      1: started", "      2: done"]


def test_the_session_serves_other_calls_while_it_runs(lisp):
    number = start(lisp, '(progn (write-line "working") (sleep 4) :finished)')
    for _ in range(20):
        assert lisp.eval("(+ 1 2)") == ("=> 3", False)
    # All of that while the background evaluation still runs, and its
    # output so far can be read.
    still = awaited(lisp, number, wait=0)
    assert still["structuredContent"]["running"], still
    assert "working" in still["structuredContent"]["stdout"]
    so_far = lisp.call("read-output", evaluation=number)
    assert so_far["structuredContent"]["lines"] == ["      1: working"]
    assert wait_for(lisp, number)["content"][0]["text"] == f"[stdout]\nworking\n\n=> :FINISHED\n\n; Evaluation {number}"


def test_await_returns_running_with_fresh_output_when_not_done(lisp):
    number = start(lisp, '(dotimes (i 40) (format t "tick ~D~%" i) (sleep 0.1))')
    result = awaited(lisp, number, wait=1)
    structure = result["structuredContent"]
    assert structure["running"] and structure["follow"] == f'await-evaluation {{"evaluation": {number}}}'
    assert "tick 1" in structure["stdout"] and structure["elapsedMs"] >= 1000
    assert wait_for(lisp, number)["content"][0]["text"].endswith(f"tick 39\n\n=> NIL\n\n; Evaluation {number}")


def test_abort_stops_it(lisp):
    number = start(lisp, "(progn (sleep 30) (setf (get :cl-mcp-background :aborted) :no))")
    result = wait_for(lisp, number, abort=True)
    assert result["structuredContent"]["aborted"] and not result["isError"]
    assert result["content"][0]["text"] == f"The evaluation was aborted.\n\n; Evaluation {number}"
    assert lisp.eval("(get :cl-mcp-background :aborted)") == ("=> NIL", False)


def test_an_error_in_the_background_waits_with_its_restarts(lisp):
    number = start(lisp, '(progn (sleep 2) (error "late failure"))')
    result = wait_for(lisp, number)
    assert result["isError"]
    text = result["content"][0]["text"]
    assert text.startswith("[ERROR] SIMPLE-ERROR\nlate failure"), text
    assert result["structuredContent"]["evaluation"] == number
    assert "[Restarts]" in text
    aborted = lisp.call("invoke-restart", evaluation=number, restart="ABORT")
    assert aborted["content"][0]["text"] == f"The evaluation was aborted.\n\n; Evaluation {number}", aborted


def test_its_deadline_still_holds_in_the_background(lisp):
    number = start(lisp, "(sleep 30)", timeout=2)
    result = wait_for(lisp, number)
    assert result["isError"] and result["content"][0]["text"].startswith("[ERROR] SB-EXT:TIMEOUT")
    lisp.call("invoke-restart", evaluation=number, restart="ABORT")


def test_past_the_limit_an_evaluation_is_stopped_with_a_clear_error(lisp):
    numbers = [start(lisp, "(sleep 60)") for _ in range(4)]
    result = lisp.call("evaluate-lisp", code="(progn (sleep 60) (setf (get :cl-mcp-background :fifth) t))",
                       **{"answer-within": 1})
    text = result["content"][0]["text"]
    assert result["isError"] and text.startswith("[ERROR] CL-MCP:TOO-MANY-BACKGROUND"), text
    assert f"({', '.join(map(str, numbers))})" in text
    assert lisp.eval("(get :cl-mcp-background :fifth)") == ("=> NIL", False)
    for number in numbers:
        assert wait_for(lisp, number, abort=True)["structuredContent"]["aborted"]
    # Room again.
    number = start(lisp, "(sleep 2)")
    assert wait_for(lisp, number)["content"][0]["text"] == f"=> NIL\n\n; Evaluation {number}"


def test_overlapping_awaits_hand_the_outcome_out_once(lisp):
    """Both calls are waiting when it ends, and the image shows both the
    outcome: one keeps it, the other is told where its output is."""
    number = start(lisp, '(progn (write-line "one") (write-line "two") (sleep 2) :done)')
    calls = [lisp.start_request("tools/call", {"name": "await-evaluation",
                                               "arguments": {"evaluation": number, "wait": 30}})
             for _ in range(2)]
    refused, outcome = sorted(lisp.response(call)["result"]["content"][0]["text"] for call in calls)
    assert refused == ("[ERROR] CL-MCP:ALREADY-FETCHED\n"
                       f"The outcome of evaluation {number} was handed to another await-evaluation call; "
                       f'read-output {{"evaluation": {number}}} reads its output.'), refused
    assert outcome.startswith("[stdout]\none\ntwo\n\n=> :DONE"), outcome
    output = lisp.call("read-output", evaluation=number)
    assert output["structuredContent"]["lines"] == ["      1: one", "      2: two"]


def test_an_await_that_finds_the_outcome_being_kept_by_another_is_told_it_was_taken(lisp):
    """The second call looks after the first has taken the outcome out of
    the image but before the image stops calling it background (held
    there, so that the second comes in that moment): it used to wait its
    whole wait and answer that the finished evaluation was still running."""
    number = start(lisp, "(progn (sleep 2) :done)")
    held = ("(sb-int:encapsulate 'cl-mcp-agent::forget-background 'held (lambda (f e) "
            "(setf (get :cl-mcp-background :held) t) (sleep 3) (funcall f e)))")
    assert lisp.eval(held)[1] is False
    try:
        first = lisp.start_request("tools/call", {"name": "await-evaluation",
                                                  "arguments": {"evaluation": number, "wait": 30}})
        while lisp.eval("(get :cl-mcp-background :held)") != ("=> T", False):
            time.sleep(0.05)
        second = awaited(lisp, number, wait=20)
        assert second["isError"], second
        assert second["content"][0]["text"].startswith("[ERROR] CL-MCP:ALREADY-FETCHED"), second
        assert lisp.response(first)["result"]["content"][0]["text"].startswith("=> :DONE")
    finally:
        lisp.eval("(sb-int:unencapsulate 'cl-mcp-agent::forget-background 'held)")
        lisp.eval("(remprop :cl-mcp-background :held)")


def test_an_await_that_reaches_the_image_after_the_outcome_was_kept_is_told_it_was_taken(lisp):
    """Both calls began while it ran; the second reaches the image only once
    the first has kept the outcome and the image has forgotten it (held on
    its way there): it is told where the output went, as when both meet in
    the image, not that there is no such evaluation (a loaded CI run)."""
    number = start(lisp, "(progn (sleep 2) :done)")
    late = ("(sb-int:encapsulate 'cl-mcp-agent::await-evaluation-of 'late (lambda (f &rest arguments) "
            "(when (> (incf (get :cl-mcp-background :calls 0)) 1) (sleep 4)) (apply f arguments)))")
    assert lisp.eval(late)[1] is False
    try:
        calls = [lisp.start_request("tools/call", {"name": "await-evaluation",
                                                   "arguments": {"evaluation": number, "wait": 30}})
                 for _ in range(2)]
        outcome, refused = sorted(lisp.response(call)["result"]["content"][0]["text"] for call in calls)
        assert outcome == f"=> :DONE\n\n; Evaluation {number}", outcome
        assert refused.startswith("[ERROR] CL-MCP:ALREADY-FETCHED"), refused
    finally:
        lisp.eval("(sb-int:unencapsulate 'cl-mcp-agent::await-evaluation-of 'late)")
        lisp.eval("(remprop :cl-mcp-background :calls)")


LONG_OUTPUT = "(dotimes (i 150000) (format t \"line ~7,'0D xxxxxxxx~%\" i))"  # 3.3 MB


@pytest.mark.parametrize("pause", [0, 2])
def test_a_continuation_of_background_work_keeps_its_whole_output(pause):
    """It went to the background, stopped at an error there, and went on
    through a restart: its output past the report's first 1,000,000
    characters is kept as a foreground evaluation's is, whether the
    continuation ends within its window or in the background again."""
    process = McpProcess("--answer-within", "1")  # invoke-restart's window too
    try:
        process.initialize()
        number = start(process, f'(progn (write-line "before") (sleep 1.5) (restart-case (error "stop") '
                                f"(continue () {LONG_OUTPUT} (sleep {pause}) :resumed)))")
        assert outcome_of(process, process.call("await-evaluation", evaluation=number), number)["isError"]
        outcome = outcome_of(process, process.call("invoke-restart", evaluation=number, restart="CONTINUE",
                                                   timeout=30), number)
        text = outcome["content"][0]["text"]
        assert "\n=> :RESUMED" in text, text[-300:]
        marker = next(line for line in text.splitlines() if "read-output" in line)
        assert f'read-output {{"evaluation": {number}, "stream": "stdout", "offset": 356, ' in marker, marker
        tail = process.call("read-output", evaluation=number, offset=150_000, length=5)["structuredContent"]
        assert tail["totalLines"] == 150_001
        assert tail["lines"] == [" 150000: line 0149998 xxxxxxxx", " 150001: line 0149999 xxxxxxxx"]
    finally:
        process.close()


def outcome_of(process, result, number):
    """RESULT, or once it says NUMBER still runs, its outcome."""
    while result["structuredContent"].get("running"):  # each wait is at most the window
        result = wait_for(process, number)
    return result


def test_quick_work_never_goes_to_the_background(lisp):
    result = lisp.call("evaluate-lisp", code="(+ 1 2)", **{"answer-within": 1})
    assert result["content"][0]["text"] == f"=> 3\n\n; Evaluation {result['structuredContent']['number']}"
    assert "running" not in result["structuredContent"]


@pytest.mark.parametrize("mode", MODES)
def test_reset_stops_background_evaluations(mode):
    with cl_mcp_in(mode) as process:
        start(process, "(progn (sleep 3) (setf (get :cl-mcp-background :after-reset) t))")
        assert not process.call("reset-session")["isError"]
        time.sleep(4)
        assert process.eval("(get :cl-mcp-background :after-reset)") == ("=> NIL", False)



def test_a_long_continuation_goes_to_the_background_too():
    """invoke-restart has the server's answer window as well."""
    process = McpProcess("--answer-within", "1")
    try:
        process.initialize()
        failed = process.call("evaluate-lisp", code='(restart-case (error "stop here") '
                                                    '(continue () (sleep 3) :resumed))')
        number = failed["structuredContent"]["evaluation"]
        resumed = checked_call(process, "invoke-restart", evaluation=number, restart="CONTINUE", timeout=30)
        assert resumed["structuredContent"]["running"] and resumed["structuredContent"]["number"] == number
        assert process.eval("(+ 1 2)") == ("=> 3", False)
        outcome = wait_for(process, number)
        while outcome["structuredContent"].get("running"):  # each wait is at most the window
            outcome = wait_for(process, number)
        assert outcome["content"][0]["text"] == f"=> :RESUMED\n\n; Evaluation {number}"
    finally:
        process.close()


def test_load_system_and_compile_file_go_to_the_background_too(tmp_path):
    slow = '(eval-when (:compile-toplevel :load-toplevel :execute) (sleep 3))\n(defun slow-done () :slow)\n'
    (tmp_path / "slow.lisp").write_text(slow)
    (tmp_path / "slow-system.asd").write_text('(asdf:defsystem "slow-system" :components ((:file "slow")))\n')
    (tmp_path / "slow-file.lisp").write_text(slow.replace("slow-done", "slow-file-done"))
    with cl_mcp_in("embedded") as process:
        assert not process.eval(f'(asdf:load-asd "{tmp_path}/slow-system.asd")')[1]
        for tool, arguments, shown in [
                ("load-system", {"system": "slow-system"}, "Loading system: slow-system\nLoaded: slow-system"),
                ("compile-file", {"path": str(tmp_path / "slow-file.lisp")}, f"Compiled {tmp_path}/slow-file.lisp")]:
            result = checked_call(process, tool, **{**arguments, "answer-within": 1})
            structure = result["structuredContent"]
            assert not result["isError"] and structure["running"], result
            assert process.eval("(+ 1 2)") == ("=> 3", False)
            outcome = wait_for(process, structure["number"])
            assert not outcome["isError"] and outcome["content"][0]["text"].startswith(shown), outcome
        assert process.eval("(list (slow-done) (slow-file-done))") == ("=> (:SLOW :SLOW)", False)


def test_leaving_a_shared_image_stops_its_background_work():
    """In attach mode the image is the programmer's: cl-mcp's background
    evaluations end with the session, and the image stays up."""
    home = temporary_home()
    swank = SwankServer(home)
    try:
        first = McpProcess("--connect", str(swank.port), env={"HOME": str(home)})
        first.initialize()
        start(first, "(progn (sleep 3) (setf (get :cl-mcp-background :after-leaving) t))")
        first.close()
        time.sleep(4)
        second = McpProcess("--connect", str(swank.port), env={"HOME": str(home)})
        try:
            second.initialize()
            assert second.eval("(get :cl-mcp-background :after-leaving)") == ("=> NIL", False)
        finally:
            second.close()
        assert swank.alive()
    finally:
        swank.stop()


def test_in_the_programmers_emacs_it_is_a_named_thread():
    """SLIME's thread list (M-x slime-list-threads asks swank:list-threads)
    shows a background evaluation like any other Swank thread, by name."""
    home = temporary_home()
    swank = SwankServer(home)
    emacs = Emacs(home)
    process = None
    try:
        emacs.connect(swank.port)
        process = McpProcess("--connect", str(swank.port), env={"HOME": str(home)})
        process.initialize()
        number = start(process, "(sleep 20)")
        threads = emacs.slime_eval("(swank:list-threads)")
        assert f"cl-mcp evaluation {number} (background)" in threads, threads
        assert wait_for(process, number, abort=True)["structuredContent"]["aborted"]
    finally:
        if process is not None:
            process.close()
        emacs.stop()
        swank.stop()
