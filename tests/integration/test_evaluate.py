"""evaluate-lisp against a real SBCL, case by case against the contracts."""

import re
import time

import pytest

from tests.integration.conftest import cl_mcp

TIMING = re.compile(r"; Timing: \d+ms real, \d+ms run, \d+ms GC, \d+ bytes consed")


# ---------------------------------------------------------------- the contract's examples

def test_single_value(shared_server):
    assert shared_server.eval("(+ 1 2 3)") == ("=> 6", False)


def test_multiple_values(shared_server):
    assert shared_server.eval("(floor 7 2)") == ("=> 3\n=> 1", False)


def test_output_sections(shared_server):
    code = ('(progn (format t "Hello, World!~%") '
            '(format *error-output* "Warning: deprecated function~%") nil)')
    assert shared_server.eval(code) == (
        "[stdout]\nHello, World!\n\n[stderr]\nWarning: deprecated function\n\n=> NIL", False)


def test_undefined_function_error(shared_server):
    text, is_error = shared_server.eval("(nonexistent-function)")
    assert is_error
    # The contract's text, then the restarts that were available.
    assert text.startswith("[ERROR] UNDEFINED-FUNCTION\nThe function NONEXISTENT-FUNCTION is undefined.\n\n"
                           "[Backtrace]\n0: (NONEXISTENT-FUNCTION)\n1: (EVAL (NONEXISTENT-FUNCTION))\n\n"
                           "[Restarts]\n0: [CONTINUE] Retry calling NONEXISTENT-FUNCTION.\n")


# ---------------------------------------------------------------- forms and values

def test_several_forms_return_the_last_value(shared_server):
    assert shared_server.eval("(defvar *ev-x* 1) (incf *ev-x*) (list *ev-x* *ev-x*)") == ("=> (2 2)", False)


def test_definitions_persist_between_calls(shared_server):
    shared_server.eval("(defun ev-square (x) (* x x))")
    assert shared_server.eval("(ev-square 12)") == ("=> 144", False)


def test_no_values(shared_server):
    assert shared_server.eval("(values)") == ("; No values", False)


def test_values_are_printed_readably_with_pretty_printing(shared_server):
    assert shared_server.eval('(list "a" #\\b :c 1/3 1.5d0)') == ('=> ("a" #\\b :C 1/3 1.5d0)', False)


def test_print_length_and_level(shared_server):
    text, _ = shared_server.eval("(loop for i below 200 collect i)")
    assert "99 ...)\n… [cut by *print-length* 100 or *print-level* 10; the value itself: " in text
    text, _ = shared_server.eval("(let ((x 0)) (dotimes (i 15) (setf x (list x))) x)")
    value, marker = text.split("\n")
    assert "#" in value and value.count("(") == 10
    assert marker.startswith("… [cut by *print-length* 100 or *print-level* 10; the value itself: ")


def test_circular_structures_print(shared_server):
    text, is_error = shared_server.eval("(let ((l (list 1 2))) (setf (cddr l) l) l)")
    assert (text, is_error) == ("=> #1=(1 2 . #1#)", False)


def test_unprintable_value_does_not_fail_the_call(shared_server):
    code = """(defclass ev-bad () ())
              (defmethod print-object ((o ev-bad) s) (error "no printing"))
              (make-instance 'ev-bad)"""
    text, is_error = shared_server.eval(code)
    assert not is_error
    assert text.startswith("=> #<error printing object of type EV-BAD")


def test_non_ascii_round_trips(shared_server):
    assert shared_server.eval('(format t "é€😀~%") "λ"') == ('[stdout]\né€😀\n\n=> "λ"', False)


# ---------------------------------------------------------------- reader errors

def test_incomplete_form_is_a_tool_error(shared_server):
    text, is_error = shared_server.eval("(defun broken (x)")
    assert is_error
    assert text.startswith("[ERROR] END-OF-FILE\n")
    assert "[Backtrace]" not in text


