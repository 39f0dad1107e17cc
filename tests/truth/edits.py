"""Seeded random edits of a library's files, as a programmer makes them
between two compilations: lines inserted or deleted above, inside and
after a definition, a definition deleted or renamed, a file cut short;
and as an assistant makes them, through edit-form: a whole top-level form
replaced (compiled or not), a new one inserted after it, or it deleted.
Each keeps the file readable, so the oracle can read it again."""

from __future__ import annotations

import random
import re
from pathlib import Path

from tests.integration.conftest import McpProcess
from tests.truth.places import Definition

INSERTED = ";; inserted by the truth harness\n"


def _lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines(keepends=True)


def _write(path: str, lines: list[str]) -> None:
    Path(path).write_text("".join(lines), encoding="utf-8")


def _removable(line: str) -> bool:
    """A blank or comment line whose deletion leaves every form as it reads."""
    stripped = line.strip()
    return (not stripped or stripped.startswith(";")) and not any(c in line for c in '"|\\')


def insert(rng: random.Random, d: Definition, where: str) -> str:
    """Insert one to five comment lines above, inside or after D."""
    lines = _lines(d.file)
    at = {"above": d.line - 1, "inside": rng.randint(d.line, max(d.line, d.end - 1)),
          "after": min(d.end, len(lines))}[where]
    count = rng.randint(1, 5)
    _write(d.file, lines[:at] + [INSERTED] * count + lines[at:])
    return f"{count} lines inserted {where} {d.name} ({Path(d.file).name}:{at + 1})"


def delete(rng: random.Random, d: Definition, where: str) -> str | None:
    """Delete blank and comment lines above, inside or after D; None when
    there are none."""
    lines = _lines(d.file)
    if where == "above":
        candidates = [i for i in range(max(0, d.line - 6), d.line - 1) if _removable(lines[i])]
    elif where == "inside":
        candidates = [i for i in range(d.line, min(d.end, len(lines))) if _removable(lines[i])]
    else:
        candidates = [i for i in range(d.end, min(d.end + 6, len(lines))) if _removable(lines[i])]
    if not candidates:
        return None
    chosen = set(rng.sample(candidates, rng.randint(1, len(candidates))))
    _write(d.file, [line for i, line in enumerate(lines) if i not in chosen])
    return f"{len(chosen)} lines deleted {where} {d.name} ({Path(d.file).name})"


def _top_level(d: Definition, lines: list[str]) -> bool:
    """True when D's lines are its own top-level form's, alone on them."""
    return (d.end <= len(lines) and lines[d.line - 1].startswith("(")
            and lines[d.end - 1].rstrip().endswith(")"))


def delete_definition(d: Definition) -> str | None:
    """Delete D's whole top-level form."""
    lines = _lines(d.file)
    if not _top_level(d, lines):
        return None
    _write(d.file, lines[:d.line - 1] + lines[d.end:])
    return f"{d.name} deleted ({Path(d.file).name}:{d.line}-{d.end})"


def rename(d: Definition) -> str | None:
    """Rename D where its opening line names it."""
    lines = _lines(d.file)
    bare = d.query.split(":")[-1].strip("|")
    pattern = re.compile(r"(?<![^\s(])" + re.escape(bare) + r"(?=[\s)])", re.IGNORECASE)
    line = lines[d.line - 1]
    if not re.match(r"\s*\(def", line, re.IGNORECASE) or not pattern.search(line):
        return None
    lines[d.line - 1] = pattern.sub(bare.lower() + "-renamed-by-truth", line, count=1)
    _write(d.file, lines)
    return f"{d.name} renamed ({Path(d.file).name}:{d.line})"


def shorten(d: Definition) -> str | None:
    """Cut D's file short after D's top-level form."""
    lines = _lines(d.file)
    if d.end >= len(lines) or not _top_level(d, lines):
        return None
    _write(d.file, lines[:d.end])
    return f"{Path(d.file).name} cut after line {d.end}"


def random_edit(rng: random.Random, d: Definition) -> str | None:
    """One edit of D's file chosen at random; None when the one chosen does
    not apply there."""
    kind = rng.choice(["insert", "insert", "insert", "delete", "delete", "delete-definition",
                       "rename", "shorten"])
    where = rng.choice(["above", "inside", "after"])
    if kind == "insert":
        return insert(rng, d, where)
    if kind == "delete":
        return delete(rng, d, where)
    if kind == "delete-definition":
        return delete_definition(d)
    if kind == "rename":
        return rename(d)
    return shorten(d)


EDITED_BY_TOOL = ";; edited by the truth harness through edit-form\n"


def assistant_edit(rng: random.Random, process: McpProcess,
                   d: Definition) -> tuple[str, tuple[int, int] | None] | None:
    """One edit-form of D's top-level form, chosen at random: what was done
    and the lines of what edit-form compiled (None: nothing); None when D is
    not a whole top-level form or edit-form refused."""
    lines = _lines(d.file)
    if not _top_level(d, lines):
        return None
    kind = rng.choice(["replace", "replace", "insert-after", "delete"])
    compile_it = kind != "delete" and rng.random() < 0.5
    arguments = {"path": d.file, "line": d.line, "action": kind, "compile": compile_it}
    if kind == "replace":
        text = lines[d.line - 1:d.end]
        arguments["text"] = "".join(text[:1] + [EDITED_BY_TOOL] + text[1:])
    elif kind == "insert-after":
        arguments["text"] = f"(defun truth-inserted-after-line-{d.line} () nil)"
    result = process.call("edit-form", **arguments)
    if result["isError"]:
        return None
    done = f"edit-form {kind} {d.name} ({Path(d.file).name}:{d.line}){' compiled' if compile_it else ''}"
    if not compile_it:
        return done, None
    # The new text's lines, as edit-form says: a form that a #+ opens
    # (cl-who's #+:sbcl (defmacro defconstant ...)) begins above D's line.
    written = result["structuredContent"]
    return done, (written["line"], written["endLine"])
