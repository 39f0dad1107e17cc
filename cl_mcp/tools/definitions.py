"""list-definitions: the session's functions, variables, macros and classes."""

from __future__ import annotations

from typing import Any

from cl_mcp.errors import SessionError
from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, error_result
from cl_mcp.tools.calls import agent_value
from cl_mcp.wire.sexp import Keyword, Symbol

SECTIONS = (
    ("function", "Functions", "- {name} {detail}"),
    ("variable", "Variables", "- {name} = {detail}"),
    ("macro", "Macros", "- {name} {detail}"),
    ("class", "Classes", "- {name} ({detail})"),
)
EMPTY = {
    "all": "No definitions in the current session.",
    "functions": "No functions defined in the current session.",
    "variables": "No variables defined in the current session.",
    "macros": "No macros defined in the current session.",
    "classes": "No classes defined in the current session.",
}


def render_definitions(entries: list[tuple[str, str, str]], kind: str) -> str:
    """Sections in the contract's order; a plain sentence when empty."""
    if not entries:
        return EMPTY[kind]
    sections = []
    for key, title, line in SECTIONS:
        lines = [line.format(name=name, detail=detail) for k, name, detail in entries if k == key]
        if lines:
            sections.append(f"[{title}]\n" + "\n".join(lines))
    return "\n\n".join(sections)


async def list_definitions(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    kind = arguments.get("type", "all")
    form = [Symbol("cl-mcp-agent:list-definitions"), Keyword("type"), kind]
    try:
        async with session.turn():
            found = await agent_value(session, form, session.config.eval_timeout)
    except SessionError as error:
        return error_result(error.kind, error.message, {"definitions": []})
    entries = [(k.name if isinstance(k, Keyword) else k, name, detail)
               for k, name, detail in found]  # type: ignore[misc, union-attr]
    return Rendered(render_definitions(entries, kind), False,
                    {"definitions": [definition_structure(*entry) for entry in entries]})


def definition_structure(kind: str, name: str, detail: str) -> dict[str, str]:
    """One definition for structuredContent: its detail under the key that
    says what it is."""
    key = {"function": "lambdaList", "macro": "lambdaList",
           "variable": "value", "class": "classKind"}[kind]
    return {"name": name, "kind": kind, key: detail}
