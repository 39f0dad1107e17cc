"""The backtraces oracle and the check of cl-mcp's backtraces against it.

Each exported function of a library (backtraces.lisp's `library-functions`:
compiled from the library's files) is called with wrong arguments (NIL for
each required parameter) in a thread an evaluation starts, under a handler
that takes `sb-debug:list-backtrace` at the signal and declines.  A call is
checked when that handler saw an error and the thread stops at it: the
oracle's frames, from the one that signalled down to the thread's
outermost own frame, must all appear, in order, and nothing else between them, among the frames of two
answers: backtrace of the evaluation number the thread waits under, and
the threads tool's backtrace of the thread (taken by an interrupt).  The
same call is then made in an evaluation's own thread: when it signals
there too, the first 20 frames of that oracle (an error result shows 20)
must appear in the result's [Backtrace].

A frame appears when cl-mcp's printed call of it is the oracle's printed
function name in parentheses, alone or followed by a space (then its
arguments): the oracle prints the name as docs/tools.md says a frame's
call is printed (CL-USER, `*print-length*` 10, `*print-level*` 3), which
SBCL applies to the function name as a whole.
"""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

from tests.integration.conftest import McpProcess
from tests.truth.frames import check_frames
from tests.truth.places import Definition, Form, Tally, read_oracle

LISP = Path(__file__).with_name("backtraces.lisp")
Sources = tuple[list[Definition], list[Form], set[str]]
ANSWERS = ("backtrace of a stopped thread", "threads backtrace", "evaluate-lisp error")
ERROR_FRAMES = 20  # an error result's backtrace shows at most these (docs/tools.md)
FRAME = re.compile(r"\n(?=\d+: \()")
# The wrong arguments, tried in turn until a call does not return.
VALUES = ("nil", ":truth-wrong-type")


def lines_of(process: McpProcess, code: str) -> list[str]:
    """The lines CODE prints, evaluated in PROCESS; an evaluation answered
    "still running" because a thread stopped meanwhile is awaited."""
    result = process.call("evaluate-lisp", code=code, wait=120)
    if result["structuredContent"].get("running"):
        result = process.call("await-evaluation", evaluation=result["structuredContent"]["number"],
                              wait=120)
    assert not result["isError"], result["content"][0]["text"][:2000]
    return result["structuredContent"].get("stdout", "").splitlines()


def lambda_nil(text: str) -> str:
    """SBCL prints an empty lambda list as NIL in a name, as () in a frame's call."""
    return text.replace("(LAMBDA NIL", "(LAMBDA ()")


def appears(name: str, call: str) -> bool:
    """Whether CALL, a printed frame, is a call of the function NAME."""
    return call == f"({name})" or call.startswith(f"({name} ")


def missing(expected: list[str], calls: list[str]) -> str | None:
    """Why CALLS (printed frames) are not EXPECTED's frames (function names)
    both ways: each must appear, in order, and from the first to the last
    of them no other frame comes between (cl-mcp leaves out the same
    evaluator frames the oracle does; a foreign frame prints no call);
    None when they are."""
    calls = [lambda_nil(call) for call in calls]
    # Matched from the outermost frame up, each at the nearest frame above
    # the one below: frames above the oracle's first (a waiting thread's
    # own, which may call the same functions) are not taken for its.
    position, matched = len(calls), []
    for name in reversed([lambda_nil(name) for name in expected]):
        found = next((i for i in range(position - 1, -1, -1) if appears(name, calls[i])), None)
        if found is None:
            return f"{name} missing above frame {position}: oracle {expected}, cl-mcp {calls}"
        matched.append(found)
        position = found
    extra = [calls[i] for i in range(matched[-1], matched[0]) if i not in matched and calls[i].startswith("(")] \
        if matched else []
    return f"extra frames {extra} among the oracle's {expected}" if extra else None


