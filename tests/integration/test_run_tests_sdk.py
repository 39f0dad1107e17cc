"""run-tests driven by the official MCP Python SDK client, as hosts drive it,
embedded and attached: split-sequence's FiveAM suite (Debian's, nobody here
wrote it) run through run-tests, its structured content valid against the
tool's outputSchema from tools/list, and its totals those FiveAM gives when
the same suite runs directly through evaluate-lisp."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from mcp import Client, StdioServerParameters

from tests.integration.attach_fixtures import SwankServer, temporary_home
from tests.integration.devtools import MODES

CL_MCP = str(Path(sys.executable).parent / "cl-mcp")

# FiveAM's own counts of its results, one list printed as the value.
FIVEAM_COUNTS = """
  (let ((results (5am:run :split-sequence)))
    (list (count-if (lambda (r) (typep r '5am::test-passed)) results)
          (count-if (lambda (r) (and (typep r '5am::test-failure)
                                     (not (typep r '5am::unexpected-test-failure)))) results)
          (count-if (lambda (r) (typep r '5am::unexpected-test-failure)) results)
          (count-if (lambda (r) (typep r '5am::test-skipped)) results)))"""


async def run_through_sdk(parameters: StdioServerParameters):
    async with Client(parameters) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        run = await client.call_tool("run-tests", {"system": "split-sequence"})
        direct = await client.call_tool("evaluate-lisp", {"code": FIVEAM_COUNTS})
        return tools["run-tests"].output_schema, run, direct


@pytest.mark.parametrize("mode", MODES)
def test_split_sequences_suite_through_the_python_sdk(mode):
    swank = None
    if mode == "attached":
        home = temporary_home()
        swank = SwankServer(home)
        parameters = StdioServerParameters(command=CL_MCP, args=["--connect", str(swank.port)],
                                           env={"HOME": str(home)})
    else:
        parameters = StdioServerParameters(command=CL_MCP, args=[])
    try:
        schema, run, direct = asyncio.run(asyncio.wait_for(run_through_sdk(parameters), 300))
    finally:
        if swank:
            swank.stop()
    assert list(Draft202012Validator(schema).iter_errors(run.structured_content)) == []
    tests = run.structured_content["tests"]
    assert not direct.is_error, direct
    counts = direct.structured_content["values"][0].strip("()").split()
    assert [tests["passed"], tests["failed"], tests["errored"], tests["skipped"]] == [int(n) for n in counts]
    assert tests["frameworks"] == ["FiveAM"] and tests["passed"] > 100
    assert run.is_error is (tests["failed"] + tests["errored"] > 0)
    assert run.content[0].text.startswith(f"[tests] FiveAM: {tests['passed']} passed, ")
