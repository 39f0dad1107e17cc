"""S-expressions as Swank writes and reads them.  Pure: no I/O.

Python values map to Lisp data like this:

    Symbol("swank:connection-info")  <->  swank:connection-info
    Keyword("ok")                     <->  :ok
    str                               <->  "string"  (only \\ and " escaped)
    int / float / Fraction            <->  42 / 1.5d0 / 1/3
    True                              <->  t
    None, False and []                 ->  nil;   nil and () read as []
    list or tuple                     <->  (a b c)

Why only two escapes: Lisp string syntax has no ``\\n``; a backslash before
any other character just yields that character.  Newlines and every other
character travel raw, so encoding and decoding must not "unescape" them.

Swank may also send syntax that has no Python counterpart (``#<...>``,
``#\\a``, ``#(1 2)``); it is read as `Unreadable`, `Character` and `tuple`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Union

from cl_mcp.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class Symbol:
    """A Lisp symbol, written exactly as named (qualify it: ``cl:+``)."""

    name: str


@dataclass(frozen=True, slots=True)
class Keyword:
    """A keyword symbol, without its colon: ``Keyword("ok")`` is ``:ok``."""

    name: str


@dataclass(frozen=True, slots=True)
class Character:
    """A character object as Swank prints it (``#\\a``)."""

    name: str


@dataclass(frozen=True, slots=True)
class Unreadable:
    """An object Lisp prints unreadably, kept as its text (``#<...>``)."""

    text: str


SExp = Union[Symbol, Keyword, Character, Unreadable, str, int, float, Fraction, bool, None, list, tuple]

# ---------------------------------------------------------------- writing

def dumps(value: SExp) -> str:
    """The Lisp text of VALUE."""
    writer = _WRITERS.get(type(value)) or _writer_by_ancestry(value)
    return writer(value)


def _string_text(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _list_text(value: list[SExp] | tuple[SExp, ...]) -> str:
    return "(" + " ".join(map(dumps, value)) + ")" if value else "nil"


def _writer_by_ancestry(value: SExp) -> Callable[[Any], str]:
    """The writer of a subclass (an IntEnum, a str subclass), by its base."""
    for kind in (bool, str, int, float, Fraction, Keyword, Symbol, list, tuple):
        if isinstance(value, kind):
            return _WRITERS[kind]
    raise TypeError(f"cannot write {type(value).__name__} as an s-expression")


def _float_text(value: float) -> str:
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"Lisp has no standard syntax for {value}")
    text = repr(value)
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}d{exponent or 0}"


# Writers by exact type: one dict look-up per value, where a chain of
# isinstance tests cost twice as long (a request is written on every call).
_WRITERS: dict[type, Callable[[Any], str]] = {
    bool: lambda value: "t" if value else "nil",
    type(None): lambda value: "nil",
    str: _string_text,
    int: int.__repr__,  # an IntEnum's str() would be its name
    float: _float_text,
    Fraction: lambda value: f"{value.numerator}/{value.denominator}",
    Keyword: lambda value: ":" + value.name,
    Symbol: lambda value: value.name,
    list: _list_text,
    tuple: _list_text,
}


# ---------------------------------------------------------------- reading

_WHITESPACE = re.compile(r"[ \t\r\n\f]*")
# An atom runs until whitespace, a parenthesis or a quote; |...| inside it
# may contain anything but a bar.
_ATOM = re.compile(r'(?:[^ \t\r\n\f()"|;]|\|[^|]*\|)+')
_INTEGER = re.compile(r"[+-]?\d+\.?\Z")
_RATIO = re.compile(r"([+-]?\d+)/(\d+)\Z")
_FLOAT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eEdDfFsSlL][+-]?\d+)?\Z")


def loads(text: str) -> SExp:
    """The one s-expression TEXT holds.  Raises `ProtocolError` on anything
    malformed or trailing."""
    try:
        return _loads_plain(text)
    except (_Uncommon, ProtocolError):
        return _loads_any(text)


