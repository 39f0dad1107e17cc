"""NDJSON framing and JSON-RPC messages."""

import json

import pytest
from hypothesis import given, strategies as st

from cl_mcp.errors import PARSE_ERROR, JsonRpcError
from cl_mcp.wire import jsonrpc
from cl_mcp.wire.jsonrpc import LineSplitter, OversizedLine


def test_splits_on_newline_only():
    message = json.dumps({"text": "a\u2028b\u2029c\u0085d"}, ensure_ascii=False).encode()
    lines = list(LineSplitter().feed(message + b"\n"))
    assert lines == [message]


def test_strips_a_trailing_carriage_return_and_skips_blank_lines():
    assert list(LineSplitter().feed(b'{"a":1}\r\n\n  \n{"b":2}\n')) == [b'{"a":1}', b'{"b":2}']


def test_last_line_without_newline_is_kept_for_finish():
    splitter = LineSplitter()
    assert list(splitter.feed(b'{"a":1}')) == []
    assert list(splitter.finish()) == [b'{"a":1}']


def test_oversized_lines_are_reported_and_dropped():
    splitter = LineSplitter(max_line=10)
    out = list(splitter.feed(b"x" * 7)) + list(splitter.feed(b"y" * 7 + b"\nok\n"))
    assert isinstance(out[0], OversizedLine) and out[0].size == 14
    assert out[1] == b"ok"


@given(st.lists(st.dictionaries(st.text(), st.text()), max_size=6), st.data())
def test_lines_survive_any_chunking(messages, data):
    stream = b"".join(jsonrpc.encode(m) for m in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    splitter = LineSplitter()
    lines, start = [], 0
    for cut in cuts + [len(stream)]:
        lines += splitter.feed(stream[start:cut])
        start = cut
    assert [jsonrpc.parse(line) for line in lines] == messages


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner)))
def test_encode_is_one_line_of_json(value):
    data = jsonrpc.encode({"jsonrpc": "2.0", "id": 1, "result": {"v": value}})
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert json.loads(data)["result"]["v"] == value


def test_big_integers_are_valid_json():
    big = 2**64 + 1  # 2**80 would survive as a float
    assert jsonrpc.parse(b'{"id": %d}' % big) == {"id": big}
    assert json.loads(jsonrpc.encode({"id": big})) == {"id": big}


ids = st.integers() | st.sampled_from([2**64 + 1, -(2**63) - 1, 2**64, 10**20 + 1])


@given(ids)
def test_any_integer_id_is_answered_exactly(request_id):
    line = json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "ping"}).encode()
    parsed = jsonrpc.parse(line)["id"]
    assert type(parsed) is int and parsed == request_id
    answer = json.loads(jsonrpc.encode(jsonrpc.result_message(parsed, {})))
    assert type(answer["id"]) is int and answer["id"] == request_id


@given(ids)
def test_ids_in_batches_cancellations_and_progress_tokens_are_exact(number):
    batch = [{"jsonrpc": "2.0", "id": number, "method": "ping"},
             {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": number}},
             {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
              "params": {"_meta": {"progressToken": number}}}]
    parsed = jsonrpc.parse(json.dumps(batch).encode())
    found = [parsed[0]["id"], parsed[1]["params"]["requestId"], parsed[2]["params"]["_meta"]["progressToken"]]
    assert all(type(each) is int and each == number for each in found)


@pytest.mark.parametrize("line", [b"not json", b"{", b'{"a": NaN}', b'"\xff"', b'"\\ud800"'])
def test_parse_errors(line):
    with pytest.raises(JsonRpcError) as caught:
        jsonrpc.parse(line)
    assert caught.value.code == PARSE_ERROR


def test_a_preencoded_value_is_sent_as_it_was_encoded():
    tools = [{"name": "evaluate-lisp", "inputSchema": {"type": "object"}}]
    fragment = jsonrpc.preencoded(tools)
    for request_id in (7, 2**70):  # the second goes through the json module
        line = jsonrpc.encode(jsonrpc.result_message(request_id, {"tools": fragment}))
        assert json.loads(line) == {"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}}


@pytest.mark.parametrize("params", [None, [], "x", {}, {"_meta": None}, {"_meta": [1]}, {"_meta": "m"}])
def test_params_without_a_meta_object_have_an_empty_one(params):
    assert jsonrpc.params_meta(params) == {}


def test_params_meta_is_the_meta_object():
    assert jsonrpc.params_meta({"_meta": {"progressToken": 7}}) == {"progressToken": 7}
