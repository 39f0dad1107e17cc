"""The command line, end to end: eval, tools, call, doctor, and the REPL
driven through a pseudo-terminal."""

import fcntl
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from cl_mcp.lisp.image import find_bootstrap, find_slime_dir, saved_core

FIXTURES = Path(__file__).parent.parent / "fixtures"
CL_MCP = str(Path(sys.executable).parent / "cl-mcp")


def cli(*args, timeout=120):
    return subprocess.run([CL_MCP, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_version_and_help():
    out = cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("cl-mcp ")
    out = cli("--help")
    assert "--connect" in out.stdout and "doctor" in out.stdout and "repl" in out.stdout


def test_eval():
    out = cli("eval", "(+ 1 2 3)")
    assert (out.returncode, out.stdout) == (0, "=> 6\n")
    out = cli("eval", "(car 1)")
    assert out.returncode == 1 and out.stdout.startswith("[ERROR] TYPE-ERROR")
    out = cli("eval", "(package-name *package*)", "--package", "COMMON-LISP", "--time")
    assert out.returncode == 0 and out.stdout.startswith('=> "COMMON-LISP"\n\n; Timing: ')


def test_eval_prints_the_whole_output_a_terminal_has_no_budget():
    out = cli("eval", '(dotimes (i 3000) (format t "line ~D of the output~%" i)) :done')
    assert out.returncode == 0 and "left out" not in out.stdout
    lines = out.stdout.splitlines()
    assert lines[1:3001] == [f"line {i} of the output" for i in range(3000)]
    assert lines[-1] == "=> :DONE"


def test_eval_shows_progress_of_long_calls_on_stderr():
    out = cli("eval", '(format t "working~%") (finish-output) (sleep 2.5) :done')
    assert out.stdout.endswith("=> :DONE\n")
    assert "cl-mcp: running for" in out.stderr


def test_tools_and_call_against_cl_mcp():
    out = cli("tools")
    assert out.returncode == 0 and out.stdout.startswith("evaluate-lisp code [package]")
    out = cli("call", "evaluate-lisp", '{"code": "(list 1 2)"}')
    assert (out.returncode, out.stdout) == (0, "=> (1 2)\n\n; Evaluation 1\n")  # a tool's whole text
    out = cli("call", "evaluate-lisp", '{"code": 1}')
    assert out.returncode == 2 and "invalid arguments" in out.stderr


def test_tools_and_call_against_another_server():
    server = f"{sys.executable} {FIXTURES / 'sdk_server.py'}"
    out = cli("tools", "--server", server)
    assert out.returncode == 0 and "add a b" in out.stdout
    out = cli("call", "add", '{"a": 20, "b": 22}', "--server", server)
    assert (out.returncode, out.stdout) == (0, "42\n")
    out = cli("call", "picture", "--server", server)
    assert out.stdout == "[image content: image/png]\none pixel\n"


def no_build_under_way(timeout: float = 300) -> None:
    """Return once no cl-mcp is saving this run's core: an earlier test's
    build may go on after its cl-mcp exited, and a start meanwhile (the
    doctor's) starts from fasls with no core to show."""
    core = saved_core(shutil.which("sbcl") or "sbcl", find_slime_dir(), find_bootstrap())
    try:
        lock = os.open(core.with_name(core.name + ".lock"), os.O_RDWR)
    except FileNotFoundError:
        return  # no build ever began
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, "the core's build never ended"
                time.sleep(0.2)
    finally:
        os.close(lock)  # and with it the shared lock


def test_doctor():
    no_build_under_way()
    out = cli("doctor", timeout=300)
    assert out.returncode == 0, out.stdout
    assert "[ok  ] SBCL" in out.stdout and "[ok  ] Swank" in out.stdout
    assert "[ok  ] image" in out.stdout and "alexandria" in out.stdout
    core = saved_core(shutil.which("sbcl") or "sbcl", find_slime_dir(), find_bootstrap())
    assert "[ok  ] saved core" in out.stdout, (
        out.stdout, out.stderr[-3000:], sorted(path.name for path in core.parent.glob("image-*")))


def test_doctor_says_why_no_core_was_saved_and_tries_again(tmp_path):
    """A failed build is not tried again by starts for a day; the doctor
    says why it failed, and builds afresh each time it is asked."""
    refuse = tmp_path / "refuse"
    refuse.touch()
    sbcl = tmp_path / "sbcl"
    sbcl.write_text(f'#!/bin/sh\ncase "$*" in *save-lisp-and-die*) [ -e {refuse} ] && '
                    f'{{ echo "no room for a core"; exit 3; }};; esac\nexec {shutil.which("sbcl")} "$@"\n')
    sbcl.chmod(0o755)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def doctor() -> str:
        out = subprocess.run([CL_MCP, "doctor", "--sbcl", str(sbcl)], capture_output=True, text=True,
                             timeout=300, stdin=subprocess.DEVNULL, env=env)
        assert out.returncode == 0, out.stdout
        return out.stdout

    assert ("[note] saved core: none (saving a core failed (exit code 3): no room for a core); "
            "images start from fasls") in doctor()
    refuse.unlink()
    assert "[ok  ] saved core" in doctor()


def test_a_bare_connect_with_no_saved_port_says_how_to_save_one(tmp_path):
    out = subprocess.run([CL_MCP, "--connect"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL, env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 2 and "M-x cl-mcp-share" in out.stderr and "--connect 4005" in out.stderr, out.stderr
    (tmp_path / ".cl-mcp-port").write_text("junk\n")
    out = subprocess.run([CL_MCP, "--connect"], capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL, env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 2 and "holds 'junk', not a port" in out.stderr, out.stderr


def test_doctor_says_what_to_install():
    out = cli("doctor", "--sbcl", "no-such-sbcl")
    assert out.returncode == 1 and "apt-get install sbcl" in out.stdout


class Terminal:
    """cl-mcp repl in a pseudo-terminal, typed at as a person would."""

    def __init__(self, home):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            # A terminal's Ctrl-C interrupts; a test run started in the
            # background (`make test &`) would hand down SIGINT ignored.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.environ["HOME"] = str(home)
            os.environ["TERM"] = "dumb"
            os.execv(CL_MCP, [CL_MCP, "repl"])
        self.screen = b""

    def expect(self, text, timeout=60):
        deadline = time.monotonic() + timeout
        while text.encode() not in self.screen:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} never appeared; screen:\n{self.screen.decode(errors='replace')}")
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    self.screen += os.read(self.fd, 65536)
                except OSError:
                    break
        position = self.screen.index(text.encode()) + len(text)
        seen, self.screen = self.screen[:position], self.screen[position:]
        return seen.decode(errors="replace")

    def type(self, text):
        os.write(self.fd, text.encode())

    def wait(self, timeout=30):
        """The exit code, reading the terminal meanwhile so that the
        program never blocks writing to it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    self.screen += os.read(self.fd, 65536)
                except OSError:
                    pass
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"cl-mcp repl did not exit; screen:\n{self.screen.decode(errors='replace')}")


def test_repl_in_a_terminal(tmp_path):
    term = Terminal(tmp_path)
    term.expect("CL-USER> ")
    term.type("(defun twice (x)\r")          # multi-line input
    term.type("  (* 2 x))\r")
    term.expect("=> TWICE")
    term.expect("CL-USER> ")
    term.type("(twice 21)\r")
    term.expect("=> 42\r\n\r\n; Evaluation 2\r\n")  # the number, for :output N
    term.expect("CL-USER> ")
    term.type("(defpackage :demo (:use :cl)) (in-package :demo)\r")
    term.expect("DEMO> ")                    # the prompt follows the package
    term.type("(sleep 30)\r")
    time.sleep(1.0)
    term.type("\x03")                        # Ctrl-C cancels the evaluation
    term.expect("; cancelled")
    term.expect("DEMO> ")
    term.type("(error \"oops\")\r")
    term.expect("[ERROR] SIMPLE-ERROR")
    term.expect("DEMO> ")
    term.type(":restart ABORT\r")
    term.expect("The evaluation was aborted.")
    term.expect("DEMO> ")
    term.type('(format t "alpha~%beta~%gamma~%")\r')
    term.expect("gamma")
    term.expect("DEMO> ")
    term.type(":output ^b\r")                 # the last evaluation's lines matching ^b
    term.expect("1 line of 3 match /^b/]")
    term.expect("      2: beta")
    term.expect("DEMO> ")
    time.sleep(0.3)                          # readline is reading again
    term.type("\x04")                        # Ctrl-D leaves
    assert term.wait() == 0
    assert "(twice 21)" in (tmp_path / ".cl_mcp_history").read_text()
