"""The programmer sees, and can stop, what the assistant does in their
image: a real Emacs with SLIME and emacs/cl-mcp.el, connected to the image
cl-mcp attaches to, shows each tool call in its `*cl-mcp*` buffer, and
stops or holds the assistant; a second Emacs without the package is told
nothing."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.integration.attach_fixtures import Emacs, SwankServer, temporary_home
from tests.integration.conftest import McpProcess

PACKAGE = (Path(__file__).parents[2] / "emacs" / "cl-mcp.el").resolve()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Wait until CONDITION holds, failing after TIMEOUT seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.1)


def text_of(emacs: Emacs, buffer: str) -> str:
    """The text of EMACS's BUFFER (a form that names it), empty when there is none."""
    return emacs.text(f"(let ((b {buffer})) (when b (with-current-buffer b "
                      "(buffer-substring-no-properties (point-min) (point-max)))))")


def watch_buffer(emacs: Emacs) -> str:
    """The text of EMACS's `*cl-mcp*` buffer."""
    return text_of(emacs, '(get-buffer "*cl-mcp*")')


def buffer_lines(emacs: Emacs) -> list[str]:
    """The lines of EMACS's `*cl-mcp*` buffer."""
    return [line for line in watch_buffer(emacs).split("\n") if line]


def text(result: dict) -> str:
    return result["content"][0]["text"]


class Shared:
    """The image, an Emacs watching with the package, one without it, and
    cl-mcp attached after the first had loaded the package."""

    def __init__(self, stack: ExitStack) -> None:
        home = temporary_home()
        server = SwankServer(home)
        stack.callback(server.stop)
        self.watching = Emacs(home)
        stack.callback(self.watching.stop)
        self.watching.connect(server.port)
        self.plain = Emacs(home)
        stack.callback(self.plain.stop)
        self.plain.connect(server.port)
        # Loaded before cl-mcp attaches (and, in the second, before SLIME
        # connects): the package registers once the agent is there.
        load = f'(progn (setq cl-mcp-register-interval 0.3) (load "{PACKAGE}") t)'
        self.watching.eval(load)
        self.second = Emacs(home)
        stack.callback(self.second.stop)
        self.second.eval(load)
        self.second.connect(server.port)
        self.process = McpProcess("--connect", str(server.port), env={"HOME": str(home)})
        stack.callback(self.process.close)
        self.process.initialize()
        for emacs in (self.watching, self.second):
            wait_for(lambda: emacs.eval("(if (cl-mcp--registered) 1 0)") == "1",
                     "the package registered")
        self.repl = self.watching.repl_text()
        self.home = home
        self.port = server.port


@pytest.fixture(scope="module")
def shared() -> Iterator[Shared]:
    with ExitStack() as stack:
        yield Shared(stack)


def line_of(emacs: Emacs, tool: str, subject: str) -> str:
    """The finished line of the call of TOOL on SUBJECT, once it is there."""
    found: list[str] = []

    def finished() -> bool:
        found[:] = [line for line in buffer_lines(emacs)
                    if f" {tool} " in line and subject in line and "running..." not in line]
        return bool(found)
    wait_for(finished, f"a finished line of {tool} on {subject}")
    return found[-1]


def test_each_call_is_a_line_with_its_tool_form_outcome_and_time(shared):
    process, emacs = shared.process, shared.watching
    done = process.call("evaluate-lisp", code="(+ 40 2)")
    assert not done["isError"]
    found = process.call("find-definition", symbol="cl-user::no-such-function-here")
    assert found is not None
    line = line_of(emacs, "evaluate-lisp", "(+ 40 2)")
    assert "=>  42  (" in line and " ms, evaluation " in line
    assert "=>  42  (" in line_of(shared.second, "evaluate-lisp", "(+ 40 2)")  # every Emacs registered
    assert line_of(emacs, "find-definition", "cl-user::no-such-")  # shortened, its outcome whole
    failed = process.call("evaluate-lisp", code='(error "boom")')
    assert failed["isError"]
    assert "SIMPLE-ERROR (waiting at its error)" in line_of(emacs, "evaluate-lisp", '(error "boom")')
    long = process.call("evaluate-lisp", code="(make-string 5000 :initial-element #\\x)")
    assert not long["isError"]
    assert max(len(line) for line in buffer_lines(emacs)) < 600  # long values are cut
    # Nothing in the programmer's REPL, no debugger.
    assert emacs.repl_text() == shared.repl
    assert emacs.debugger_windows() == 0
    shared.process.call("invoke-restart", restart="abort")


