"""The compiler notes oracle (tests/truth/notes.py, issue 37) on real code,
in `make test`: compile-file's notes of every file of lparallel (SBCL's
optimisation notes) and named-readtables (deprecation style-warnings),
each one SBCL signals when a plain SBCL compiles the same file, at a line
inside the top-level form it was compiling."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.integration.conftest import McpProcess
from tests.truth.corpus import CORPUS, copy_library, load_copy
from tests.truth.notes import check_notes, read_notes
from tests.truth.places import Tally, read_oracle

LIBRARIES = {library.directory: library for library in CORPUS}


@pytest.mark.parametrize("directory, severity", [("lparallel", "note"), ("named-readtables", "style-warning")])
def test_compile_files_notes_are_what_sbcl_signals_where_it_signals_them(directory, severity):
    library = LIBRARIES[directory]
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="cl-mcp-truth-notes-") as scratch:
        pristine = copy_library(library, Path(scratch) / "pristine")
        edited = copy_library(library, Path(scratch) / "edited")
        notes = read_notes(pristine, library.system, edited)
        forms = read_oracle(pristine, library.system, edited)[1]
        process = McpProcess("--max-result-chars", "1000000")
        try:
            process.initialize()
            load_copy(process, library, edited)
            check_notes(process, tally, "before edits", notes, forms, sorted({form.file for form in forms}))
        finally:
            process.close(60)
    assert tally.failures == []
    assert tally.right.get(("compiler notes before edits", severity), 0) >= 3, tally.right
