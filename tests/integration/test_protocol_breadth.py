"""Revisions, batches, cancellation, progress and logging, over raw pipes."""

import json
import time

import pytest

from tests.integration.conftest import McpProcess

MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "0"}}


def eval_params(code, **meta):
    params = {"name": "evaluate-lisp", "arguments": {"code": code}}
    if meta:
        params["_meta"] = meta
    return params


def notifications(process, method):
    return [m for m in process.seen if m.get("method") == method]


def answers_to(process, request_id):
    """Every response to REQUEST_ID cl-mcp has written so far, read or not."""
    return [m for m in map(json.loads, list(process.raw_lines))
            if isinstance(m, dict) and m.get("id") == request_id and "method" not in m]


@pytest.fixture
def raw():
    process = McpProcess()
    process.seen = []
    original = process.messages.get

    def get(*args, **kwargs):  # keep every message, notifications included
        message = original(*args, **kwargs)
        if message is not None:
            process.seen.append(message)
        return message
    process.messages.get = get
    yield process
    process.close()


# ---------------------------------------------------------------- 2026-07-28

def test_discover(raw):
    result = raw.request("server/discover", {"_meta": MODERN_META})["result"]
    assert "2026-07-28" in result["supportedVersions"] and "2024-11-05" in result["supportedVersions"]
    assert result["capabilities"]["tools"] == {"listChanged": False}
    assert result["resultType"] == "complete"
    assert result["ttlMs"] >= 0 and result["cacheScope"] in ("public", "private")
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "cl-mcp"


def test_stateless_requests_without_initialize(raw):
    listed = raw.request("tools/list", {"_meta": MODERN_META})["result"]
    assert listed["resultType"] == "complete" and "ttlMs" in listed and "cacheScope" in listed
    assert all("annotations" in tool for tool in listed["tools"])
    called = raw.request("tools/call", eval_params("(+ 1 2)", **MODERN_META))["result"]
    assert called["content"][0]["text"] == "=> 3\n\n; Evaluation 1"
    assert called["resultType"] == "complete"


def test_unsupported_modern_version(raw):
    meta = {**MODERN_META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
    error = raw.request("tools/list", {"_meta": meta})["error"]
    assert error["code"] == -32022
    assert error["data"]["requested"] == "2099-01-01"
    assert "2026-07-28" in error["data"]["supported"]


def test_missing_client_capabilities(raw):
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}
    assert raw.request("tools/list", {"_meta": meta})["error"]["code"] == -32602


def test_legacy_results_carry_no_modern_fields(raw):
    raw.initialize("2025-11-25")
    result = raw.request("tools/list")["result"]
    assert "resultType" not in result and "ttlMs" not in result
    called = raw.request("tools/call", eval_params("1"))["result"]
    assert "resultType" not in called


# ---------------------------------------------------------------- batches

def test_batches_under_2025_03_26(raw):
    raw.initialize("2025-03-26")
    raw.send_raw(b'[{"jsonrpc":"2.0","id":"b1","method":"ping"},'
                 b'{"jsonrpc":"2.0","method":"notifications/initialized"},'
                 b'{"jsonrpc":"2.0","id":"b2","method":"tools/call","params":'
                 b'{"name":"evaluate-lisp","arguments":{"code":"(+ 40 2)"}}},'
                 b'{"jsonrpc":"2.0","id":"b3","method":"initialize","params":{"protocolVersion":"2025-03-26"}}]\n')
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        batch = [line for line in raw.raw_lines if line.startswith(b"[")]
        if batch:
            break
        time.sleep(0.05)
    import json
    responses = {r["id"]: r for r in json.loads(batch[0])}
    assert set(responses) == {"b1", "b2", "b3"}
    assert responses["b1"]["result"] == {}
    assert responses["b2"]["result"]["content"][0]["text"].startswith("=> 42\n\n; Evaluation ")
    assert responses["b3"]["error"]["code"] == -32600


def test_empty_batch(raw):
    raw.initialize("2025-03-26")
    raw.send_raw(b"[]\n")
    assert raw.response(None)["error"]["code"] == -32600


