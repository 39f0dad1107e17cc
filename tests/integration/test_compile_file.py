"""compile-file: Swank's C-c C-k compilation of the fixture files, with
every compiler note at its line, in an image cl-mcp owns and in a
programmer's image it attaches to."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tests.integration.devtools import FIXTURES, MODES, checked_call, cl_mcp_in

FILES = FIXTURES / "files"


@pytest.fixture(scope="module", params=MODES)
def lisp(request, tmp_path_factory):
    """cl-mcp, embedded or attached, and a copy of the fixture files (the
    fasls are written beside them)."""
    with cl_mcp_in(request.param) as process:
        directory = tmp_path_factory.mktemp("files")
        for source in FILES.glob("*.lisp"):
            shutil.copy(source, directory / source.name)
        process.files = directory.resolve()
        yield process


def compile_file(process, **arguments):
    return checked_call(process, "compile-file", **arguments)


def test_warnings_are_reported_at_their_lines_and_do_not_stop_the_load(lisp):
    path = str(lisp.files / "warnings.lisp")
    result = compile_file(lisp, path=path)
    assert not result["isError"]
    structured = result["structuredContent"]
    assert structured["success"] is True and structured["loaded"] is True
    assert structured["fasl"] == str(lisp.files / "warnings.fasl") and Path(structured["fasl"]).exists()
    notes = [(n["severity"], n["file"], n["line"], n["column"]) for n in structured["notes"]]
    assert ("warning", path, 8, 3) in notes
    assert ("style-warning", path, 4, 9) in notes
    assert ("style-warning", path, 5, 5) in notes
    assert {severity for severity, *_ in notes} == {"warning", "style-warning"}
    # The plain compiler note ("deleting unreachable code") is counted, not listed.
    assert structured["noteCounts"] == [{"file": path, "count": 1}]
    unused = next(n for n in structured["notes"] if n["line"] == 4)
    assert "UNUSED" in unused["message"] and unused["snippet"].startswith("(unused 1))")
    full = next(n for n in structured["notes"] if n["severity"] == "warning")
    assert '"two"' in full["message"] and full["snippet"] == '(+ 1 "two"))'
    text = result["content"][0]["text"]
    blocks = text.split("\n\n")
    assert blocks[0] == (f"Compiled {path}: {len(notes)} distinct notes listed, 1 compiler note counted\n"
                         f"fasl: {lisp.files / 'warnings.fasl'}\nloaded: yes")
    assert blocks[-1] == ('[compiler notes: 1, counted per file, not listed (notes: "all" lists them)]\n'
                          f"{path}: 1")
    assert f"WARNING at {path}:8:3\n{full['message']}\n  (+ 1 \"two\"))" in blocks
    assert lisp.eval("(not (null (fboundp 'fixture-style)))") == ("=> T", False)


def test_notes_all_lists_the_plain_compiler_notes_too(lisp):
    path = str(lisp.files / "warnings.lisp")
    result = compile_file(lisp, path=path, notes="all")
    structured = result["structuredContent"]
    assert "noteCounts" not in structured
    assert [(n["severity"], n["line"], n["column"]) for n in structured["notes"]] == [
        ("style-warning", 4, 9), ("style-warning", 5, 5), ("note", 8, 3), ("warning", 8, 3)]
    assert "deleting unreachable code" in structured["notes"][2]["message"]
    text = result["content"][0]["text"]
    assert text.startswith(f"Compiled {path}: 4 distinct notes\n") and "counted" not in text
    assert f"NOTE at {path}:8:3\ndeleting unreachable code" in text


def test_an_undefined_function_names_every_place_that_uses_it(lisp):
    source = lisp.files / "undefined.lisp"
    source.write_text("(in-package #:common-lisp-user)\n\n"
                      "(defun fixture-caller-1 () (fixture-nowhere 1))\n"
                      "(defun fixture-caller-2 ()\n  (list (fixture-nowhere 2)))\n")
    result = compile_file(lisp, path=str(source))
    [note] = result["structuredContent"]["notes"]
    assert (note["severity"], note["line"], note["column"]) == ("style-warning", 3, 28)
    assert note["message"] == "undefined function: COMMON-LISP-USER::FIXTURE-NOWHERE"
    assert note["uses"] == [{"file": str(source), "line": 3, "column": 28, "name": "FIXTURE-CALLER-1"},
                            {"file": str(source), "line": 5, "column": 9, "name": "FIXTURE-CALLER-2"}]
    assert (f"used at:\n  {source}:3:28 (FIXTURE-CALLER-1)\n  {source}:5:9 (FIXTURE-CALLER-2)"
            in result["content"][0]["text"])


def test_a_read_error_fails_the_compilation_and_nothing_is_loaded(lisp):
    path = str(lisp.files / "read-error.lisp")
    result = compile_file(lisp, path=path)
    assert result["isError"]
    structured = result["structuredContent"]
    assert structured["success"] is False and structured["loaded"] is False
    assert [(n["severity"], n["line"]) for n in structured["notes"]] == [("read-error", 6)]
    text = result["content"][0]["text"]
    assert text.startswith(f"[ERROR] CL-MCP:COMPILATION-FAILED\nCompiling {path} failed: 1 note\n")
    assert f"READ-ERROR at {path}:6:" in text and "loaded: no" in text
    assert lisp.eval("(fboundp 'fixture-fine)") == ("=> NIL", False)


def test_a_clean_file_compiles_without_notes_and_loads(lisp):
    path = str(lisp.files / "clean.lisp")
    result = compile_file(lisp, path=path)
    assert not result["isError"]
    assert result["structuredContent"]["notes"] == [] and result["structuredContent"]["loaded"] is True
    assert result["content"][0]["text"] == (f"Compiled {path}: 0 notes\nfasl: {lisp.files / 'clean.fasl'}\n"
                                            "loaded: yes")
    assert lisp.eval("(fixture-clean 1)") == ("=> 2", False)


def test_load_false_only_compiles(lisp):
    source = lisp.files / "unloaded.lisp"
    source.write_text((FILES / "clean.lisp").read_text().replace("fixture-clean", "fixture-unloaded"))
    result = compile_file(lisp, path=str(source), load=False)
    assert not result["isError"]
    assert result["structuredContent"]["success"] is True and result["structuredContent"]["loaded"] is False
    assert (lisp.files / "unloaded.fasl").exists()
    assert "loaded: no" in result["content"][0]["text"]
    assert lisp.eval("(fboundp 'fixture-unloaded)") == ("=> NIL", False)


def test_an_error_while_loading_is_an_error_of_the_call(lisp):
    source = lisp.files / "load-fails.lisp"
    source.write_text('(in-package #:common-lisp-user)\n\n(error "fixture load failure")\n')
    result = compile_file(lisp, path=str(source))
    assert result["isError"]
    structured = result["structuredContent"]
    assert structured["success"] is True and structured["loaded"] is False
    assert structured["error"]["type"] == "SIMPLE-ERROR"
    assert result["content"][0]["text"].startswith(
        f"[ERROR] SIMPLE-ERROR\nLoading the compiled {source} failed: fixture load failure")
    assert lisp.eval("(+ 1 2)") == ("=> 3", False)  # nothing waits in a debugger


def test_a_relative_or_missing_path_is_a_clear_error(lisp):
    result = compile_file(lisp, path="clean.lisp")
    assert result["isError"]
    assert result["content"][0]["text"].startswith("[ERROR] CL-MCP:INVALID-PATH\n")
    missing = str(lisp.files / "missing.lisp")
    result = compile_file(lisp, path=missing)
    assert result["isError"]
    assert result["content"][0]["text"] == (f"[ERROR] CL-MCP:FILE-NOT-FOUND\nNo file {missing} exists "
                                            "(or it is a directory).")


def test_cancelling_the_call_stops_the_compilation(lisp, tmp_path):
    """notifications/cancelled stops the compilation in the image, as it
    stops an evaluation or a load, and frees the session at once."""
    slow = tmp_path / "slow.lisp"
    slow.write_text("(eval-when (:compile-toplevel)\n  (sleep 6)\n"
                    "  (defparameter cl-user::*compiled-past-the-sleep* t))\n")
    request_id = lisp.start_request("tools/call", {"name": "compile-file",
                                                   "arguments": {"path": str(slow)}})
    time.sleep(0.5)
    lisp.notify("notifications/cancelled", {"requestId": request_id, "reason": "test"})
    started = time.monotonic()
    assert lisp.eval("(+ 1 2)") == ("=> 3", False)
    assert time.monotonic() - started < 4  # not after the compilation's 6 s
    time.sleep(6)
    assert lisp.eval("(boundp 'cl-user::*compiled-past-the-sleep*)") == ("=> NIL", False)
