"""Results that fit the host's budget (--max-result-chars), and nothing
lost: read-output reads what a result left out, against a real SBCL."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from tests.integration.conftest import McpProcess

# About 5 MB of output, its last line the one that matters.
FIVE_MB = ('(dotimes (i 100000) (format t "line ~D ~A~%" i (make-string 40 :initial-element #\\x)))'
           ' (format t "ERROR: the disk is full~%") :done')


def structured_size(result: dict) -> int:
    return len(json.dumps(result["structuredContent"], ensure_ascii=False, separators=(",", ":")))


@pytest.fixture(scope="module", params=[1_000, 20_000])
def lisp(request):
    process = McpProcess("--max-result-chars", str(request.param))
    process.initialize()
    process.budget = request.param
    process.tools = {tool["name"]: tool for tool in process.request("tools/list")["result"]["tools"]}
    yield process
    process.close()


def checked(lisp, tool: str, **arguments) -> dict:
    result = lisp.call(tool, **arguments)
    assert len(result["content"][0]["text"]) <= lisp.budget
    if "structuredContent" in result:
        assert structured_size(result) <= lisp.budget
        assert list(Draft202012Validator(lisp.tools[tool]["outputSchema"]).iter_errors(
            result["structuredContent"])) == []
    return result


def test_five_megabytes_keep_their_end_and_read_output_finds_the_rest(lisp):
    result = checked(lisp, "evaluate-lisp", code=FIVE_MB)
    text = result["content"][0]["text"]
    assert "ERROR: the disk is full" in text
    assert text.endswith(f"=> :DONE\n\n; Evaluation {result['structuredContent']['number']}")
    assert text.startswith("[stdout]\nline 0 ")
    number = result["structuredContent"]["number"]
    marker = next(line for line in text.splitlines() if line.startswith("… ["))
    assert f'read-output {{"evaluation": {number}, "stream": "stdout", "offset": ' in marker
    call = json.loads(marker.split("read-output ", 1)[1].rstrip("]"))
    found = checked(lisp, "read-output", **call)
    assert f"[stdout of evaluation {number}: lines {call['offset']}–" in found["content"][0]["text"]
    assert found["structuredContent"]["totalLines"] == 100_001
    first = found["structuredContent"]["lines"][0]
    assert first.startswith(f"{call['offset']:>7}: line {call['offset'] - 1} x")
    early = checked(lisp, "read-output", evaluation=number, pattern=r"^line 17 ")
    assert "     18: line 17 x" in early["content"][0]["text"]
    assert early["structuredContent"]["matches"] == 1


def test_a_long_value_says_how_to_reach_it(lisp):
    result = checked(lisp, "evaluate-lisp", code="(make-string 50000 :initial-element #\\a)")
    number = result["structuredContent"]["number"]
    text = result["content"][0]["text"]
    assert text.startswith('=> "aaa') and text.endswith(f'aaa"\n\n; Evaluation {number}')
    assert f"(cl-mcp-agent:value {number})" in text
    whole = checked(lisp, "read-output", evaluation=number, stream="values")
    assert "more characters on this line]" in whole["content"][0]["text"]


def test_every_result_fits(lisp):
    for tool, arguments in [("apropos", {"pattern": "a"}), ("evaluate-lisp", {"code": "(error \"x\")"}),
                            ("backtrace", {}), ("describe-symbol", {"symbol": "list"}),
                            ("invoke-restart", {"restart": "ABORT"}),
                            ("evaluate-lisp", {"code": "(dotimes (i 20000) (print i *error-output*))"})]:
        checked(lisp, tool, **arguments)


def test_truncated_counts_the_notes_the_budget_left_out_too(lisp, tmp_path):
    """compile-file lists at most 200 notes; the budget cuts the structured
    list further, and `truncated` counts every note not in it (issue 49,
    item 8: 250 warnings answered `truncated` 50 beside 25 notes)."""
    source = tmp_path / "warnings.lisp"
    source.write_text("".join(f"(defun budget-w{i} (x) (declare (ignorable x)) (+ (quote a{i}) 1))\n"
                              for i in range(250)))
    result = checked(lisp, "compile-file", path=str(source), load=False)
    structured = result["structuredContent"]
    assert result["content"][0]["text"].startswith(f"Compiled {source}: 250 distinct notes, 200 listed")
    assert len(structured["notes"]) < 200
    assert len(structured["notes"]) + structured["truncated"] == 250
    assert [note["message"] for note in structured["notes"]] == [
        f"Constant A{i} conflicts with its asserted type NUMBER." for i in range(len(structured["notes"]))]


def test_what_read_output_cannot_give_is_an_error_that_says_why(lisp):
    unknown = lisp.call("read-output", evaluation=999_999)
    assert unknown["isError"]
    assert "No output of evaluation 999999 is kept" in unknown["content"][0]["text"]
    bad = lisp.call("read-output", evaluation=1, pattern="(")
    assert bad["isError"] and "cannot be searched: missing ): (." in bad["content"][0]["text"]
    refused = lisp.call("read-output", evaluation=1, pattern=r"(a)\1")
    assert refused["isError"]
    assert "cannot be searched: invalid escape sequence: \\1. Patterns are RE2's syntax: Python's " \
           "without backreferences or lookaround" in refused["content"][0]["text"]


def test_tools_list_gives_the_budget_as_a_size_hint(lisp):
    for tool in lisp.tools.values():
        assert tool["_meta"]["anthropic/maxResultSizeChars"] == lisp.budget


def test_the_oldest_output_goes_first_past_keep_output():
    process = McpProcess("--keep-output", "1000000")
    try:
        process.initialize()
        code = "(dotimes (i 12000) (format t \"~49D~%\" i))"  # 600,000 characters
        first = process.call("evaluate-lisp", code=code)["structuredContent"]["number"]
        second = process.call("evaluate-lisp", code=code)["structuredContent"]["number"]
        assert not process.call("read-output", evaluation=second, offset=1, length=1)["isError"]
        gone = process.call("read-output", evaluation=first)
        assert gone["isError"] and "no longer kept" in gone["content"][0]["text"]
    finally:
        process.close()