def test_reader_error_is_a_tool_error(shared_server):
    text, is_error = shared_server.eval(")")
    assert is_error and text.startswith("[ERROR] READER-ERROR\n")
    text, is_error = shared_server.eval("no-such-package::foo")
    assert is_error and text.startswith("[ERROR] READER-ERROR\n")
    assert "NO-SUCH-PACKAGE" in text


def test_forms_before_a_reader_error_take_effect(shared_server):
    text, is_error = shared_server.eval("(defvar *ev-before* 7) (")
    assert is_error
    assert shared_server.eval("*ev-before*") == ("=> 7", False)


# ---------------------------------------------------------------- errors

def test_error_shows_type_message_and_user_frames(shared_server):
    shared_server.eval("(defun ev-div (x) (/ x 0))")
    text, is_error = shared_server.eval("(ev-div 3)")
    assert is_error
    lines = text.splitlines()
    assert lines[0] == "[ERROR] DIVISION-BY-ZERO"
    assert "[Backtrace]" in lines
    frames = lines[lines.index("[Backtrace]") + 1:lines.index("[Restarts]") - 1]
    assert frames[0].startswith("0: ")
    assert any("(EV-DIV 3)" in frame for frame in frames)
    assert frames[-1].endswith("(EVAL (EV-DIV 3))")
    assert not any("SWANK" in frame or "CL-MCP-AGENT" in frame for frame in frames)


def test_backtrace_has_at_most_twenty_frames(shared_server):
    shared_server.eval("(defun ev-deep (n) (if (zerop n) (error \"bottom\") (1+ (ev-deep (1- n)))))")
    text, is_error = shared_server.eval("(ev-deep 50)")
    assert is_error
    frames = text.split("[Backtrace]\n")[1].split("\n\n")[0].splitlines()
    assert len(frames) == 20
    assert frames[19].startswith("19: ")


def test_output_before_an_error_is_kept(shared_server):
    text, is_error = shared_server.eval('(progn (format t "partial~%") (warn "careful") (error "boom ~a" 42))')
    assert is_error
    assert text.startswith("[ERROR] SIMPLE-ERROR\nboom 42\n\n[Backtrace]\n")
    assert text.endswith("[stdout]\npartial\n\n[warnings]\nSIMPLE-WARNING: careful")


def test_non_cl_condition_types_are_qualified(shared_server):
    shared_server.eval("(defpackage :ev-pkg (:use :cl)) (in-package :ev-pkg) "
                       "(define-condition my-error (error) ()) (in-package :cl-user)")
    text, _ = shared_server.eval("(error 'ev-pkg::my-error)")
    assert text.startswith("[ERROR] EV-PKG::MY-ERROR\n")


def test_storage_condition_is_caught_and_the_session_survives(shared_server):
    shared_server.eval("(defun ev-recurse (n) (1+ (ev-recurse (1+ n))))")
    text, is_error = shared_server.eval("(ev-recurse 0)")
    assert is_error
    assert text.startswith("[ERROR] ")
    assert "stack" in text.lower()
    assert shared_server.eval("(+ 1 1)") == ("=> 2", False)


def test_break_and_invoke_debugger_never_reach_a_debugger(shared_server):
    text, is_error = shared_server.eval("(break)")
    assert is_error and text.startswith("[ERROR]")
    text, is_error = shared_server.eval("(invoke-debugger (make-condition 'simple-error :format-control \"direct\"))")
    assert is_error and "direct" in text
    assert shared_server.eval("(+ 2 2)") == ("=> 4", False)


# ---------------------------------------------------------------- warnings

def test_style_warnings_are_recorded_and_muffled(shared_server):
    text, is_error = shared_server.eval("(defun ev-calls-missing (x) (ev-missing-fn x))")
    assert not is_error
    assert text == ("[warnings]\nSTYLE-WARNING: undefined function: COMMON-LISP-USER::EV-MISSING-FN"
                    "\n\n=> EV-CALLS-MISSING")


