"""`cl-mcp repl`: a small interactive loop over one cl-mcp session, for a
person at a terminal.  History (readline, kept in ~/.cl_mcp_history) and
multi-line input: a form is sent once its parentheses balance.  Ctrl-C
cancels a running evaluation; Ctrl-D or :quit leaves."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
from pathlib import Path

from cl_mcp.cli.commands import ProgressPrinter, own_server, split_server_options
from cl_mcp.client import McpClient, ToolResult
from cl_mcp.errors import ClMcpError

HISTORY = Path.home() / ".cl_mcp_history"
HELP = """Type Lisp forms; a form is evaluated once its parentheses balance.
  :restart N|NAME   continue the evaluation waiting at an error
  :bt               its backtrace
  :output [N] [RE]  the output of evaluation N (default: the last), or its lines matching RE
  :reset            a fresh session
  :quit             leave (or Ctrl-D)"""


def form_is_complete(text: str) -> bool:
    """True when TEXT holds whole forms: parentheses balance outside
    strings, comments, |symbols| and character literals."""
    depth = 0
    i = 0
    in_string = in_bars = False
    while i < len(text):
        char = text[i]
        if in_string:
            if char == "\\":
                i += 1
            elif char == '"':
                in_string = False
        elif in_bars:
            if char == "|":
                in_bars = False
        elif char == ";":
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline
        elif char == "#" and text.startswith("#\\", i):
            i += 2
        elif char == "#" and text.startswith("#|", i):
            end = text.find("|#", i + 2)
            if end < 0:
                return False
            i = end + 1
        elif char == '"':
            in_string = True
        elif char == "|":
            in_bars = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        i += 1
    return depth <= 0 and not in_string and not in_bars


def setup_history() -> None:
    try:
        import readline
    except ImportError:  # no readline on this Python: plain input() still works
        return
    try:
        readline.read_history_file(HISTORY)
    except OSError:
        pass
    readline.set_history_length(1000)
    import atexit
    atexit.register(lambda: _save_history(readline))


def _save_history(readline: object) -> None:
    try:
        readline.write_history_file(HISTORY)  # type: ignore[attr-defined]
    except OSError:
        pass


def read_form(package: str) -> str | None:
    """One complete input from the person, or None at end of input."""
    prompt = f"{short_package(package)}> "
    lines: list[str] = []
    while True:
        try:
            line = input(prompt if not lines else " " * (len(prompt) - 2) + ". ")
        except EOFError:
            return None
        lines.append(line)
        text = "\n".join(lines)
        if not text.strip():
            lines = []
            continue
        if text.lstrip().startswith(":") or form_is_complete(text):
            return text


def short_package(name: str) -> str:
    return {"COMMON-LISP-USER": "CL-USER", "COMMON-LISP": "CL"}.get(name, name)


class BackgroundLoop:
    """An asyncio loop in a thread of its own, so that the terminal stays in
    the main thread, where Ctrl-C arrives as KeyboardInterrupt."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine, timeout: float | None = None):  # type: ignore[no-untyped-def]
        """Run COROUTINE there and wait (up to TIMEOUT); Ctrl-C cancels it
        and re-raises."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(timeout)
        except KeyboardInterrupt:
            future.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


def command_call(text: str, last: int | None = None) -> tuple[str, dict[str, object]] | None:
    """The tool call an input stands for (LAST: the number of the last
    evaluation); None for :help."""
    command = text.strip()
    if command == ":reset":
        return "reset-session", {}
    if command == ":bt":
        return "backtrace", {}
    if command.startswith(":restart"):
        designator = command.split(maxsplit=1)[1] if " " in command else "0"
        return "invoke-restart", {"restart": int(designator) if designator.isdigit() else designator}
    if command == ":output" or command.startswith(":output "):
        rest = command.removeprefix(":output").strip()
        number, _, pattern = rest.partition(" ") if rest[:1].isdigit() else ("", "", rest)
        arguments: dict[str, object] = {"evaluation": int(number) if number else last or 0}
        return "read-output", {**arguments, **({"pattern": pattern.strip()} if pattern.strip() else {})}
    if command == ":help":
        return None
    return "evaluate-lisp", {"code": text}


async def outcome_of(client: McpClient, call: tuple[str, dict[str, object]]) -> ToolResult:
    """CALL's result; for an evaluation still running in the background,
    its outcome, waited for (a terminal has no tool timeout)."""
    result = await client.call_tool(*call, progress=ProgressPrinter())
    return await client.outcome(result, progress=ProgressPrinter())


def repl(server_args: list[str]) -> int:
    background = BackgroundLoop()
    client = McpClient(own_server(server_args, terminal=True), protocol_version="2025-11-25")
    try:
        background.run(client.start())
        print(f"cl-mcp REPL ({client.server_info.get('name')} {client.server_info.get('version')}); "
              ":help for commands, Ctrl-D to leave.")
        package = "COMMON-LISP-USER"
        last: int | None = None  # the number of the last evaluation, for :output
        while True:
            try:
                text = read_form(package)
            except KeyboardInterrupt:
                print()
                continue
            if text is None or text.strip() in (":quit", ":q", ":exit"):
                print()
                return 0
            call = command_call(text, last)
            if call is None:
                print(HELP)
                continue
            try:
                result = background.run(outcome_of(client, call))
            except KeyboardInterrupt:
                print("; cancelled")
                continue
            except ClMcpError as error:  # the client's, or a JSON-RPC error answered
                print(f"; {error}")
                continue
            print(result.text)
            if isinstance(result.structured_content, dict):
                package = str(result.structured_content.get("package", package))
                last = result.structured_content.get("number", last)
    finally:
        try:
            background.run(client.close(), timeout=10)
        except Exception:  # leaving anyway; the server is in a session of its own
            pass
        finally:
            background.stop()


def repl_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="cl-mcp repl", description="An interactive Lisp REPL over cl-mcp. Options not "
        "listed here are passed to the server (cl-mcp --help lists them).")
    own, server_args = split_server_options(argv)
    parser.parse_args(own)
    setup_history()
    if not sys.stdin.isatty():
        os.environ.setdefault("TERM", "dumb")
    try:
        return repl(server_args)
    except ClMcpError as error:
        print(f"cl-mcp: {error}", file=sys.stderr)
        return 2
