"""A regular expression searched over kept output, line by line as grep
would (``^`` and ``$`` at each line), where each match starts.

Python's ``re`` finds a pattern with a literal start by a fast scan for
that literal, but a pattern anchored at line starts (``^ERROR``) has none,
so it is tried at every character: 59 ms over 5 MB.  Such a pattern is
searched as ``\\n(?=...)`` instead, which ``re`` finds by its newline
(4 ms), and line 1 is tried on its own.  Matched that way, a line counts
when the pattern matches at its start, even inside an earlier match that
spanned lines."""

from __future__ import annotations

import re
from typing import Iterator


def branches_at_top(pattern: str) -> bool:
    """Whether PATTERN has a ``|`` outside every group and character class,
    so that a ``^`` before it anchors only its first branch."""
    depth, index, in_class = 0, 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            index += 1
            index += pattern.startswith("^", index)  # [^ ...
            index += pattern.startswith("]", index)  # a ] first is a literal
            continue
        elif pattern.startswith("(?#", index):
            index = pattern.find(")", index) % (len(pattern) + 1)  # a comment ends at its ")"
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "|" and depth == 0:
            return True
        index += 1
    return False


class LinePattern:
    """PATTERN compiled to search kept output; raises re.error as re.compile does."""

    def __init__(self, pattern: str) -> None:
        self.pattern = re.compile(pattern, re.MULTILINE)
        self.after_newline: re.Pattern[str] | None = None
        if pattern.startswith("^") and not branches_at_top(pattern[1:]):
            try:
                self.after_newline = re.compile(f"\n(?={pattern[1:]})", re.MULTILINE)
            except re.error:  # e.g. a look-behind the rewriting made invalid: search as written
                pass

    def starts(self, text: str) -> Iterator[int]:
        """Where each match in TEXT starts, in order."""
        if self.after_newline is None:
            for match in self.pattern.finditer(text):
                yield match.start()
            return
        if self.pattern.match(text):
            yield 0
        for match in self.after_newline.finditer(text):
            yield match.start() + 1