def test_stop_cancels_the_running_evaluation_as_the_programmer_s(shared):
    process, emacs = shared.process, shared.watching
    request = process.start_request("tools/call", {"name": "evaluate-lisp",
                                                   "arguments": {"code": "(sleep 30)"}})
    wait_for(lambda: any("(sleep 30)" in line and "running..." in line
                         for line in buffer_lines(emacs)), "the running line")
    started = time.monotonic()
    emacs.eval("(cl-mcp-stop)")
    answer = process.response(request, timeout=60)["result"]
    assert time.monotonic() - started < 25
    assert answer["isError"]
    assert "CL-MCP:CANCELLED-BY-PROGRAMMER" in text(answer)
    assert "programmer stopped" in text(answer)
    assert "cancelled by the programmer" in line_of(emacs, "evaluate-lisp", "(sleep 30)")
    # Nothing runs now: Stop says so.
    emacs.eval("(cl-mcp-stop)")
    wait_for(lambda: "nothing to stop" in text_of(emacs, '(get-buffer "*Messages*")'),
             "Stop's message")
    assert emacs.repl_text() == shared.repl
    assert process.eval("(+ 1 1)") == ("=> 2", False)


def test_stop_cancels_an_evaluation_running_in_the_background(shared):
    process, emacs = shared.process, shared.watching
    running = process.call("evaluate-lisp", code="(sleep 60)", **{"answer-within": 1})
    number = running["structuredContent"]["number"]
    assert running["structuredContent"].get("running"), running
    line_of(emacs, "evaluate-lisp", "(sleep 60)")
    emacs.eval("(cl-mcp-stop)")
    wait_for(lambda: f"Stopped evaluation {number}" in text_of(emacs, '(get-buffer "*Messages*")'),
             "Stop's message")
    outcome = process.call("await-evaluation", evaluation=number, wait=30)
    assert outcome["isError"] and "CL-MCP:CANCELLED-BY-PROGRAMMER" in text(outcome), outcome
    assert "cancelled by the programmer" in line_of(emacs, "await-evaluation", str(number))
    assert process.eval("(+ 1 1)") == ("=> 2", False)


