"""What every tool needs to call the image-side agent: its answers as
dicts, numbers the Lisp reader reads fast, how long past its own deadline a
call may take to come back, and one call with its failures in one shape."""

from __future__ import annotations

from typing import Any

from cl_mcp.errors import SessionError
from cl_mcp.lisp.session import LispSession
from cl_mcp.wire import sexp
from cl_mcp.wire.sexp import SExp, Symbol

# How long past its own deadline an evaluation may take to come back (the
# image interrupts it itself) before cl-mcp gives up on the image.
DEADLINE_GRACE = 5.0


def lisp_seconds(seconds: float) -> int | float:
    """Whole seconds as an integer: the Lisp reader reads one much faster
    than a double-float."""
    return int(seconds) if float(seconds).is_integer() else float(seconds)


def result_dict(value: SExp) -> dict[str, Any]:
    """An agent plist with keyword values turned into their names."""
    result = sexp.plist_named(value)
    if isinstance(result.get("error"), list):
        result["error"] = sexp.plist_named(result["error"])
    return result


def strings(value: Any) -> list[str]:
    """A Lisp list of strings from a result plist (NIL arrives as an empty
    list), anything else in it left out."""
    return [item for item in value or [] if isinstance(item, str)]


def follow_package(session: LispSession, result: dict[str, Any], explicit: bool) -> None:
    """The session's package after RESULT.  An explicit package is for one
    call only, unless the code itself moved to another package (IN-PACKAGE
    sticks)."""
    if isinstance(result.get("package"), str) and (not explicit or result.get("package-changed")):
        session.package = result["package"]



_CANCELLABLE, _QUOTE = Symbol("cl-mcp-agent:cancellable"), Symbol("cl:quote")


async def call_cancellable(session: LispSession, form: list[SExp], deadline: float) -> SExp:
    """`session.call` of FORM, an agent call that runs the user's code,
    tagged (the agent's `cancellable`): a cancelled caller, or a missed
    deadline in a shared image, stops that code in the image."""
    tag = session.new_tag()
    return await session.call([_CANCELLABLE, tag, [_QUOTE, form[0]], *form[1:]], deadline, tag)


# What went wrong with an agent call: the error's type and message.
Failure = tuple[str, str]


async def ask_agent(session: LispSession, form: list[SExp], deadline: float,
                    runs_code: bool = False) -> tuple[dict[str, Any], None] | tuple[None, Failure]:
    """Run FORM in the session's turn (`call_cancellable` when it RUNS_CODE,
    the user's): (its plist as a dict, None), or (None, (TYPE, MESSAGE))
    when the session could not run it or the agent answered :status :error.
    For the tools whose every failure is one kind of tool error."""
    try:
        async with session.turn():
            result = result_dict(await (call_cancellable(session, form, deadline) if runs_code
                                        else session.call(form, deadline)))
    except SessionError as error:
        return None, (error.kind, error.message)
    if result.get("status") != "ok":
        return None, (result["error"]["type"], result["error"]["message"])
    return result, None