@pytest.mark.parametrize("version", ["2024-11-05", "2025-06-18", "2025-11-25"])
def test_batches_rejected_in_other_revisions(raw, version):
    raw.initialize(version)
    raw.send_raw(b'[{"jsonrpc":"2.0","id":"x","method":"ping"}]\n')
    assert raw.response(None)["error"]["code"] == -32600


# ---------------------------------------------------------------- cancellation

def test_cancel_a_running_evaluation(raw):
    raw.initialize()
    raw.eval("(defvar *reached* nil)")
    slow = raw.start_request("tools/call", eval_params("(sleep 100) (setf *reached* t)"))
    time.sleep(0.5)
    started = time.monotonic()
    raw.notify("notifications/cancelled", {"requestId": slow, "reason": "user"})
    assert raw.eval("(list *reached* (+ 1 1))") == ("=> (NIL 2)", False)
    assert time.monotonic() - started < 50  # a session that waited for the sleep took 100 s
    time.sleep(0.3)
    assert not answers_to(raw, slow)  # never answered


def test_cancel_a_queued_evaluation(raw):
    raw.initialize()
    first = raw.start_request("tools/call", eval_params("(sleep 1) :first"))
    queued = raw.start_request("tools/call", eval_params(":queued"))
    raw.notify("notifications/cancelled", {"requestId": queued})
    assert raw.response(first)["result"]["content"][0]["text"] == "=> :FIRST\n\n; Evaluation 1"
    assert raw.eval(":after") == ("=> :AFTER", False)
    time.sleep(0.3)
    assert not answers_to(raw, queued)


def test_cancel_unknown_or_finished_ids_is_ignored(raw):
    raw.initialize()
    done = raw.start_request("ping")
    raw.response(done)
    raw.notify("notifications/cancelled", {"requestId": done})
    raw.notify("notifications/cancelled", {"requestId": "never-sent"})
    raw.notify("notifications/cancelled", {})
    assert raw.request("ping")["result"] == {}


# ---------------------------------------------------------------- progress

def test_progress_during_a_long_evaluation(raw):
    raw.initialize()
    code = '(dotimes (i 5) (format t "step ~a~%" i) (sleep 0.5)) :done'
    params = {**eval_params(code), "_meta": {"progressToken": "tok-1"}}
    request_id = raw.start_request("tools/call", params)
    response = raw.response(request_id)
    assert response["result"]["content"][0]["text"].endswith("=> :DONE\n\n; Evaluation 1")
    # Every progress notification came before the response.
    position = raw.seen.index(response)
    progress = [m["params"] for m in raw.seen[:position] if m.get("method") == "notifications/progress"]
    assert len(progress) >= 2
    assert all(p["progressToken"] == "tok-1" for p in progress)
    values = [p["progress"] for p in progress]
    assert values == sorted(set(values))
    assert "running for" in progress[-1]["message"]
    assert any("latest output: step" in p["message"] for p in progress)
    time.sleep(0.6)
    assert len(notifications(raw, "notifications/progress")) == len(progress)


def test_no_progress_without_a_token(raw):
    raw.initialize()
    raw.eval("(sleep 1.2)")
    assert notifications(raw, "notifications/progress") == []


# ---------------------------------------------------------------- logging

def test_logging_capability_and_set_level(raw):
    result = raw.initialize()
    assert result["capabilities"]["logging"] == {}
    assert raw.request("logging/setLevel", {"level": "info"})["result"] == {}
    assert raw.request("logging/setLevel", {"level": "loud"})["error"]["code"] == -32602
    assert raw.request("logging/setLevel", {})["error"]["code"] == -32602


def test_image_loss_is_logged_to_the_client(raw):
    raw.initialize()
    raw.eval("(sb-ext:exit :abort t)")
    raw.eval("1")
    messages = notifications(raw, "notifications/message")
    assert any(m["params"]["level"] == "warning" and "state was lost" in m["params"]["data"]
               for m in messages)


def test_truncated_output_is_logged_to_the_client():
    process = McpProcess("--max-output", "1000")
    process.seen = []
    try:
        process.initialize()
        process.eval('(dotimes (i 300) (write-string "abcdefghij"))')
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if any(b"truncated" in line and b"notifications/message" in line for line in process.raw_lines):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("no log message about the truncation")
    finally:
        process.close()
