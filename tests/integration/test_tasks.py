"""MCP tasks over raw pipes, in both revisions that have them: 2025-11-25's
experimental tasks (asked for with `task`) and 2026-07-28's
io.modelcontextprotocol/tasks extension (the server turns a call still
running at its answer window into a task)."""

import json
import signal
import threading
import time

import pytest

from cl_mcp.errors import SERVER_BUSY
from tests.integration.conftest import McpProcess, cl_mcp
from tests.integration.devtools import FIXTURE, FIXTURES
from tests.integration.test_intake import PeakSampler, is_python, resident_kib

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


# Without the intake limits on task calls cl-mcp grew ~90 MiB in the flood
# below (every call and its 2 MB kept); with them ~45 MiB: 32 MiB of queued
# requests, up to 1024 queued jobs (each a task, its runner's frames and a
# lock waiter), and transient copies of the line being parsed.
TASK_FLOOD_GROWTH_LIMIT_KIB = 64 * 1024


# ---------------------------------------------------------------- 2025-11-25

def test_tasks_are_declared_only_in_2025_11_25(legacy):
    capabilities = legacy.request("initialize", {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}})["result"]["capabilities"]
    assert capabilities["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    tools = {tool["name"]: tool for tool in legacy.request("tools/list")["result"]["tools"]}
    supported = {name for name, tool in tools.items() if tool.get("execution")}
    assert supported == {"evaluate-lisp", "load-system", "compile-file", "run-tests"}
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
    assert result["content"][0]["text"] == f"[stdout]\nbegun\n\n=> 42\n\n; Evaluation {result['structuredContent']['number']}"
    assert result["structuredContent"]["values"] == ["42"]
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
    assert task_status(legacy, task_id)["status"] == "completed"
    assert status_notifications(legacy, task_id) == ["completed"]


def test_a_quick_task_and_a_failing_one(legacy):
    quick = start_task(legacy, "evaluate-lisp", {"code": "(* 6 7)"})
    assert legacy.request("tasks/result", {"taskId": quick})["result"]["content"][0]["text"].startswith(
        "=> 42\n\n; Evaluation ")
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


def test_run_tests_as_a_task(legacy):
    legacy.eval(f'(asdf:load-asd "{FIXTURES}/run-tests-fixture/run-tests-fixture.asd")')
    task_id = start_task(legacy, "run-tests", {"system": "run-tests-fixture"})
    result = legacy.request("tasks/result", {"taskId": task_id})["result"]
    tests = result["structuredContent"]["tests"]
    assert (tests["passed"], tests["failed"], tests["errored"]) == (2, 1, 1), result
    # Failing tests make a tool error, which 2025-11-25 counts as a failed task.
    assert result["isError"] and task_status(legacy, task_id)["status"] == "failed"


def test_what_cannot_be_a_task(legacy):
    refused = legacy.request("tools/call", {"name": "apropos", "arguments": {"pattern": "car"}, "task": {}})
    assert refused["error"]["code"] == -32601
    unknown = legacy.request("tasks/get", {"taskId": "no-such-task"})
    assert unknown["error"]["code"] == -32602
    assert legacy.request("tasks/update", {"taskId": "x", "inputResponses": {}})["error"]["code"] == -32601


def first_line(result):
    """The first line of a call's text: the value, whatever notes follow it."""
    return result["content"][0]["text"].partition("\n")[0]


def line(request_id, params):
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                       "params": params}).encode() + b"\n"


def test_a_task_runs_in_arrival_order(legacy):
    legacy.eval("(defparameter cl-user::*task-order* nil)")
    task = {"name": "evaluate-lisp", "arguments": {"code": "(push :first cl-user::*task-order*)"},
            "task": {"ttl": 60_000}}
    plain = {"name": "evaluate-lisp", "arguments": {"code": "(push :second cl-user::*task-order*)"}}
    legacy.send_raw(line("order-task", task) + line("order-plain", plain))  # one write
    task_id = legacy.response("order-task")["result"]["task"]["taskId"]
    assert first_line(legacy.response("order-plain")["result"]) == "=> (:SECOND :FIRST)"
    assert first_line(legacy.request("tasks/result", {"taskId": task_id})["result"]) == "=> (:FIRST)"


def test_a_task_working_past_its_ttl_stays_known_until_it_ends(legacy):
    task_id = start_task(legacy, "evaluate-lisp", {"code": "(sleep 3)"}, ttl=0)
    time.sleep(0.2)
    assert task_status(legacy, task_id)["status"] == "working"
    assert legacy.request("tasks/cancel", {"taskId": task_id})["result"]["status"] == "cancelled"
    # Ended, and its ttl long run out: forgotten.
    assert legacy.request("tasks/get", {"taskId": task_id})["error"]["code"] == -32602


