"""How a tool calls the image-side agent (agent/*.lisp): the one place
that adds the grace past the agent's own deadline (`agent_value`), its
answers as dicts, a call in a turn of its own with its failures in one
shape (`ask_agent`), and numbers the Lisp reader reads fast."""

from __future__ import annotations

from typing import Any

from cl_mcp.errors import SessionError
from cl_mcp.lisp.session import LispSession
from cl_mcp.wire import sexp
from cl_mcp.wire.sexp import Keyword, SExp

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
    sticks).  An error's report leaves it as it was: *PACKAGE* at the error
    may be a binding of the code's own, COMPILE-FILE's or LOAD's, gone once
    the evaluation ends; its outcome after a restart says where it ended."""
    if result.get("status") == "error":
        return
    if isinstance(result.get("package"), str) and (not explicit or result.get("package-changed")):
        session.package = result["package"]



_TAG = Keyword("tag")


async def agent_value(session: LispSession, form: SExp, seconds: float, *,
                      tag: int | None = None, beside: bool = False) -> SExp:
    """FORM's value from the agent, the caller having the session's turn
    (`LispSession.call`, TAG naming the call for a cancel), or BESIDE it
    (`LispSession.call_beside`).  SECONDS bounds the agent's own work: the
    call may take DEADLINE_GRACE more to come back before cl-mcp gives up
    on the image.  A failure raises `SessionError`."""
    deadline = seconds + DEADLINE_GRACE
    return await (session.call_beside(form, deadline) if beside else session.call(form, deadline, tag))


async def agent_plist(session: LispSession, form: SExp, seconds: float, *,
                      tag: int | None = None, beside: bool = False) -> dict[str, Any]:
    """`agent_value` of FORM, an entry point that answers a plist, as a dict."""
    return result_dict(await agent_value(session, form, seconds, tag=tag, beside=beside))


async def ask_agent(session: LispSession, form: list[SExp], seconds: float,
                    runs_code: bool = False) -> dict[str, Any]:
    """`agent_plist` of FORM in a turn of its own.  When it RUNS_CODE (the
    user's), the call is tagged (the entry point's :tag) so that a
    cancelled caller, or a missed deadline in a shared image, stops that
    code in the image.  A session failure comes back as a :status :error
    plist, as the agent's own refusals do (`failure` reads either)."""
    try:
        async with session.turn():
            tag = session.new_tag() if runs_code else None
            return await agent_plist(session, form if tag is None else [*form, _TAG, tag], seconds, tag=tag)
    except SessionError as error:
        return {"status": "error", "error": {"type": error.kind, "message": error.message}}


# What went wrong with an agent call: the error's type and message.
Failure = tuple[str, str]


def failure(result: dict[str, Any]) -> Failure | None:
    """(TYPE, MESSAGE) of a result whose :status is not :ok, else None."""
    if result.get("status") == "ok":
        return None
    return result["error"]["type"], result["error"]["message"]
