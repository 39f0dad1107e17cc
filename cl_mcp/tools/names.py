"""find-definition and describe-symbol: where a name is defined and what it
names, through Swank's find-definitions and describe-symbol-for-emacs and
SB-MOP (the agent's `find-definition-of` and `describe-symbol-of`).
Definitions made through evaluate-lisp have no file: the agent keeps their
source text, and find-definition returns it with the evaluation's number."""

from __future__ import annotations

from typing import Any

from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, condition_structure, error_text, place_structure, place_text
from cl_mcp.tools.calls import ask_agent, failure, result_dict, strings
from cl_mcp.wire.sexp import Keyword, Symbol




# A slot's lists and, when not the defaults, its options, in the order shown.
SLOT_LISTS = ("initargs", "accessors", "readers", "writers")
SLOT_OPTIONS = ("type", "initform", "allocation")


def slot_structure(slot: dict[str, Any]) -> dict[str, Any]:
    """One slot of a class for structuredContent: its name, lists, and the
    options the agent gave (type, initform, allocation)."""
    structure: dict[str, Any] = {"name": slot["name"], **{key: strings(slot.get(key)) for key in SLOT_LISTS}}
    return structure | {key: slot[key] for key in SLOT_OPTIONS if isinstance(slot.get(key), str)}

def _about_symbol(session: LispSession, function: str, arguments: dict[str, Any]) -> list[Any]:
    """The agent's FUNCTION called on the symbol, read in the given package
    or the session's."""
    return [Symbol(function), arguments["symbol"],
            Keyword("package"), arguments.get("package") or session.package]


# ---------------------------------------------------------------- find-definition

def definition_structure(definition: dict[str, Any]) -> dict[str, Any]:
    """One definition for structuredContent: type and name (a method's
    qualifiers and specializers), then its place, or the evaluation that
    made it and its source, or why it has neither."""
    structure: dict[str, Any] = {"type": definition["type"], "name": definition["name"]}
    if definition["type"] == "method":
        structure["qualifiers"] = strings(definition.get("qualifiers"))
        structure["specializers"] = strings(definition.get("specializers"))
    if "evaluation" in definition:
        structure["evaluation"] = definition["evaluation"]
        structure["source"] = definition["source"]
        if definition.get("replaced") is True:
            structure["replaced"] = True
    else:
        structure.update(place_structure(definition))
    return structure


def definition_title(definition: dict[str, Any]) -> str:
    """``TYPE NAME``; a method's qualifiers and specializers follow its name:
    ``method AREA :AROUND (CIRCLE)``."""
    title = f"{definition['type']} {definition['name']}"
    if definition["type"] == "method":
        qualifiers = strings(definition.get("qualifiers"))
        specializers = strings(definition.get("specializers"))
        title += "".join(f" {q}" for q in qualifiers) + f" ({' '.join(specializers)})"
    return title


def definition_text(definition: dict[str, Any]) -> str:
    """The title line, then the place (or the evaluation and its source,
    and whether a later definition replaced it)."""
    title = definition_title(definition)
    if "evaluation" in definition:
        source = "\n".join(f"    {line}" for line in definition["source"].splitlines())
        replaced = " (replaced by a later definition)" if definition.get("replaced") is True else ""
        return f"{title}\n  defined by evaluation {definition['evaluation']}{replaced}:\n{source}"
    return f"{title}\n{place_text(definition)}"


def render_definitions(result: dict[str, Any]) -> Rendered:
    """Every definition, the live ones first (as the agent orders them);
    none is an answer, not an error."""
    symbol = result["symbol"]
    definitions = [result_dict(item) for item in result.get("definitions") or []]
    dropped = result.get("dropped") or 0
    if not definitions:
        text = f"No definitions of {symbol} were found."
    else:
        count = len(definitions) + dropped
        sections = [f"Definitions of {symbol}: {count}"]
        sections += [definition_text(definition) for definition in definitions]
        if dropped:
            sections.append(f"… and {dropped} more, not listed")
        text = "\n\n".join(sections)
    structure: dict[str, Any] = {"symbol": symbol,
                                 "definitions": [definition_structure(d) for d in definitions]}
    if dropped:
        structure["truncated"] = dropped
    return Rendered(text, False, structure, counted="definitions")


def find_definition_error(arguments: dict[str, Any], kind: str, message: str) -> Rendered:
    """A tool error whose structured content still fits find-definition's
    outputSchema."""
    return Rendered(error_text(kind, message), True,
                    {"symbol": arguments["symbol"], "definitions": [],
                     "error": condition_structure(kind, message)})