def test_a_reset_cancels_the_tasks_made_before_it():
    with cl_mcp() as process:
        before = start_task(process, "evaluate-lisp", {"code": "(sleep 20)"})
        deadline = time.monotonic() + 30
        while "running" not in task_status(process, before).get("statusMessage", ""):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        reset = {"name": "reset-session", "arguments": {}}
        after = {"name": "evaluate-lisp", "arguments": {"code": ":after-the-reset"}, "task": {"ttl": 60_000}}
        process.send_raw(line("reset", reset) + line("after", after))
        assert process.response("reset")["result"]["isError"] is False
        cancelled = task_status(process, before)
        assert cancelled["status"] == "cancelled", cancelled
        assert cancelled["statusMessage"] == "The task was cancelled: the session was reset."
        after_id = process.response("after")["result"]["task"]["taskId"]
        result = process.request("tasks/result", {"taskId": after_id})["result"]
        assert first_line(result) == "=> :AFTER-THE-RESET"


def test_leaving_cl_mcp_cancels_the_working_tasks_without_waiting_for_them():
    process = McpProcess()
    process.initialize("2025-11-25")
    task_id = start_task(process, "evaluate-lisp", {"code": "(sleep 30)"})
    deadline = time.monotonic() + 30
    while "running" not in task_status(process, task_id).get("statusMessage", ""):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    started = time.monotonic()
    assert process.close() == 0
    assert time.monotonic() - started < 15  # half the task's sleep
    statuses = [m["params"] for m in map(json.loads, list(process.raw_lines))
                if m.get("method") == "notifications/tasks/status"]
    assert statuses == [{**statuses[0], "status": "cancelled",
                         "statusMessage": "The task was cancelled: cl-mcp is shutting down."}]


def test_a_flood_of_task_calls_is_refused_past_the_intake_limits(tmp_path):
    """The issue's reproduction: while an evaluation holds the session, 40
    task calls of 2 MB and 1,200 small ones; the limits apply to them as to
    any call, and memory stays within them.  The session is held until
    every call was answered (a (sleep 3) ended before a loaded machine had
    sent them all, and calls that ran meanwhile let 1,026 tasks in)."""
    release = tmp_path / "release"
    with cl_mcp("--log-level", "warning") as process:
        pid = process.proc.pid
        assert is_python(pid)
        process.eval("(+ 1 2)")
        baseline = resident_kib(pid)
        holding = f'(loop until (probe-file "{release}") do (sleep 0.05))'
        sleeper = process.start_request("tools/call", {"name": "evaluate-lisp", "arguments": {
            "code": holding, "timeout": 600, "answer-within": 600}})
        big_code = f'(length "{"x" * 2_000_000}")'
        big = [(f"big-{i}", big_code) for i in range(40)]
        small = [(f"small-{i}", "(+ 1 2)") for i in range(1200)]
        lines = [line(request_id, {"name": "evaluate-lisp", "arguments": {"code": code},
                                   "task": {"ttl": 600_000}})
                 for request_id, code in big + small]
        sampler = PeakSampler(pid)
        writer = threading.Thread(target=lambda: [process.send_raw(data) for data in lines])
        writer.start()
        try:
            responses = {request_id: process.response(request_id, timeout=120) for request_id, _ in big + small}
        finally:
            release.touch()
            peak = sampler.stop()
            writer.join(30)
        assert process.response(sleeper)["result"]["isError"] is False

        def refused(prefix):
            return [r for request_id, r in responses.items() if request_id.startswith(prefix) and "error" in r]

        assert all(r["error"]["code"] == SERVER_BUSY for r in refused("big") + refused("small"))
        assert 0 < len(refused("big")) < 40 and refused("small"), (len(refused("big")), len(refused("small")))
        created = [r["result"]["task"]["taskId"] for r in responses.values() if "result" in r]
        assert len(created) <= 1024
        last = process.request("tasks/result", {"taskId": created[-1]}, timeout=120)["result"]
        assert first_line(last) == "=> 3"
        assert first_line(process.call("evaluate-lisp", code="(+ 1 2)")) == "=> 3"
        growth = peak - baseline
        print(f"cl-mcp VmRSS: baseline {baseline} KiB, peak {peak} KiB (+{growth} KiB); "
              f"{len(created)} tasks made, {len(responses) - len(created)} refused")
        assert growth < TASK_FLOOD_GROWTH_LIMIT_KIB


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
    assert modern_call(modern, "(+ 1 2)", WITH_TASKS)["content"][0]["text"].startswith("=> 3\n\n; Evaluation ")
    deadline = time.monotonic() + 30
    while (task := task_status(modern, task_id, **WITH_TASKS))["status"] == "working":
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert task["status"] == "completed" and task["resultType"] == "complete"
    assert task["result"]["content"][0]["text"].startswith("[stdout]\nlong\n\n=> :DONE\n\n; Evaluation ")


