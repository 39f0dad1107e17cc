"""The fast schema check gives jsonschema's verdict, on every schema cl-mcp
uses, for generated instances, valid and not."""

from functools import cache

import pytest
from hypothesis import Phase, find, given, settings, strategies as st
from jsonschema import Draft7Validator, Draft202012Validator

from cl_mcp.wire.contracts import load_schema, tool_definitions
from cl_mcp.wire.schema_check import compile_schema

shared = load_schema("shared-types.json")
SCHEMAS = {f"shared:{name}": ({"$ref": f"#/definitions/{name}", "definitions": shared["definitions"]},
                              Draft7Validator)
           for name in shared["definitions"]}
SCHEMAS.update({name: (load_schema(f"{name}.json"), Draft7Validator) for name in
                ("tools-call-params", "tools-list-params", "initialize-params", "set-level-params")})
for tool in tool_definitions():  # JSON Schema 2020-12, MCP's default
    SCHEMAS[f"tool:{tool['name']}"] = (tool["inputSchema"], Draft202012Validator)
    SCHEMAS[f"output:{tool['name']}"] = (tool["outputSchema"], Draft202012Validator)


@cache
def fast_check(name):
    return compile_schema(SCHEMAS[name][0])


@cache
def jsonschema_check(name):
    schema, validator_class = SCHEMAS[name]
    return validator_class(schema).is_valid


scalars = (st.none() | st.booleans() | st.integers(-10, 10) | st.integers()
           | st.sampled_from([0.0, -0.0, 1.0, 1.5, -2.5, 1e300, 2.0**70])
           | st.sampled_from(["", "2.0", "all", "x", "code", "functions", "CONTINUE"]))
keys = st.sampled_from(["jsonrpc", "id", "method", "params", "name", "arguments", "code", "package",
                        "capture-time", "timeout", "type", "restart", "values", "frame", "count",
                        "evaluation", "system", "cursor", "level", "protocolVersion", "result", "error",
                        "message", "success", "warnings", "definitions", "kind", "frames", "x"])
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(keys, inner, max_size=6), max_leaves=20)
anything = scalars | st.lists(scalars, max_size=2) | st.dictionaries(keys, scalars, max_size=2)


def _numbers_near(schema, integral):
    """Numbers at, just inside and just outside SCHEMA's bounds, as ints
    and as floats (1.0 is an integer to JSON Schema, True is not)."""
    bounds = [schema[k] for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in schema]
    offsets = [0, 1, -1] + ([] if integral else [0.5, -0.5])
    near_bounds = st.builds(lambda bound, offset: bound + offset, st.sampled_from(bounds or [0]),
                            st.sampled_from(offsets))
    return st.one_of(near_bounds, near_bounds.map(float), st.integers(-5, 5), st.integers())


def _resolve(root, reference):
    target = root
    for part in reference.removeprefix("#/").split("/"):
        target = target[part]
    return target


def _with_branches(schema, keyword, branches):
    """SCHEMA with BRANCHES of its oneOf or anyOf folded in."""
    merged = {k: v for k, v in schema.items() if k != keyword}
    for branch in branches:
        folded = {**merged, **branch}
        for key, join in (("properties", lambda a, b: {**a, **b}), ("required", lambda a, b: [*a, *b])):
            if key in merged and key in branch:
                folded[key] = join(merged[key], branch[key])
        merged = folded
    return merged


def near(schema, root, depth=0):
    """Instances built to satisfy SCHEMA, broken now and then: about one
    part in eight is any value at all, a key may go missing or an
    unknown one come in, a number may cross a bound."""
    if depth > 8 or schema is True or schema == {}:
        return anything
    built = _built(schema, root, depth)
    return st.integers(0, 7).flatmap(lambda n: anything if n == 0 else built)


