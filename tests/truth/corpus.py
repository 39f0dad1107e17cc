"""The corpus: Debian's sources of real libraries, each copied to a
temporary directory (so that edits never touch /usr/share) and loaded from
there."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tests.integration.conftest import McpProcess

SOURCES = Path("/usr/share/common-lisp/source")


@dataclass(frozen=True)
class Library:
    """One library of the corpus: its directory under SOURCES and its system;
    UNTESTED says why its test suite cannot be an oracle (it can hang, or
    Debian's package lacks what it needs), when it cannot."""

    directory: str
    system: str
    untested: str = ""

    @property
    def source(self) -> Path:
        return SOURCES / self.directory


CORPUS = [
    Library("esrap", "esrap"),
    Library("iterate", "iterate"),
    Library("lparallel", "lparallel"),
    Library("bordeaux-threads", "bordeaux-threads",
            untested="its test CONDITION-VARIABLE wakes one of 100 waiting threads "
                          "(condition-notify) where only the next in turn may go on, so it "
                          "hangs now and then, in a plain SBCL too"),
    Library("named-readtables", "named-readtables"),
    Library("fiveam", "fiveam"),
    Library("cl-ppcre", "cl-ppcre"),
    Library("cl-split-sequence", "split-sequence"),
    Library("alexandria", "alexandria"),
    Library("cl-flexi-streams", "flexi-streams"),
    Library("babel", "babel", untested="its test system needs HU.DWIM.STEFIL, which Debian does not package"),
    Library("cl-who", "cl-who", untested="Debian's package leaves out its test files"),
    Library("cl-containers", "cl-containers", untested="Debian's package leaves out its test system"),
    Library("cl-unicode", "cl-unicode"),
    Library("cl-cffi", "cffi"),
]


def copy_library(library: Library, under: Path) -> Path:
    """A fresh copy of LIBRARY's sources in UNDER; fails when Debian's
    package is missing (`make test` installs it)."""
    if not library.source.is_dir():
        raise AssertionError(f"{library.source} is missing: run `make test`, which installs it")
    copy = under / library.directory
    shutil.copytree(library.source, copy)
    return copy


def compile_in_plain_sbcl(library: Library, copy: Path) -> dict[Path, float]:
    """Compile COPY's system in a plain SBCL, into ASDF's cache, as an
    earlier session leaves it; the fasls made, with their times."""
    run = subprocess.run(["sbcl", "--non-interactive", "--no-userinit", "--eval", "(require :asdf)",
                          "--eval", f'(push #p"{copy}/" asdf:*central-registry*)',
                          "--eval", f'(asdf:load-system "{library.system}")'],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    fasls = {path: path.stat().st_mtime
             for path in (Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "common-lisp").glob(f"*/{str(copy).lstrip('/')}/**/*.fasl")}
    assert fasls, f"no fasls of {copy} in ASDF's cache"
    return fasls


def load_copy(process: McpProcess, library: Library, copy: Path, from_fasls: bool = False) -> None:
    """Register COPY with ASDF in PROCESS's image (the central registry is
    searched before Debian's source registry) and load its system there:
    with load-system; or, FROM_FASLS, as code the session did not load
    through cl-mcp (an evaluation's asdf:load-system, a programmer's
    image): from fasls a plain SBCL compiled, so that the image holds no
    text of the files as they were compiled."""
    fasls = compile_in_plain_sbcl(library, copy) if from_fasls else {}
    text, is_error = process.eval(f'(push #p"{copy}/" asdf:*central-registry*)')
    assert not is_error, text
    if from_fasls:
        text, is_error = process.eval(f'(asdf:load-system "{library.system}")', wait=600, timeout=500,
                                      **{"answer-within": 500})
        assert not is_error, text[:2000]
        assert {path: path.stat().st_mtime for path in fasls} == fasls, "the fasls were compiled again"
        return
    loaded = process.call("load-system", system=library.system, wait=600, **{"answer-within": 500})
    assert not loaded["isError"], loaded["content"][0]["text"][:2000]


@contextmanager
def loaded(library: Library, *options: str, env: dict[str, str] | None = None) -> Iterator[tuple[McpProcess, Path]]:
    """A fresh cl-mcp (embedded, started with OPTIONS, in ENV beside ours)
    that loaded a fresh copy of LIBRARY, and the copy."""
    with tempfile.TemporaryDirectory(prefix="cl-mcp-truth-") as scratch:
        copy = copy_library(library, Path(scratch))
        process = McpProcess(*options, env=env)
        try:
            process.initialize()
            load_copy(process, library, copy)
            yield process, copy
        finally:
            process.close(60)
