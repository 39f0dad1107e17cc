"""Live restarts: an erroring evaluation waits at its error, and the
restart tools act on it, as SLIME's debugger would."""

import re
import time

import pytest

from tests.integration.conftest import cl_mcp
from tests.integration.devtools import MODES, cl_mcp_in


def restart(process, restart, **arguments):
    result = process.call("invoke-restart", restart=restart, **arguments)
    return result["content"][0]["text"], result["isError"]


def tool_text(process, tool, **arguments):
    result = process.call(tool, **arguments)
    return result["content"][0]["text"], result["isError"]


def test_repair_an_undefined_function_through_the_retry_restart(server):
    text, is_error = server.eval("(foo)")
    assert is_error
    assert text.startswith("[ERROR] UNDEFINED-FUNCTION\nThe function FOO is undefined.")
    restarts = text.split("[Restarts]\n")[1].splitlines()
    assert restarts[0] == "0: [CONTINUE] Retry calling FOO."
    assert "[ABORT] Abort this evaluation." in restarts[4]
    assert restarts[5].startswith("Evaluation 1 is waiting at this error")
    assert server.eval("(defun foo () 42)") == ("=> FOO", False)
    assert restart(server, "CONTINUE") == ("=> 42\n\n; Evaluation 1", False)
    # It finished: nothing waits any more.
    text, is_error = restart(server, 0)
    assert is_error and text.startswith("[ERROR] CL-MCP:NO-SUSPENDED-EVALUATION")


def test_restart_by_number_with_values(server):
    text, _ = server.eval("(+ 1 (missing-thing))")
    names = [line.split("]")[0].split("[")[1] for line in text.split("[Restarts]\n")[1].splitlines()[:-1]]
    use_value = names.index("USE-VALUE")
    assert restart(server, use_value, values=["(lambda () 10)"]) == ("=> 11\n\n; Evaluation 1", False)


def test_store_value_and_a_new_error_after_continuing(server):
    text, _ = server.eval("(defvar *tries* 0) (check-type *tries* string) :checked")
    assert text.startswith("[ERROR] SIMPLE-TYPE-ERROR")
    assert "[STORE-VALUE]" in text
    assert restart(server, "STORE-VALUE", values=['"now a string"']) == ("=> :CHECKED\n\n; Evaluation 1", False)
    assert server.eval("*tries*") == ('=> "now a string"', False)


def test_output_after_a_restart_is_reported_with_the_new_outcome(server):
    server.eval('(defun noisy () (format t "before~%") (cerror "Go on." "paused") (format t "after~%") :end)')
    text, is_error = server.eval("(noisy)")
    assert is_error and "[stdout]\nbefore" in text
    assert restart(server, "CONTINUE") == ("[stdout]\nafter\n\n=> :END\n\n; Evaluation 2", False)


def test_backtrace_shows_frames_and_locals(server):
    server.eval("(defun inner (a b) (declare (optimize (debug 2))) (error \"bad ~a\" (+ a b)))"
                "(defun outer (x) (declare (optimize (debug 2))) (inner x (* 2 x)))")
    error_text, _ = server.eval("(outer 5)")
    number = error_text.split("Evaluation ")[1].split()[0]
    text, is_error = tool_text(server, "backtrace")
    assert not is_error
    lines = text.splitlines()
    assert lines[0] == f"[Backtrace of evaluation {number}]"
    assert any(line.endswith("(INNER 5 10)") for line in lines)
    assert "     A = 5" in lines and "     B = 10" in lines
    assert any(line.endswith("(OUTER 5)") for line in lines)


def test_eval_in_frame_sees_the_frames_locals(server):
    server.eval("(defun inner (a b) (declare (optimize (debug 2))) (error \"bad ~a\" (+ a b)))")
    text, _ = server.eval("(inner 3 4)")
    frame = next(int(line.split(":")[0]) for line in text.splitlines() if line.endswith("(INNER 3 4)"))
    assert tool_text(server, "eval-in-frame", frame=frame, code="(* a b)") == ("=> 12\n\n; Evaluation 2", False)
    text, is_error = tool_text(server, "eval-in-frame", frame=99, code="1")
    assert is_error and text.startswith("[ERROR] CL-MCP:NO-SUCH-FRAME")
    text, is_error = tool_text(server, "eval-in-frame", frame=frame, code="(/ a 0)")
    assert is_error and text.startswith("[ERROR] DIVISION-BY-ZERO")
    # The evaluation still waits.
    assert restart(server, "ABORT") == ("The evaluation was aborted.\n\n; Evaluation 2", False)


