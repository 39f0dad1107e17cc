"""apropos and macroexpand: finding symbols and reading macros, through
Swank's apropos and SBCL's expanders (the agent's `apropos-of` and
`macroexpand-of`)."""

from __future__ import annotations

from typing import Any

from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, condition_structure, error_text
from cl_mcp.tools.calls import ask_agent, failure, lisp_seconds
from cl_mcp.wire import sexp
from cl_mcp.wire.sexp import Keyword, Symbol


def _plist(value: Any) -> dict[str, Any]:
    """A nested agent plist as a dict."""
    return dict(sexp.plist(value))


def _flag(value: Any) -> bool:
    """A Lisp generalized boolean: NIL arrives as an empty list."""
    return value is True


# ---------------------------------------------------------------- apropos

def symbol_line(entry: dict[str, Any]) -> str:
    """``PACKAGE:NAME  kind, kind  (arglist)``; ``PACKAGE::NAME`` for a
    symbol its package does not export, so that the line reads back."""
    marker = ":" if entry["external"] else "::"
    line = f"{entry['package']}{marker}{entry['name']}  {', '.join(entry['kinds'])}"
    if "arglist" in entry:
        line += f"  {entry['arglist']}"
    return line


def render_apropos(result: dict[str, Any]) -> Rendered:
    """One line per symbol, and how many more matched when capped."""
    pattern, total = result["pattern"], result["total"]
    entries = []
    for item in result.get("symbols") or []:
        plist = _plist(item)
        entry: dict[str, Any] = {"name": plist["name"], "package": plist["package"],
                                 "external": _flag(plist["external"]), "kinds": list(plist["kinds"] or [])}
        if isinstance(plist.get("arglist"), str):
            entry["arglist"] = plist["arglist"]
        entries.append(entry)
    if not entries:
        text = f'No symbol whose name contains "{pattern}" names anything.'
    else:
        lines = [symbol_line(entry) for entry in entries]
        if total > len(entries):
            lines.append(f"… {total - len(entries)} more (narrow the pattern or pass package / type)")
        text = "\n".join(lines)
    return Rendered(text, False, {"pattern": pattern, "total": total, "symbols": entries,
                                  "truncated": total > len(entries)})


def apropos_error(arguments: dict[str, Any], kind: str, message: str) -> Rendered:
    """A tool error whose structured content still fits apropos' outputSchema."""
    return Rendered(error_text(kind, message), True,
                    {"pattern": arguments["pattern"], "total": 0, "symbols": [], "truncated": False,
                     "error": condition_structure(kind, message)})


async def apropos(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """The symbols whose names contain a pattern, with what they name."""
    form: list[Any] = [Symbol("cl-mcp-agent:apropos-of"), arguments["pattern"]]
    if arguments.get("package"):
        form += [Keyword("package"), arguments["package"]]
    if arguments.get("external-only"):
        form += [Keyword("external-only"), Symbol("t")]
    if arguments.get("type"):
        form += [Keyword("type"), arguments["type"]]
    result = await ask_agent(session, form, session.config.eval_timeout)
    if failed := failure(result):
        return apropos_error(arguments, *failed)
    return render_apropos(result)


# ---------------------------------------------------------------- macroexpand

NOT_EXPANDED = "; not a macro form: it comes back unchanged"


def macroexpand_error(arguments: dict[str, Any], kind: str, message: str) -> Rendered:
    """A tool error whose structured content still fits macroexpand's outputSchema."""
    return Rendered(error_text(kind, message), True,
                    {"form": arguments["form"], "expansion": "", "expanded": False,
                     "all": bool(arguments.get("all")), "error": condition_structure(kind, message)})


async def macroexpand(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """A form's macroexpansion, once or fully, pretty-printed."""
    timeout = session.config.eval_timeout
    form: list[Any] = [Symbol("cl-mcp-agent:macroexpand-of"), arguments["form"],
                       Keyword("package"), arguments.get("package") or session.package,
                       Keyword("timeout"), lisp_seconds(timeout)]
    if arguments.get("all"):
        form += [Keyword("all"), Symbol("t")]
    result = await ask_agent(session, form, timeout)
    if failed := failure(result):
        return macroexpand_error(arguments, *failed)
    expanded = _flag(result.get("expanded"))
    text = result["expansion"] + ("" if expanded else f"\n{NOT_EXPANDED}")
    return Rendered(text, False, {"form": arguments["form"], "expansion": result["expansion"],
                                  "expanded": expanded, "all": bool(arguments.get("all"))})