def test_modern_cancel_and_the_methods_it_lacks(modern):
    created = modern_call(modern, "(progn (sleep 4) (setf (get :cl-mcp-task :modern) t))", WITH_TASKS)
    task_id = created["taskId"]
    assert modern.request("tasks/cancel", {"taskId": task_id, "_meta": WITH_TASKS})["result"] == {
        "resultType": "complete", "_meta": created["_meta"]}
    time.sleep(4)
    assert task_status(modern, task_id, **WITH_TASKS)["status"] == "cancelled"
    assert modern_call(modern, "(get :cl-mcp-task :modern)", MODERN)["content"][0]["text"].startswith(
        "=> NIL\n\n; Evaluation ")
    for method in ("tasks/result", "tasks/list"):
        response = modern.request(method, {"taskId": task_id, "_meta": WITH_TASKS})
        assert response["error"]["code"] == -32601, method
    ack = modern.request("tasks/update", {"taskId": task_id, "inputResponses": {}, "_meta": WITH_TASKS})
    assert ack["result"]["resultType"] == "complete"


def test_a_call_that_may_become_a_task_runs_in_arrival_order(modern):
    modern_call(modern, "(defparameter cl-user::*modern-order* nil)", MODERN)
    first = {"name": "evaluate-lisp", "arguments": {"code": "(push :first cl-user::*modern-order*)"},
             "_meta": WITH_TASKS}
    second = {"name": "evaluate-lisp", "arguments": {"code": "(push :second cl-user::*modern-order*)"},
              "_meta": MODERN}
    modern.send_raw(line("modern-first", first) + line("modern-second", second))  # one write
    assert first_line(modern.response("modern-first")["result"]) == "=> (:FIRST)"
    assert first_line(modern.response("modern-second")["result"]) == "=> (:SECOND :FIRST)"


def test_no_task_for_a_client_without_the_extension(modern):
    result = modern_call(modern, "(sleep 2)", MODERN)
    assert result["resultType"] == "complete" and result["structuredContent"]["running"]
    number = result["structuredContent"]["number"]
    outcome = modern.request("tools/call", {"name": "await-evaluation",
                                            "arguments": {"evaluation": number, "wait": 10},
                                            "_meta": MODERN})["result"]
    assert outcome["content"][0]["text"] == f"=> NIL\n\n; Evaluation {number}"


def cancelled_text(response):
    result = response["result"]
    assert result["resultType"] == "complete" and result["isError"], result
    return result["content"][0]["text"]


def test_a_reset_during_a_call_that_may_become_a_task_answers_it_cancelled(modern):
    """The call is waited on within its answer window when the reset stops
    its task: it answers the cancelled result, not an internal error."""
    sleeper = {"name": "evaluate-lisp", "arguments": {"code": "(sleep 10)"}, "_meta": WITH_TASKS}
    reset = {"name": "reset-session", "arguments": {}, "_meta": MODERN}
    modern.send_raw(line("reset-sleeper", sleeper) + line("reset-it", reset))  # one write
    assert cancelled_text(modern.response("reset-sleeper")) == (
        "[ERROR] CL-MCP:CANCELLED\nThe task was cancelled: the session was reset.")
    assert modern.response("reset-it")["result"]["isError"] is False


def test_sigterm_during_a_call_that_may_become_a_task_answers_it_cancelled():
    process = McpProcess("--answer-within", "5")
    try:
        request_id = process.start_request("tools/call", {"name": "evaluate-lisp", "_meta": WITH_TASKS,
                                                          "arguments": {"code": "(sleep 10)"}})
        process.request("ping", {"_meta": MODERN})  # read after the call: the call is under way
        process.proc.send_signal(signal.SIGTERM)
        assert cancelled_text(process.response(request_id)) == (
            "[ERROR] CL-MCP:CANCELLED\nThe task was cancelled: cl-mcp is shutting down.")
    finally:
        process.close()


def test_a_call_that_may_become_a_task_keeps_its_own_answer_window(modern):
    """--answer-within is 1 s here; the call's own 6 s window lets its 3 s
    evaluation answer inline rather than as a task."""
    result = modern.request("tools/call", {"name": "evaluate-lisp", "_meta": WITH_TASKS, "arguments": {
        "code": "(progn (sleep 3) :inline)", "answer-within": 6}})["result"]
    assert result["resultType"] == "complete", result
    assert first_line(result) == "=> :INLINE"