def test_an_unknown_restart_leaves_the_evaluation_waiting(server):
    server.eval("(error \"stuck\")")
    text, is_error = restart(server, "NO-SUCH-RESTART")
    assert is_error and text.startswith("[ERROR] CL-MCP:NO-SUCH-RESTART")
    assert restart(server, "ABORT") == ("The evaluation was aborted.\n\n; Evaluation 1", False)


def test_restarts_after_a_timeout(server):
    text, is_error = server.eval("(defvar *n* 0) (loop (incf *n*))", timeout=0.5)
    assert is_error and text.startswith("[ERROR] SB-EXT:TIMEOUT")
    assert "0: [CONTINUE] Continue the evaluation." in text
    text, is_error = restart(server, "CONTINUE", timeout=0.5)
    assert is_error and text.startswith("[ERROR] SB-EXT:TIMEOUT")
    assert restart(server, "ABORT") == ("The evaluation was aborted.\n\n; Evaluation 1", False)
    assert server.eval("(> *n* 0)") == ("=> T", False)


def test_evaluations_are_named_by_number(server):
    server.eval("(error \"first\")")
    server.eval("(error \"second\")")
    text, is_error = tool_text(server, "eval-in-frame", evaluation=1, frame=0, code="1")
    assert not is_error
    assert restart(server, "ABORT", evaluation=1) == ("The evaluation was aborted.\n\n; Evaluation 1", False)
    text, is_error = restart(server, "ABORT", evaluation=1)
    assert is_error and "No evaluation 1 is waiting" in text
    assert restart(server, "ABORT") == ("The evaluation was aborted.\n\n; Evaluation 2", False)


def test_at_most_max_suspended_wait():
    with cl_mcp("--max-suspended", "2") as process:
        for n in range(3):
            process.eval(f'(error "e~a" {n})')
        text, is_error = restart(process, "ABORT", evaluation=1)
        assert is_error and "No evaluation 1 is waiting" in text
        assert restart(process, "ABORT", evaluation=2)[1] is False
        assert restart(process, "ABORT", evaluation=3)[1] is False


def test_waiting_is_bounded_in_time():
    with cl_mcp("--suspend-timeout", "0.5") as process:
        process.eval('(error "soon gone")')
        deadline = time.monotonic() + 10  # looked at from aside: a command would keep it
        while process.eval("(length cl-mcp-agent::*suspended*)") != ("=> 0", False):
            assert time.monotonic() < deadline, "the evaluation still waits long after its 0.5 s"
            time.sleep(0.1)
        text, is_error = restart(process, "ABORT")
        assert is_error and text.startswith("[ERROR] CL-MCP:NO-SUSPENDED-EVALUATION")


def test_a_command_restarts_the_wait():
    """An evaluation being looked into does not abort under the assistant."""
    with cl_mcp("--suspend-timeout", "1") as process:
        process.eval('(error "still here")')
        started = time.monotonic()
        while time.monotonic() - started < 2.5:  # well past the timeout
            assert tool_text(process, "backtrace")[0].startswith("[Backtrace of evaluation")
            time.sleep(0.05)
        assert restart(process, "ABORT") == ("The evaluation was aborted.\n\n; Evaluation 1", False)


def test_waiting_can_be_switched_off():
    with cl_mcp("--max-suspended", "0") as process:
        text, is_error = process.eval('(error "plain")')
        assert is_error and "[Restarts]" in text and "is waiting" not in text
        assert restart(process, "ABORT")[0].startswith("[ERROR] CL-MCP:NO-SUSPENDED-EVALUATION")


def test_reset_aborts_waiting_evaluations(server):
    server.eval('(error "before reset")')
    server.call("reset-session")
    text, is_error = restart(server, "ABORT")
    assert is_error and text.startswith("[ERROR] CL-MCP:NO-SUSPENDED-EVALUATION")


