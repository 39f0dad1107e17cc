"""The complete output of the session's evaluations, kept for read-output:
whatever a result had to leave out to fit the host's budget stays here, up
to --keep-output characters for the whole session, the oldest evaluations
dropped first.  The line index of the stream read last counts against the
same limit, a byte for a character, and goes with its output.  Pure: no
I/O."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add

STREAMS = ("stdout", "stderr", "values")


@dataclass(frozen=True, slots=True)
class Kept:
    """One evaluation's streams: its output and its printed values (one
    value after another, each starting on a new line)."""
    stdout: str
    stderr: str
    values: str

    def size(self) -> int:
        return len(self.stdout) + len(self.stderr) + len(self.values)

    def stream(self, name: str) -> str:
        return {"stdout": self.stdout, "stderr": self.stderr, "values": self.values}[name]


class NotKept(LookupError):
    """The evaluation's output is not (or no longer) kept; the message says which."""


class OutputStore:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._kept: OrderedDict[int, Kept] = OrderedDict()
        self._size = 0  # the kept streams' characters and the index's bytes
        self._newest_dropped = 0  # numbers grow: one at or below this was dropped
        self._indexed: tuple[tuple[int, str], Lines] | None = None

    def keep(self, number: int, kept: Kept) -> dict[str, int]:
        """Keep evaluation NUMBER's streams, dropping the oldest evaluations
        past the limit (the newest is always kept).  An evaluation that goes
        on after a restart adds its new output to what it had, and its new
        values replace the old.  Returns, for each stream, the lines kept
        before this output (its first line is the next)."""
        earlier = self._kept.pop(number, None)
        offsets = {"stdout": 0, "stderr": 0, "values": 0}
        if earlier is not None:
            self._size -= earlier.size()
            self._forget_index(number)
            offsets = {"stdout": earlier.stdout.count("\n"), "stderr": earlier.stderr.count("\n"),
                       "values": 0}
            kept = Kept(earlier.stdout + kept.stdout, earlier.stderr + kept.stderr, kept.values)
        self._kept[number] = kept
        self._size += kept.size()
        self._fit(number)
        return offsets

    def _fit(self, keeping: int) -> None:
        """Drop the oldest evaluations but KEEPING while past the limit."""
        for old in list(self._kept):
            if self._size <= self.limit:
                return
            if old != keeping:
                self._size -= self._kept.pop(old).size()
                self._forget_index(old)
                self._newest_dropped = max(self._newest_dropped, old)

    def _forget_index(self, number: int) -> None:
        """Drop the line index when it is of evaluation NUMBER."""
        if self._indexed is not None and self._indexed[0][0] == number:
            self._size -= self._indexed[1].index_size()
            self._indexed = None

    def get(self, number: int) -> Kept:
        kept = self._kept.get(number)
        if kept is not None:
            return kept
        if number <= self._newest_dropped:
            raise NotKept(f"The output of evaluation {number} is no longer kept: the session keeps "
                          f"the newest {self.limit:,} characters of output (--keep-output), and "
                          "drops the oldest evaluations' first.")
        raise NotKept(f"No output of evaluation {number} is kept: no evaluation of this session's "
                      "image has that number (a reset or a new image forgets earlier ones).")

    def lines(self, number: int, stream: str) -> "Lines":
        """Evaluation NUMBER's STREAM as `Lines`, the latest one asked for
        kept indexed (a model reads one output in several calls); its index
        counts against the limit, which may drop older evaluations."""
        text = self.get(number).stream(stream)
        if self._indexed is not None and self._indexed[0] == (number, stream):
            return self._indexed[1]
        if self._indexed is not None:
            self._forget_index(self._indexed[0][0])
        lines = Lines(text)
        self._indexed = ((number, stream), lines)
        self._size += lines.index_size()
        self._fit(number)
        return lines

    def clear(self) -> None:
        self._kept.clear()
        self._size = 0
        self._newest_dropped = 0
        self._indexed = None


# Characters split at a time while indexing: the pieces of one chunk are
# all the index costs beyond its array.
_CHUNK = 1 << 16


def line_starts(text: str) -> array:
    """Where each line of TEXT starts, 4 bytes a line (8 past 4 GiB): a
    list of ints took about 40."""
    starts = array("I" if len(text) < 2**32 else "Q")
    if not text:
        return starts
    starts.append(0)
    for chunk_start in range(0, len(text), _CHUNK):
        pieces = text[chunk_start:chunk_start + _CHUNK].split("\n")
        # After each newline a line starts: the pieces' lengths, each with
        # its newline, summed from the chunk's start.
        after = accumulate(map(add, map(len, pieces[:-1]), repeat(1)), initial=chunk_start)
        next(after)
        starts.extend(after)
    if len(starts) > 1 and starts[-1] == len(text):
        starts.pop()  # a final newline ends the last line; it starts none
    return starts


class Lines:
    """A kept stream's text with where each of its lines starts, so that a
    slice or a search over megabytes of output is one pass, made once."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.starts = line_starts(text)

    def __len__(self) -> int:
        return len(self.starts)

    def index_size(self) -> int:
        """The index's bytes (the text is the kept stream's own)."""
        return len(self.starts) * self.starts.itemsize

    def line(self, number: int) -> str:
        """Line NUMBER (1-based), without its newline."""
        start = self.starts[number - 1]
        end = self.starts[number] - 1 if number < len(self.starts) else len(self.text)
        return self.text[start:end].removesuffix("\n")