def test_hold_refuses_code_and_lets_reading_go_on_until_release(shared):
    process, emacs = shared.process, shared.watching
    emacs.eval("(cl-mcp-hold)")
    wait_for(lambda: "holds the assistant" in watch_buffer(emacs), "the hold")
    try:
        held = process.call("evaluate-lisp", code="(defvar cl-user::*held-ran* t)")
        assert held["isError"]
        assert "CL-MCP:PAUSED-BY-PROGRAMMER" in text(held) and "paused" in text(held)
        edited = shared.home / "held-edit.lisp"
        source = "(in-package #:cl-user)\n\n(defun held-edit () 1)\n"
        edited.write_text(source)
        for tool, arguments in (("macroexpand", {"form": "(when t 1)"}),
                                ("inspect", {"code": "(list 1 2)"}),
                                ("edit-form", {"path": str(edited), "form": "defun held-edit",
                                               "text": "(defun held-edit () 2)"}),
                                ("reset-session", {})):
            refused = process.call(tool, **arguments)
            assert refused["isError"] and "PAUSED-BY-PROGRAMMER" in text(refused), (tool, refused)
        assert edited.read_text() == source
        # Reading runs nothing of the file: not even a #. (issue 44).
        read = shared.home / "held-read.lisp"
        read.write_text("(in-package #:cl-user)\n\n(defun held-read () #.(progn (defvar cl-user::*held-read-ran* t) 1))\n")
        for arguments in ({}, {"mode": "check"}, {"mode": "form", "form": "defun held-read"}):
            answer = process.call("read-lisp-file", path=str(read), **arguments)
            assert not answer["isError"], (arguments, answer)
        outline = process.call("read-lisp-file", path=str(edited))
        assert not outline["isError"], outline
        found = process.call("find-definition", symbol="cl:car")
        assert not found["isError"], found
        described = process.call("describe-symbol", symbol="cl:car")
        assert not described["isError"], described
        assert not process.call("threads", action="list")["isError"]
    finally:
        emacs.eval("(cl-mcp-release)")
    wait_for(lambda: "released the assistant" in watch_buffer(emacs), "the release")
    assert process.eval("(boundp 'cl-user::*held-ran*)") == ("=> NIL", False)
    assert process.eval("(boundp 'cl-user::*held-read-ran*)") == ("=> NIL", False)
    assert process.eval("(+ 2 3)") == ("=> 5", False)


def jump_from(emacs: Emacs, tool: str, subject: str) -> None:
    """`cl-mcp-jump` on the line of TOOL's call on SUBJECT."""
    line_of(emacs, tool, subject)
    emacs.eval('(with-current-buffer "*cl-mcp*" (goto-char (point-max)) '
               f"(search-backward {json.dumps(subject)}) (cl-mcp-jump))")


def test_jump_goes_to_the_form_s_file_and_line_or_the_waiting_backtrace(shared):
    process, emacs = shared.process, shared.watching
    path = shared.home / "jump-here.lisp"
    path.write_text("(in-package #:cl-user)\n\n(defun jumped-to (x)\n  (* x 2))\n")
    compiled = process.call("compile-form", path=str(path), line=4)
    assert not compiled["isError"], compiled
    jump_from(emacs, "compile-form", "jump-here.lisp:4")  # a long path loses its start
    assert json.loads(emacs.eval("(buffer-file-name (window-buffer (selected-window)))")) == str(path)
    # The form's first line, where line 4 is.
    assert emacs.eval("(with-current-buffer (window-buffer (selected-window)) (line-number-at-pos))") == "3"
    failed = process.call("evaluate-lisp", code='(error "ew-bt")')  # short: its line is full
    assert failed["isError"]
    jump_from(emacs, "evaluate-lisp", "ew-bt")
    wait_for(lambda: "waiting at its error" in text_of(emacs, '(get-buffer "*cl-mcp backtrace*")'),
             "the backtrace buffer")
    assert "ERROR" in text_of(emacs, '(get-buffer "*cl-mcp backtrace*")').upper()
    assert emacs.debugger_windows() == 0
    process.call("invoke-restart", restart="abort")


def test_an_emacs_without_the_package_sees_no_event(shared):
    process, plain = shared.process, shared.plain
    process.call("evaluate-lisp", code="(list :seen-by-one)")
    line_of(shared.watching, "evaluate-lisp", ":seen-by-one")
    assert plain.eval("(if (slime-connected-p) 1 0)") == "1"
    assert "cl-mcp-watch" not in text_of(plain, "(slime-events-buffer)")
    messages = text_of(plain, '(get-buffer "*Messages*")')
    assert "channel" not in messages.lower() and "error" not in messages.lower(), messages
    # The package's own events reached SLIME's log in the watching Emacs.
    assert "cl-mcp-watch" in text_of(shared.watching, "(slime-events-buffer)")


