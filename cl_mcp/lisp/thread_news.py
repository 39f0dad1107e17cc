"""What the user's threads did between two calls, as the image tells it
(the agent's `:cl-mcp-threads` event, agent/user-threads.lisp): the output
they wrote, kept for read-output under a number of its own, and the
threads that stopped at an error or were aborted there.  Turned here into
the `[threads]` notice the next tool result carries.  Pure: no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from cl_mcp.results.outputs import Kept
from cl_mcp.wire import sexp
from cl_mcp.wire.sexp import SExp

# Output this short is shown in the notice itself, not only named.
INLINE_CHARS = 600
INLINE_LINES = 8
MESSAGE_CHARS = 500  # of a condition's message in the notice
MAX_LINES = 20  # notices in one result

END_REASONS = {
    "timed-out": "it waited longer than --suspend-timeout",
    "aborted": "more stopped threads waited than --max-suspended allows, or a reset or threads kill ended it",
    "no-waiting": "--max-suspended is 0, so nothing waits at an error",
}


def _entries(value: SExp) -> list[dict[str, SExp]]:
    return [sexp.plist_named(entry) for entry in value or []]


def _message(entry: dict[str, SExp]) -> str:
    message = " ".join(str(entry.get("message") or "").split())  # one line
    return message if len(message) <= MESSAGE_CHARS else message[:MESSAGE_CHARS] + " …"


def _call(tool: str, **arguments: object) -> str:
    return f"{tool} {json.dumps(arguments)}"


@dataclass(slots=True)
class ThreadNews:
    """One `:cl-mcp-threads` event."""
    number: int | None  # under which its output is kept
    stdout: str
    stderr: str
    dropped: int  # characters of output dropped in the image, oldest first
    writers: list[tuple[str, int, int]]  # (thread, characters, lines)
    stops: list[dict[str, SExp]]
    ends: list[dict[str, SExp]]
    untold: int = 0  # stops and ends past the image's limit, only counted

    @classmethod
    def from_plist(cls, value: SExp) -> ThreadNews:
        news = sexp.plist(value)
        number = news.get("number")
        return cls(number=number if isinstance(number, int) else None,
                   stdout=news.get("stdout") or "", stderr=news.get("stderr") or "",
                   dropped=int(news.get("stdout-dropped") or 0) + int(news.get("stderr-dropped") or 0),
                   writers=[(str(name), int(chars), int(lines))
                            for name, chars, lines in news.get("writers") or []],
                   stops=_entries(news.get("stops")), ends=_entries(news.get("ends")),
                   untold=int(news.get("untold") or 0))

    def stop_summaries(self) -> list[str]:
        """A line for each thread that stopped and still waits, for the log
        and for progress messages: which thread, its error and its number."""
        ended = {end.get("evaluation") for end in self.ends}
        return [f"thread {json.dumps(stop.get('thread'))} stopped at an error, {stop.get('type')}: "
                f"{_message(stop)} (it waits as evaluation {stop.get('evaluation')})"
                for stop in self.stops
                if stop.get("evaluation") is not None and stop.get("evaluation") not in ended]

    def kept(self) -> Kept:
        """What read-output keeps under `number` (when there is one)."""
        return Kept(self.stdout, self.stderr, "")

    def stopped_kept(self) -> dict[int, Kept]:
        """What read-output keeps under each stopped thread's own evaluation
        number: that thread's lines (each begun ``[LABEL]``), among them its
        error and backtrace, so the number backtrace and invoke-restart take
        reads its output too."""
        def own(text: str, label: str) -> str:
            return "".join(line for line in text.splitlines(keepends=True)
                           if line.startswith(f"[{label}] ") or line.rstrip("\n") == f"[{label}]")
        return {stop["evaluation"]: Kept(own(self.stdout, str(stop.get("thread"))),
                                         own(self.stderr, str(stop.get("thread"))), "")
                for stop in self.stops if isinstance(stop.get("evaluation"), int)}


@dataclass(slots=True)
class NewsNotices:
    """The `[threads]` lines not yet shown, and where each stopped thread's
    error was kept (a thread aborted later points there)."""
    pending: list[str] = field(default_factory=list)
    kept_in: dict[int, int] = field(default_factory=dict)  # evaluation -> output number
    left_out: int = 0  # notices dropped from between the first and the latest
    # Each stop heard since the notice was last taken, as a line: a call
    # under way tells them in its progress messages.
    stops: list[str] = field(default_factory=list)

    def hear(self, news: ThreadNews) -> None:
        self.stops.extend(news.stop_summaries())
        del self.stops[:-MAX_LINES]
        if news.writers and news.number is not None:
            self._add(self._output_line(news))
        ended = {end.get("evaluation") for end in news.ends}
        for stop in news.stops:
            evaluation = stop.get("evaluation")
            if isinstance(evaluation, int) and news.number is not None:
                self.kept_in[evaluation] = news.number
            # One that was aborted since is told by its end alone.
            if evaluation is not None and evaluation not in ended:
                self._add(self._stop_line(stop))
        for end in news.ends:
            self._add(self._end_line(end, news.number))
        if news.untold:
            self._add(
                f"{news.untold:,} more threads stopped or were aborted at an error than are told here; "
                "each one's error and backtrace is in the threads' error output"
                + (f" ({_call('read-output', evaluation=news.number, stream='stderr')})" if news.number else "")
                + ', and threads {"action": "list"} shows those still stopped.')

    def _add(self, notice: str) -> None:
        """Keep NOTICE; past MAX_LINES notices, the first and the latest are
        kept and the ones between counted (news keeps coming with every reply
        of a long call, none of which is a tool result that takes it)."""
        self.pending.append(notice)
        if len(self.pending) > MAX_LINES:
            del self.pending[MAX_LINES // 2]
            self.left_out += 1

    def take(self) -> str | None:
        """The notice, once: the first and the latest notices, and how many
        between were left out (each says where to look: its read-output call)."""
        if not self.pending:
            return None
        lines, left_out = self.pending, self.left_out
        self.pending, self.left_out = [], 0
        self.stops.clear()
        if left_out:
            half = MAX_LINES // 2
            lines = [*lines[:half], f"({left_out:,} more notices left out)", *lines[half:]]
        return "\n".join(lines)

    def clear(self) -> None:
        self.pending.clear()
        self.stops.clear()
        self.left_out = 0
        self.kept_in.clear()

    @staticmethod
    def _output_line(news: ThreadNews) -> str:
        who = ", ".join(f"{json.dumps(name)} {chars:,} character{'s' if chars != 1 else ''}"
                        f" ({lines:,} line{'s' if lines != 1 else ''})"
                        for name, chars, lines in news.writers)
        where = _call("read-output", evaluation=news.number)
        if news.stderr:
            where += f' (stream "stderr": {_call("read-output", evaluation=news.number, stream="stderr")})'
        line = f"Output from threads since the last call: {who}; {where}."
        if news.dropped:
            line += f" The oldest {news.dropped:,} characters were dropped."
        shown = news.stdout
        if shown and len(shown) <= INLINE_CHARS and len(shown.splitlines()) <= INLINE_LINES:
            line += "\n" + shown.rstrip("\n")
        return line

    @staticmethod
    def _stop_line(stop: dict[str, SExp]) -> str:
        number = stop["evaluation"]
        restarts = "; ".join(f"{index} {name} ({description})"
                             for index, (name, description) in enumerate(stop.get("restarts") or []))
        return (f"Thread {json.dumps(stop.get('thread'))} stopped at an error: {stop.get('type')}: "
                f"{_message(stop)}\nIt waits as evaluation {number}: backtrace and eval-in-frame "
                f"look at it (inspect {{\"code\": \"*\"}} then shows eval-in-frame's value), and {_call('invoke-restart', evaluation=number, restart=0)} "
                f"takes it on. Restarts: {restarts or 'none'}.")

    def _end_line(self, end: dict[str, SExp], number: int | None) -> str:
        evaluation = end.get("evaluation")
        kept = self.kept_in.pop(evaluation, number) if isinstance(evaluation, int) else number
        reason = END_REASONS.get(str(end.get("reason")).lower(), str(end.get("reason")).lower())
        waited = f" (evaluation {evaluation})" if evaluation is not None else ""
        line = (f"Thread {json.dumps(end.get('thread'))}{waited} was aborted at its error, "
                f"{end.get('type')}: {_message(end)}, because {reason}.")
        if kept is not None:
            line += (f" Its error and backtrace are kept: "
                     f"{_call('read-output', evaluation=kept, stream='stderr')}.")
        return line
