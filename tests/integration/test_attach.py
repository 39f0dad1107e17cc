"""Attach mode: cl-mcp joins a Swank server the programmer runs."""

import re
import shutil
import signal
import time

import pytest

from tests.integration.attach_fixtures import SwankServer, temporary_home
from tests.integration.conftest import McpProcess, cl_mcp
from tests.integration.devtools import FIXTURES, shared_with_emacs


@pytest.fixture
def programmer():
    home = temporary_home()
    server = SwankServer(home)
    yield server, home
    server.stop()


def attached(port, home, *args):
    process = McpProcess("--connect", str(port), *args, env={"HOME": str(home)})
    process.initialize()
    return process


def test_tools_work_attached_and_reset_is_soft(programmer):
    server, home = programmer
    # Something of the programmer's own, made before this session: through
    # an earlier cl-mcp session, whose definitions count as the image's now.
    other = attached(server.port, home)
    other.eval("(defun users-own () :mine) (defpackage :users-pkg (:use :cl))")
    other.close()
    process = attached(server.port, home)
    try:
        assert process.eval("(defun session-fn () 1) (defpackage :session-pkg (:use :cl)) (session-fn)") == ("=> 1", False)
        assert "- SESSION-FN ()" in process.call("list-definitions")["content"][0]["text"]
        assert process.call("reset-session")["content"][0]["text"] == (
            "Session reset (soft: the image is shared, and stays).\n"
            "Removed: 1 CL-USER symbol (SESSION-FN) and 1 package (SESSION-PKG); 0 waiting or background "
            "evaluations aborted; cl-mcp's *, +, / and the rest, its kept values and inspected objects forgotten.")
        assert process.eval("(list (fboundp 'session-fn) (find-package :session-pkg) (users-own) "
                            "(not (null (find-package :users-pkg))))") == ("=> (NIL NIL :MINE T)", False)
        assert server.alive()
    finally:
        process.close()
    assert server.alive()  # cl-mcp leaving never stops the image


def test_attaching_again_does_not_reload_the_agent(programmer):
    server, home = programmer
    first = attached(server.port, home)
    first.eval("(setf (get 'cl-mcp-agent::*loaded-digest* :marker) :kept)")
    first.close()
    second = attached(server.port, home)
    try:
        assert second.eval("(get 'cl-mcp-agent::*loaded-digest* :marker)") == ("=> :KEPT", False)
        assert not any("loaded the cl-mcp agent" in line for line in second.stderr_lines)
    finally:
        second.close()


def test_a_dropped_connection_fails_the_call_in_flight_and_reconnects(programmer):
    server, home = programmer
    process = attached(server.port, home)
    try:
        process.eval("(defvar *kept* :still-here)")
        # Drop cl-mcp's connection from the image's side during a call.
        text, is_error = process.eval(
            "(let ((c (first cl-mcp-agent::*connections*))) (sb-thread:make-thread "
            "(lambda () (sleep 0.2) (swank::close-connection c nil nil)))) (sleep 3)")
        assert is_error and text.startswith("[ERROR] CL-MCP:CONNECTION-LOST")
        deadline = time.monotonic() + 15
        seen = []
        while True:
            text, is_error = process.eval("*kept*")
            seen.append(text)
            if not is_error:
                break
            assert text.startswith("[ERROR] CL-MCP:NOT-CONNECTED"), text
            assert time.monotonic() < deadline, text
            time.sleep(0.3)
        assert text.startswith("=> :STILL-HERE")  # the image was never restarted
        # Once, a result says what the drop cost: the session's work in the image.
        told = [each for each in seen if "\n\n[session]\n" in each]
        assert len(told) == 1 and "The image ended this session's work with it" in told[0], seen
        assert any("reconnected to" in line for line in process.stderr_lines)
    finally:
        process.close()


def test_calls_fail_at_once_while_the_image_is_gone(programmer):
    server, home = programmer
    process = attached(server.port, home)
    try:
        assert process.eval("1") == ("=> 1", False)
        server.stop()
        time.sleep(0.5)
        for _ in range(3):
            started = time.monotonic()
            text, is_error = process.eval("(+ 1 1)")
            assert is_error and text.startswith("[ERROR] CL-MCP:NOT-CONNECTED")
            assert "reconnect" in text
            assert time.monotonic() - started < 4  # not after a connect's 5 s limit
    finally:
        process.close()


def test_the_slime_secret_is_presented(tmp_path):
    home = temporary_home()
    (home / ".slime-secret").write_text("s3cr3t-é\n")
    server = SwankServer(home)
    try:
        process = attached(server.port, home)
        assert process.eval("(+ 2 3)") == ("=> 5", False)
        process.close()
    finally:
        server.stop()


