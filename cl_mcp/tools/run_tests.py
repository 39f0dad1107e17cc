"""run-tests: a system's tests, or one test or suite, run as an evaluation
(the agent's `run-tests-of`), with the results read from the framework's
own data: totals, each failure at its test's definition, each error's
condition (see docs/tools.md)."""

from __future__ import annotations

from typing import Any

from cl_mcp.errors import SessionError
from cl_mcp.lisp.session import LispSession
from cl_mcp.results import budget
from cl_mcp.results.outputs import Lines
from cl_mcp.results.render import Rendered, condition_structure, error_result, error_text, place_structure, place_text
from cl_mcp.tools.calls import agent_plist, follow_package, lisp_seconds, result_dict
from cl_mcp.tools.evaluate import (AGENT_MAX_OUTPUT, Work, evaluation_rendered, keep_output, rendered_running,
                                   rendered_within, sent_to_background)
from cl_mcp.tools.window import answer_window, window_keywords
from cl_mcp.wire.sexp import Keyword, SExp, Symbol

BASE: dict[str, Any] = {"success": False, "stdout": "", "stderr": "", "warnings": []}


def run_form(session: LispSession, arguments: dict[str, Any], timeout: float, tag: int,
             window: float | None) -> list[SExp]:
    form: list[SExp] = [Symbol("cl-mcp-agent:run-tests-of"), Keyword("timeout"), lisp_seconds(timeout),
                        Keyword("tag"), tag, *window_keywords(window)]
    for key in ("system", "test", "package"):
        if arguments.get(key):
            form += [Keyword(key), arguments[key]]
    if arguments.get("debug"):
        form += [Keyword("debug"), True]
    if session.config.max_output != AGENT_MAX_OUTPUT:
        form += [Keyword("max-output"), session.config.max_output]
    return form


def _dict(value: Any) -> dict[str, Any]:
    return result_dict(value) if isinstance(value, list) else {}


def tests_of(result: dict[str, Any]) -> dict[str, Any] | None:
    """The run's :tests plist as a dict (problems and places too), or None
    when the report has none (the run waits at an error, or was stopped)."""
    if not isinstance(result.get("tests"), list):
        return None
    tests = result_dict(result["tests"])
    tests["problems"] = [{**_dict(problem), "place": _dict(_dict(problem).get("place"))}
                         for problem in tests.get("problems") or []]
    tests["signalled"] = _dict(tests.get("signalled")) or None
    tests["frameworks"] = [name for name in tests.get("frameworks") or [] if isinstance(name, str)]
    return tests


def problem_structure(problem: dict[str, Any]) -> dict[str, Any]:
    structure = {"kind": problem["kind"], "test": problem["test"],
                 **{key: problem[key] for key in ("form", "reason", "expected", "actual", "type", "message")
                    if isinstance(problem.get(key), str)}}
    if problem.get("expected-to-fail"):
        structure["expectedToFail"] = True
    structure["place"] = place_structure(problem["place"])
    return structure


def problem_text(problem: dict[str, Any]) -> str:
    expected = " (expected to fail)" if problem.get("expected-to-fail") else ""
    if problem["kind"] == "failure":
        lines = [f"FAIL {problem['test']}{expected}"]
        if problem.get("form"):
            lines.append(f"  check: {problem['form']}")
        if problem.get("reason"):
            lines.append(f"  {problem['reason']}")
    else:
        lines = [f"ERROR {problem['test']}{expected}: {problem.get('type')}: {problem.get('message')}"]
    lines.append(place_text(problem["place"]))
    return "\n".join(lines)


def totals_text(tests: dict[str, Any]) -> str:
    seconds = (tests.get("elapsed-ms") or 0) / 1000
    if not tests["frameworks"]:
        return f"[tests] no test framework recognised (FiveAM, Fiasco and RT are); ran in {seconds:.2f} s"
    not_run = f"; {tests['not-run']} did not run" if tests.get("not-run") else ""
    expected = f" ({tests['expected-failures']} expected to fail)" if tests.get("expected-failures") else ""
    return (f"[tests] {', '.join(tests['frameworks'])}: {tests['passed']} passed, {tests['failed']} failed{expected}, "
            f"{tests['errored']} errored, {tests['skipped']} skipped ({tests['counts']}){not_run} in {seconds:.2f} s")