def test_warn_is_recorded(shared_server):
    assert shared_server.eval('(progn (warn "careful: ~a" 1) :done)') == (
        "[warnings]\nSIMPLE-WARNING: careful: 1\n\n=> :DONE", False)


# ---------------------------------------------------------------- streams

def test_trace_output_goes_to_stderr(shared_server):
    shared_server.eval("(defun ev-traced (x) x)")
    text, _ = shared_server.eval("(trace ev-traced) (ev-traced 5)")
    shared_server.eval("(untrace ev-traced)")
    assert text.startswith("[stderr]\n")
    assert "EV-TRACED" in text and text.endswith("=> 5")


@pytest.mark.parametrize("code", ["(read-line)", "(read)", '(y-or-n-p "Sure?")', "(read-char *query-io*)"])
def test_reading_input_fails_fast(shared_server, code):
    text, is_error = shared_server.eval(code, timeout=10)
    assert is_error
    assert text.startswith("[ERROR] END-OF-FILE\nNo input")


def test_debug_io_and_query_io_are_suppressed(shared_server):
    assert shared_server.eval('(format *debug-io* "x") (format *query-io* "y") 1') == ("=> 1", False)


def test_output_is_capped_with_a_marker():
    with cl_mcp("--max-output", "1000") as process:
        text, is_error = process.eval('(dotimes (i 300) (write-string "abcdefghij")) (make-string 5000 :initial-element #\\z)')
        assert not is_error
        assert "[stdout]\n" + "abcdefghij" * 100 + "\n… [2000 more characters truncated]" in text
        # --max-output caps the captured streams, not the values (those
        # only the result budget cuts, and (cl-mcp-agent:value N) reaches).
        assert text.endswith("\n\n=> \"" + "z" * 5000 + "\"")


# ---------------------------------------------------------------- packages

def test_package_argument_binds_the_package_for_one_call(server):
    server.eval("(defpackage :ev-a (:use :cl)) (defpackage :ev-b (:use :cl))")
    assert server.eval("(package-name *package*)", package="ev-a") == ('=> "EV-A"', False)
    assert server.eval("(package-name *package*)") == ('=> "COMMON-LISP-USER"', False)


def test_in_package_sticks(server):
    server.eval("(defpackage :ev-sticky (:use :cl)) (in-package :ev-sticky)")
    assert server.eval("(package-name *package*)") == ('=> "EV-STICKY"', False)
    server.eval("(defun here () :here)")
    assert server.eval("(ev-sticky::here)", package="CL-USER") == ("=> :HERE", False)
    assert server.eval("(here)") == ("=> :HERE", False)
    server.eval("(in-package :cl-user)")
    assert server.eval("(package-name *package*)") == ('=> "COMMON-LISP-USER"', False)


def test_an_error_inside_compile_file_leaves_the_package_as_it_was(server, tmp_path):
    """COMPILE-FILE binds *PACKAGE* while it compiles: an error there (its
    report saw the file's package) moved the session to that package for
    good, though the evaluation, aborted, ended where it began (issue 49's
    trial replay: every later call ran in USOCKET-TEST)."""
    server.eval("(defpackage :ev-compiled (:use :cl))")
    source = tmp_path / "stops.lisp"
    source.write_text('(in-package :ev-compiled)\n(eval-when (:compile-toplevel) (error "stop here"))\n')
    text, is_error = server.eval(f'(compile-file "{source}" :output-file "{tmp_path / "stops.fasl"}")')
    assert is_error and "stop here" in text, text
    assert not server.call("invoke-restart", restart="ABORT")["isError"]
    assert server.eval("(package-name *package*)") == ('=> "COMMON-LISP-USER"', False)


def test_unknown_package_is_a_tool_error(shared_server):
    text, is_error = shared_server.eval("1", package="NO-SUCH-PACKAGE")
    assert is_error
    assert text == '[ERROR] PACKAGE-ERROR\nThe package "NO-SUCH-PACKAGE" does not exist.'


