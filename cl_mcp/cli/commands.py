"""The command line for people: `cl-mcp eval`, `tools`, `call` and `doctor`
(and `repl`, in repl.py).  Each talks MCP to a server through the client
library: cl-mcp itself by default, or any server given with --server."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from typing import Any

from cl_mcp.client import ClientError, McpClient, JsonRpcError, ToolValidationError
from cl_mcp.lisp.config import parse_address
from cl_mcp.results.render import without_number_line


# The server's options that take a value (see cli.build_parser); the
# commands that start cl-mcp pass them on, wherever they stand.
SERVER_OPTIONS = ("--connect", "--sbcl", "--slime-dir", "--heap-size", "--eval-timeout", "--load-timeout",
                  "--answer-within", "--max-background",
                  "--max-output", "--max-result-chars", "--keep-output", "--max-suspended",
                  "--suspend-timeout", "--log-level")
SERVER_FLAGS = ("--no-saved-core",)  # server options without a value


def split_server_options(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the command's own arguments, the server's options)."""
    own: list[str] = []
    server: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        name = token.split("=", 1)[0]
        index += 1
        if token in SERVER_FLAGS:
            server.append(token)
        elif name in SERVER_OPTIONS:
            server.append(token)
            bare_connect = name == "--connect" and not is_address(argv[index] if index < len(argv) else None)
            if "=" not in token and not bare_connect:  # a bare --connect: the saved port
                server.append(argv[index] if index < len(argv) else "")
                index += 1
        else:
            own.append(token)
    return own, server


def is_address(text: str | None) -> bool:
    try:
        parse_address(text or "")
        return True
    except ValueError:
        return False


# A terminal has no result budget: eval and repl show whole results (unless
# told otherwise: a later option wins).
FOR_A_TERMINAL = ("--max-result-chars", "10000000")


def own_server(server_args: list[str], terminal: bool = False) -> list[str]:
    """The command that runs this cl-mcp as a server, with its options (its
    log is kept to warnings unless they say otherwise); for a TERMINAL, with
    no budget on results."""
    return [sys.executable, "-m", "cl_mcp", "--log-level", "warning",
            *(FOR_A_TERMINAL if terminal else ()), *server_args]


def server_command(text: str | None, server_args: list[str]) -> list[str]:
    return shlex.split(text) if text else own_server(server_args)


class ProgressPrinter:
    """Shows a long call's progress on stderr, at most once a second."""

    def __init__(self) -> None:
        self._last = -1.0

    def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        if message and progress - self._last >= 2:  # notifications come every half second
            self._last = progress
            print(f"cl-mcp: {message}", file=sys.stderr, flush=True)


def fail(message: str) -> int:
    print(f"cl-mcp: {message}", file=sys.stderr)
    return 2


# ---------------------------------------------------------------- eval

def eval_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="cl-mcp eval", description="Evaluate Lisp code in a fresh image and print the result. "
        "Options not listed here are passed to the server (cl-mcp --help lists them).")
    parser.add_argument("code", help="Lisp form(s) to evaluate")
    parser.add_argument("--package", help="package to evaluate in (default CL-USER)")
    parser.add_argument("--time", action="store_true", help="add the ; Timing: line")
    parser.add_argument("--timeout", type=float, help="seconds before the evaluation is interrupted")
    own, server_args = split_server_options(argv)
    args = parser.parse_args(own)
    arguments: dict[str, Any] = {"code": args.code}
    if args.package:
        arguments["package"] = args.package
    if args.time:
        arguments["capture-time"] = True
    if args.timeout:
        arguments["timeout"] = args.timeout

    async def run() -> int:
        async with McpClient(own_server(server_args, terminal=True),
                             timeout=(args.timeout or 30) + 60) as client:
            result = await client.outcome(
                await client.call_tool("evaluate-lisp", arguments, progress=ProgressPrinter()),
                progress=ProgressPrinter())
        # The image is gone once this prints: its evaluation number reaches nothing.
        print(without_number_line(result.text))
        return 1 if result.is_error else 0

    return _run(run())


# ---------------------------------------------------------------- tools, call

def tools_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cl-mcp tools", description="List a server's tools.")
    parser.add_argument("--server", help="server command to run instead of cl-mcp (quoted)")
    parser.add_argument("--json", action="store_true", help="print the tool list as JSON")
    own, server_args = split_server_options(argv)
    args = parser.parse_args(own)

    async def run() -> int:
        async with McpClient(server_command(args.server, server_args)) as client:
            tools = await client.list_tools()
        if args.json:
            print(json.dumps(tools, indent=2, ensure_ascii=False))
            return 0
        for tool in tools:
            required = set(tool.get("inputSchema", {}).get("required") or [])
            properties = tool.get("inputSchema", {}).get("properties") or {}
            signature = " ".join(name if name in required else f"[{name}]" for name in properties)
            print(f"{tool['name']} {signature}".rstrip())
            if tool.get("description"):
                print(f"    {tool['description']}")
        return 0

    return _run(run())


def call_command(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="cl-mcp call", description="Call one tool of a server.")
    parser.add_argument("tool", help="the tool's name")
    parser.add_argument("arguments", nargs="?", default="{}", help="the arguments, as a JSON object")
    parser.add_argument("--server", help="server command to run instead of cl-mcp (quoted)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait (default 120)")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    own, server_args = split_server_options(argv)
    args = parser.parse_args(own)
    try:
        arguments = json.loads(args.arguments)
    except ValueError as error:
        return fail(f"the arguments are not JSON: {error}")
    if not isinstance(arguments, dict):
        return fail("the arguments must be a JSON object")

    async def run() -> int:
        async with McpClient(server_command(args.server, server_args), timeout=args.timeout) as client:
            result = await client.call_tool(args.tool, arguments, progress=ProgressPrinter())
        if args.json:
            print(json.dumps({"content": result.content, "isError": result.is_error,
                              "structuredContent": result.structured_content},
                             indent=2, ensure_ascii=False))
        else:
            for block in result.content:
                print(block["text"] if block.get("type") == "text"
                      else f"[{block.get('type')} content: {block.get('mimeType', '')}]")
        return 1 if result.is_error else 0

    return _run(run())


def _run(work: Any) -> int:
    """Run a command's coroutine; client errors become a message and exit 2."""
    try:
        return asyncio.run(work)
    except ToolValidationError as error:
        return fail(str(error))
    except JsonRpcError as error:
        return fail(f"the server refused the request: {error.message} ({error.code})")
    except ClientError as error:
        return fail(str(error))
    except KeyboardInterrupt:
        return 130