def test_an_unreachable_swank_is_a_clear_error():
    with cl_mcp("--connect", "127.0.0.1:1") as process:
        text, is_error = process.eval("1")
        assert is_error and text.startswith("[ERROR] CL-MCP:NOT-CONNECTED")
        # It says what to do.
        assert "evaluate (swank:create-server :port 1 :dont-close t) in the image first" in text, text


# ---------------------------------------------------------------- with Emacs


@pytest.fixture(scope="module")
def shared():
    """The programmer's image, Emacs connected to it with SLIME, and cl-mcp
    attached to the same image."""
    with shared_with_emacs() as (server, emacs, process, _home):
        yield server, emacs, process


def test_a_function_defined_through_cl_mcp_is_callable_from_emacs(shared):
    _, emacs, process = shared
    assert process.eval("(defun from-mcp (x) (* x 10))") == ("=> FROM-MCP", False)
    assert emacs.slime_eval("(cl-user::from-mcp 4)") == "40"


def test_a_function_defined_in_emacs_is_visible_to_cl_mcp(shared):
    _, emacs, process = shared
    emacs.slime_eval("(cl:progn (cl:defun cl-user::from-emacs (y) (cl:+ y 1)) cl:t)")
    assert process.eval("(from-emacs 41)") == ("=> 42", False)
    text = process.call("list-definitions", type="functions")["content"][0]["text"]
    assert "- FROM-EMACS (Y)" in text


def test_emacs_stays_healthy_after_errors_timeouts_restarts_and_reset(shared):
    _, emacs, process = shared
    emacs.slime_eval("(cl:progn (cl:defun cl-user::from-emacs (y) (cl:+ y 1)) cl:t)")
    text, is_error = process.eval('(error "boom from cl-mcp")')
    assert is_error
    text, is_error = process.eval("(loop)", timeout=1)
    assert is_error and text.startswith("[ERROR] SB-EXT:TIMEOUT")
    assert process.call("invoke-restart", restart="ABORT")["content"][0]["text"].startswith("The evaluation was aborted.\n\n; Evaluation ")
    process.eval("(undefined-yet)")
    process.eval("(defun undefined-yet () :ok)")
    assert process.call("invoke-restart", restart="CONTINUE")["content"][0]["text"].startswith("=> :OK\n\n; Evaluation ")
    process.eval('(error "left waiting")')
    process.call("reset-session")
    # Emacs never saw a debugger window, its REPL got nothing of cl-mcp's,
    # and its connection still answers.
    assert emacs.debugger_windows() == 0
    assert emacs.slime_eval("(cl:+ 1 2)") == "3"
    repl = emacs.repl_text()
    assert "boom" not in repl and "cl-mcp" not in repl.lower() and "compil" not in repl.lower()
    # The programmer's own definition survived the soft reset.
    assert emacs.slime_eval("(cl-user::from-emacs 1)") == "2"


def test_the_programmers_own_errors_still_go_to_emacs(shared):
    _, emacs, process = shared
    emacs.slime_eval('(cl:progn (sb-thread:make-thread (cl:lambda () (cl:error "users bg error")))'
                     " cl:t)")
    emacs.await_debugger("the programmer's error")
    emacs.quit_debuggers()
    assert process.eval("(+ 1 1)") == ("=> 2", False)


def test_the_agents_evaluate_called_from_emacs_reports_without_waiting(shared):
    """Only cl-mcp's own requests may wait at an error: the programmer who
    calls the agent from SLIME gets the report back at once."""
    _, emacs, process = shared
    result = emacs.slime_eval('(cl-mcp-agent:evaluate "(error \\"from emacs\\")")')
    assert "SIMPLE-ERROR" in result and "from emacs" in result
    assert ":evaluation nil" in result
    assert emacs.debugger_windows() == 0
    assert process.eval("(+ 2 2)") == ("=> 4", False)


