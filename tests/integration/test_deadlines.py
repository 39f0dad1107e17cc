"""A deadline stops the evaluation whatever the user's code catches, and
costs neither the image nor its definitions."""

from tests.integration.conftest import cl_mcp

SWALLOWING_LOOP = "(loop (handler-case (loop) (serious-condition () nil)))"


def pid_of(process) -> str:
    return process.eval("(sb-posix:getpid)")[0]


def test_a_deadline_that_user_code_catches_still_stops_it(shared_server):
    shared_server.eval("(defun deadline-survivor () :alive)")
    pid = pid_of(shared_server)
    text, is_error = shared_server.eval(SWALLOWING_LOOP, timeout=1, wait=20)
    assert is_error
    assert text.startswith("[ERROR] SB-EXT:TIMEOUT\nEvaluation exceeded its deadline of 1 second")
    assert "0: [CONTINUE] Continue the evaluation." in text
    shared_server.call("invoke-restart", restart="ABORT")
    assert pid_of(shared_server) == pid  # the same image
    assert shared_server.eval("(deadline-survivor)") == ("=> :ALIVE", False)


def test_a_handler_for_every_condition_cannot_take_the_deadline(shared_server):
    code = ("(loop (handler-bind ((condition (lambda (c) (declare (ignore c)) (throw :again nil))))"
            "        (catch :again (loop))))")
    text, is_error = shared_server.eval(code, timeout=1, wait=20)
    assert is_error and text.startswith("[ERROR] SB-EXT:TIMEOUT")
    shared_server.call("invoke-restart", restart="ABORT")
    assert shared_server.eval("(+ 1 2)") == ("=> 3", False)


def test_cleanups_run_when_the_timed_out_evaluation_is_aborted(shared_server):
    shared_server.eval("(defvar *deadline-cleaned* nil)")
    code = f"(unwind-protect {SWALLOWING_LOOP} (setf *deadline-cleaned* :yes))"
    text, is_error = shared_server.eval(code, timeout=1, wait=20)
    assert is_error and text.startswith("[ERROR] SB-EXT:TIMEOUT")
    assert shared_server.eval("*deadline-cleaned*") == ("=> NIL", False)  # it waits at the error
    shared_server.call("invoke-restart", restart="ABORT")
    assert shared_server.eval("*deadline-cleaned*") == ("=> :YES", False)


def test_continue_runs_on_until_the_next_deadline(shared_server):
    shared_server.eval("(defvar *deadline-rounds* 0)")
    code = "(loop (handler-case (progn (incf *deadline-rounds*) (loop)) (serious-condition () nil)))"
    text, is_error = shared_server.eval(code, timeout=0.5, wait=20)
    assert is_error and text.startswith("[ERROR] SB-EXT:TIMEOUT")
    result = shared_server.call("invoke-restart", restart="CONTINUE", timeout=0.5)
    assert result["isError"] and result["content"][0]["text"].startswith("[ERROR] SB-EXT:TIMEOUT")
    shared_server.call("invoke-restart", restart="ABORT")
    assert shared_server.eval("*deadline-rounds*") == ("=> 1", False)


def test_without_waiting_the_deadline_aborts_at_once_and_cleans_up():
    with cl_mcp("--max-suspended", "0") as process:
        process.eval("(defvar *deadline-cleaned* nil)")
        pid = pid_of(process)
        code = f"(unwind-protect {SWALLOWING_LOOP} (setf *deadline-cleaned* :yes))"
        text, is_error = process.eval(code, timeout=1, wait=20)
        assert is_error and text.startswith("[ERROR] SB-EXT:TIMEOUT")
        assert "is waiting at this error" not in text
        assert process.eval("*deadline-cleaned*") == ("=> :YES", False)
        assert pid_of(process) == pid
