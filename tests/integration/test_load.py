"""Bursts of requests written at once: every one answered, the evaluations
in arrival order, cl-mcp's memory bounded, even when the client is slow to
read."""

import json
import subprocess
import threading
import time
from pathlib import Path

from tests.integration.conftest import cl_mcp, cl_mcp_command


def resident_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_burst_of_a_thousand_requests():
    with cl_mcp("--log-level", "warning") as process:
        process.eval("(defvar *seen* nil)")
        lines = []
        for i in range(1000):
            if i % 4 == 3:
                lines.append({"jsonrpc": "2.0", "id": f"p{i}", "method": "ping"})
            else:
                lines.append({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                    "name": "evaluate-lisp", "arguments": {"code": f"(push {i} *seen*) {i}"}}})
        process.send_raw(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        for line in lines:
            response = process.response(line["id"], timeout=120)
            if line["method"] == "ping":
                assert response["result"] == {}
            else:
                assert response["result"]["content"][0]["text"] == (
                    f"=> {line['id']}\n\n; Evaluation {response['result']['structuredContent']['number']}")
        order = [line["id"] for line in lines if line["method"] == "tools/call"]
        text, _ = process.eval("(length *seen*)")
        assert text == f"=> {len(order)}"
        # Arrival order, checked in the image: *SEEN* is the pushes reversed.
        text, _ = process.eval(f"(equal (reverse *seen*) '({' '.join(map(str, order))}))")
        assert text == "=> T"
        assert resident_kib(process.proc.pid) < 150_000


def test_a_client_that_does_not_read_cannot_pile_up_answers():
    """5,000 tools/list requests (~240 MB of answers, 47 KB each) from a client that
    reads nothing for a while: cl-mcp stops reading requests once 4 MB of
    answers wait, so its memory stays bounded, and every answer comes."""
    proc = subprocess.Popen(cl_mcp_command() + ["--log-level", "warning"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}}).encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 0
        count = 5_000
        requests = b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"tools/list"}\n' % i
                            for i in range(1, count + 1))
        writer = threading.Thread(target=lambda: (proc.stdin.write(requests), proc.stdin.flush()))
        writer.start()
        time.sleep(3)
        assert resident_kib(proc.pid) < 120_000
        ids = [json.loads(proc.stdout.readline())["id"] for _ in range(count)]
        assert sorted(ids) == list(range(1, count + 1))
        writer.join(10)
    except BaseException:
        proc.kill()  # else closing stdin waits for the writer, blocked in its write
        raise
    finally:
        proc.stdin.close()
        proc.wait(10)


def test_cl_mcp_ends_when_its_reader_goes_away_while_it_waits_for_it():
    """Reading requests is paused while answers wait unread; if the client
    then closes its end of stdout, cl-mcp must still notice and exit."""
    proc = subprocess.Popen(cl_mcp_command() + ["--log-level", "warning"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        requests = b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"tools/list"}\n' % i
                            for i in range(1, 20_001))
        def write() -> None:
            try:
                proc.stdin.write(requests)
            except (BrokenPipeError, ValueError):  # cl-mcp has gone, as it should
                pass

        threading.Thread(target=write, daemon=True).start()
        time.sleep(2)  # answers pile up, reading pauses
        proc.stdout.close()
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