def test_compiling_and_loading_through_cl_mcp_print_nothing_in_emacs(shared, tmp_path):
    """compile-file and load-system show their notes to the model only: the
    programmer's REPL gets none of the compiler's output or warnings."""
    _, emacs, process = shared
    for system in ("noisy-system", "noisy-dependency"):
        shutil.copytree(FIXTURES / system, tmp_path / system)
        assert not process.eval(f'(asdf:load-asd "{tmp_path / system / system}.asd")')[1]
    loaded = process.call("load-system", system="noisy-system")
    assert "WARNING at" in loaded["content"][0]["text"]
    shutil.copy(FIXTURES / "files" / "warnings.lisp", tmp_path / "warnings.lisp")
    compiled = process.call("compile-file", path=str(tmp_path / "warnings.lisp"))
    assert "WARNING at" in compiled["content"][0]["text"]
    # The control: a warning of the programmer's own request does show.
    emacs.slime_eval('(cl:progn (cl:warn "the programmers warning") cl:t)')
    deadline = time.monotonic() + 10
    while "the programmers warning" not in emacs.repl_text():
        assert time.monotonic() < deadline, "the control warning never reached the REPL"
        time.sleep(0.1)
    repl = emacs.repl_text()
    for seen in ("UNUSED", "two", "noisy", "fixture-", "compil"):
        assert seen.lower() not in repl.lower(), (seen, repl)
    assert emacs.debugger_windows() == 0


def test_a_reset_keeps_the_systems_and_modules_the_session_loaded(shared):
    """What loading a system or a module made belongs to the image: a soft
    reset never leaves a system that ASDF, or a module that *modules*, calls
    loaded without its packages."""
    _, emacs, process = shared
    emacs.slime_eval("(cl:progn (cl:defpackage :programmers-pkg (:use :cl)) cl:t)")
    assert not process.eval("(defpackage :scratch-pkg (:use :cl)) (defun scratch-fn () 1)")[1]
    for load in ("(asdf:load-system :cl-ppcre)", "(require :sb-sprof)"):
        text, is_error = process.eval(load, timeout=120)
        assert not is_error, text
    assert not process.call("reset-session")["isError"]
    # The session's own forms are forgotten.
    assert process.eval("(list (find-package :scratch-pkg) (fboundp 'scratch-fn))") == ("=> (NIL NIL)", False)
    whole = ("(list (not (null (asdf:component-loaded-p :cl-ppcre))) "
             "(funcall (find-symbol \"SCAN-TO-STRINGS\" :cl-ppcre) \"b+\" \"abbc\") "
             "(not (null (member \"SB-SPROF\" *modules* :test #'string=))) "
             "(not (null (find-symbol \"START-PROFILING\" :sb-sprof))))")
    assert process.eval(whole) == ('=> (T "bb" T T)', False)
    assert emacs.slime_eval('(cl:funcall (cl:find-symbol "SCAN-TO-STRINGS" "CL-PPCRE") "b+" "abbc")') == '"bb"'
    assert emacs.slime_eval('(cl:not (cl:null (cl:find-package "PROGRAMMERS-PKG")))') == "t"


def test_a_reset_after_a_load_that_failed_lets_the_system_load_again(shared, tmp_path):
    """ASDF remembers the files of a system that it loaded before one failed:
    their packages stay, so that loading the system again finishes it."""
    _, _, process = shared
    (tmp_path / "half-loaded.asd").write_text(
        '(asdf:defsystem "half-loaded" :serial t :components ((:file "package") (:file "body")))\n')
    (tmp_path / "package.lisp").write_text("(defpackage :half-loaded (:use :cl) (:export #:ready))\n")
    (tmp_path / "body.lisp").write_text(
        "(in-package :half-loaded)\n"
        '(when (find-symbol "*BREAK-THE-LOAD*" :cl-user) (error "the load breaks here"))\n'
        "(defun ready () :ready)\n")
    assert not process.eval(f'(asdf:load-asd "{tmp_path / "half-loaded.asd"}") '
                            "(defvar *break-the-load* t)")[1]
    text, is_error = process.eval('(asdf:load-system "half-loaded")', timeout=120)
    assert is_error and "the load breaks here" in text, text
    # The reset forgets *BREAK-THE-LOAD* (the session's) and aborts the load.
    assert not process.call("reset-session")["isError"]
    text, is_error = process.eval('(asdf:load-system "half-loaded") (funcall (find-symbol "READY" :half-loaded))',
                                  timeout=120)
    assert (text, is_error) == ("=> :READY", False)


