"""A regular expression searched over kept output line by line, as grep
would: ``^`` and ``$`` match at each line, and a line matches when a match
starts in it.

The engine is RE2 (google-re2), whose search takes time linear in the
text whatever the pattern: Python's ``re`` backtracks, and ``(a+)+$`` over
one line of 25 ``a``s and a ``!`` took it 2.6 s, doubling with each ``a``.
RE2's syntax is Python's without backreferences and lookaround (and
``\\Z``, which RE2 spells ``\\z``); a pattern it refuses raises
PatternError with its reason.

RE2 finds a pattern with a literal start by a fast scan for that literal,
but a pattern anchored at line starts (``^ERROR``) has none: 11 ms over
5 MB, against 0.4 ms for ``\\nERROR``.  Such a pattern is searched as
``\\n(?:...)`` instead (a ``\\Q`` quote left open closed first), found by
its newline, and line 1 is tried on its own; one that RE2 takes only as
written is searched so."""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple


class PatternError(ValueError):
    """A pattern RE2 refuses; the message is RE2's reason."""


class Shape(NamedTuple):
    """What a pattern's top level holds, as far as rewriting it goes."""

    branches: bool  # a "|" outside every group, class and quote
    open_quote: bool  # a \\Q quote that runs to the end (no \\E closes it)


def shape(pattern: str) -> Shape:
    """Whether PATTERN has a ``|`` outside every group, character class
    and ``\\Q...\\E`` quote, so that a ``^`` before it anchors only its
    first branch (where unsure it says yes, which costs speed, not
    correctness), and whether it ends inside a ``\\Q`` quote, which a
    rewrite must close before it adds to it."""
    depth, index, in_class = 0, 0, False
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("\\Q", index) and not in_class:
            end = pattern.find("\\E", index + 2)
            if end < 0:  # literal up to the end
                return Shape(False, True)
            index = end + 2
            continue
        if char == "\\":
            index += 2
            continue
        if in_class:
            if pattern.startswith("[:", index):  # [[:alpha:]]: its "]" does not end the class
                end = pattern.find(":]", index + 2)
                index = index + 1 if end < 0 else end + 2
                continue
            in_class = char != "]"
        elif char == "[":
            in_class = True
            index += 1
            index += pattern.startswith("^", index)  # [^ ...
            index += pattern.startswith("]", index)  # a ] first is a literal
            continue
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            return Shape(True, False)
        index += 1
    return Shape(False, False)


# re2's compiled pattern; its class is private.
Regexp = Any


def compiled(pattern: str) -> Regexp:
    """PATTERN compiled by RE2; raises PatternError."""
    # Imported on the first search: a session may never search, and the
    # extension takes milliseconds to load at start-up.
    import re2

    options = re2.Options()
    options.never_capture = True  # only where a match starts is wanted
    options.log_errors = False  # RE2 would write its refusals to stderr
    try:
        return re2.compile(pattern, options)
    except re2.error as error:
        reason = error.args[0] if error.args else ""
        raise PatternError(reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason))
    finally:
        # re2.compile keeps its last 128 patterns, each with up to 8 MiB of
        # DFA cache: here a pattern lives only as long as its LinePattern.
        re2.purge()


class LinePattern:
    """PATTERN compiled to search kept output; raises PatternError."""

    def __init__(self, pattern: str) -> None:
        try:
            self.pattern = compiled(f"(?m){pattern}")
        except PatternError:
            compiled(pattern)  # raises again, quoting the pattern as given rather than with (?m)
            raise
        self.after_newline: Regexp | None = None
        rest = shape(pattern[1:])
        if pattern.startswith("^") and not rest.branches:
            closed = pattern[1:] + ("\\E" if rest.open_quote else "")
            try:
                self.after_newline = compiled(f"(?m)\n(?:{closed})")
            except PatternError:  # RE2 takes "^*" but not "\n(?:*)": searched as written
                pass

    def lines(self, text: str) -> Iterator[int]:
        """The numbers (from 1) of the lines of TEXT in which a match
        starts, in order; after a match, the search starts again at the
        next line."""
        # RE2 searches UTF-8, where a newline is the same byte; a lone
        # surrogate (a str may hold one) becomes bytes RE2 matches as bytes.
        data = text.encode("utf-8", "surrogatepass")
        end = len(data)
        if not end:
            return  # no lines
        line, counted = 1, 0  # the line holding byte COUNTED
        if self.after_newline is None:
            position = 0
            while position < end:  # a final newline starts no line
                found = self.pattern.search(data, position)
                start = end if found is None else found.start()
                if found is None or start == end and data.endswith(b"\n"):
                    return
                line += data.count(b"\n", counted, start)
                counted = start
                yield line
                position = data.find(b"\n", counted) + 1 or end
            return
        if self.pattern.match(data):
            yield 1
        position = data.find(b"\n")
        while 0 <= position < end - 1:
            found = self.after_newline.search(data, position)
            start = end if found is None else found.start() + 1  # where the matching line starts
            if start >= end:
                return  # past the final newline no line starts
            line += data.count(b"\n", counted, start)
            counted = start
            yield line
            position = data.find(b"\n", counted)
