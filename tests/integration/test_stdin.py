"""Any stdin: a process manager's /dev/null, a file of requests, a pipe, a
closed descriptor.  Each is read to its end, every request read is
answered, then cl-mcp exits 0, with no traceback and no SBCL left behind."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from unittest.mock import ANY

import pytest

from tests.integration.conftest import cl_mcp_command, processes_naming

REQUESTS = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize",
     "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "test_stdin", "version": "0"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
     "params": {"name": "evaluate-lisp", "arguments": {"code": "(+ 1 2)"}}},
    # Still running when the input ends.
    {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
     "params": {"name": "evaluate-lisp", "arguments": {"code": "(sleep 2) :slept"}}},
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """XDG_CACHE_HOME of these runs: every SBCL they start names it in its
    command line (the agent's fasl), which tells whether one is left."""
    return tmp_path_factory.mktemp("xdg-cache")


def run_cl_mcp(cache_dir: Path, *args: str, **popen: object) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    out = subprocess.run([*cl_mcp_command(), "--no-saved-core", *args],
                         env={**os.environ, "XDG_CACHE_HOME": str(cache_dir)},
                         stderr=subprocess.PIPE, timeout=60, **popen)  # type: ignore[call-overload]
    return out, time.monotonic() - started


def assert_clean_exit(out: subprocess.CompletedProcess, cache_dir: Path) -> None:
    stderr = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert processes_naming(str(cache_dir)) == []


@pytest.mark.parametrize("stdout", [subprocess.PIPE, subprocess.DEVNULL], ids=["pipe", "devnull"])
def test_null_stdin_ends_at_once(cache_dir, stdout):
    out, seconds = run_cl_mcp(cache_dir, stdin=subprocess.DEVNULL, stdout=stdout)
    assert_clean_exit(out, cache_dir)
    assert seconds < 30  # at once; a cl-mcp that waited for input is killed at 60 s
    assert not out.stdout


def test_closed_stdin_ends_at_once(cache_dir):
    out, seconds = run_cl_mcp(cache_dir, stdout=subprocess.PIPE, preexec_fn=lambda: os.close(0))
    assert_clean_exit(out, cache_dir)
    assert seconds < 30  # at once; a cl-mcp that waited for input is killed at 60 s
    assert out.stdout == b""


def test_requests_in_a_file_are_all_answered_into_a_file(cache_dir, tmp_path):
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(message) + "\n" for message in REQUESTS))
    answers = tmp_path / "answers.jsonl"
    with requests.open("rb") as stdin, answers.open("wb") as stdout:
        out, _ = run_cl_mcp(cache_dir, stdin=stdin, stdout=stdout)
    assert_clean_exit(out, cache_dir)
    messages = [json.loads(line) for line in answers.read_text().splitlines()]
    by_id = {message["id"]: message for message in messages if "id" in message}
    assert sorted(by_id) == [1, 2, 3]
    assert "result" in by_id[1] and by_id[1]["result"]["serverInfo"]["name"] == "cl-mcp"
    assert by_id[2].get("result", by_id[2]) == {"content": [{"type": "text", "text": "=> 3\n\n; Evaluation 1"}],
                                                "isError": False, "structuredContent": ANY}
    assert by_id[3].get("result", by_id[3])["content"] == [{"type": "text", "text": "=> :SLEPT\n\n; Evaluation 2"}]


def test_requests_piped_in_are_answered_on_a_first_run(tmp_path):
    """The end of a pipe waits for the requests read before it, however long
    the image takes to start: on a first run (an empty HOME, so no cache) it
    compiles the agent and saves its core before the call can run."""
    home = tmp_path / "home"
    home.mkdir()
    environment = {name: value for name, value in os.environ.items() if name != "XDG_CACHE_HOME"}
    piped = "".join(json.dumps(message) + "\n" for message in REQUESTS[:3])
    out = subprocess.run(cl_mcp_command(), input=piped.encode(), env={**environment, "HOME": str(home)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr.decode("utf-8", "replace")
    by_id = {m["id"]: m for m in map(json.loads, out.stdout.splitlines()) if "id" in m}
    assert sorted(by_id) == [1, 2]
    assert by_id[2].get("result", by_id[2])["content"][0]["text"].partition("\n")[0] == "=> 3"
    assert list((home / ".cache" / "cl-mcp").glob("*.core")), "not a first run: no core was saved"
    assert processes_naming(str(home)) == []


def test_a_remote_connect_is_warned_about_on_stderr(cache_dir):
    # Nothing is connected: with no request, no connection is made.
    out, _ = run_cl_mcp(cache_dir, "--connect", "lisp.example.com:4006",
                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert_clean_exit(out, cache_dir)
    warnings = [line for line in out.stderr.decode().splitlines() if " WARNING " in line]
    assert len(warnings) == 1
    assert "clear text" in warnings[0]
    assert "ssh -L 4006:127.0.0.1:4006 lisp.example.com, then --connect 4006" in warnings[0]