def test_a_reset_keeps_all_that_a_systems_load_made(shared, tmp_path):
    """A package made by uiop:define-package has no defpackage in a file, and
    a system may define things in CL-USER: what the evaluation that loaded it
    created stays all the same."""
    _, emacs, process = shared
    (tmp_path / "facade.asd").write_text('(asdf:defsystem "facade" :components ((:file "facade")))\n')
    (tmp_path / "facade.lisp").write_text(
        "(uiop:define-package :facade (:use :cl) (:export #:hello))\n"
        "(in-package :facade)\n"
        "(defun hello () :hello)\n"
        "(in-package :cl-user)\n"
        "(defun facade-helper () :helper)\n")
    text, is_error = process.eval(f'(asdf:load-asd "{tmp_path / "facade.asd"}") (asdf:load-system "facade")',
                                  timeout=120)
    assert not is_error, text
    (tmp_path / "scratch-package.lisp").write_text("(defpackage :scratch-from-file (:use :cl))\n")
    assert not process.eval(f'(defun scratch-alone () 1) (load "{tmp_path / "scratch-package.lisp"}")')[1]
    # The reset says what went, what stayed and why (it said "All
    # definitions cleared." while FACADE-HELPER stayed).
    text = process.call("reset-session")["content"][0]["text"]
    assert "SCRATCH-ALONE" in text.split("\n")[1] and "SCRATCH-FROM-FILE" not in text.split("\n")[1], text
    from_file = next(line for line in text.split("\n") if "defined in a loaded file" in line)
    assert "SCRATCH-FROM-FILE" in from_file and from_file.endswith(
        "defined in a loaded file: what the file made is the image's (ASDF may call it loaded)."), text
    # (Names others intern meanwhile count too: attach.md's limits.)
    by_load = next(line for line in text.split("\n") if "made by evaluations that also loaded" in line)
    assert re.match(r"Kept: \d+ CL-USER symbols? \([^)]*\bFACADE-HELPER\b[^)]*\) and \d+ packages? "
                    r"\([^)]*\bFACADE\b[^)]*\), made by evaluations that also loaded [^:]*\bfacade\b[^:]*: "
                    r"the image calls those loaded, so what they made stays", by_load), text
    assert process.eval('(list (funcall (find-symbol "HELLO" :facade)) (facade-helper))') == \
        ("=> (:HELLO :HELPER)", False)
    assert emacs.slime_eval("(cl-user::facade-helper)") == ":helper"


@pytest.mark.parametrize("leaving", ["close", "kill"])
def test_the_deadline_watchdog_leaves_with_the_last_cl_mcp(programmer, leaving):
    """Issue 44: `cl-mcp deadline watchdog` stayed in the programmer's
    thread list after cl-mcp exited; it goes when the image is detached,
    whether cl-mcp closed or was killed, and comes back with the next."""
    server, home = programmer
    watchdogs = ('(count "cl-mcp deadline watchdog" (sb-thread:list-all-threads) '
                 ':key (function sb-thread:thread-name) :test (function equal))')
    for _ in range(2):
        process = attached(server.port, home)
        assert process.eval("(+ 1 2)") == ("=> 3", False)  # every evaluation has a deadline
        assert server.client_eval(watchdogs) == "1"
        if leaving == "kill":
            process.proc.kill()
            process.proc.wait()
        else:
            process.close()
        deadline = time.monotonic() + 10  # Swank's sentinel sees the connection close
        while server.client_eval(watchdogs) != "0":
            assert time.monotonic() < deadline, "the watchdog stayed after cl-mcp left"
            time.sleep(0.1)


# Sent to a stopped cl-mcp, which never reads it (so that its death resets
# the connection), then more that the image only buffers.
UNSENT = """(let ((stream (swank::connection.socket-io (first cl-mcp-agent::*connections*)))
      (spaces (make-array 64 :element-type '(unsigned-byte 8) :initial-element 32)))
  (write-sequence spaces stream)
  (finish-output stream)
  (write-sequence spaces stream)
  t)"""


def test_a_killed_cl_mcp_with_output_unsent_still_detaches(programmer):
    """cl-mcp killed while the image had output for it still to send (as
    when it dies in the middle of a long reply): Swank's close of the
    connection's stream signalled in its sentinel thread, which stopped in
    the debugger, so no connection closed after it and cl-mcp's marks
    stayed on the image (a loaded CI run's soak).  The marks come off, and
    the sentinel still closes the next cl-mcp's connection."""
    server, home = programmer
    marked = ("(list (sb-int:encapsulated-p 'sb-thread:make-thread 'cl-mcp-agent::watched) "
              "(sb-int:encapsulated-p 'swank::close-connection% 'cl-mcp-agent::cl-mcp-unsent))")
    for leaving in ("killed with output unsent", "closed"):
        process = attached(server.port, home)
        assert process.eval("(+ 1 2)") == ("=> 3", False)
        assert server.client_eval(marked) == "(T T)"
        if leaving == "closed":
            process.close()
        else:
            process.proc.send_signal(signal.SIGSTOP)
            assert server.client_eval(UNSENT) == "T"
            process.proc.kill()
            process.proc.wait()
        deadline = time.monotonic() + 10  # Swank's sentinel sees the connection close
        while server.client_eval(marked) != "(NIL NIL)":
            assert time.monotonic() < deadline, (leaving, "cl-mcp's marks stayed")
            time.sleep(0.1)
