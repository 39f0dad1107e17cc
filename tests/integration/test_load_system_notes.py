"""load-system's compiler notes: Swank's notes for the files of the system
being loaded, each at its line, as compile-file gives them (and none for
its dependencies' files), in an image cl-mcp owns and in one it attaches to."""

from __future__ import annotations

import shutil

import pytest

from tests.integration.devtools import FIXTURES, MODES, checked_call, cl_mcp_in

SYSTEMS = ("noisy-system", "noisy-dependency", "broken-system")


@pytest.fixture(scope="module", params=MODES)
def lisp(request, tmp_path_factory):
    """cl-mcp, embedded or attached, with fresh copies of the fixture systems
    registered: a new directory, so ASDF compiles them again."""
    with cl_mcp_in(request.param) as process:
        directory = tmp_path_factory.mktemp("systems").resolve()
        for system in SYSTEMS:
            shutil.copytree(FIXTURES / system, directory / system)
            text, is_error = process.eval(f'(asdf:load-asd "{directory / system / system}.asd")')
            assert not is_error, text
        process.systems = directory
        yield process


def test_the_systems_own_notes_come_at_their_lines(lisp):
    path = str(lisp.systems / "noisy-system" / "noisy.lisp")
    result = checked_call(lisp, "load-system", system="noisy-system")
    assert not result["isError"], result
    structured = result["structuredContent"]
    assert structured["loaded"] is True
    notes = [(n["severity"], n["file"], n["line"], n["column"]) for n in structured["notes"]]
    assert ("warning", path, 8, 3) in notes
    assert ("style-warning", path, 4, 9) in notes
    assert ("style-warning", path, 5, 5) in notes
    # The dependency was compiled in the same load; its notes are its own.
    assert all(n["file"] == path for n in structured["notes"]), notes
    assert any("UNUSED-IN-DEPENDENCY" in w["message"] for w in structured["warnings"])
    text = result["content"][0]["text"]
    full = next(n for n in structured["notes"] if n["severity"] == "warning")
    assert text.startswith("Loading system: noisy-system\nLoaded: noisy-system\n\n[notes]\n")
    assert f"WARNING at {path}:8:3\n{full['message']}\n  (+ 1 \"two\"))" in text
    # A warning shown as a note is not repeated among the warnings.
    warnings = text.split("[warnings]\n", 1)[1]
    assert "UNUSED-IN-DEPENDENCY" in warnings and '"two"' not in warnings


def test_a_load_that_does_not_compile_again_has_no_notes(lisp):
    result = checked_call(lisp, "load-system", system="noisy-system")
    assert not result["isError"]
    assert result["structuredContent"]["notes"] == []
    assert "[notes]" not in result["content"][0]["text"]


def test_a_read_error_fails_the_load_with_the_note_at_its_line(lisp):
    path = str(lisp.systems / "broken-system" / "broken.lisp")
    result = checked_call(lisp, "load-system", system="broken-system")
    assert result["isError"]
    structured = result["structuredContent"]
    assert structured["loaded"] is False
    [note] = [n for n in structured["notes"] if n["severity"] == "read-error"]
    assert (note["file"], note["line"]) == (path, 6)
    assert f"READ-ERROR at {path}:6:" in result["content"][0]["text"]
