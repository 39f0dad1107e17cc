"""The session's record of its work in the background whose outcome has not
been kept yet, so that each outcome is handed out once.  Pure: no I/O.

It mirrors the image's `*background*` (agent/registries.lisp): an entry
comes with the work's "still running" answer and goes when its outcome is
kept, or when the image says it forgot the outcome to stay within its bound
(the answer's `forgotten`), so it never holds more than the image does.

Two await-evaluation calls on one evaluation may both be shown its outcome
by the image, which only looks until the outcome is kept.  The first to
`claim` it keeps it; the other is told it was handed out already.  Each
entry is a stint: the same number sent to the background again (a
continuation through a restart) is a new one, so an await that began
before the earlier outcome was kept cannot claim the later stint.  An
await that began in a stint and finds its outcome gone from the image
because another call claimed it is told it was handed out, however the
two met there (the last stints kept are remembered for it)."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Generic, Iterable, TypeVar

W = TypeVar("W")

KEPT_REMEMBERED = 64  # stints whose outcome was kept, for late awaits


@dataclass(slots=True)
class _Stint(Generic[W]):
    work: W
    stint: int
    claimed: bool = False


class Unclaimed(Generic[W]):
    def __init__(self) -> None:
        self._entries: dict[int, _Stint[W]] = {}
        self._stints = itertools.count(1)
        self._kept: deque[int] = deque(maxlen=KEPT_REMEMBERED)

    def add(self, number: int, work: W, forgotten: Iterable[int] = ()) -> None:
        """NUMBER went to the background as WORK (how its tool shows it);
        the image forgot the outcomes numbered FORGOTTEN to make room."""
        for old in forgotten:
            self._entries.pop(old, None)
        self._entries.pop(number, None)
        self._entries[number] = _Stint(work, next(self._stints))

    def work(self, number: int, default: W) -> W:
        entry = self._entries.get(number)
        return default if entry is None else entry.work

    def stint(self, number: int) -> int | None:
        """Which stint of NUMBER an await-evaluation beginning now follows
        (None: not this session's background work, as far as it knows)."""
        entry = self._entries.get(number)
        return None if entry is None else entry.stint

    def claim(self, number: int, stint: int | None) -> bool:
        """True when the outcome of NUMBER's STINT is the caller's to keep;
        False when another caller has it, or had it.  Work the record does
        not know (STINT None) is not this session's to hand out: the caller
        keeps what the image gave it."""
        entry = self._entries.get(number)
        if stint is None:
            return entry is None or not entry.claimed
        if entry is None or entry.stint != stint or entry.claimed:
            return False
        entry.claimed = True
        return True

    def release(self, number: int, stint: int | None) -> None:
        """The claim on NUMBER's STINT could not be kept (the call failed or
        was cancelled): the image still holds the outcome for the next call."""
        entry = self._entries.get(number)
        if entry is not None and entry.stint == stint:
            entry.claimed = False

    def kept(self, number: int, stint: int | None) -> None:
        """NUMBER's outcome (of STINT, when known) is kept: forget it."""
        entry = self._entries.get(number)
        if entry is not None and (stint is None or entry.stint == stint):
            del self._entries[number]
            self._kept.append(entry.stint)

    def handed_out(self, number: int, stint: int | None) -> bool:
        """True when another call has NUMBER's STINT: claimed, or kept (one
        of the last KEPT_REMEMBERED)."""
        if stint is None:
            return False
        entry = self._entries.get(number)
        return stint in self._kept or (entry is not None and entry.stint == stint and entry.claimed)

    def discard(self, number: int) -> None:
        """The image has no outcome of NUMBER for anyone."""
        entry = self._entries.get(number)
        if entry is not None and not entry.claimed:
            del self._entries[number]

    def clear(self) -> None:
        self._entries.clear()
        self._kept.clear()

    def __contains__(self, number: object) -> bool:
        return number in self._entries

    def __len__(self) -> int:
        return len(self._entries)
