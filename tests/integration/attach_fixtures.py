"""A programmer's image (SBCL with Swank, started as from Emacs) and a real
Emacs with SLIME connected to it, for the attach-mode tests."""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from cl_mcp.lisp.image import find_slime_dir
from cl_mcp.lisp.swank.connection import SwankConnection
from cl_mcp.wire.sexp import Symbol

SLIME_ELISP = Path("/usr/share/emacs/site-lisp/elpa-src")


class SwankServer:
    """SBCL running Swank with :dont-close t, as `M-x slime` leaves it."""

    def __init__(self, home: Path, heap_mib: int | None = None) -> None:
        slime = find_slime_dir()
        script = home / "start-swank.lisp"
        script.write_text(
            "(require :asdf)\n"
            f'(load "{slime}/swank-loader.lisp")\n'
            "(swank-loader:init :load-contribs nil :setup nil)\n"
            '(format t "~&SWANK-PORT ~D~%" (swank:create-server :port 0 :interface "127.0.0.1"'
            " :dont-close t))\n"
            "(finish-output)\n"
            "(loop (sleep 1))\n")
        self.proc = subprocess.Popen(
            ["sbcl", *(["--dynamic-space-size", f"{heap_mib}MB"] if heap_mib else []),
             "--noinform", "--no-userinit", "--load", str(script)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**os.environ, "HOME": str(home)}, start_new_session=True)
        assert self.proc.stdout
        for line in self.proc.stdout:
            match = re.match(rb"SWANK-PORT (\d+)", line)
            if match:
                self.port = int(match.group(1))
                break
        else:
            raise AssertionError("Swank did not start")
        # Keep draining its output so it never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        # The programmer's own client stays connected, reading all Swank
        # sends, as Emacs does.  (A client that hangs up after each answer
        # meets a Swank bug: what Swank sends it after the answer, as an
        # indentation update, fails to reach it, Swank's close of the
        # connection then signals in its sentinel thread, which stops in
        # the debugger and closes no connection after it, cl-mcp's neither.)
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        self._connection: SwankConnection | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def client_eval(self, form: str) -> str:
        """FORM (text) read and evaluated in CL-USER by a Swank client of the
        programmer's own, as Emacs would: its value printed."""
        async def ask() -> str:
            if self._connection is None or self._connection.closed:
                self._connection = await SwankConnection.open("127.0.0.1", self.port)
            value = await self._connection.rex(
                [Symbol("cl:prin1-to-string"),
                 [Symbol("cl:eval"), [Symbol("cl:read-from-string"), form]]], deadline=60)
            assert isinstance(value, str), value
            return value
        return asyncio.run_coroutine_threadsafe(ask(), self._loop).result(90)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self._connection is not None:
            asyncio.run_coroutine_threadsafe(self._connection.close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)


class Emacs:
    """An Emacs daemon with SLIME, driven through emacsclient."""

    def __init__(self, home: Path) -> None:
        if shutil.which("emacs") is None or not list(SLIME_ELISP.glob("slime-*/slime.el")):
            pytest.fail("Emacs and SLIME are not installed: run `make test`, which installs "
                        "Debian's emacs-nox and slime")
        self.name = f"clmcp-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "HOME": str(home)}
        slime_dir = sorted(SLIME_ELISP.glob("slime-*"))[-1]
        # No native compilation: each fresh HOME would compile SLIME's and
        # Emacs's own files again in the background, on the tests' CPUs.
        setup = ("(progn (setq native-comp-jit-compilation nil native-comp-deferred-compilation nil) "
                 f'(add-to-list (quote load-path) "{slime_dir}") (require (quote slime)) '
                 "(slime-setup (quote (slime-repl))))")
        subprocess.run(["emacs", "-Q", f"--daemon={self.name}", "--eval", setup],
                       env=self.env, check=True, capture_output=True, timeout=60)

    def eval(self, elisp: str, timeout: float = 30) -> str:
        out = subprocess.run(["emacsclient", "-s", self.name, "--eval", elisp], env=self.env,
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise AssertionError(f"emacsclient failed: {out.stderr}")
        return out.stdout.strip()

    def text(self, form: str) -> str:
        """The string FORM returns in Emacs, or "" for nil.  It comes back
        through a file: emacsclient garbles long printed answers (it splits
        them across its protocol's messages and then reports one of them as
        unknown)."""
        with tempfile.NamedTemporaryFile(suffix=".txt") as out:
            self.eval(f"(let ((text {form}) (coding-system-for-write (quote utf-8-unix))) "
                      f'(with-temp-file "{out.name}" (when text (insert text))) t)')
            return Path(out.name).read_text(encoding="utf-8")

    def connect(self, port: int) -> None:
        self.eval(f'(slime-connect "127.0.0.1" {port})')
        deadline = time.monotonic() + 30
        while self.eval("(if (slime-connected-p) 1 0)") != "1":
            if time.monotonic() > deadline:
                raise AssertionError("SLIME did not connect")
            time.sleep(0.2)
        # The REPL is set up asynchronously after connecting.
        while self.eval("(if (slime-output-buffer) 1 0)") != "1":
            if time.monotonic() > deadline:
                raise AssertionError("SLIME's REPL did not start")
            time.sleep(0.2)

    def slime_eval(self, lisp: str) -> str:
        """Evaluate LISP (with package-qualified symbols) in the image, as
        SLIME does for its own commands; the printed result."""
        return self.eval(f"(slime-eval (quote {lisp}))")

    def debugger_windows(self) -> int:
        return int(self.eval("(length (sldb-buffers))"))

    def repl_text(self) -> str:
        return self.text("(with-current-buffer (slime-output-buffer) "
                         "(buffer-substring-no-properties (point-min) (point-max)))")

    def await_debugger(self, what: str, timeout: float = 10) -> None:
        """Wait until a debugger window is open; WHAT says whose error it is."""
        deadline = time.monotonic() + timeout
        while self.debugger_windows() == 0:
            if time.monotonic() > deadline:
                threads = self.slime_eval("(cl:mapcar (cl:function sb-thread:thread-name) "
                                          "(sb-thread:list-all-threads))")
                messages = self.text("(with-current-buffer \"*Messages*\" (buffer-string))")
                raise AssertionError(f"{what} never reached Emacs's debugger; the image's "
                                     f"threads: {threads}; Emacs's messages: {messages[-800:]}")
            time.sleep(0.1)

    def quit_debuggers(self) -> None:
        """Quit every debugger, and wait until Swank has closed them (sldb-quit
        only sends the request)."""
        self.eval("(progn (dolist (b (sldb-buffers)) (with-current-buffer b (sldb-quit))) t)")
        deadline = time.monotonic() + 10
        while self.debugger_windows():
            assert time.monotonic() < deadline, "the debugger did not close"
            time.sleep(0.05)

    def stop(self) -> None:
        subprocess.run(["emacsclient", "-s", self.name, "--eval", "(kill-emacs)"], env=self.env,
                       capture_output=True, timeout=30)


_HOMES = Path(tempfile.mkdtemp(prefix="cl-mcp-homes-"))
atexit.register(shutil.rmtree, _HOMES, ignore_errors=True)


def temporary_home() -> Path:
    """A fresh HOME for a programmer's image and Emacs; all of this test
    process's go when it exits."""
    return Path(tempfile.mkdtemp(prefix="home-", dir=_HOMES))
