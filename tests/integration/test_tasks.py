"""MCP tasks over raw pipes, in both revisions that have them: 2025-11-25's
experimental tasks (asked for with `task`) and 2026-07-28's
io.modelcontextprotocol/tasks extension (the server turns a call still
running at its answer window into a task)."""

import json
import time

import pytest

from tests.integration.conftest import McpProcess
from tests.integration.devtools import FIXTURE

MODERN = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
          "io.modelcontextprotocol/clientCapabilities": {}}
WITH_TASKS = {**MODERN, "io.modelcontextprotocol/clientCapabilities": {
    "extensions": {"io.modelcontextprotocol/tasks": {}}}}


@pytest.fixture(scope="module")
def legacy():
    process = McpProcess()
    process.initialize("2025-11-25")
    yield process
    process.close()


def start_task(process, tool, arguments, ttl=60_000):
    response = process.request("tools/call", {"name": tool, "arguments": arguments, "task": {"ttl": ttl}})
    task = response["result"]["task"]
    assert task["status"] == "working" and task["ttl"] == ttl and task["pollInterval"] > 0
    assert task["createdAt"].endswith("Z") and task["lastUpdatedAt"].endswith("Z")
    return task["taskId"]


def task_status(process, task_id, **meta):
    params = {"taskId": task_id, **({"_meta": meta} if meta else {})}
    return process.request("tasks/get", params)["result"]


def status_notifications(process, task_id):
    messages = (json.loads(line) for line in list(process.raw_lines))
    return [message["params"]["status"] for message in messages
            if message.get("method") == "notifications/tasks/status"
            and message["params"]["taskId"] == task_id]


# ---------------------------------------------------------------- 2025-11-25