def test_a_stalled_emacs_costs_cl_mcp_nothing_and_its_messages_are_bounded(shared):
    process, stalled = shared.process, shared.second
    # The second Emacs's connection stops writing for 6 s: its control thread sleeps.
    stalled.eval("(slime-eval-async (quote (cl:let ((c swank::*emacs-connection*)) "
                 "(sb-thread:interrupt-thread (swank::mconn.control-thread c) "
                 "(cl:lambda () (cl:setf (cl:get :cl-mcp-test :stalled) t) (cl:sleep 6))) t)))")
    wait_for(lambda: process.eval("(get :cl-mcp-test :stalled)") == ("=> T", False),
             "the control thread stalled")
    slowest = 0.0
    for index in range(20):  # more batches (one per 50 ms) than its backlog limit, 4
        started = time.monotonic()
        assert process.eval(f"(list :while-stalled {index})")[1] is False
        slowest = max(slowest, time.monotonic() - started)
        time.sleep(0.1)
    assert slowest < 3, slowest
    line_of(shared.watching, "evaluate-lisp", ":while-stalled 19")
    assert "dropped" not in watch_buffer(shared.watching)
    # Once it writes again, its next batch says how many it missed.

    def told() -> bool:
        process.eval("(list :after-the-stall)")
        return "messages dropped" in watch_buffer(stalled)
    wait_for(told, "the dropped messages' count")
    line_of(stalled, "evaluate-lisp", ":after-the-stall")


def test_a_stop_that_comes_once_an_edit_is_written_answers_that_it_is_written(shared, tmp_path):
    """A stop can undo no edit: one that lands after the rename answers the
    edit, written, and its compile cut short (it answered
    CANCELLED-BY-PROGRAMMER, for an edit that was on disk).  The agent's
    watch-file-written, which runs right after the rename, is made slow so
    that the stop lands there."""
    process, emacs = shared.process, shared.watching
    source = tmp_path / "ew-edit.lisp"
    source.write_text("(defun ew-edited () 1)\n")
    assert not process.eval("(sb-int:encapsulate 'cl-mcp-agent::watch-file-written 'ew-slow "
                            "(lambda (f &rest args) (sleep 3) (apply f args)))")[1]
    try:
        request = process.start_request("tools/call", {"name": "edit-form", "arguments": {
            "path": str(source), "line": 1, "text": "(defun ew-edited () 2)"}})
        wait_for(lambda: any(" edit-form " in line and "running..." in line for line in buffer_lines(emacs)),
                 "the running line")
        wait_for(lambda: "2)" in source.read_text(), "the edit written")
        emacs.eval("(cl-mcp-stop)")
        answer = process.response(request, timeout=60)["result"]
    finally:
        process.eval("(sb-int:unencapsulate 'cl-mcp-agent::watch-file-written 'ew-slow)")
    assert "CANCELLED-BY-PROGRAMMER" not in text(answer), answer
    assert "cancelled once the edit was written" in text(answer), answer
    assert "the edit is written, and stays written" in text(answer), answer
    assert "its compile did not finish" in text(answer), answer
    assert answer["structuredContent"]["written"] is True, answer
    assert source.read_text() == "(defun ew-edited () 2)\n"
    assert emacs.repl_text() == shared.repl