# The fast path: lists, strings and atoms, which is all the agent's replies
# hold.  str.split, which runs in C, does the scanning: the text splits at
# its double quotes into what lies outside strings and what lies inside;
# outside, spaced-out parentheses and whitespace separate the tokens.
# Anything else (#-syntax, quote, |bars|, a lone dot, non-ASCII outside a
# string, an error of any kind) is left to the general reader below, which
# also gives malformed input its precise error.  Two readers are worth it
# only because the fast one pays on the replies cl-mcp reads (bench/pure.py,
# figures in docs/performance.md) and tests/unit/test_sexp.py proves that
# both read the same.

# Outside strings: the syntax only the general reader handles, and any
# character str.split would take for whitespace where Lisp does not.
_NOT_PLAIN = re.compile(r"[#'|;\\]|[^\t\n\f\r\x20-\x7e]")
# A whole string, escaped quotes and all, without backtracking (possessive
# repeats); a backtracking pattern over a multi-megabyte string costs
# seconds and hundreds of MiB.
_STRING = re.compile(r'"([^"\\]*+(?:\\.[^"\\]*+)*+)"', re.DOTALL)
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)


class _Uncommon(Exception):
    pass


# Keywords and symbols recur in every reply and are immutable: read each once.
_ATOM_CACHE: dict[str, SExp] = {"t": True, "T": True}  # never nil: a list is mutable
_ATOM_CACHE_SIZE = 4096
_NOT_CACHED = object()  # a token not read before


def _loads_plain(text: str) -> SExp:
    parts = text.split('"')
    # What is read at top level goes into TOP, so that no token need ask
    # where it is: exactly one value must end up there.
    top: list[SExp] = []
    items = top  # the list being read
    stack: list[list[SExp]] = []  # the lists it is inside
    inside = False  # parts alternate: outside a string, inside one, ...
    index, count, pos = 0, len(parts), 0  # POS: where parts[index] starts
    cached = _ATOM_CACHE.get
    while index < count:
        part = parts[index]
        index += 1
        if inside:  # a string
            if "\\" in part:  # it may run on past escaped quotes
                string = _STRING.match(text, pos - 1)
                if string is None:
                    raise _Uncommon  # unterminated
                part = _unescape(string.group(1))
                index += string.group(1).count('"')
                pos = string.end()
            else:
                pos += len(part) + 1
            inside = False
            items.append(part)
            continue
        inside = True
        pos += len(part) + 1
        if _NOT_PLAIN.search(part):
            raise _Uncommon
        for token in part.replace("(", " ( ").replace(")", " ) ").split():
            if token == "(":
                stack.append(items)
                items = []
            elif token == ")":
                if not stack:
                    raise _Uncommon
                value, items = items, stack.pop()
                items.append(value)
            else:
                value = cached(token, _NOT_CACHED)
                items.append(_new_atom(token) if value is _NOT_CACHED else value)
    # The last part lies outside any string, unless the last string is open.
    if stack or not inside or len(top) != 1:
        raise _Uncommon
    return top[0]


def _new_atom(token: str) -> SExp:
    """An atom not in the cache, which keeps it when it is a symbol."""
    if token == ".":
        raise _Uncommon
    value = _atom(token)
    if isinstance(value, (Keyword, Symbol)) and len(_ATOM_CACHE) < _ATOM_CACHE_SIZE:
        _ATOM_CACHE[token] = value
    return value


def _unescape(body: str) -> str:
    """A Lisp string's text from between its quotes: a backslash stands for
    the character after it.  str.replace, left to right, pairs the escaped
    backslashes first; every backslash left escapes its neighbour."""
    if "\0" in body:
        return _ESCAPED.sub(lambda escape: escape.group(1), body)
    return body.replace("\\\\", "\0").replace("\\", "").replace("\0", "\\")


def _loads_any(text: str) -> SExp:
    value, end = _read(text, _skip(text, 0))
    end = _skip(text, end)
    if end != len(text):
        raise ProtocolError(f"trailing characters after s-expression at {end}")
    return value


def _skip(text: str, pos: int) -> int:
    return _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]


