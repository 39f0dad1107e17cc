"""Results that fit the host's budget (--max-result-chars): long parts keep
their start and their end, with one marker line between them that says
what was left out and how to read it.  Pure: no I/O.

Hosts limit what they show a model (docs/tools.md, "Result budgets"), and
the end of a long output (the last error of a log) matters as much as its
start, so a part is cut in its middle, never at its end.
"""

from __future__ import annotations

from typing import Any, Callable

import orjson

# Room a marker line takes, at most (the read-output call included).
MARKER_ROOM = 240
HEAD_SHARE = 0.4  # of a cut part's room; the end gets the rest

Sizer = Callable[[dict[str, str]], int]
Reader = Callable[[str, int, int], str]  # (part, first line left out, lines left out) -> how to read


def cut_middle(text: str, room: int, how_to_read: Callable[[int, int], str]) -> str:
    """TEXT in at most ROOM characters plus a marker line: whole lines from
    its start and its end where lines allow, and between them
    ``… [N characters in L lines left out: HOW]`` where HOW (from the
    first line left out, 1-based, and the number of lines) says how to
    read them."""
    if len(text) <= room:
        return text
    head_end = int(room * HEAD_SHARE)
    tail_start = len(text) - (room - head_end)
    newline = text.rfind("\n", 0, head_end)
    if newline > 0:
        head_end = newline + 1
    newline = text.find("\n", tail_start, len(text) - 1)
    if newline >= 0:
        tail_start = newline + 1
    head, left_out, tail = text[:head_end], text[head_end:tail_start], text[tail_start:]
    first_line = head.count("\n") + 1
    lines = left_out.count("\n") + (0 if left_out.endswith("\n") else 1)
    marker = f"… [{len(left_out):,} characters in {lines:,} line{'s' if lines != 1 else ''} left out: " \
             f"{how_to_read(first_line, lines)}]"
    separator = "" if not head or head.endswith("\n") else "\n"
    return f"{head}{separator}{marker}\n{tail}"


def shares(lengths: dict[str, int], room: int) -> dict[str, int]:
    """ROOM shared among parts of LENGTHS: a part that needs less than an
    equal share keeps all of it, and what it leaves goes to the others."""
    allowed: dict[str, int] = {}
    pending = sorted(lengths, key=lengths.__getitem__)
    while pending:
        share = max(0, room) // len(pending)
        name = pending[0]
        if lengths[name] <= share:
            allowed[name] = lengths[name]
            room -= lengths[name]
            pending.pop(0)
        else:
            for name in pending:
                allowed[name] = share
            break
    return allowed


def fit_parts(parts: dict[str, str], size: Sizer, budget: int, reader: Reader) -> dict[str, str]:
    """PARTS (named texts) cut in their middles so that SIZE of them is at
    most BUDGET, if cutting them can do it; READER says how to read what a
    part leaves out."""
    if size(parts) <= budget:
        return parts
    overhead = size({name: "" for name in parts})
    room = budget - overhead - MARKER_ROOM * sum(1 for text in parts.values() if text)
    lengths = {name: len(text) for name, text in parts.items()}
    cut = parts
    for _ in range(8):
        allowed = shares(lengths, room)
        cut = {name: cut_middle(text, allowed[name], lambda line, lines, name=name: reader(name, line, lines))
               for name, text in parts.items()}
        excess = size(cut) - budget
        if excess <= 0:
            return cut
        room -= excess + 64  # JSON escapes and markers weigh more than counted
    return cut


def fit_text(text: str, budget: int) -> str:
    """Any result text in BUDGET characters: its start and its end."""
    if len(text) <= budget:
        return text
    return cut_middle(text, budget - MARKER_ROOM,
                      lambda line, lines: "the result was longer than the server's result budget "
                                          "(--max-result-chars)")


def json_size(value: Any) -> int:
    return len(orjson.dumps(value).decode())


def fit_structure(structure: dict[str, Any], budget: int) -> dict[str, Any]:
    """Any structured content in BUDGET characters of JSON: each list
    first kept to the longest of its halvings that fits half the budget
    (`_copy_halved`), then the tails of the longest lists dropped until the
    whole does, with its long strings counted empty; then those strings cut
    in their middles to share the rest, and lists halved again if that is
    not enough.  Strings stay strings and lists stay lists (each keeps its
    first item), so the result still fits its outputSchema."""
    if json_size(structure) <= budget:
        return structure
    strings: dict[str, str] = {}

    def collect(value: Any, path: str) -> None:
        if isinstance(value, str) and len(value) > MARKER_ROOM:
            strings[path] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                collect(item, f"{path}/{key}")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                collect(item, f"{path}/{index}")

    def rebuild(value: Any, path: str, replaced: dict[str, str]) -> Any:
        if path in replaced:
            return replaced[path]
        if isinstance(value, dict):
            return {key: rebuild(item, f"{path}/{key}", replaced) for key, item in value.items()}
        if isinstance(value, list):
            return [rebuild(item, f"{path}/{index}", replaced) for index, item in enumerate(value)]
        return value

    # Long lists first, down to half the budget without their long
    # strings, so that the strings left keep room for their ends.
    fitted = _copy_halved(structure, budget // 2)
    collect(fitted, "")
    while (json_size(rebuild(fitted, "", {path: "" for path in strings})) > budget // 2
           and _halve_longest_list(fitted)):
        strings.clear()
        collect(fitted, "")
    strings_cut = fit_parts(strings, lambda parts: json_size(rebuild(fitted, "", parts)), budget,
                            lambda name, line, lines: "the value was longer than the result budget")
    fitted = rebuild(fitted, "", strings_cut)
    while json_size(fitted) > budget and _halve_longest_list(fitted):
        pass
    return fitted


def _blanked(value: Any) -> Any:
    """VALUE with its long strings empty: what fit_structure weighs lists
    by, since their strings are cut later."""
    if isinstance(value, str) and len(value) > MARKER_ROOM:
        return ""
    if isinstance(value, dict):
        return {key: _blanked(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_blanked(item) for item in value]
    return value


def _copy_halved(value: Any, room: int) -> Any:
    """A copy of VALUE in which each list, innermost first, keeps the
    longest of its halvings (the whole, its first half, the first half of
    that, ...) whose JSON, long strings counted empty, fits in ROOM; at
    least one item.  Only the items kept are copied and weighed, once: a
    listing of 10,000 definitions took 110 ms when the whole was copied and
    traversed again for each halving."""
    if isinstance(value, dict):
        return {key: _copy_halved(item, room) for key, item in value.items()}
    if not isinstance(value, list):
        return value
    kept: list[Any] = []
    size, fit = 1, 0  # size: the brackets, less the comma the first item does not need
    for item in value:
        copied = _copy_halved(item, room)
        size += json_size(_blanked(copied)) + 1
        if size > room:
            kept = kept or [copied]
            break
        kept.append(copied)
        fit += 1
    count = len(value)
    while count > max(1, fit):
        count //= 2
    return kept[:count]


def _halve_longest_list(value: Any) -> bool:
    """Drop the second half of the longest list in VALUE; False when no
    list has more than one item."""
    longest: list[Any] | None = None

    def find(item: Any) -> None:
        nonlocal longest
        if isinstance(item, list):
            if len(item) > 1 and (longest is None or len(item) > len(longest)):
                longest = item
            for each in item:
                find(each)
        elif isinstance(item, dict):
            for each in item.values():
                find(each)

    find(value)
    if longest is None:
        return False
    del longest[len(longest) // 2:]
    return True