def test_a_file_with_unsaved_changes_in_emacs_is_not_written_and_a_saved_one_is_reverted(shared, tmp_path):
    """edit-form wrote a file whose Emacs buffer had unsaved changes, and
    the programmer's save then asked "changed since visited?", where yes
    dropped the edit: the write is refused while Emacs's lock is there.
    Once saved, the edit is written and the companion reverts the buffer."""
    process, emacs = shared.process, shared.watching
    source = tmp_path / "ew-unsaved.lisp"
    source.write_text("(defun ew-unsaved () 1)\n")
    emacs.eval(f'(with-current-buffer (find-file-noselect "{source}") (goto-char (point-max)) '
               '(insert "(defun ew-typed () 0)\\n") t)')
    # Not find-file-noselect again: once the file changes on disk, it asks
    # whether to read it again, and a daemon's question waits for nobody.
    visit = f'(with-current-buffer (get-file-buffer "{source}")'
    assert (tmp_path / ".#ew-unsaved.lisp").is_symlink()  # Emacs's lock, while the buffer is modified
    refused = process.call("edit-form", path=str(source), line=1, text="(defun ew-unsaved () 2)")
    assert refused["isError"] and "CL-MCP:UNSAVED-IN-EDITOR" in text(refused), refused
    assert "has unsaved changes in an Emacs buffer" in text(refused), refused
    assert source.read_text() == "(defun ew-unsaved () 1)\n"
    emacs.eval(f"{visit} (save-buffer) t)")
    written = process.call("edit-form", path=str(source), line=1, text="(defun ew-unsaved () 2)")
    assert not written["isError"], written
    expected = "(defun ew-unsaved () 2)\n(defun ew-typed () 0)\n"
    assert source.read_text() == expected
    wait_for(lambda: emacs.text(f"{visit} (buffer-substring-no-properties (point-min) (point-max)))") == expected,
             "the buffer reverted")
    assert emacs.eval(f"{visit} (buffer-modified-p))") == "nil"


def test_a_buffer_with_unsaved_changes_and_no_lock_is_known_by_asking_its_emacs(shared, tmp_path):
    """With `create-lockfiles` off, Emacs leaves no .#NAME lock: the agent
    asks each registered Emacs whether a buffer visiting the file is
    modified."""
    process, emacs = shared.process, shared.watching
    source = tmp_path / "ew-nolock.lisp"
    source.write_text("(defun ew-nolock () 1)\n")
    emacs.eval(f'(with-current-buffer (find-file-noselect "{source}") (setq-local create-lockfiles nil) '
               '(goto-char (point-max)) (insert "(defun ew-nolock-typed () 0)\\n") t)')
    visit = f'(with-current-buffer (get-file-buffer "{source}")'
    assert not (tmp_path / ".#ew-nolock.lisp").exists()
    refused = process.call("edit-form", path=str(source), line=1, text="(defun ew-nolock () 2)")
    assert refused["isError"] and "CL-MCP:UNSAVED-IN-EDITOR" in text(refused), refused
    pid = emacs.eval("(emacs-pid)")
    assert f"its buffer ew-nolock.lisp in Emacs {pid} says so" in text(refused), refused
    assert source.read_text() == "(defun ew-nolock () 1)\n"
    emacs.eval(f"{visit} (save-buffer) t)")
    assert not process.call("edit-form", path=str(source), line=1, text="(defun ew-nolock () 2)")["isError"]
    assert source.read_text() == "(defun ew-nolock () 2)\n(defun ew-nolock-typed () 0)\n"


def test_a_lock_left_by_an_emacs_that_died_holds_no_write(shared, tmp_path):
    process = shared.process
    source = tmp_path / "ew-stale.lisp"
    source.write_text("(defun ew-stale () 1)\n")
    host = process.eval("(machine-instance)")[0].removeprefix("=> ").strip('"')
    dead = int(process.eval("(+ 1 (with-open-file (in \"/proc/sys/kernel/pid_max\") (read in)))")[0][3:])
    (tmp_path / ".#ew-stale.lisp").symlink_to(f"root@{host}.{dead}:1")
    assert not process.call("edit-form", path=str(source), line=1, text="(defun ew-stale () 2)")["isError"]
    (tmp_path / ".#ew-stale.lisp").unlink()
    (tmp_path / ".#ew-stale.lisp").symlink_to(f"root@{host}.1:1")  # pid 1 lives
    refused = process.call("edit-form", path=str(source), line=1, text="(defun ew-stale () 3)")
    assert refused["isError"] and f"root@{host}.1 holds its lock" in text(refused), refused
    assert source.read_text() == "(defun ew-stale () 2)\n"