def test_repeated_stack_overflows_leave_the_image_alive(server):
    pid = server.eval("(sb-posix:getpid)")[0]
    server.eval("(defun down (n) (1+ (down n)))")
    for number in (3, 4, 5):
        text, is_error = server.eval("(down 1)")
        assert is_error and text.startswith("[ERROR] STORAGE-CONDITION\nControl stack exhausted")
        assert restart(server, "ABORT") == (f"The evaluation was aborted.\n\n; Evaluation {number}", False)
    assert server.eval("(sb-posix:getpid)")[0] == pid


def test_eval_in_frame_reads_every_form_and_records_warnings(server):
    server.eval("(defun inner (a) (declare (optimize (debug 2))) (error \"bad ~a\" a))")
    text, _ = server.eval("(inner 3)")
    frame = next(int(line.split(":")[0]) for line in text.splitlines() if line.endswith("(INNER 3)"))
    assert tool_text(server, "eval-in-frame", frame=frame, code='(warn "w") (format t "x~%") (* a 2)') == (
        "[stdout]\nx\n\n[warnings]\nSIMPLE-WARNING: w\n\n=> 6\n\n; Evaluation 2", False)
    text, is_error = tool_text(server, "eval-in-frame", frame=frame, code="(1 2")
    assert is_error and text.startswith("[ERROR] END-OF-FILE\nIncomplete form")


def test_break_and_endless_loops_in_a_frame_leave_the_evaluation_waiting():
    with cl_mcp("--eval-timeout", "1") as process:
        process.eval("(break)")
        text, is_error = tool_text(process, "eval-in-frame", frame=0, code="(break)")
        assert is_error and text.startswith("[ERROR]")
        text, is_error = tool_text(process, "eval-in-frame", frame=0, code="(loop)")
        assert is_error and text.startswith("[ERROR] SB-EXT:TIMEOUT")
        assert restart(process, "CONTINUE") == ("=> NIL\n\n; Evaluation 1", False)


def test_wrong_number_of_restart_values_keeps_the_evaluation_waiting(server):
    server.eval("(foo-missing)")
    text, is_error = restart(server, "CONTINUE", values=["1", "2"])
    assert is_error and text.startswith("[ERROR] CL-MCP:RESTART-FAILED")
    assert "still waits" in text
    # Still waiting at the same error: its frames answer, and once the
    # function exists, CONTINUE carries on from there.
    text, is_error = tool_text(server, "backtrace")
    assert not is_error and "0: (FOO-MISSING)" in text
    server.eval("(defun foo-missing () :found)")
    assert restart(server, "CONTINUE") == ("=> :FOUND\n\n; Evaluation 1", False)



def test_whole_number_floats_are_integers(server):
    server.eval("(error \"float ids\")")
    text, _ = tool_text(server, "eval-in-frame", frame=0.0, code="1")
    assert text == "=> 1\n\n; Evaluation 1"
    text, _ = server.eval("(foo-float)")
    abort = next(line.split(":")[0] for line in text.splitlines() if "[ABORT]" in line)
    assert restart(server, float(abort))[0] == "The evaluation was aborted.\n\n; Evaluation 2"


def test_a_nested_evaluate_does_not_answer_for_the_outer_evaluation(shared_server):
    text, is_error = shared_server.eval('(getf (cl-mcp-agent:evaluate "(error \\"inner\\")") :status)')
    assert (text, is_error) == ("=> :ERROR", False)
    assert shared_server.eval("(+ 1 2)") == ("=> 3", False)


# ------------------------------------------ frame commands (sldb's r and R)

@pytest.fixture(scope="module", params=MODES)
def either_mode(request):
    """A cl-mcp in each mode, shared by the tests below."""
    with cl_mcp_in(request.param) as process:
        yield process


def outcome(process, tool, **arguments):
    """TOOL's text and isError, without the `; Evaluation N` line that may
    end it."""
    text, is_error = tool_text(process, tool, **arguments)
    return re.sub(r"\n\n; Evaluation \d+$", "", text), is_error


def continued(process, restart, **arguments):
    """invoke-restart's outcome."""
    return outcome(process, "invoke-restart", restart=restart, **arguments)


