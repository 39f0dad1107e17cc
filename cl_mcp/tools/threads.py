"""threads: the image's threads as SLIME's thread list shows them (the
agent's `threads-of`); a thread's backtrace; stopping a user's thread as at
an error (SLIME's slime-thread-debug), where the debugger tools reach it;
ending one."""

from __future__ import annotations

from typing import Any

from cl_mcp.errors import SessionError
from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, error_result
from cl_mcp.tools.calls import agent_plist, result_dict
from cl_mcp.tools.evaluate import rendered_within
from cl_mcp.wire.sexp import Keyword, Symbol

# Seconds the agent gives a thread to answer, with room for the call.
THREAD_SECONDS = 2

EMPTY = {"threads": []}


def thread_structure(entry: dict[str, Any]) -> dict[str, Any]:
    """One thread as the outputSchema has it."""
    thread = {"id": entry["id"], "name": entry["name"], "owner": entry["owner"],
              "state": entry["state"]}
    for key in ("evaluation", "debugger", "lock", "read-only"):
        if key in entry:
            thread[key] = entry[key]
    return thread


def thread_line(thread: dict[str, Any]) -> str:
    """``27316 "sleeper" user sleeping`` and what it waits for or at."""
    line = f'{thread["id"]} "{thread["name"]}" {thread["owner"]} {thread["state"]}'
    if "evaluation" in thread:
        line += f' (evaluation {thread["evaluation"]})'
    if "debugger" in thread:
        line += f' ({thread["debugger"]})'
    if "lock" in thread:
        line += f' (lock "{thread["lock"]}")'
    if "read-only" in thread:
        line += f' read-only: {thread["read-only"]}'
    return line


def render_threads(action: str, result: dict[str, Any]) -> Rendered:
    """list, backtrace or kill's result."""
    if action == "list":
        threads = [thread_structure(result_dict(each)) for each in result["threads"]]
        user = sum(thread["owner"] == "user" for thread in threads)
        text = f"{len(threads)} threads ({user} the user's):\n" + "\n".join(map(thread_line, threads))
        return Rendered(text, False, {"threads": threads})
    thread = thread_structure(result_dict(result["thread"]))
    if action == "kill":
        return Rendered(f"Killed thread {thread_line(thread)}", False, {"threads": [thread]})
    frames = [frame for frame in result.get("frames") or [] if isinstance(frame, str)]
    text = f"Thread {thread_line(thread)}\n\n[Backtrace]\n" + "\n".join(
        f"{index}: {frame}" for index, frame in enumerate(frames))
    return Rendered(text, False, {"threads": [thread], "frames": frames})


async def threads(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """List the image's threads, or act on one."""
    action = arguments["action"]
    form = [Symbol("cl-mcp-agent:threads-of"), Keyword(action),
            Keyword("thread"), arguments.get("thread"),
            Keyword("count"), arguments.get("count", 20)]
    try:
        async with session.turn():
            result = await agent_plist(session, form, THREAD_SECONDS)
    except SessionError as error:
        return error_result(error.kind, error.message, EMPTY)
    if action == "interrupt" and "evaluation" in result:
        # The thread waits at an error, as an evaluation does.
        rendered = rendered_within(result, session.config.max_result_chars)
        return Rendered(rendered.text, False, {**EMPTY, "evaluation": result["evaluation"]})
    if result.get("status") != "ok":
        return error_result(result["error"]["type"], result["error"]["message"], EMPTY)
    return render_threads(action, result)