def test_cl_mcp_share_opens_a_port_a_bare_connect_finds(shared):
    """M-x slime's listener closes once Emacs connects: cl-mcp-share opens
    one that stays, saves its port, and `cl-mcp --connect` with no port
    attaches there, to the programmer's image; run again, it keeps it."""
    emacs, home = shared.watching, shared.home
    port_file = home / ".cl-mcp-port"
    port_file.unlink(missing_ok=True)
    emacs.eval("(cl-mcp-share)")
    wait_for(port_file.exists, "the saved port")
    port = int(port_file.read_text())
    assert port != shared.port and port_file.stat().st_mode & 0o777 == 0o600
    assert emacs.slime_eval("(cl:progn (cl:defvar cl-user::*ew-from-emacs* 42) cl:t)") == "t"
    for _ in range(2):  # two assistants, one after the other: the listener stays open
        assistant = McpProcess("--connect", env={"HOME": str(home)})
        try:
            assistant.initialize()
            assert assistant.eval("cl-user::*ew-from-emacs*") == ("=> 42", False)
        finally:
            assistant.close()
    before = port_file.stat().st_mtime_ns
    emacs.eval("(cl-mcp-share)")
    wait_for(lambda: port_file.stat().st_mtime_ns != before, "the port saved again")
    assert int(port_file.read_text()) == port


def test_a_call_whose_cl_mcp_is_killed_ends_in_the_buffer_and_stop_passes_it_by(shared):
    """Its line said running... for good, and every later Stop said "Stopped
    call N" while nothing stopped (issue 50)."""
    emacs = shared.watching
    other = McpProcess("--connect", str(shared.port), env={"HOME": str(shared.home)})
    try:
        other.initialize()
        other.start_request("tools/call", {"name": "evaluate-lisp",
                                           "arguments": {"code": "(loop (sleep 0.5))"}})
        wait_for(lambda: any("(loop (sleep 0.5))" in line and "running..." in line
                             for line in buffer_lines(emacs)), "the running line")
        other.proc.kill()  # SIGKILL: no goodbye
        other.proc.wait()
    finally:
        other.close()
    assert "its cl-mcp ended before the answer" in line_of(emacs, "evaluate-lisp", "(loop (sleep 0.5))")
    wait_for(lambda: f"cl-mcp-tests:{other.proc.pid} left, aborting 1 evaluation --" in watch_buffer(emacs),
             "the leave line")
    emacs.eval('(with-current-buffer "*Messages*" (let ((inhibit-read-only t)) (erase-buffer)))')
    emacs.eval("(cl-mcp-stop)")
    wait_for(lambda: "nothing to stop" in text_of(emacs, '(get-buffer "*Messages*")'), "Stop's message")
    assert "Stopped call" not in text_of(emacs, '(get-buffer "*Messages*")')
    assert shared.process.eval("(+ 1 1)") == ("=> 2", False)


def messages_of(emacs: Emacs) -> str:
    return text_of(emacs, '(get-buffer "*Messages*")')


def clear_messages(emacs: Emacs) -> None:
    emacs.eval('(with-current-buffer "*Messages*" (let ((inhibit-read-only t)) (erase-buffer)))')


def on_line(emacs: Emacs, subject: str, command: str) -> None:
    """Run COMMAND (an Elisp call) on the newest `*cl-mcp*` line with SUBJECT."""
    emacs.eval('(with-current-buffer "*cl-mcp*" (goto-char (point-max)) '
               f"(search-backward {json.dumps(subject)}) {command})")


