"""Reports of objects whose whole printing would run to tens of megabytes:
a condition's message, backtrace frames and their locals, describe-symbol,
inspect and list-definitions.  Each prints at most what it keeps (plus the
small overrun `print-within' allows, agent/output.lisp) and says when it
cut; an error with a 20,000,000-character message is an ordinary error
result, not a reply too large for Swank's 16 MiB frame.

The memory checks measure bytes consed inside the image around one call
(SB-EXT:GET-BYTES-CONSED, as tests/integration/test_printing.py does):
printing the 20,000,000-character string whole conses 100 to 200 MB each
time, so a bound of a few tens of MB tells the two apart.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from tests.integration.conftest import McpProcess, cl_mcp

MESSAGE_LIMIT = 100_000  # cl-mcp-agent::*message-limit*
WARNING_LIMIT = 1_000  # a warning's message (cl-mcp-agent::warning-entries)
OVERRUN = 10_000  # cl-mcp-agent::*print-overrun*
STOPPED = f"\n… [printing stopped: more than {OVERRUN} more characters truncated]"
MB = 1_000_000
SMALL = 25 * MB  # bytes a call may cons here; printing the huge string whole conses 100+ MB

# A 20,000,000-character base string (20 MB in the image), and a function
# that keeps it in its frame while it signals.
SETUP = [
    "(defparameter *hr-huge* (make-string 20000000 :initial-element #\\x :element-type 'base-char))",
    "(defun hr-inner (s) (declare (optimize (debug 2))) (error \"short: ~D characters\" (length s)))",
]


@pytest.fixture(scope="module")
def lisp():
    """cl-mcp with a result budget wide enough to show a cut message whole,
    and the huge string defined."""
    with cl_mcp("--max-result-chars", "1000000") as process:
        for code in SETUP:
            text, is_error = process.eval(code)
            assert not is_error, text
        yield process


def bytes_consed(process: McpProcess) -> int:
    text, is_error = process.eval("(sb-ext:get-bytes-consed)")
    assert not is_error and text.startswith("=> "), text
    return int(text[3:])


def consed_by(process: McpProcess, action: Callable[[], Any]) -> tuple[int, Any]:
    """Bytes the image conses while ACTION runs (two evaluations' own
    bookkeeping included), and ACTION's result."""
    before = bytes_consed(process)
    result = action()
    return bytes_consed(process) - before, result


def abort_waiting(process: McpProcess) -> None:
    result = process.call("invoke-restart", restart="ABORT")
    assert (result["content"][0]["text"], result["isError"]) == (
        f"The evaluation was aborted.\n\n; Evaluation {result['structuredContent']['number']}", False)


# ---------------------------------------------------------------- conditions

def test_an_error_with_a_huge_message_is_reported_with_the_message_cut(lisp):
    result = lisp.call("evaluate-lisp",
                       code='(error "~A" (make-string 20000000 :initial-element #\\x))')
    text = result["content"][0]["text"]
    assert result["isError"], text[:300]
    message = "x" * MESSAGE_LIMIT + STOPPED
    assert text.startswith("[ERROR] SIMPLE-ERROR\n" + message + "\n\n[Backtrace]\n"
                           '0: (ERROR "~A" "xxxxxxxxxx'), text[:300]
    assert "\n[Restarts]\n0: [ABORT] Abort this evaluation." in text
    assert len(text) < MESSAGE_LIMIT + 2_000
    error = result["structuredContent"]["error"]
    assert (error["type"], error["message"]) == ("SIMPLE-ERROR", message)
    # The evaluation waits at its error as any other, and the session goes on.
    abort_waiting(lisp)
    assert lisp.eval("(+ 1 2)") == ("=> 3", False)


def test_a_message_cut_by_a_little_says_exactly_how_much(lisp):
    text, is_error = lisp.eval('(error "~A" (make-string 100005 :initial-element #\\y))')
    assert is_error
    assert text.startswith("[ERROR] SIMPLE-ERROR\n" + "y" * MESSAGE_LIMIT
                           + "\n… [5 more characters truncated]\n\n[Backtrace]\n")
    abort_waiting(lisp)


def test_a_huge_message_conses_little(lisp):
    consed, (text, is_error) = consed_by(lisp, lambda: lisp.eval('(error "~A" *hr-huge*)'))
    assert is_error and text.startswith("[ERROR] SIMPLE-ERROR\nxxxxxxxxxx")
    assert consed < SMALL, f"{consed:,} bytes consed"
    abort_waiting(lisp)


def test_a_huge_warning_is_cut_to_its_thousand_characters(lisp):
    consed, (text, is_error) = consed_by(lisp, lambda: lisp.eval('(progn (warn "~A" *hr-huge*) :done)'))
    assert not is_error
    assert text == "[warnings]\nSIMPLE-WARNING: " + "x" * WARNING_LIMIT + STOPPED + "\n\n=> :DONE"
    assert consed < SMALL, f"{consed:,} bytes consed"


# ---------------------------------------------------------------- backtraces

def test_a_backtrace_whose_frame_holds_a_huge_string_stays_small(lisp):
    def error_and_backtrace():
        error_text, is_error = lisp.eval("(hr-inner *hr-huge*)")
        assert is_error
        return error_text, lisp.call("backtrace")

    consed, (error_text, backtrace) = consed_by(lisp, error_and_backtrace)
    # The frame's line is cut at 300 characters, then " ...".
    line = '1: (HR-INNER "' + "x" * (300 - len('(HR-INNER "')) + " ..."
    assert error_text.startswith("[ERROR] SIMPLE-ERROR\nshort: 20000000 characters\n\n[Backtrace]\n"
                                 '0: (ERROR "short: ~D characters" 20000000)\n' + line + "\n")
    assert len(error_text) < 2_000
    assert not backtrace["isError"]
    text = backtrace["content"][0]["text"]
    assert line in text.splitlines()
    # A local's value is cut at 200 characters, then "...".
    assert '     S = "' + "x" * 196 + "..." in text.splitlines()
    assert len(text) < 3_000
    frame = backtrace["structuredContent"]["frames"][1]
    assert frame["locals"] == [{"name": "S", "value": '"' + "x" * 196 + "..."}]
    assert consed < SMALL, f"{consed:,} bytes consed"
    abort_waiting(lisp)