def stopped_entry(process: McpProcess, thread: str, seconds: float = 10) -> dict | None:
    """The threads list entry of THREAD once it is stopped at its error;
    None when it ended, or did not stop within SECONDS."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        entries = process.call("threads", action="list")["structuredContent"]["threads"]
        entry = next((e for e in entries if e["name"] == thread), None)
        if entry is None or entry.get("state") == "stopped-at-error":
            return entry
        time.sleep(0.05)
    return None


def check_call(process: McpProcess, tally: Tally, name: str, value: str, thread: str,
               sources: Sources) -> str:
    """Call NAME with VALUE for each argument in THREAD and check the
    backtraces, and the places of their frames in the library's SOURCES;
    what became of the call."""
    lines_of(process, f'(truth-backtraces:start-call "{name}" {value} "{thread}")')
    outcome = lines_of(process, f'(truth-backtraces:outcome "{thread}")')
    if outcome[0] != "SIGNALLED":
        return outcome[0].lower()
    entry = stopped_entry(process, thread)
    if entry is None:
        # The thread ended: the error was signalled, not raised (SIGNAL
        # returned), when the call returned after all.
        outcome = lines_of(process, f'(truth-backtraces:outcome "{thread}" :seconds 0)')
        if outcome[0] == "RETURNED":
            return "returned"
        for answer in ANSWERS:
            tally.count(answer, "call", f"{name}: thread {thread} signalled {outcome[1:2]} and did not stop")
        return "not stopped"
    condition, expected = outcome[1], outcome[2:]
    evaluation = entry["evaluation"]
    result = process.call("backtrace", evaluation=evaluation, count=200)
    frames = result.get("structuredContent", {}).get("frames", [])
    failure = missing(expected, [frame["call"] for frame in frames])
    tally.count(ANSWERS[0], "call", failure and f"{name} ({condition}): {failure}")
    check_frames(tally, frames, *sources, what=f"{name} ({condition})")
    result = process.call("threads", action="backtrace", thread=entry["id"], count=200)
    failure = missing(expected, result.get("structuredContent", {}).get("frames", []))
    tally.count(ANSWERS[1], "call", failure and f"{name} ({condition}): {failure}")
    aborted = process.call("invoke-restart", evaluation=evaluation, restart="ABORT")
    assert not aborted["isError"], aborted
    check_evaluation(process, tally, name, value, thread)
    return "checked"


def check_evaluation(process: McpProcess, tally: Tally, name: str, value: str, key: str) -> None:
    """Call NAME with VALUE for each argument in an evaluation's own thread,
    checked when it signals there too: the first frames of the oracle, as
    many as an error result shows, must appear in its [Backtrace]."""
    result = process.call("evaluate-lisp", code=f'(truth-backtraces:call-here "{name}" {value} "{key}-here")',
                          timeout=10)
    structure = result["structuredContent"]
    outcome = lines_of(process, f'(truth-backtraces:outcome "{key}-here" :seconds 0)')
    if structure.get("evaluation"):
        aborted = process.call("invoke-restart", evaluation=structure["evaluation"], restart="ABORT")
        assert not aborted["isError"], aborted
    if outcome[0] != "SIGNALLED" or structure.get("error", {}).get("type") == "SB-EXT:TIMEOUT":
        return
    frames = [re.sub(r"^\d+: ", "", frame) for frame in FRAME.split(structure.get("error", {}).get("backtrace", ""))]
    failure = missing(outcome[2:2 + ERROR_FRAMES], frames)
    tally.count(ANSWERS[2], "call", failure and f"{name} ({outcome[1]}): {failure}")


def check_backtraces(process: McpProcess, tally: Tally, copy: Path, system: str, log=print) -> None:
    """Every exported function of SYSTEM loaded in PROCESS from COPY,
    called with wrong arguments, its backtraces checked, and the places of
    their frames in COPY's files (frames.py)."""
    definitions, forms = read_oracle(copy, system, copy)
    sources = (definitions, forms, {form.file for form in forms})
    lines_of(process, f'(load "{LISP}")')
    names = lines_of(process, f'(format t "~{{~A~%~}}" (truth-backtraces:library-functions "{copy}/"))')
    outcomes: dict[str, int] = {}
    threads = itertools.count(1)
    for name in names:
        for value in VALUES:
            outcome = check_call(process, tally, name, value, f"truth-bt-{next(threads)}", sources)
            if outcome != "returned":
                break
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    log(f"  backtraces: {len(names)} functions: {outcomes}")