def _built(schema, root, depth):
    if "$ref" in schema:
        return near(_resolve(root, schema["$ref"]), root, depth + 1)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for keyword in ("oneOf", "anyOf"):
        if keyword in schema:  # each branch, and all at once (which oneOf refuses)
            folds = [[branch] for branch in schema[keyword]] + [schema[keyword]]
            return st.one_of([near(_with_branches(schema, keyword, fold), root, depth + 1) for fold in folds])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([near({**schema, "type": one}, root, depth) for one in kind])
    if kind == "object":
        properties = {name: near(sub, root, depth + 1) for name, sub in schema.get("properties", {}).items()}
        required = {name: properties.get(name, anything) for name in schema.get("required", [])}
        optional = {name: each for name, each in properties.items() if name not in required}
        return st.builds(_damaged, st.fixed_dictionaries(required, optional=optional),
                         st.integers(0, 7), st.integers(0, 99), st.integers(0, 7), st.tuples(keys, anything))
    if kind == "array":
        return st.lists(near(schema.get("items", True), root, depth + 1), max_size=3)
    if kind in ("integer", "number"):
        return _numbers_near(schema, kind == "integer")
    return {"string": st.text(max_size=6) | st.sampled_from(["", "2.0", "all", "x", "CONTINUE"]),
            "boolean": st.booleans(), "null": st.none()}.get(kind, anything)


def _damaged(instance, drop, which, add, extra):
    """INSTANCE less one of its keys when DROP is 0, with EXTRA's key and
    value when ADD is 0."""
    if drop == 0 and instance:
        del instance[sorted(instance)[which % len(instance)]]
    if add == 0:
        instance[extra[0]] = extra[1]
    return instance


INSTANCES = {name: near(schema, schema) | json_values for name, (schema, _) in SCHEMAS.items()}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=100)
@given(data=st.data())
def test_the_fast_check_gives_jsonschemas_verdict(name, data):
    instance = data.draw(INSTANCES[name])
    assert fast_check(name)(instance) == jsonschema_check(name)(instance)


@pytest.mark.parametrize("verdict", [True, False])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_instances_reach_both_verdicts(name, verdict):
    """Without valid instances the test above would pass a check that
    always says no; without invalid ones, a check that always says yes.
    Among the first 200 instances drawn (the same each run), one has
    VERDICT: the search stops at it, unshrunk."""
    find(INSTANCES[name], lambda instance: jsonschema_check(name)(instance) == verdict,
         settings=settings(max_examples=200, derandomize=True, database=None, phases=[Phase.generate]))


@pytest.mark.parametrize("schema, instance", [
    ({"type": "integer"}, True),             # a boolean is no number
    ({"type": "integer"}, 1.0),              # an integral float is an integer
    ({"type": "integer"}, 1.5),
    ({"type": "integer"}, 2**70),
    ({"type": "integer"}, 1e300),
    ({"type": "number"}, False),
    ({"minimum": 1}, True),                  # bounds apply to numbers only
    ({"exclusiveMinimum": 0, "maximum": 86400}, -0.0),
    ({"exclusiveMinimum": 0, "maximum": 86400}, 86400.0),
    ({"exclusiveMinimum": 0, "maximum": 86400}, 86400.5),
    ({"const": True}, 1),                    # true is not 1
    ({"const": 1}, True),
    ({"const": 1}, 1.0),                     # 1 is 1.0
    ({"const": [1]}, [True]),
    ({"const": {"a": 1}}, {"a": 1.0}),
    ({"const": None}, False),
    ({"const": "2.0"}, 2.0),
    ({"enum": [1, "a"]}, True),
    ({"enum": [1, "a"]}, 1.0),
    ({"enum": [False]}, 0),
    ({"type": "object"}, []),
    ({"type": "array"}, {}),
])
@pytest.mark.parametrize("validator_class", [Draft7Validator, Draft202012Validator])
def test_json_equality_and_numbers_as_jsonschema_has_them(schema, instance, validator_class):
    assert compile_schema(schema)(instance) == validator_class(schema).is_valid(instance)


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
    assert fast_check("shared:JsonRpcRequest")(instance) is valid
    assert jsonschema_check("shared:JsonRpcRequest")(instance) is valid


def test_unknown_keywords_are_refused():
    with pytest.raises(ValueError):
        compile_schema({"type": "string", "pattern": "^a"})
