"""A fast yes/no check against a JSON schema.  Pure: no I/O.

Why: every message is validated, and jsonschema's general machinery costs
tens of microseconds per message (and about 100 ms to import).  This module
compiles the subset of JSON Schema that cl-mcp's schemas use into Python
source, once: straight-line `if ...: return False` statements, one function
per schema and per `$ref` target.  Only when a message fails does cl-mcp ask
jsonschema which rule failed and where (see contracts.py).  A keyword outside
the subset is refused at compile time, so a schema can never be checked more
loosely than it says; tests/unit/test_schema_check.py checks the verdicts
against jsonschema's on generated instances.

Why not fastjsonschema, which does the same job: on these schemas it is
3-17x slower per check (a failed oneOf branch raises and catches an
exception with its message built) and takes 3-5x as long to build the
checks at start-up (bench/pure.py; figures in docs/performance.md).
"""

from __future__ import annotations

from typing import Any, Callable

Check = Callable[[Any], bool]

# Keywords that only document a schema.
ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "default", "examples"}

_TYPE_TESTS = {
    "object": "isinstance({v}, dict)",
    "array": "isinstance({v}, list)",
    "string": "isinstance({v}, str)",
    "boolean": "isinstance({v}, bool)",
    "null": "{v} is None",
    "integer": "((isinstance({v}, int) and not isinstance({v}, bool))"
               " or (isinstance({v}, float) and {v}.is_integer()))",
    "number": "(isinstance({v}, (int, float)) and not isinstance({v}, bool))",
}
_COMPARISONS = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}


def _json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON means it: true is not 1, and 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def compile_schema(schema: Any, root: Any = None) -> Check:
    """A predicate that is true exactly when an instance is valid."""
    compiler = _Compiler(schema if root is None else root)
    entry = compiler.function(schema)
    namespace: dict[str, Any] = {"_json_equal": _json_equal, "_ABSENT": _ABSENT,
                                 **compiler.constants}
    exec("\n\n".join(compiler.sources), namespace)  # noqa: S102 - our own generated code
    return namespace[entry]  # type: ignore[no-any-return]


_ABSENT = object()  # a property the instance does not have