def tests_structure(tests: dict[str, Any]) -> dict[str, Any]:
    structure: dict[str, Any] = {"frameworks": tests["frameworks"], "recognised": bool(tests["frameworks"]),
                                 "elapsedMs": tests.get("elapsed-ms") or 0,
                                 "problems": [problem_structure(p) for p in tests["problems"]],
                                 "unlisted": tests.get("unlisted") or 0}
    if tests["frameworks"]:
        structure.update({key: tests[key] for key in ("counts", "passed", "failed", "errored", "skipped")})
        if tests.get("not-run"):
            structure["notRun"] = tests["not-run"]
        if tests.get("expected-failures"):
            structure["expectedFailures"] = tests["expected-failures"]
    if tests["signalled"]:
        structure["signalled"] = condition_structure(tests["signalled"]["type"], tests["signalled"]["message"])
    return structure


def rendered_tests(result: dict[str, Any], limit: int) -> Rendered:
    """A finished run: the totals, each failure and error, and where the
    framework's printout is kept; the output itself, within LIMIT, when no
    framework was recognised (all there is to read)."""
    tests = tests_of(result)
    if tests is None:
        return rendered_within(result, limit)
    sections = [totals_text(tests)]
    sections += [problem_text(problem) for problem in tests["problems"]]
    if tests.get("unlisted"):
        sections.append(f"… and {tests['unlisted']} more failures and errors, not listed")
    if tests["signalled"]:
        sections.append(error_text(tests["signalled"]["type"], "The run ended with an error: "
                                   + tests["signalled"]["message"]))
    elif not tests["frameworks"] and not result.get("stdout") and not result.get("stderr"):
        sections.append("The test-op printed nothing and signalled nothing: it may run no tests "
                        "(a system without a test-op does nothing).")
    number = result.get("number")
    offsets = result.get("line-offsets") or {}
    if tests["frameworks"] and number is not None and result.get("stdout"):
        lines = len(Lines(result["stdout"]))  # as read-output counts them: a last line may lack its newline
        sections.append(f'The framework\'s printout ({lines} lines): read-output {{"evaluation": {number}, '
                        f'"offset": {offsets.get("stdout", 0) + 1}}} reads it')
    head = "\n\n".join(sections)
    failed = bool(tests["signalled"] or tests.get("failed") or tests.get("errored") or tests["problems"])
    structure: dict[str, Any] = {**BASE, "success": not failed, "tests": tests_structure(tests)}
    if isinstance(number, int):
        structure["number"] = number
    if not tests["frameworks"]:
        output = rendered_within(result, max(500, limit - len(head) - 100))
        head += "\n\n" + output.text
        structure.update({key: output.structured[key] for key in ("stdout", "stderr")
                          if output.structured and key in output.structured})
    return Rendered(budget.fit_text(head, limit), failed, budget.fit_structure(structure, limit))


def run_work(limit: int) -> Work:
    return Work("Test run {number}", BASE, lambda result: rendered_tests(result, limit))


def outcome_rendered(session: LispSession, result: dict[str, Any]) -> Rendered:
    """An evaluation's outcome: run-tests' result when it is a test run's end
    (also reached through invoke-restart after a debug stop), else
    evaluate-lisp's."""
    if tests_of(result) is None:
        return evaluation_rendered(session, result)
    return rendered_tests(result, session.config.max_result_chars)


async def run_tests(session: LispSession, arguments: dict[str, Any]) -> Rendered:
    if not arguments.get("system") and not arguments.get("test"):
        return error_result("CL-MCP:BAD-ARGUMENTS", "Give the system whose tests to run, or a test or suite.", BASE)
    limit = session.config.max_result_chars
    timeout = arguments.get("timeout") or session.config.load_timeout
    window = answer_window(arguments.get("answer-within"), session.config.answer_within, timeout)
    try:
        async with session.turn():
            tag = session.new_tag()
            result = await agent_plist(session, run_form(session, arguments, timeout, tag, window),
                                         timeout, tag=tag)
            if result.get("status") == "running":
                sent_to_background(session, result, run_work(limit))
                return rendered_running(result, limit, run_work(limit))
            result["line-offsets"] = await keep_output(session, result)
            follow_package(session, result, explicit=True)
    except SessionError as error:
        return error_result(error.kind, error.message, BASE)
    return outcome_rendered(session, result)