# ---------------------------------------------------------------- describe, inspect, list-definitions

def test_describe_symbol_of_a_huge_variable_stays_small(lisp):
    consed, result = consed_by(lisp, lambda: lisp.call("describe-symbol", symbol="*hr-huge*"))
    assert not result["isError"]
    assert result["structuredContent"]["value"] == '"' + "x" * 196 + "..."
    assert len(result["content"][0]["text"]) < 1_000
    assert consed < SMALL, f"{consed:,} bytes consed"


def describe_cheaply(process: McpProcess, symbol: str) -> dict[str, Any]:
    """describe-symbol's structured content for SYMBOL, checking that the
    reply is small and the call consed little."""
    consed, result = consed_by(process, lambda: process.call("describe-symbol", symbol=symbol))
    assert not result["isError"], result["content"][0]["text"][:300]
    assert len(result["content"][0]["text"]) < MESSAGE_LIMIT + 1_000
    assert consed < SMALL, f"{consed:,} bytes consed"
    return result["structuredContent"]


def test_a_huge_documentation_string_is_cut(lisp):
    text, is_error = lisp.eval("(defvar *hr-documented* nil)"
                               "(setf (documentation '*hr-documented* 'variable) *hr-huge*)")
    assert not is_error, text
    structured = describe_cheaply(lisp, "*hr-documented*")
    assert structured["documentation"] == {
        "variable": "x" * 100_000 + "\n… [19900000 more characters truncated]"}  # *documentation-limit*


def test_a_huge_eql_specializer_is_cut(lisp):
    text, is_error = lisp.eval("(defgeneric hr-gf (x)) (defmethod hr-gf ((x (eql *hr-huge*))) 1)")
    assert not is_error, text
    structured = describe_cheaply(lisp, "hr-gf")
    # A printed name is cut at 1,000 characters (*name-limit*), then "…".
    assert structured["methods"] == [{"qualifiers": [], "specializers": ['(EQL "' + "x" * 994 + "…"]}]


def test_a_huge_default_value_in_a_lambda_list_is_cut(lisp):
    text, is_error = lisp.eval("(setf (fdefinition 'hr-default)"
                               "      (compile nil `(lambda (&optional (s ,*hr-huge*)) s)))")
    assert not is_error, text
    structured = describe_cheaply(lisp, "hr-default")
    # A lambda list is cut at 2,000 characters (*lambda-list-limit*), then "…".
    assert structured["arglist"] == '(&OPTIONAL (S "' + "x" * 1985 + "…"


def test_inspect_of_a_variable_holding_a_huge_string_stays_small(lisp):
    consed, result = consed_by(lisp, lambda: lisp.call("inspect", code="'*hr-huge*"))
    assert not result["isError"]
    parts = {part["label"]: part["value"] for part in result["structuredContent"]["parts"]}
    assert parts["Value"] == '"' + "x" * 196 + "..."
    assert len(result["content"][0]["text"]) < 2_000
    assert consed < SMALL, f"{consed:,} bytes consed"


def test_inspect_of_a_list_holding_a_huge_string_stays_small(lisp):
    consed, result = consed_by(lisp, lambda: lisp.call("inspect", code="(list *hr-huge*)"))
    assert not result["isError"]
    structured = result["structuredContent"]
    assert structured["printed"] == '("' + "x" * 995 + "..."  # cut at 1,000 characters
    assert [(part["label"], part["value"]) for part in structured["parts"]] == [("0", '"' + "x" * 196 + "...")]
    assert len(result["content"][0]["text"]) < 3_000
    assert consed < SMALL, f"{consed:,} bytes consed"


def test_inspect_of_the_huge_string_itself_stays_small(lisp):
    # Its parts are its characters, of which Swank's content is read up to
    # 100,000 (*inspect-content-limit*) to count them: about 60 MB, whatever
    # the string's length.  Only the page shown is printed; printing every
    # part read consed 760 MB more.
    consed, result = consed_by(lisp, lambda: lisp.call("inspect", code="*hr-huge*"))
    assert not result["isError"]
    structured = result["structuredContent"]
    assert structured["printed"] == '"' + "x" * 996 + "..."
    assert (structured["total"], len(structured["parts"]), structured["cut"]) == (99_999, 50, True)
    assert [(part["label"], part["value"]) for part in structured["parts"][:8]] == [
        ("Dimensions", "(20000000)"), ("Element type", "BASE-CHAR"), ("Total size", "20000000"),
        ("Adjustable", "NIL"), ("Fill pointer", "NIL"), ("Contents:", ""), ("0", "#\\x"), ("1", "#\\x")]
    assert len(result["content"][0]["text"]) < 5_000
    assert consed < 4 * SMALL, f"{consed:,} bytes consed"


def test_list_definitions_of_a_huge_variable_stays_small(lisp):
    consed, result = consed_by(lisp, lambda: lisp.call("list-definitions", type="variables"))
    assert not result["isError"]
    assert {"name": "*HR-HUGE*", "kind": "variable", "value": '"' + "x" * 76 + "..."} \
        in result["structuredContent"]["definitions"]
    assert len(result["content"][0]["text"]) < 1_000
    assert consed < SMALL, f"{consed:,} bytes consed"
