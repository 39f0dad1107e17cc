"""Faults an assistant will cause, each ending with a normal evaluation."""

from pathlib import Path

import pytest


def resident_mib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_heap_exhaustion_from_a_huge_allocation(shared_server):
    pid = shared_server.eval("(sb-posix:getpid)")[0]
    text, is_error = shared_server.eval("(make-array (expt 10 12))")
    assert is_error and text.startswith("[ERROR] STORAGE-CONDITION\nHeap exhausted")
    shared_server.call("invoke-restart", restart="ABORT")
    assert shared_server.eval("(sb-posix:getpid)")[0] == pid  # the same image
    assert shared_server.eval("(+ 1 2)") == ("=> 3", False)


def test_fifty_megabytes_of_output_are_capped(shared_server):
    before = resident_mib(shared_server.proc.pid)
    text, is_error = shared_server.eval(
        '(let ((line (make-string 99 :initial-element #\\y))) (dotimes (i 500000) (write-line line))) :done')
    assert not is_error
    assert "more characters truncated]" in text and text.endswith("=> :DONE")
    assert len(text) < 1_100_000
    assert resident_mib(shared_server.proc.pid) - before < 100
    assert shared_server.eval("(+ 1 2)") == ("=> 3", False)


def test_a_ten_megabyte_code_string(shared_server):
    code = '(length "' + "z" * 10_000_000 + '")'
    assert shared_server.eval(code) == ("=> 10000000", False)
    assert shared_server.eval("(+ 1 2)") == ("=> 3", False)


def test_print_of_a_circular_list_ends(shared_server):
    text, is_error = shared_server.eval("(let ((l (list 1 2 3))) (setf (cdr (last l)) l) (print l) :printed)")
    assert (text, is_error) == ("[stdout]\n\n#1=(1 2 3 . #1#) \n\n=> :PRINTED", False)


def test_an_error_while_printing_output(shared_server):
    code = """(defstruct (ugly (:print-object (lambda (o s) (declare (ignore o s)) (error "no")))))
              (print (make-ugly))"""
    text, is_error = shared_server.eval(code)
    assert is_error and text.startswith("[ERROR] SIMPLE-ERROR\nno")
    shared_server.call("invoke-restart", restart="ABORT")
    assert shared_server.eval("(+ 1 2)") == ("=> 3", False)


@pytest.mark.parametrize("code", ["(sb-ext:exit)", "(sb-ext:exit :code 3 :abort t)"])
def test_the_image_exiting(server, code):
    text, is_error = server.eval(code)
    assert is_error and text.split("\n")[0] in ("[ERROR] CL-MCP:IMAGE-LOST", "[ERROR] CL-MCP:IMAGE-EXITING")
    assert "[session]" not in text  # a notice is for the call that runs in the next image
    after, is_error = server.eval("(+ 1 2)")
    assert not is_error and after.startswith("=> 3")
    if text.startswith("[ERROR] CL-MCP:IMAGE-EXITING"):  # the error did not say the state is gone
        assert "[session]\nThe Lisp image exited (exit code" in after