def _read(text: str, pos: int) -> tuple[SExp, int]:
    if pos >= len(text):
        raise ProtocolError("unexpected end of s-expression")
    char = text[pos]
    if char == "(":
        return _read_list(text, pos + 1, list)
    if char == '"':
        return _read_string(text, pos + 1)
    if char == "'":
        value, end = _read(text, _skip(text, pos + 1))
        return [Symbol("quote"), value], end
    if char == "#":
        return _read_dispatch(text, pos)
    if char == ")":
        raise ProtocolError(f"unexpected ')' at {pos}")
    match = _ATOM.match(text, pos)
    if not match:
        raise ProtocolError(f"unexpected character {char!r} at {pos}")
    if match.group() == ".":  # the fast path declines it too, and leaves the error to this one
        raise ProtocolError(f"a lone dot at {pos} (dotted pairs are not supported)")
    return _atom(match.group()), match.end()


def _read_list(text: str, pos: int, kind: type) -> tuple[SExp, int]:
    items: list[SExp] = []
    while True:
        pos = _skip(text, pos)
        if pos >= len(text):
            raise ProtocolError("unterminated list")
        if text[pos] == ")":
            return kind(items), pos + 1
        item, pos = _read(text, pos)
        items.append(item)


def _read_string(text: str, pos: int) -> tuple[str, int]:
    string = _STRING.match(text, pos - 1)
    if string is None:
        raise ProtocolError("unterminated string")
    return _unescape(string.group(1)), string.end()


def _read_dispatch(text: str, pos: int) -> tuple[SExp, int]:
    nxt = text[pos + 1] if pos + 1 < len(text) else ""
    if nxt == "<":
        depth, at = 0, pos + 1
        while at < len(text):
            if text[at] == "<":
                depth += 1
            elif text[at] == ">":
                depth -= 1
                if depth == 0:
                    return Unreadable(text[pos : at + 1]), at + 1
            at += 1
        raise ProtocolError("unterminated #<...>")
    if nxt == "\\":
        # #\x is one character even when x is a delimiter; a name runs on.
        end = pos + 3
        match = _ATOM.match(text, end)
        if match and text[pos + 2].isalnum():
            end = match.end()
        if end > len(text):
            raise ProtocolError("unterminated character")
        return Character(text[pos + 2 : end]), end
    if nxt == "(":
        return _read_list(text, pos + 2, tuple)
    raise ProtocolError(f"unsupported dispatch macro #{nxt} at {pos}")


def _atom(token: str) -> SExp:
    if token.isdigit() and token.isascii():  # most atoms not cached: ids, counts
        return int(token)
    lowered = token.lower()
    if lowered == "nil":
        return []
    if lowered == "t":
        return True
    if token.startswith(":") and len(token) > 1:
        return Keyword(token[1:])
    if _INTEGER.match(token):
        return int(token.rstrip("."))
    ratio = _RATIO.match(token)
    if ratio:
        if int(ratio.group(2)) == 0:  # Lisp's reader signals division-by-zero
            raise ProtocolError(f"ratio with a zero denominator: {token}")
        return Fraction(int(ratio.group(1)), int(ratio.group(2)))
    if _FLOAT.match(token) and any(c.isdigit() for c in token):
        return float(re.sub(r"[eEdDfFsSlL]", "e", token))
    return Symbol(token)


# ---------------------------------------------------------------- plists

def plist(value: SExp) -> dict[str, SExp]:
    """A property list ``(:a 1 :b 2)`` as ``{"a": 1, "b": 2}``."""
    if not isinstance(value, (list, tuple)) or len(value) % 2:
        raise ProtocolError(f"not a property list: {value!r:.200}")
    result: dict[str, SExp] = {}
    for key, item in zip(value[::2], value[1::2]):
        if not isinstance(key, Keyword):
            raise ProtocolError(f"property list key is not a keyword: {key!r:.100}")
        result[key.name] = item
    return result


def plist_named(value: SExp) -> dict[str, SExp]:
    """`plist`, with each keyword value turned into its name (the agent's
    plists say `:status :ok`; Python wants "ok")."""
    result = plist(value)
    for key, item in result.items():
        if isinstance(item, Keyword):
            result[key] = item.name
    return result