async def find_definition(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """Every definition of a name: its type and place, or the source an
    evaluate-lisp call gave it."""
    result = await ask_agent(session, _about_symbol(session, "cl-mcp-agent:find-definition-of", arguments),
                             session.config.eval_timeout)
    if failed := failure(result):
        return find_definition_error(arguments, *failed)
    return render_definitions(result)


# ---------------------------------------------------------------- describe-symbol

# The sections of the text, in order, and the kinds each one covers.
SECTION_KINDS = (
    ("function", ("function", "generic function", "macro", "special operator")),
    ("variable", ("variable", "constant")),
    ("class", ("class", "structure", "condition")),
    ("type", ("type",)),
    ("setf expander", ("setf expander",)),
    ("package", ("package",)),
)

# The documentation string each section shows.
SECTION_DOCUMENTATION = {"function": ("function", "compiler-macro"), "variable": ("variable",),
                         "class": ("type",), "type": ("type",), "setf expander": ("setf",),
                         "package": ("package",)}


def describe_structure(result: dict[str, Any]) -> dict[str, Any]:
    """The agent's description as describe-symbol's structuredContent."""
    structure: dict[str, Any] = {
        "symbol": result["symbol"],
        "package": result["package"],
        "external": result.get("external") is True,
        "kinds": strings(result.get("kinds")),
        "description": result["description"],
        "documentation": {kind: text for kind, text in result.get("documentation") or []},
    }
    if isinstance(result.get("arglist"), str):
        structure["arglist"] = result["arglist"]
    if isinstance(result.get("value"), str):
        structure["value"] = result["value"]
    if result.get("class"):
        described = result_dict(result["class"])
        structure["class"] = {
            "superclasses": strings(described.get("superclasses")),
            "slots": [slot_structure(slot) for slot in map(result_dict, described.get("slots") or [])]}
    if "method-count" in result:
        structure["methods"] = [{"qualifiers": strings(method.get("qualifiers")),
                                 "specializers": strings(method.get("specializers"))}
                                for method in map(result_dict, result.get("methods") or [])]
        structure["methodCount"] = result["method-count"]
    if result.get("location"):
        location = result_dict(result["location"])
        if "evaluation" in location:
            structure["location"] = {"type": location["type"], "evaluation": location["evaluation"]}
        else:
            structure["location"] = {"type": location["type"], **place_structure(location)}
    return structure


def method_line(method: dict[str, Any]) -> str:
    """``:AROUND (CIRCLE T)``."""
    return "".join(f"{q} " for q in method["qualifiers"]) + f"({' '.join(method['specializers'])})"


def describe_text(structure: dict[str, Any]) -> str:
    """A header ``NAME (home package, external|internal)``, one section per
    kind of thing the name is (each documentation string labelled by its
    kind), and the primary definition's place."""
    home = structure["package"] or "no home package"
    sections = [f"{structure['symbol']} ({home}, {'external' if structure['external'] else 'internal'})"]
    kinds, documentation = structure["kinds"], structure["documentation"]
    if not kinds:
        sections.append("It names no function, variable, class, type or package.")
    for title, covered in SECTION_KINDS:
        named = [kind for kind in kinds if kind in covered]
        if not named:
            continue
        lines = [f"[{title}]", ", ".join(named)]
        if title == "function" and "arglist" in structure:
            lines.append(f"arglist: {structure['arglist']}")
        if title == "variable" and "value" in structure:
            lines.append(f"value: {structure['value']}")
        if title == "class" and "class" in structure:
            described = structure["class"]
            lines.append(f"superclasses: {' '.join(described['superclasses']) or 'none'}")
            for slot in described["slots"]:
                details = [f"{key} {' '.join(slot[key])}" for key in SLOT_LISTS if slot[key]]
                details += [f"{key} {slot[key]}" for key in SLOT_OPTIONS if key in slot]
                lines.append(f"slot {slot['name']}" + "".join(f"; {d}" for d in details))
        for kind in SECTION_DOCUMENTATION[title]:
            if kind in documentation:
                lines.append(f"documentation ({kind}): {documentation[kind]}")
        if title == "function" and "methods" in structure:
            shown, total = structure["methods"], structure["methodCount"]
            lines.append(f"methods ({total}):")
            lines += [f"  {method_line(method)}" for method in shown]
            if total > len(shown):
                lines.append(f"  … and {total - len(shown)} more, not listed")
        sections.append("\n".join(lines))
    if "location" in structure:
        location = structure["location"]
        # place_text reads the agent's keys: the "edited since" note needs them
        where = (f"  defined by evaluation {location['evaluation']}" if "evaluation" in location
                 else place_text({**location, "status": location.get("place"),
                                  "compiled-line": location.get("compiledLine")}))
        sections.append(f"[location]\n{location['type']}\n{where}")
    return "\n\n".join(sections)


def describe_error(arguments: dict[str, Any], kind: str, message: str) -> Rendered:
    """A tool error whose structured content still fits describe-symbol's
    outputSchema."""
    return Rendered(error_text(kind, message), True,
                    {"symbol": arguments["symbol"], "error": condition_structure(kind, message)})


async def describe_symbol(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """What a name is: its kinds, arglist, documentation, value, class,
    methods, home package and first definition's place."""
    result = await ask_agent(session, _about_symbol(session, "cl-mcp-agent:describe-symbol-of", arguments),
                             session.config.eval_timeout)
    if failed := failure(result):
        return describe_error(arguments, *failed)
    structure = describe_structure(result)
    return Rendered(describe_text(structure), False, structure)