def test_each_assistant_s_attaching_calls_and_leaving_are_lines_that_name_it(shared):
    """Each line says which assistant made the call, by its host's name and
    cl-mcp's process, at the time the call started (it said the time the
    line was last drawn); attaching and leaving are lines of their own."""
    emacs = shared.watching
    other = McpProcess("--connect", str(shared.port), env={"HOME": str(shared.home)})
    try:
        other.initialize()
        who = f"cl-mcp-tests:{other.proc.pid}"
        wait_for(lambda: f"{who} attached --" in watch_buffer(emacs), "the attach line")
        started = time.time()
        slept = other.call("evaluate-lisp", code="(progn :ew-slept (sleep 2.5))")
        assert not slept["isError"], slept
        line = line_of(emacs, "evaluate-lisp", ":ew-slept")
        assert who in line, line
        # HH:MM:SS when the call started; its end was 2.5 s later.
        assert line.split()[1] in {time.strftime("%H:%M:%S", time.localtime(started + delta))
                                   for delta in (-1, 0, 1)}, line
        assert not shared.process.call("evaluate-lisp", code="(list :ew-the-other)")["isError"]
        assert f"cl-mcp-tests:{shared.process.proc.pid}" in line_of(emacs, "evaluate-lisp", ":ew-the-other")
    finally:
        other.close()
    wait_for(lambda: f"{who} left --" in watch_buffer(emacs), "the leave line")


def test_a_long_form_is_shortened_so_that_its_outcome_shows(shared):
    process, emacs = shared.process, shared.watching
    code = "(progn " + " ".join(f":ew-filler-{i}" for i in range(40)) + " :ew-the-outcome-shows)"
    assert not process.call("evaluate-lisp", code=code)["isError"]
    line = line_of(emacs, "evaluate-lisp", "(progn :ew-filler-0")
    assert "=>  :EW-THE-OUTCOME-SHOWS  (" in line and line.endswith(")"), line
    assert "(progn :ew-filler-0" in line and "..." in line, line
    # cl-mcp-line-width, with no window on the buffer.
    assert len(line) <= int(emacs.eval("cl-mcp-line-width")), line


def test_the_buffer_follows_new_lines_unless_the_programmer_moved_point(shared):
    process, emacs = shared.process, shared.watching
    at_end = '(with-current-buffer "*cl-mcp*" (if (= (point) (point-max)) 1 0))'
    emacs.eval('(with-current-buffer "*cl-mcp*" (goto-char (point-max)))')
    process.call("evaluate-lisp", code="(list :ew-follow-1)")
    line_of(emacs, "evaluate-lisp", ":ew-follow-1")
    assert emacs.eval(at_end) == "1"
    emacs.eval('(with-current-buffer "*cl-mcp*" (goto-char (point-min)))')
    process.call("evaluate-lisp", code="(list :ew-follow-2)")
    line_of(emacs, "evaluate-lisp", ":ew-follow-2")
    assert emacs.eval('(with-current-buffer "*cl-mcp*" (point))') == "1"
    emacs.eval('(with-current-buffer "*cl-mcp*" (goto-char (point-max)))')


def test_stop_on_a_line_stops_that_call_and_only_while_it_runs(shared):
    process, emacs = shared.process, shared.watching
    assert not process.call("evaluate-lisp", code="(list :ew-stop-finished)")["isError"]
    line_of(emacs, "evaluate-lisp", ":ew-stop-finished")
    request = process.start_request("tools/call", {"name": "evaluate-lisp",
                                                   "arguments": {"code": "(progn :ew-stop-me (sleep 30))"}})
    wait_for(lambda: any(":ew-stop-me" in line and "running..." in line for line in buffer_lines(emacs)),
             "the running line")
    clear_messages(emacs)
    on_line(emacs, ":ew-stop-finished", "(cl-mcp-stop)")
    wait_for(lambda: "has ended: nothing to stop" in messages_of(emacs), "Stop's message")
    time.sleep(1)
    assert not process.answered(request)  # the running call was left alone
    on_line(emacs, ":ew-stop-me", "(cl-mcp-stop)")
    answer = process.response(request, timeout=60)["result"]
    assert "CL-MCP:CANCELLED-BY-PROGRAMMER" in text(answer), answer
    assert "cancelled by the programmer" in line_of(emacs, "evaluate-lisp", ":ew-stop-me")