def frame_of(error_text, name):
    """The number of the first frame in an error's [Backtrace] that calls NAME."""
    frames = error_text.split("[Backtrace]\n")[1].split("\n\n")[0]
    return next(int(line.split(":")[0]) for line in frames.splitlines()
                if line.split(": (", 1)[1].startswith(name + " "))


FRAMES_CODE = ("(defun fr-half (x) (/ x 2))"
               "(defun fr-inner (x) (* 10 (fr-half x)))"
               "(defun fr-outer (x) (list :result (fr-inner x)))")


def test_restart_frame_calls_the_function_again_as_now_defined(either_mode):
    either_mode.eval(FRAMES_CODE)
    text, is_error = either_mode.eval("(fr-outer 'seven)")
    assert is_error and text.startswith("[ERROR] TYPE-ERROR")
    either_mode.eval("(defun fr-inner (x) (if (symbolp x) (length (symbol-name x)) (* 10 (fr-half x))))")
    assert continued(either_mode, "RESTART-FRAME", frame=frame_of(text, "FR-INNER")) == (
        "=> (:RESULT 5)", False)


def test_restart_frame_warns_that_sbcl_rebuilds_a_call_with_keyword_arguments(either_mode):
    """SBCL rebuilds the call from the frame's variables: a keyword argument
    the call left out is passed with its default (issue 49, item 6)."""
    either_mode.eval("(defvar *fr-calls* '())"
                     "(defun fr-order (&key item qty) (push (list item qty) *fr-calls*)"
                     " (if (= (length *fr-calls*) 1) (error \"first\") :done))")
    either_mode.eval("(setf *fr-calls* '())")
    text, is_error = either_mode.eval("(fr-order)")
    assert is_error and "first" in text
    result = either_mode.call("invoke-restart", restart="RESTART-FRAME", frame=frame_of(text, "FR-ORDER"))
    text = result["content"][0]["text"]
    assert not result["isError"] and "\n=> :DONE" in text, text
    assert text.startswith("[warnings]\nSIMPLE-WARNING: RESTART-FRAME calls FR-ORDER again as "
                           "(FR-ORDER :ITEM NIL :QTY NIL),"), text
    assert "The original call may have differed." in text


def test_restart_frame_of_required_parameters_only_has_no_warning(either_mode):
    either_mode.eval(FRAMES_CODE)
    text, _ = either_mode.eval("(fr-outer 'seven)")
    either_mode.eval("(defun fr-inner (x) (if (symbolp x) (length (symbol-name x)) (* 10 (fr-half x))))")
    result = either_mode.call("invoke-restart", restart="RESTART-FRAME", frame=frame_of(text, "FR-INNER"))
    assert "WARNING" not in result["content"][0]["text"], result


def test_return_from_frame_returns_values_computed_in_the_frame(either_mode):
    either_mode.eval(FRAMES_CODE)
    text, _ = either_mode.eval('(fr-outer "eleven")')
    assert continued(either_mode, "return-from-frame", frame=frame_of(text, "FR-INNER"),
                   values=["(length x)"]) == ("=> (:RESULT 6)", False)


def test_swank_frame_commands_work_from_eval_in_frame(either_mode):
    """Swank's backend counts from its debugger's stack top, bound while an
    evaluation waits: frame 0 is the backtrace's frame 0."""
    either_mode.eval(FRAMES_CODE)
    text, _ = either_mode.eval('(fr-outer "twelve")')
    inner = frame_of(text, "FR-INNER")
    assert outcome(either_mode, "eval-in-frame", frame=0,
                   code=f"(swank/backend:return-from-frame {inner} '(values 99))") == (
        "=> (:RESULT 99)", False)
    # The evaluation ran on to its end: nothing waits any more.
    assert restart(either_mode, 0)[0].startswith("[ERROR] CL-MCP:NO-SUSPENDED-EVALUATION")


