"""A burst of 1,000 requests written at once: every one answered, the
evaluations in arrival order, cl-mcp's memory bounded."""

import json
from pathlib import Path

from tests.integration.conftest import cl_mcp


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
                assert response["result"]["content"][0]["text"] == f"=> {line['id']}"
        order = [line["id"] for line in lines if line["method"] == "tools/call"]
        text, _ = process.eval("(length *seen*)")
        assert text == f"=> {len(order)}"
        # Arrival order, checked in the image: *SEEN* is the pushes reversed.
        text, _ = process.eval(f"(equal (reverse *seen*) '({' '.join(map(str, order))}))")
        assert text == "=> T"
        assert resident_kib(process.proc.pid) < 150_000