def test_jump_goes_to_where_an_edit_put_its_form_and_says_when_an_evaluation_waits_no_more(shared):
    process, emacs = shared.process, shared.watching
    path = shared.home / "ew-jump-edit.lisp"
    path.write_text("(in-package #:cl-user)\n\n(defun ew-first () 1)\n\n(defun ew-jumped () 2)\n")
    edited = process.call("edit-form", path=str(path), form="defun ew-jumped",
                          text="(defun ew-jumped ()\n  3)")
    assert not edited["isError"], edited
    jump_from(emacs, "edit-form", "defun ew-jumped")
    assert json.loads(emacs.eval("(buffer-file-name (window-buffer (selected-window)))")) == str(path)
    assert emacs.eval("(with-current-buffer (window-buffer (selected-window)) (line-number-at-pos))") == "5"
    failed = process.call("evaluate-lisp", code='(error "ew-waits")')
    assert failed["isError"]
    line_of(emacs, "evaluate-lisp", "ew-waits")
    assert not process.call("invoke-restart", restart="abort")["isError"]
    clear_messages(emacs)
    jump_from(emacs, "evaluate-lisp", "ew-waits")
    wait_for(lambda: "no longer waits at its error" in messages_of(emacs), "Jump's message")


def test_the_hold_shows_in_every_mode_line_and_the_keys_work_in_every_buffer(shared):
    emacs = shared.watching
    some = '(get-buffer-create "ew-some-buffer.lisp")'
    mode_line = f"(format-mode-line mode-line-format nil nil {some})"
    for key, command in (("s", "cl-mcp-stop"), ("h", "cl-mcp-hold"), ("r", "cl-mcp-release"),
                         ("b", "cl-mcp-show")):
        assert emacs.eval(f'(with-current-buffer {some} (key-binding (kbd "C-c ; {key}")))') == command
    assert "cl-mcp HELD" not in emacs.eval(mode_line)
    emacs.eval(f'(with-current-buffer {some} (call-interactively (key-binding (kbd "C-c ; h"))))')
    try:
        for each in (emacs, shared.second):  # every Emacs that watches
            wait_for(lambda: "cl-mcp HELD" in each.eval(mode_line), "the hold in the mode line")
    finally:
        emacs.eval(f'(with-current-buffer {some} (call-interactively (key-binding (kbd "C-c ; r"))))')
    for each in (emacs, shared.second):
        wait_for(lambda: "cl-mcp HELD" not in each.eval(mode_line), "the release in the mode line")


def test_a_hold_ends_when_no_emacs_that_could_release_it_is_connected(shared):
    """Last: it disconnects the Emacs that watch."""
    process = shared.process
    holds = watch_buffer(shared.watching).count("holds the assistant")
    shared.second.eval("(cl-mcp-hold)")
    wait_for(lambda: watch_buffer(shared.watching).count("holds the assistant") > holds, "the hold")
    assert "PAUSED-BY-PROGRAMMER" in text(process.call("evaluate-lisp", code="(+ 1 2)"))
    for emacs in (shared.watching, shared.second):
        emacs.eval("(slime-disconnect-all)")
    wait_for(lambda: "PAUSED" not in text(process.call("evaluate-lisp", code="(+ 3 4)")),
             "the hold ended")
    assert process.eval("(+ 3 4)") == ("=> 7", False)
    # With no Emacs watching, the image keeps neither the hook nor the sender.
    leftovers = ('(list (and (member (quote cl-mcp-agent::watch-event-hook) swank::*event-hook*) t) '
                 '(and (find "cl-mcp watch sender" (sb-thread:list-all-threads) '
                 ':key (function sb-thread:thread-name) :test (function equal)) t))')
    wait_for(lambda: process.eval(leftovers) == ("=> (NIL NIL)", False), "the watch's hook and sender gone")