def test_eval_in_frame_reads_in_the_frames_package(either_mode):
    """As SLIME's debugger reads: alexandria's FLATTEN, unqualified, in the
    frame of alexandria's REQUIRED-ARGUMENT; in CL-USER in ERROR's own frame."""
    assert not either_mode.call("load-system", system="alexandria")["isError"]
    text, is_error = either_mode.eval("(alexandria:required-argument :size)")
    assert is_error, text
    assert outcome(either_mode, "eval-in-frame", frame=frame_of(text, "ALEXANDRIA:REQUIRED-ARGUMENT"),
                   code="(flatten '((1) (2 3))) (package-name *package*)") == ('=> "COMMON-LISP-USER"', False)
    assert outcome(either_mode, "eval-in-frame", frame=frame_of(text, "ALEXANDRIA:REQUIRED-ARGUMENT"),
                   code="(flatten '((1) (2 3)))") == ("=> (1 2 3)", False)
    assert outcome(either_mode, "eval-in-frame", frame=frame_of(text, "ERROR"),
                   code="(symbol-package 'cl-mcp-frame-symbol)") == ('=> #<PACKAGE "COMMON-LISP-USER">', False)
    restart(either_mode, "ABORT")


def test_frame_commands_that_cannot_act_leave_the_evaluation_waiting(server):
    server.eval(FRAMES_CODE)
    error_text, _ = server.eval("(fr-outer :x)")
    inner = frame_of(error_text, "FR-INNER")
    text, is_error = restart(server, "RESTART-FRAME")
    assert is_error and "RESTART-FRAME needs a frame number" in text
    text, is_error = restart(server, "CONTINUE", frame=inner)
    assert is_error and text.startswith("[ERROR] CL-MCP:NO-SUCH-RESTART")
    text, is_error = restart(server, "RESTART-FRAME", frame=99)
    assert is_error and text.startswith("[ERROR] CL-MCP:NO-SUCH-FRAME")
    # EVAL, SBCL's own, has no debug catch tag.
    text, is_error = restart(server, "RESTART-FRAME", frame=frame_of(error_text, "EVAL"))
    assert is_error and text.startswith("[ERROR] CL-MCP:RESTART-FAILED") and "still waits" in text
    text, is_error = restart(server, "RETURN-FROM-FRAME", frame=inner, values=["(error \"no\")"])
    assert is_error and "Could not compute a restart value: no" in text
    assert continued(server, "RETURN-FROM-FRAME", frame=inner, values=["1"]) == (
        "=> (:RESULT 1)", False)


# ------------------------------------------------------------- trace output

def test_trace_output_comes_back_with_the_evaluation_that_made_the_calls(either_mode):
    either_mode.eval("(defun tr-square (x) (* x x)) (trace tr-square)")
    try:
        text, is_error = either_mode.eval("(+ (tr-square 3) 1)")
        assert (text, is_error) == ("[stderr]\n  0: (TR-SQUARE 3)\n  0: TR-SQUARE returned 9\n\n=> 10",
                                    False)
        # Calls made after a restart, or in a frame, come back with that call.
        either_mode.eval("(progn (tr-square 2) (cerror \"Go on.\" \"paused\") (tr-square 4))")
        assert continued(either_mode, "CONTINUE") == (
            "[stderr]\n  0: (TR-SQUARE 4)\n  0: TR-SQUARE returned 16\n\n=> 16", False)
        either_mode.eval("(error \"stop\")")
        assert outcome(either_mode, "eval-in-frame", frame=0, code="(tr-square 5)") == (
            "[stderr]\n  0: (TR-SQUARE 5)\n  0: TR-SQUARE returned 25\n\n=> 25", False)
        restart(either_mode, "ABORT")
    finally:
        either_mode.eval("(untrace tr-square)")


def test_a_continuation_and_a_frames_result_name_the_evaluation(server):
    """invoke-restart's and eval-in-frame's texts end with the number of the
    evaluation they act on, as evaluate-lisp's do."""
    server.eval("(+ 1 2)")  # evaluation 1
    text, is_error = tool_text(server, "evaluate-lisp", code='(cerror "Go on." "paused") :resumed')
    assert is_error and text.endswith("inspect it.\n\n; Evaluation 2")
    assert tool_text(server, "eval-in-frame", frame=0, code="(+ 40 2)") == ("=> 42\n\n; Evaluation 2", False)
    assert restart(server, "CONTINUE") == ("=> :RESUMED\n\n; Evaluation 2", False)
    assert tool_text(server, "evaluate-lisp", code="(abort)") == (
        "The evaluation was aborted.\n\n; Evaluation 3", False)

