"""The frame places oracle: where a backtrace's frame of the library's own
code says it is running, checked against the definitions a plain SBCL
reads (places.lisp).

A frame's function is named by its printed call: `(NAME ...)`, a method's
`((:METHOD NAME ...) ...)`, a local function's or lambda's
`((FLET F :IN NAME) ...)`.  A frame of the library's files is right when
its line falls inside a definition of that NAME in its file (from the
definition's first line to the last line of the top-level form holding
it), with `place` `unchanged` (the file is as compiled).  When the file
defines no such name (a function a library macro defines, such as
esrap's rules), the line must fall inside one of the file's top-level
forms.
"""

from __future__ import annotations

import re

from tests.truth.places import Definition, Form, Tally, short

ANSWER = "frame places"
SYMBOL = re.compile(r"[^\s()|#\"';`,:]*::?(?=[^\s():])")  # a package prefix
FUNCTION_TYPES = {"function", "generic-function", "method", "macro"}


def bare(name: str) -> str:
    """NAME without package prefixes, upper-case."""
    return SYMBOL.sub("", name).upper()


def head(call: str) -> str | None:
    """The name of the function a printed frame call runs, bare; None for
    an anonymous lambda."""
    if call.startswith("(("):
        depth, end = 0, 1
        for end, char in enumerate(call[1:], 1):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                break
        inner = call[1:end + 1]
        found = re.search(r" :IN (\(SETF [^()]+\)|[^\s()]+)\)$", inner)
        if found:
            return bare(found.group(1))
        method = re.match(r"\((?::METHOD|SB-PCL::FAST-METHOD|SB-PCL::SLOW-METHOD) (\(SETF [^()]+\)|[^\s()]+)", inner)
        if method:
            return bare(method.group(1))
        if inner.startswith("(SETF "):
            return bare(inner)
        return None
    token = re.match(r"\(([^\s()]+)", call)
    return bare(token.group(1)) if token else None


def check_frames(tally: Tally, frames: list[dict], definitions: list[Definition], forms: list[Form],
                 files: set[str], what: str) -> None:
    """Count each frame of FRAMES (a backtrace's structured frames) in one
    of FILES, the library's, against DEFINITIONS and FORMS; WHAT says whose
    backtrace it is."""
    for frame in frames:
        file, line = frame.get("file"), frame.get("line")
        if file not in files or line is None:
            continue
        name = head(frame.get("call", ""))
        here = f"{what}: frame {frame.get('index')} {frame.get('call', '')[:80]} at {short(file)}:{line}"
        if frame.get("place", "unchanged") != "unchanged":
            tally.count(ANSWER, "frame", f"{here}: place {frame.get('place')} in a file as compiled")
            continue
        named = [d for d in definitions if d.file == file and d.type in FUNCTION_TYPES and name
                 and bare(d.name) == name]
        if named:
            inside = any(d.line <= line <= d.end for d in named)
            spans = ", ".join(f"{d.line}-{d.end}" for d in named[:3])
            tally.count(ANSWER, "frame", None if inside else f"{here}: outside {name}'s definitions ({spans})")
        else:
            inside = any(f.file == file and f.start <= line <= f.end for f in forms)
            tally.count(ANSWER, "frame", None if inside else f"{here}: in no top-level form of the file")