class _Compiler:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.sources: list[str] = []
        self.constants: dict[str, Any] = {}
        self._references: dict[str, str] = {}  # $ref → the name of its function
        self._names = 0

    def _name(self, prefix: str) -> str:
        self._names += 1
        return f"{prefix}{self._names}"

    def constant(self, value: Any) -> str:
        name = self._name("_C")
        self.constants[name] = value
        return name

    def function(self, schema: Any, name: str | None = None) -> str:
        """The name of a generated function that checks SCHEMA."""
        name = name or self._name("_check")
        body = self.statements(schema, "v", 1)
        self.sources.append("\n".join([f"def {name}(v):", *body, "    return True"]))
        return name

    def statements(self, schema: Any, var: str, depth: int) -> list[str]:
        """Lines, indented to DEPTH, that return False unless VAR is valid."""
        pad = "    " * depth
        if schema is True or schema == {}:
            return []
        if schema is False:
            return [f"{pad}return False"]
        if "$ref" in schema:  # draft 7: siblings of $ref are ignored
            return [f"{pad}if not {self.reference(schema['$ref'])}({var}): return False"]
        # A single type is checked first: the keywords after it then need no
        # guard of their own (`if isinstance(v, dict)`, ...), which every
        # message would pay for again.
        known = schema.get("type") if isinstance(schema.get("type"), str) else None
        lines = self.keyword("type", known, schema, var, depth) if known else []
        for keyword, argument in schema.items():
            if keyword in ANNOTATIONS or keyword == "definitions" or (known and keyword == "type"):
                continue
            lines += self.keyword(keyword, argument, schema, var, depth, known)
        return lines

    def reference(self, reference: str) -> str:
        if reference not in self._references:
            if not reference.startswith("#/"):
                raise ValueError(f"only local references are supported: {reference}")
            target = self.root
            for part in reference[2:].split("/"):
                target = target[part]
            # Named before it is compiled: a reference may recurse.
            self._references[reference] = name = self._name("_ref")
            self.function(target, name)
        return self._references[reference]

    def keyword(self, keyword: str, argument: Any, schema: dict[str, Any],
                var: str, depth: int, known: str | None = None) -> list[str]:
        """Lines for one KEYWORD; KNOWN, when given, is VAR's type, checked already."""
        pad = "    " * depth

        def is_a(kind: str) -> str:  # Python compiles `if True:` away
            return "True" if known == kind else _TYPE_TESTS[kind].format(v=var)
        if keyword == "type":
            names = argument if isinstance(argument, list) else [argument]
            test = " or ".join(_TYPE_TESTS[name].format(v=var) for name in names)
            return [f"{pad}if not ({test}): return False"]
        if keyword == "const":
            if isinstance(argument, str):
                guard = "" if known == "string" else f"{is_a('string')} and "
                return [f"{pad}if not ({guard}{var} == {argument!r}): return False"]
            return [f"{pad}if not _json_equal({var}, {self.constant(argument)}): return False"]
        if keyword == "enum":
            if all(isinstance(item, str) for item in argument):
                names = self.constant(frozenset(argument))
                return [f"{pad}if not (isinstance({var}, str) and {var} in {names}): return False"]
            items = self.constant(list(argument))
            return [f"{pad}if not any(_json_equal({var}, item) for item in {items}): return False"]
        if keyword == "required":
            if not argument:
                return []
            missing = " or ".join(f"{name!r} not in {var}" for name in argument)
            guard = "" if known == "object" else f"{is_a('object')} and "
            return [f"{pad}if {guard}({missing}): return False"]
        if keyword == "properties":
            lines = [f"{pad}if {is_a('object')}:"]
            for name, sub in argument.items():
                inner = self.statements(sub, item := self._name("p"), depth + 2)
                if inner:
                    lines += [f"{pad}    {item} = {var}.get({name!r}, _ABSENT)",
                              f"{pad}    if {item} is not _ABSENT:", *inner]
            return lines if len(lines) > 1 else []
        if keyword == "additionalProperties":
            known = self.constant(frozenset(schema.get("properties", {})))
            key, item = self._name("k"), self._name("a")
            inner = self.statements(argument, item, depth + 3)
            if not inner:
                return []
            return [f"{pad}if {is_a('object')}:",
                    f"{pad}    for {key}, {item} in {var}.items():",
                    f"{pad}        if {key} not in {known}:", *inner]
        if keyword == "items":
            item = self._name("i")
            inner = self.statements(argument, item, depth + 2)
            if not inner:
                return []
            return [f"{pad}if {is_a('array')}:", f"{pad}    for {item} in {var}:", *inner]
        if keyword in ("oneOf", "anyOf") and _disjoint_types(argument, keyword):
            # Types alone, none of them overlapping (as integer and number
            # do): one test, not a function call per option.
            test = " or ".join(_TYPE_TESTS[sub["type"]].format(v=var) for sub in argument)
            return [f"{pad}if not ({test}): return False"]
        if keyword in ("oneOf", "anyOf"):
            options = [self.function(sub) for sub in argument]
            if keyword == "anyOf":
                return [f"{pad}if not ({' or '.join(f'{o}({var})' for o in options)}): return False"]
            count = " + ".join(f"{o}({var})" for o in options)
            return [f"{pad}if ({count}) != 1: return False"]
        if keyword in _COMPARISONS:
            number = _TYPE_TESTS["number"].format(v=var)
            return [f"{pad}if {number} and not ({var} {_COMPARISONS[keyword]} {argument!r}): return False"]
        if keyword in ("minLength", "maxLength"):
            compare = ">=" if keyword == "minLength" else "<="
            return [f"{pad}if isinstance({var}, str) and not (len({var}) {compare} {int(argument)}): "
                    "return False"]
        raise ValueError(f"schema keyword not supported by the fast check: {keyword}")


def _disjoint_types(options: list[Any], keyword: str) -> bool:
    """True when OPTIONS are bare single types (`{"type": "string"}`) that no
    instance can match two of (or, for anyOf, any bare single types)."""
    if not all(isinstance(sub, dict) and sub.keys() == {"type"} and sub["type"] in _TYPE_TESTS
               for sub in options):
        return False
    kinds = [sub["type"] for sub in options]
    return keyword == "anyOf" or (len(set(kinds)) == len(kinds) and not {"integer", "number"} <= set(kinds))