def test_tasks_are_declared_only_in_2025_11_25(legacy):
    capabilities = legacy.request("initialize", {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}})["result"]["capabilities"]
    assert capabilities["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    tools = {tool["name"]: tool for tool in legacy.request("tools/list")["result"]["tools"]}
    supported = {name for name, tool in tools.items() if tool.get("execution")}
    assert supported == {"evaluate-lisp", "load-system", "compile-file"}
    assert all(tools[name]["execution"] == {"taskSupport": "optional"} for name in supported)
    older = McpProcess()
    try:
        assert "tasks" not in older.initialize("2025-06-18")["capabilities"]
        assert not any("execution" in tool for tool in older.request("tools/list")["result"]["tools"])
        assert older.request("tasks/list")["error"]["code"] == -32601
    finally:
        older.close()


def test_an_evaluation_as_a_task(legacy):
    task_id = start_task(legacy, "evaluate-lisp", {"code": '(progn (write-line "begun") (sleep 3) 42)'})
    # The session serves other calls while the task runs.
    assert legacy.eval("(+ 1 2)") == ("=> 3", False)
    time.sleep(1.5)
    working = task_status(legacy, task_id)
    assert working["status"] == "working" and "latest output: begun" in working["statusMessage"]
    assert task_id in [task["taskId"] for task in legacy.request("tasks/list")["result"]["tasks"]]
    result = legacy.request("tasks/result", {"taskId": task_id})["result"]
    assert result["content"][0]["text"] == "[stdout]\nbegun\n\n=> 42"
    assert result["structuredContent"]["values"] == ["42"]
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    assert task_status(legacy, task_id)["status"] == "completed"
    assert status_notifications(legacy, task_id) == ["completed"]


def test_a_quick_task_and_a_failing_one(legacy):
    quick = start_task(legacy, "evaluate-lisp", {"code": "(* 6 7)"})
    assert legacy.request("tasks/result", {"taskId": quick})["result"]["content"][0]["text"] == "=> 42"
    failing = start_task(legacy, "evaluate-lisp", {"code": '(error "no luck")'})
    result = legacy.request("tasks/result", {"taskId": failing})["result"]
    assert result["isError"] and result["content"][0]["text"].startswith("[ERROR] SIMPLE-ERROR\nno luck")
    # 2025-11-25 counts a tool error as a failed task.
    assert task_status(legacy, failing)["status"] == "failed"
    legacy.call("invoke-restart", restart="ABORT")


def test_cancelling_a_task_stops_its_evaluation(legacy):
    task_id = start_task(legacy, "evaluate-lisp",
                         {"code": "(progn (sleep 3) (setf (get :cl-mcp-task :finished) t))"})
    time.sleep(1.5)  # in the background by now
    cancelled = legacy.request("tasks/cancel", {"taskId": task_id})["result"]
    assert cancelled["status"] == "cancelled" and cancelled["taskId"] == task_id
    time.sleep(3)
    assert legacy.eval("(get :cl-mcp-task :finished)") == ("=> NIL", False)
    assert task_status(legacy, task_id)["status"] == "cancelled"
    again = legacy.request("tasks/cancel", {"taskId": task_id})
    assert again["error"]["code"] == -32602
    result = legacy.request("tasks/result", {"taskId": task_id})["result"]
    assert result["isError"] and "CANCELLED" in result["content"][0]["text"]


def test_load_system_and_compile_file_as_tasks(legacy, tmp_path):
    source = tmp_path / "task-file.lisp"
    source.write_text("(defun task-file-function (x) (* x 3))\n")
    compiled = start_task(legacy, "compile-file", {"path": str(source)})
    result = legacy.request("tasks/result", {"taskId": compiled})["result"]
    assert not result["isError"], result
    assert legacy.eval("(task-file-function 5)") == ("=> 15", False)
    legacy.eval(f'(asdf:load-asd "{FIXTURE}/cl-mcp-fixture.asd")')
    loaded = start_task(legacy, "load-system", {"system": "cl-mcp-fixture"})
    result = legacy.request("tasks/result", {"taskId": loaded})["result"]
    assert not result["isError"] and result["structuredContent"]["system"] == "cl-mcp-fixture", result


def test_what_cannot_be_a_task(legacy):
    refused = legacy.request("tools/call", {"name": "apropos", "arguments": {"pattern": "car"}, "task": {}})
    assert refused["error"]["code"] == -32601
    unknown = legacy.request("tasks/get", {"taskId": "no-such-task"})
    assert unknown["error"]["code"] == -32602
    assert legacy.request("tasks/update", {"taskId": "x", "inputResponses": {}})["error"]["code"] == -32601


# ---------------------------------------------------------------- 2026-07-28

@pytest.fixture(scope="module")
def modern():
    process = McpProcess("--answer-within", "1")
    yield process
    process.close()


def modern_call(process, code, meta):
    return process.request("tools/call", {"name": "evaluate-lisp", "arguments": {"code": code},
                                          "_meta": meta})["result"]


def test_the_extension_is_declared(modern):
    result = modern.request("server/discover", {"_meta": MODERN})["result"]
    assert result["capabilities"]["extensions"] == {"io.modelcontextprotocol/tasks": {}}
    tools = modern.request("tools/list", {"_meta": MODERN})["result"]["tools"]
    assert not any("execution" in tool for tool in tools)


def test_a_call_still_running_at_its_window_becomes_a_task(modern):
    created = modern_call(modern, '(progn (write-line "long") (sleep 4) :done)', WITH_TASKS)
    assert created["resultType"] == "task" and created["status"] == "working", created
    assert created["ttlMs"] > 0 and created["pollIntervalMs"] > 0
    task_id = created["taskId"]
    assert modern_call(modern, "(+ 1 2)", WITH_TASKS)["content"][0]["text"] == "=> 3"
    deadline = time.monotonic() + 30
    while (task := task_status(modern, task_id, **WITH_TASKS))["status"] == "working":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert task["status"] == "completed" and task["resultType"] == "complete"
    assert task["result"]["content"][0]["text"] == "[stdout]\nlong\n\n=> :DONE"


def test_modern_cancel_and_the_methods_it_lacks(modern):
    created = modern_call(modern, "(progn (sleep 4) (setf (get :cl-mcp-task :modern) t))", WITH_TASKS)
    task_id = created["taskId"]
    assert modern.request("tasks/cancel", {"taskId": task_id, "_meta": WITH_TASKS})["result"] == {
        "resultType": "complete", "_meta": created["_meta"]}
    time.sleep(4)
    assert task_status(modern, task_id, **WITH_TASKS)["status"] == "cancelled"
    assert modern_call(modern, "(get :cl-mcp-task :modern)", MODERN)["content"][0]["text"] == "=> NIL"
    for method in ("tasks/result", "tasks/list"):
        response = modern.request(method, {"taskId": task_id, "_meta": WITH_TASKS})
        assert response["error"]["code"] == -32601, method
    ack = modern.request("tasks/update", {"taskId": task_id, "inputResponses": {}, "_meta": WITH_TASKS})
    assert ack["result"]["resultType"] == "complete"


def test_no_task_for_a_client_without_the_extension(modern):
    result = modern_call(modern, "(sleep 2)", MODERN)
    assert result["resultType"] == "complete" and result["structuredContent"]["running"]
    number = result["structuredContent"]["number"]
    outcome = modern.request("tools/call", {"name": "await-evaluation",
                                            "arguments": {"evaluation": number, "wait": 10},
                                            "_meta": MODERN})["result"]
    assert outcome["content"][0]["text"] == "=> NIL"