# ---------------------------------------------------------------- timing and deadlines

def test_capture_time(shared_server):
    text, is_error = shared_server.eval("(+ 1 2)", **{"capture-time": True})
    assert not is_error
    first, second = text.split("\n\n")
    assert first == "=> 3"
    assert TIMING.fullmatch(second)


def test_no_timing_unless_asked(shared_server):
    assert "; Timing" not in shared_server.eval("(+ 1 2)", **{"capture-time": False})[0]


def test_endless_loop_hits_the_deadline_and_the_session_survives(shared_server):
    shared_server.eval("(defvar *ev-survivor* :alive)")
    text, is_error = shared_server.eval("(loop)", timeout=1)
    assert is_error
    assert text.startswith("[ERROR] SB-EXT:TIMEOUT\nEvaluation exceeded its deadline of 1 second")
    assert shared_server.eval("*ev-survivor*") == ("=> :ALIVE", False)


def test_a_deadline_wakes_the_dozing_watchdog(shared_server):
    """The deadline watchdog dozes once no deadline has been seen for a
    while; a new evaluation must wake it."""
    shared_server.eval("(setf cl-mcp-agent::*watchdog-linger* 0)")
    try:
        shared_server.eval("(+ 1 2)", timeout=30)  # the watchdog is there,
        deadline = time.monotonic() + 10
        while shared_server.eval("cl-mcp-agent::*watchdog-dozing*") != ("=> T", False):
            assert time.monotonic() < deadline, "the watchdog never dozed off"
            time.sleep(0.05)  # and, with no deadline since, dozes off
        text, is_error = shared_server.eval("(loop)", timeout=1, wait=15)
        # The image's own deadline: a watchdog left dozing never fires, and
        # cl-mcp's backstop 5 s later answers CL-MCP:IMAGE-UNRESPONSIVE.
        assert is_error and text.startswith("[ERROR] SB-EXT:TIMEOUT")
    finally:
        shared_server.eval("(setf cl-mcp-agent::*watchdog-linger* 5)")


def test_server_wide_deadline():
    with cl_mcp("--eval-timeout", "1") as process:
        text, is_error = process.eval("(sleep 30)")
        assert is_error and text.startswith("[ERROR] SB-EXT:TIMEOUT")
        assert process.eval("(+ 1 2)") == ("=> 3", False)


def test_every_result_of_an_evaluation_ends_with_its_number():
    """The model reads the text, not always the structured content: the
    last line names the number that read-output, await-evaluation and
    (cl-mcp-agent:value N) take; a fresh image counts from 1."""
    with cl_mcp() as process:
        def text_of(code, **arguments):
            result = process.call("evaluate-lisp", code=code, **arguments)
            return result["content"][0]["text"], result["structuredContent"].get("number")

        assert text_of("(+ 1 2)") == ("=> 3\n\n; Evaluation 1", 1)
        text, number = text_of("(values)", **{"capture-time": True})
        assert number == 2 and text.startswith("; No values\n\n; Timing: ")
        assert TIMING.search(text) and text.endswith(" bytes consed\n\n; Evaluation 2")
        text, number = text_of('(error "boom")')
        assert number == 3 and text.endswith("Evaluation 3 is waiting at this error: invoke-restart "
                                             "continues it; backtrace and eval-in-frame inspect it."
                                             "\n\n; Evaluation 3")
        assert text_of("(abort)") == ("The evaluation was aborted.\n\n; Evaluation 4", 4)
        assert text_of("(cl-mcp-agent:value 1)") == ("=> 3\n\n; Evaluation 5", 5)
        # Nothing was evaluated: no number.
        assert text_of(":x", package="NO-SUCH-PACKAGE") == (
            '[ERROR] PACKAGE-ERROR\nThe package "NO-SUCH-PACKAGE" does not exist.', None)
