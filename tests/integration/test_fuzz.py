"""Schema fuzzing of the real cl-mcp: valid requests generated from the
contract schemas, and mutated invalid ones, sent over pipes.

Properties: every request with an id gets exactly one response, and it is
a well-formed JsonRpcResponse; notifications get none; the server answers
correctly at the end.  CL_MCP_FUZZ_EXAMPLES raises the example count for
long local runs (CI runs the default).
"""

import itertools
import json
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cl_mcp.contracts import first_error, shared_type
from tests.integration.conftest import McpProcess

EXAMPLES = int(os.environ.get("CL_MCP_FUZZ_EXAMPLES", "300"))
ids = itertools.count(1)
DEEP = "@deep@"

json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)

safe_code = st.sampled_from([
    "(+ 1 2)", "(list 1 \"two\" :three)", "(values)", "(floor 7 2)", "(error \"fuzz\")",
    "(format t \"out~%\")", ")", "(", "#<", "(car 1)", "nil", "'(a . b)", "(make-list 3)",
    "(in-package :cl-user)", "(warn \"w\")", "\"é€😀\"",
]) | st.text(max_size=40)

tool_calls = st.one_of(
    st.fixed_dictionaries({"name": st.just("evaluate-lisp"), "arguments": st.fixed_dictionaries(
        {"code": safe_code}, optional={"package": st.sampled_from(["CL-USER", "KEYWORD", "nope", ""]),
                                       "capture-time": st.booleans(),
                                       "timeout": st.floats(0.5, 5)})}),
    st.fixed_dictionaries({"name": st.just("list-definitions"), "arguments": st.fixed_dictionaries(
        {}, optional={"type": st.sampled_from(["all", "functions", "variables", "macros", "classes"])})}),
    st.fixed_dictionaries({"name": st.just("load-system"),
                           "arguments": st.fixed_dictionaries({"system": st.text(max_size=20)})}),
    st.fixed_dictionaries({"name": st.just("invoke-restart"), "arguments": st.fixed_dictionaries(
        {"restart": st.integers(0, 6) | st.sampled_from(["ABORT", "CONTINUE", "x"])})}),
    st.fixed_dictionaries({"name": st.just("backtrace"), "arguments": st.just({})}),
    st.fixed_dictionaries({"name": st.sampled_from(["nope", "", "EVALUATE-LISP"]), "arguments": st.just({})}),
)

valid_requests = st.one_of(
    st.fixed_dictionaries({"method": st.just("ping")}),
    st.fixed_dictionaries({"method": st.just("tools/list")}, optional={"params": st.just({})}),
    st.fixed_dictionaries({"method": st.just("tools/call"), "params": tool_calls}),
    st.fixed_dictionaries({"method": st.just("logging/setLevel"),
                           "params": st.fixed_dictionaries({"level": st.sampled_from(["debug", "info", "nope"])})}),
    st.fixed_dictionaries({"method": st.text(max_size=20)}),
)


@st.composite
def mutated(draw, request):
    """One invalid variation of a request."""
    message = dict(request)
    kind = draw(st.sampled_from(["drop", "retype", "extra", "params", "id", "jsonrpc", "deep", "huge"]))
    if kind == "drop":
        message.pop(draw(st.sampled_from(sorted(message))), None)
    elif kind == "retype":
        message[draw(st.sampled_from(sorted(message)))] = draw(json_values)
    elif kind == "extra":
        message[draw(st.text(min_size=1, max_size=8))] = draw(json_values)
    elif kind == "params":
        message["params"] = draw(st.lists(json_values, max_size=3) | json_scalars)
    elif kind == "id":
        message["id"] = draw(json_values)
    elif kind == "jsonrpc":
        message["jsonrpc"] = draw(json_scalars)
    elif kind == "deep":
        # Built as text: a nested Python value this deep defeats repr().
        depth = draw(st.integers(50, 3000))
        message["params"] = {"name": "evaluate-lisp", "arguments": {"code": "1", "x": DEEP}}
        return json.dumps(message).replace('"' + DEEP + '"', "[" * depth + "1" + "]" * depth)
    elif kind == "huge":
        message["params"] = {"name": "evaluate-lisp", "arguments": {"code": "x" * draw(st.integers(0, 200_000))}}
    return message


@st.composite
def lines(draw):
    """(bytes of one line, the id it must be answered under, or None)."""
    request = {"jsonrpc": "2.0", **draw(valid_requests)}
    shape = draw(st.sampled_from(["request", "notification", "mutated", "garbage"]))
    if shape == "garbage":
        junk = draw(st.binary(max_size=60).filter(lambda b: b"\n" not in b) |
                    st.sampled_from([b"{", b"[", b"null", b"\xff\xfe", b'{"jsonrpc":"2.0"', b"[]", b"123"]))
        return junk, None
    if shape == "notification":
        return json.dumps(request).encode(), None
    request_id = draw(st.sampled_from(["s", "i"]))
    request["id"] = f"fz-{next(ids)}" if request_id == "s" else 10**9 + next(ids)
    if shape == "mutated":
        request = draw(mutated(request))
        if isinstance(request, str):  # deep nesting, already JSON text
            return request.encode(), None
    expected = request.get("id")
    well_formed = isinstance(expected, (str, int)) and not isinstance(expected, bool) \
        and first_error(shared_type("JsonRpcRequest"), request) is None
    return json.dumps(request).encode(), expected if well_formed else None


@pytest.fixture(scope="module")
def fuzzed():
    process = McpProcess("--eval-timeout", "5", "--log-level", "warning")
    process.initialize()
    yield process
    process.close()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines())
def test_every_request_gets_exactly_one_well_formed_response(fuzzed, line):
    data, expected = line
    fuzzed.send_raw(data + b"\n")
    if expected is not None:
        response = fuzzed.response(expected, timeout=60)
        assert first_error(shared_type("JsonRpcResponse"), response) is None, response
    # The server is alive and answering after every line.
    assert fuzzed.request("ping", timeout=60)["result"] == {}


def test_the_server_is_correct_after_fuzzing(fuzzed):
    time.sleep(0.5)
    text, is_error = fuzzed.eval("(+ 1 2 3)", package="CL-USER")
    assert not is_error and text.startswith("=> 6"), text
    for raw in fuzzed.raw_lines:
        message = json.loads(raw)
        if isinstance(message, dict) and "method" not in message:
            assert first_error(shared_type("JsonRpcResponse"), message) is None, message
    # Ids this test generated are unique, so each must be answered once (a
    # mutated message may reuse an arbitrary id, which proves nothing).
    answered = [json.loads(raw).get("id") for raw in fuzzed.raw_lines if raw.startswith(b"{")]
    ours = [i for i in answered if (isinstance(i, str) and i.startswith("fz-"))
            or (isinstance(i, int) and not isinstance(i, bool) and i > 10**9)]
    assert len(ours) == len(set(ours)), "an id was answered twice"
