"""profile: code run under SB-SPROF on the thread that evaluates it, and
the flat report's top rows; or under SB-PROFILE, the calls of the named
functions (the agent's `profile-of`)."""

from __future__ import annotations

from typing import Any

from cl_mcp.lisp.session import LispSession
from cl_mcp.results.render import Rendered, error_result
from cl_mcp.tools.calls import ask_agent, failure, lisp_seconds, result_dict, strings
from cl_mcp.wire.sexp import Keyword, Symbol

EMPTY: dict[str, Any] = {"rows": []}


def percent(tenths: int) -> float:
    return tenths / 10


def seconds(millionths: int) -> float:
    return millionths / 1_000_000


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def render_calls(result: dict[str, Any]) -> Rendered:
    """``N functions profiled, K called``, then one row a called function:
    calls, seconds, bytes consed, seconds per call."""
    rows = [{"function": row["function"], "calls": row["calls"], "seconds": seconds(row["seconds"]),
             "consedBytes": row["consed"], "secondsPerCall": seconds(row["per-call"])}
            for row in map(result_dict, result["rows"] or [])]
    theirs = strings(result["already-profiled"])
    head = (f'{plural(result["profiled"], "function")} profiled, {result["called"]} called (deterministic); '
            f'the value: {result["value"]}')
    if theirs:
        head += "\nProfiled before this call, left alone (their counts are not here): " + ", ".join(theirs)
    if result["called"] > len(rows):
        head += f'\nThe {len(rows)} with the most seconds:'
    table = "\n".join(f'{row["calls"]:>9} {row["seconds"]:9.3f} {row["consedBytes"]:>13,} '
                      f'{row["secondsPerCall"]:10.6f}  {row["function"]}' for row in rows)
    text = head + ("\n\n    calls   seconds        consed   sec/call  function\n" + table if rows else "")
    return Rendered(text, False, {"mode": "deterministic", "value": result["value"],
                                  "functions": result["profiled"], "called": result["called"],
                                  "alreadyProfiled": theirs, "rows": rows})


def render_profile(result: dict[str, Any]) -> Rendered:
    """``N samples (cpu)``, then one row a function: self %, cumulative %;
    a line when the rows are the first of more, and one when an alloc
    profile's samples fell in SBCL's allocation trampolines."""
    rows = [{"function": row["function"], "selfPercent": percent(row["self"]),
             "cumulativePercent": percent(row["total"])}
            for row in map(result_dict, result["rows"] or [])]
    head = f'{result["samples"]} samples ({result["mode"]}); the value: {result["value"]}'
    if not rows:
        head += "\nNo samples: the code ran for less than one sample interval (0.01 s)" \
                if result["mode"] == "cpu" else "\nNo samples: the code allocated too little"
    if result["in-trampolines"]:
        head += (f'\n{percent(result["in-trampolines"])}% of the samples fell in SBCL\'s allocation '
                 "trampolines (ALLOC-TRAMP, LIST-ALLOC-TRAMP), where alloc samples are taken: "
                 "the code that allocates shows in the cum column")
    if result["sampled"] > len(rows):
        head += f'\nThe {len(rows)} of {result["sampled"]} functions with the most samples of their own:'
    if result.get("left-out"):
        head += f'\n({result["left-out"]} functions of cl-mcp\'s, Swank\'s and SBCL\'s, under the code, left out)'
    table = "\n".join(f'{row["selfPercent"]:5.1f}% {row["cumulativePercent"]:5.1f}%  {row["function"]}'
                      for row in rows)
    text = head + ("\n\n  self    cum  function\n" + table if rows else "")
    return Rendered(text, False, {"mode": result["mode"], "samples": result["samples"],
                                  "value": result["value"], "sampledFunctions": result["sampled"],
                                  "rows": rows})


async def profile(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    """Profile CODE and report where its samples fell."""
    timeout = session.config.eval_timeout
    form = [Symbol("cl-mcp-agent:profile-of"), arguments["code"],
            Keyword("mode"), Keyword(arguments.get("mode", "cpu")),
            Keyword("max-rows"), arguments.get("max-rows", 20),
            Keyword("package"), arguments.get("package"),
            Keyword("functions"), quoted(arguments.get("functions")),
            Keyword("packages"), quoted(arguments.get("packages")),
            Keyword("timeout"), lisp_seconds(timeout)]
    result = await ask_agent(session, form, timeout, runs_code=True)
    if failed := failure(result):
        return error_result(*failed, EMPTY)
    return render_calls(result) if result["mode"] == "deterministic" else render_profile(result)


def quoted(names: list[str] | None) -> Any:
    """A list of strings as Lisp data, not a call."""
    return [Symbol("cl:quote"), names] if names else None
