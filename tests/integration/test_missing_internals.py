"""An SBCL or Swank internal the agent relies on that the image lacks is
found when the agent loads: the tool that needs it answers
CL-MCP:NOT-IMPLEMENTED naming it, and the other tools work on.  The
programmer's image (attach mode: the agent loads there when cl-mcp
attaches) is made to lack four of them first."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.integration.attach_fixtures import SwankServer, temporary_home
from tests.integration.conftest import McpProcess

# What a newer SBCL or Swank might lack: a thread's Linux id, the
# condition behind a compiler note, the special variable Swank's backend
# counts frames from (an agent binding it would bind a lexical), and
# Swank's apropos search.
REMOVE = """(progn
  (sb-ext:unlock-package "SB-THREAD")
  (fmakunbound 'sb-thread::thread-os-tid)
  (sb-ext:lock-package "SB-THREAD")
  (fmakunbound 'swank/backend::original-condition)
  (setf (sb-int:info :variable :kind 'swank/sbcl::*sldb-stack-top*) :unknown)
  (fmakunbound 'swank::apropos-symbols)
  t)"""


@pytest.fixture(scope="module")
def lacking() -> Iterator[McpProcess]:
    home = temporary_home()
    server = SwankServer(home)
    try:
        assert server.client_eval(REMOVE) == "T"
        process = McpProcess("--connect", str(server.port), env={"HOME": str(home)})
        try:
            process.initialize()
            yield process
        finally:
            process.close()
    finally:
        server.stop()


def not_implemented(result: dict) -> str:
    text = result["content"][0]["text"]
    assert result["isError"] and text.startswith("[ERROR] CL-MCP:NOT-IMPLEMENTED\n"), result
    return text


def test_the_threads_tool_names_the_internal_it_lacks(lacking):
    text = not_implemented(lacking.call("threads", action="list"))
    assert "This image lacks SB-THREAD::THREAD-OS-TID," in text, text
    assert "ORIGINAL-CONDITION" not in text, text


def test_compile_file_names_the_internal_it_lacks(lacking, tmp_path):
    source = tmp_path / "small.lisp"
    source.write_text("(defun mi-small () 1)\n")
    text = not_implemented(lacking.call("compile-file", path=str(source)))
    assert "This image lacks SWANK/BACKEND::ORIGINAL-CONDITION," in text, text


def test_restart_frame_names_the_internal_it_lacks(lacking):
    text, is_error = lacking.eval("(defun mi-inner (x) (car x)) (mi-inner 5)")
    assert is_error and text.startswith("[ERROR] TYPE-ERROR"), text
    result = lacking.call("invoke-restart", restart="RESTART-FRAME", frame=0)
    text = not_implemented(result)
    assert "This image lacks SWANK/SBCL::*SLDB-STACK-TOP*," in text and "still waits" in text, text
    aborted = lacking.call("invoke-restart", restart="ABORT")
    assert aborted["content"][0]["text"].startswith("The evaluation was aborted."), aborted


def test_apropos_names_the_internal_it_lacks(lacking):
    text = not_implemented(lacking.call("apropos", pattern="mi-inner"))
    assert "This image lacks SWANK::APROPOS-SYMBOLS," in text, text


def test_the_other_tools_work_on(lacking):
    assert lacking.eval("(+ 1 2)") == ("=> 3", False)
    for tool, arguments in (("profile", {"code": "(+ 1 2)"}), ("describe-symbol", {"symbol": "car"}),
                            ("inspect", {"code": "(list 1 2)"})):
        result = lacking.call(tool, **arguments)
        assert not result["isError"], result
