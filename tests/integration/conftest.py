"""Real SBCL, real Swank, the installed `cl-mcp` over real pipes.

A missing SBCL or Swank is a loud failure, never a skip: these tests are
the proof that the server works.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cl_mcp.lisp.image import find_slime_dir
from cl_mcp.results.render import without_number_line

RESPONSE_TIMEOUT = 60.0


def cl_mcp_command() -> list[str]:
    """The console script installed beside this Python."""
    script = Path(sys.executable).parent / "cl-mcp"
    if not script.exists():
        pytest.fail(f"cl-mcp is not installed in {script.parent}; run `make test`")
    return [str(script)]


@pytest.fixture(scope="session", autouse=True)
def require_lisp() -> None:
    if shutil.which("sbcl") is None:
        pytest.fail("SBCL is not installed: run `make test`, which installs it (apt-get install sbcl)")
    find_slime_dir()  # raises with a clear message when cl-swank is missing


class McpProcess:
    """cl-mcp as an MCP host runs it: a child process spoken to over pipes."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            cl_mcp_command() + list(args),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )
        self._ids = itertools.count(1000)
        self.messages: queue.Queue[Any] = queue.Queue()
        self.raw_lines: list[bytes] = []
        self.stderr_lines: list[str] = []
        self._responses: dict[Any, Any] = {}
        self.null_responses: list[dict[str, Any]] = []  # answers to unreadable requests
        threading.Thread(target=self._read_stdout, daemon=True).start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()

    def _read_stdout(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.raw_lines.append(line)
            self.messages.put(json.loads(line))
        self.messages.put(None)

    def _read_stderr(self) -> None:
        assert self.proc.stderr
        for line in self.proc.stderr:
            self.stderr_lines.append(line.decode("utf-8", "replace"))

    # ------------------------------------------------------------ sending

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.send_raw(json.dumps(message).encode() + b"\n")

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def start_request(self, method: str, params: dict[str, Any] | None = None) -> int:
        request_id = next(self._ids)
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return request_id

    def request(self, method: str, params: dict[str, Any] | None = None,
                timeout: float = RESPONSE_TIMEOUT) -> dict[str, Any]:
        return self.response(self.start_request(method, params), timeout)

    # ------------------------------------------------------------ receiving

    def response(self, request_id: Any, timeout: float = RESPONSE_TIMEOUT) -> dict[str, Any]:
        """The response to REQUEST_ID; with None, the next response whose id
        is null (an unparseable or invalid request)."""
        deadline = time.monotonic() + timeout
        while not (self.null_responses if request_id is None else request_id in self._responses):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no response to {request_id!r} within {timeout} s;"
                                     f" stderr tail: {''.join(self.stderr_lines[-20:])}")
            try:
                message = self.messages.get(timeout=remaining)
            except queue.Empty:
                continue
            if message is None:
                raise AssertionError(f"cl-mcp closed stdout; stderr tail: {''.join(self.stderr_lines[-20:])}")
            self._file(message)
        if request_id is None:
            return self.null_responses.pop(0)
        return self._responses.pop(request_id)

    def answered(self, request_id: Any) -> bool:
        """True when the response to REQUEST_ID has come (it stays for
        `response` to take): the order of events, without waiting."""
        while True:
            try:
                message = self.messages.get_nowait()
            except queue.Empty:
                return request_id in self._responses
            if message is None:
                self.messages.put(None)  # for `response` to report
                return request_id in self._responses
            self._file(message)

    def _file(self, message: dict[str, Any]) -> None:
        """Keep MESSAGE when it is a response, by its id."""
        if "id" in message and "method" not in message:
            if message["id"] is None:
                self.null_responses.append(message)
                return
            assert message["id"] not in self._responses, f"two responses to {message['id']!r}"
            self._responses[message["id"]] = message

    def call(self, tool: str, wait: float = RESPONSE_TIMEOUT, **arguments: Any) -> dict[str, Any]:
        """tools/call; returns the result (fails on a JSON-RPC error)."""
        response = self.request("tools/call", {"name": tool, "arguments": arguments}, wait)
        assert "result" in response, response
        return response["result"]

    def eval(self, code: str, **arguments: Any) -> tuple[str, bool]:
        """evaluate-lisp's text and isError, the text without the `; Evaluation
        N` line that ends it when the evaluation has a number: most tests do
        not know N, which counts every evaluation since the image started.
        test_evaluate.py and test_restarts.py check that line (`call`)."""
        result = self.call("evaluate-lisp", code=code, **arguments)
        assert [c["type"] for c in result["content"]] == ["text"]
        return without_number_line(result["content"][0]["text"]), result["isError"]

    def initialize(self, version: str = "2025-11-25") -> dict[str, Any]:
        response = self.request("initialize", {
            "protocolVersion": version, "capabilities": {},
            "clientInfo": {"name": "cl-mcp-tests", "version": "0"}})
        self.notify("notifications/initialized")
        return response["result"]

    # ------------------------------------------------------------ ending

    def close(self, timeout: float = 10.0) -> int:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("cl-mcp did not exit after stdin closed")
        self._stderr_reader.join(5)  # stderr_lines complete
        return returncode


@contextmanager
def cl_mcp(*args: str, version: str = "2025-11-25", env: dict[str, str] | None = None):
    """A fresh cl-mcp with these options, initialized, closed afterwards."""
    process = McpProcess(*args, env=env)
    try:
        process.initialize(version)
        yield process
    finally:
        process.close()


@pytest.fixture
def server():
    """A fresh cl-mcp, initialized."""
    process = McpProcess()
    process.initialize()
    yield process
    process.close()


@pytest.fixture(scope="module")
def shared_server():
    """One cl-mcp for a module's tests that leave nothing behind."""
    process = McpProcess()
    process.initialize()
    yield process
    process.close()


def sbcl_children(pid: int) -> list[int]:
    """PIDs of SBCL processes whose parent is PID."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,comm="], capture_output=True, text=True).stdout
    return [int(p) for p, pp, comm in (line.split(None, 2) for line in out.splitlines())
            if int(pp) == pid and comm.strip() == "sbcl"]


def processes_naming(text: str) -> list[int]:
    """PIDs of the processes whose command line holds TEXT."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:  # gone meanwhile
            pass
    return pids


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def listening_ports(pid: int) -> list[tuple[str, int]]:
    """(address, port) of the TCP sockets PID listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:
                address, port = local.split(":")
                if len(address) == 8:
                    address = ".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0))
                found.append((address, int(port, 16)))
    return found
