"""The fast schema check gives jsonschema's verdict, on every schema cl-mcp
uses, for generated instances, valid and not."""

import pytest
from hypothesis import given, settings, strategies as st
from jsonschema import Draft7Validator, Draft202012Validator

from cl_mcp.contracts import load_schema, tool_definitions
from cl_mcp.schema_check import compile_schema

shared = load_schema("shared-types.json")
DRAFT7 = {f"shared:{name}": {"$ref": f"#/definitions/{name}", "definitions": shared["definitions"]}
          for name in shared["definitions"]}
DRAFT7.update({name: load_schema(f"{name}.json") for name in
               ("tools-call-params", "tools-list-params", "initialize-params", "set-level-params")})
TOOLS = {f"tool:{t['name']}": t["inputSchema"] for t in tool_definitions()}
OUTPUTS = {f"output:{t['name']}": t["outputSchema"] for t in tool_definitions()}

scalars = (st.none() | st.booleans() | st.integers(-10, 10) | st.sampled_from([0.0, 1.0, 1.5, -2.5])
           | st.sampled_from(["", "2.0", "all", "x", "code", "functions", "CONTINUE"]))
keys = st.sampled_from(["jsonrpc", "id", "method", "params", "name", "arguments", "code", "package",
                        "capture-time", "timeout", "type", "restart", "values", "frame", "count",
                        "evaluation", "system", "cursor", "level", "protocolVersion", "result", "error",
                        "message", "success", "warnings", "definitions", "kind", "frames", "x"])
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(keys, inner, max_size=6), max_leaves=20)


def agree(schema, validator_class, instance):
    assert compile_schema(schema)(instance) == validator_class(schema).is_valid(instance), instance


@pytest.mark.parametrize("name", sorted(DRAFT7))
@settings(max_examples=300)
@given(instance=json_values)
def test_draft7_schemas(name, instance):
    agree(DRAFT7[name], Draft7Validator, instance)


@pytest.mark.parametrize("name", sorted(TOOLS) + sorted(OUTPUTS))
@settings(max_examples=300)
@given(instance=json_values)
def test_tool_schemas(name, instance):
    agree({**TOOLS, **OUTPUTS}[name], Draft202012Validator, instance)


@pytest.mark.parametrize("instance, valid", [
    ({"jsonrpc": "2.0", "method": "ping"}, True),
    ({"jsonrpc": "2.0", "method": "ping", "id": True}, False),     # a boolean is no id
    ({"jsonrpc": "2.0", "method": "ping", "id": 1.0}, True),       # 1.0 is an integer
    ({"jsonrpc": "2.0", "method": "ping", "id": 1.5}, False),
    ({"jsonrpc": 2.0, "method": "ping"}, False),
    ({"jsonrpc": "2.0", "method": "ping", "params": []}, True),
    ({"jsonrpc": "2.0", "method": "ping", "params": "x"}, False),
    ([], False),
])
def test_json_rpc_request_edge_cases(instance, valid):
    assert compile_schema(DRAFT7["shared:JsonRpcRequest"])(instance) is valid
    agree(DRAFT7["shared:JsonRpcRequest"], Draft7Validator, instance)


def test_unknown_keywords_are_refused():
    with pytest.raises(ValueError):
        compile_schema({"type": "string", "pattern": "^a"})
