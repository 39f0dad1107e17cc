"""The tools cl-mcp offers: each a frozen ToolSpec of data plus one handler.

Definitions (name, description, inputSchema, annotations) come from
cl_mcp/schemas/tools.json; the handlers live beside this file.  Every
handler's result is fitted to the result budget (--max-result-chars) on its
way out, which tools/list tells hosts that read a size hint; its arguments,
valid only within the integer bound, come in with every integral float
its schema types "integer" made an int (cl_mcp/wire/integers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from cl_mcp.results import budget
from cl_mcp.results.render import Rendered
from cl_mcp.wire.contracts import Schema, tool_definitions, tool_schema
from cl_mcp.wire.integers import Normalize, bounded, integers_of

if TYPE_CHECKING:  # loaded after initialize is answered
    from cl_mcp.lisp.session import LispSession

Handler = Callable[["LispSession", dict[str, Any]], Awaitable[Rendered]]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    definition: dict[str, Any]
    validator: Schema
    handler: Handler
    # Runs beside the session's calls, never waiting for its turn (see
    # LispSession.call_beside), so it never queues behind them.
    beside: bool = False


# The tools that never take the session's turn.
BESIDE = frozenset({"read-output", "await-evaluation"})


# Where a host reads a per-tool size hint in tools/list (Claude Code).
SIZE_HINTS = ("anthropic/maxResultSizeChars",)


def within_budget(handler: Handler) -> Handler:
    """HANDLER, its result's text and structured content each cut to the
    session's --max-result-chars (the evaluation tools fit theirs with
    read-output markers already, and say so; this catches every other result)."""
    async def run(session: LispSession, arguments: dict[str, Any]) -> Rendered:
        rendered = await handler(session, arguments)
        if rendered.fitted:
            return rendered
        limit = session.config.max_result_chars
        structured = rendered.structured
        if structured is not None:
            structured = budget.fit_structure(structured, limit)
            if rendered.counted and structured is not rendered.structured:
                cut = len(rendered.structured[rendered.counted]) - len(structured[rendered.counted])
                if cut:
                    structured["truncated"] = structured.get("truncated", 0) + cut
        return Rendered(budget.fit_text(rendered.text, limit), rendered.is_error, structured)
    return run


def with_integers(handler: Handler, normalize: Normalize) -> Handler:
    """HANDLER, given its valid arguments with NORMALIZE's integers."""
    async def run(session: LispSession, arguments: dict[str, Any]) -> Rendered:
        return await handler(session, normalize(arguments))
    return run


def build_tools(max_result_chars: int | None = None) -> dict[str, ToolSpec]:
    """Every tool, by name, with its argument validator compiled once; with
    MAX_RESULT_CHARS, each definition's `_meta` gives hosts that size hint."""
    from cl_mcp.tools import definitions, evaluate, restarts, systems
    from cl_mcp.tools import code, edit, forms
    from cl_mcp.tools import browse, inspector
    from cl_mcp.tools import names
    from cl_mcp.tools import output
    from cl_mcp.tools import background
    from cl_mcp.tools import profile, threads
    from cl_mcp.tools import run_tests

    handlers: dict[str, Handler] = {
        "evaluate-lisp": evaluate.evaluate_lisp,
        "list-definitions": definitions.list_definitions,
        "reset-session": systems.reset_session,
        "load-system": systems.load_system,
        "invoke-restart": restarts.invoke_restart,
        "backtrace": restarts.backtrace,
        "eval-in-frame": restarts.eval_in_frame,
        "xref": code.xref,
        "compile-file": code.compile_file,
        "compile-form": forms.compile_form,
        "edit-form": edit.edit_form,
        "read-lisp-file": edit.read_lisp_file,
        "apropos": browse.apropos,
        "macroexpand": browse.macroexpand,
        "inspect": inspector.inspect,
        "find-definition": names.find_definition,
        "describe-symbol": names.describe_symbol,
        "read-output": output.read_output,
        "await-evaluation": background.await_evaluation,
        "threads": threads.threads,
        "profile": profile.profile,
        "run-tests": run_tests.run_tests,
    }
    tools = {}
    for definition in tool_definitions():
        name = definition["name"]
        if max_result_chars is not None:
            definition = {**definition, "_meta": {hint: max_result_chars for hint in SIZE_HINTS}}
        handler = within_budget(handlers[name])
        normalize = integers_of(definition["inputSchema"])
        if normalize is not None:
            handler = with_integers(handler, normalize)
        tools[name] = ToolSpec(name, definition, tool_schema(bounded(definition["inputSchema"])),
                               handler, beside=name in BESIDE)
    return tools
