"""An integral float is an integer (JSON Schema says 1.0 is one): every
tool gets it as an int, over real pipes against a real SBCL."""

from tests.integration.conftest import cl_mcp


def test_read_output_takes_an_integral_float_offset_and_length():
    with cl_mcp() as process:
        evaluated = process.call("evaluate-lisp", code='(format t "one~%two~%three~%")')
        number = evaluated["structuredContent"]["number"]
        result = process.call("read-output", evaluation=float(number), offset=2.0, length=1.0)
        assert not result["isError"], result
        assert result["structuredContent"]["lines"] == ["      2: two"]
        assert result["structuredContent"]["evaluation"] == number
        assert result["content"][0]["text"].startswith(f"[stdout of evaluation {number}: lines 2–2 of 3]")


def test_await_evaluation_takes_an_integral_float_evaluation():
    with cl_mcp() as process:
        running = process.call("evaluate-lisp", code="(progn (sleep 1.5) :done)", **{"answer-within": 0.5})
        assert running["structuredContent"]["running"], running
        number = running["structuredContent"]["number"]
        response = process.request("tools/call", {"name": "await-evaluation",
                                                  "arguments": {"evaluation": float(number), "wait": 30.0}})
        result = response["result"]
        assert not result["isError"], result
        assert result["content"][0]["text"].startswith("=> :DONE")
        assert result["structuredContent"]["number"] == number


def test_integer_arguments_past_the_bound_are_argument_errors():
    """1e20 and 100000000000000000000 (a float to orjson) were -32603: its
    writer cannot hold the int they became."""
    with cl_mcp() as process:
        for evaluation in (1e20, 10**20, 2**64 + 1, -(2**63) - 1):
            process.send_raw(b'{"jsonrpc":"2.0","id":"big","method":"tools/call","params":'
                             b'{"name":"read-output","arguments":{"evaluation":%s}}}\n' % repr(evaluation).encode())
            result = process.response("big")["result"]
            assert result["isError"], result
            assert result["content"][0]["text"].startswith(
                "[ERROR] CL-MCP:INVALID-ARGUMENTS\nInvalid arguments for read-output: at /evaluation: "), result
        result = process.call("read-output", evaluation=1, offset=2**53 - 1)  # within the bound
        assert result["content"][0]["text"].startswith("[ERROR] CL-MCP:OUTPUT-NOT-KEPT"), result


def test_the_restart_tools_threads_and_inspect_take_integral_floats():
    """integers.py's rule is the only one: these tools had their own."""
    with cl_mcp() as process:
        waiting = process.call("evaluate-lisp", code='(error "stop here")')
        number = waiting["structuredContent"]["number"]
        frames = process.call("backtrace", evaluation=float(number), count=2.0)
        assert not frames["isError"] and len(frames["structuredContent"]["frames"]) == 2, frames
        in_frame = process.call("eval-in-frame", evaluation=float(number), frame=0.0, code="(+ 1 2)")
        assert in_frame["content"][0]["text"].startswith("=> 3"), in_frame
        assert len(waiting["structuredContent"]["restarts"]) == 1  # 0: [ABORT]
        aborted = process.call("invoke-restart", evaluation=float(number), restart=0.0)
        assert "waiting" not in aborted["content"][0]["text"], aborted
        assert process.call("backtrace", evaluation=number)["isError"]  # no longer waiting
        threads = process.call("threads", action="list", count=1.0)
        assert not threads["isError"], threads
        inspected = process.call("inspect", code="(list 1 2 3)")
        handle = inspected["structuredContent"]["handle"]
        part = process.call("inspect", handle=float(handle), part=1.0, start=0.0)
        assert not part["isError"], part
        profiled = process.call("profile", code="(loop repeat 100000 sum 1)", **{"max-rows": 3.0})
        assert not profiled["isError"], profiled
