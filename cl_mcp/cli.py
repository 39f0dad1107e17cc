"""The `cl-mcp` command: parse arguments, log to stderr, serve on stdio."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from cl_mcp import __version__, idle_poll, jsonrpc
from cl_mcp.jsonrpc import OversizedLine
from cl_mcp.client_log import ClientLogHandler
from cl_mcp.image import ImageConfig
from cl_mcp.link import parse_address
from cl_mcp.session import LispSession, SessionConfig
from cl_mcp.stdio import StdioTransport, claim_stdout

log = logging.getLogger("cl_mcp")

# After stdin closes, running requests get this long to answer before exit.
EOF_GRACE = 1.5


def bounded_int(low: int, high: int):
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}")
        return value
    return parse


def address(text: str) -> tuple[str, int]:
    try:
        return parse_address(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value <= 86400 * 365:
        raise argparse.ArgumentTypeError("must be a positive number of seconds")
    return value


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="cl-mcp",
        usage="cl-mcp [serve] [options]  |  cl-mcp COMMAND ...",
        description="MCP server over stdio that evaluates Common Lisp in an SBCL image through "
                    "Swank. With no command it serves MCP on stdio, which is what MCP hosts run.",
        epilog="commands:\n" + "\n".join(f"  {name:<8} {text}" for name, text in COMMANDS.items())
               + "\n\n`cl-mcp COMMAND --help` describes each.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cl-mcp {__version__}")
    parser.add_argument("--connect", metavar="[HOST:]PORT", type=address,
                        default=address(env("CL_MCP_CONNECT")) if env("CL_MCP_CONNECT") else None,
                        help="attach to a running Swank (e.g. Emacs's M-x slime) instead of "
                             "starting SBCL (env CL_MCP_CONNECT); presents ~/.slime-secret if it exists")
    parser.add_argument("--sbcl", default=env("CL_MCP_SBCL", "sbcl"),
                        help="SBCL executable (env CL_MCP_SBCL; default: sbcl)")
    parser.add_argument("--slime-dir", default=env("CL_MCP_SLIME_DIR"),
                        help="directory with swank-loader.lisp (env CL_MCP_SLIME_DIR; "
                             "default: Debian's cl-swank)")
    parser.add_argument("--no-saved-core", action="store_true",
                        default=env("CL_MCP_NO_SAVED_CORE", "") not in ("", "0"),
                        help="start SBCL from fasls every time instead of from a core with Swank "
                             "and the agent saved under ~/.cache/cl-mcp (~50 MB; env CL_MCP_NO_SAVED_CORE=1)")
    parser.add_argument("--eval-timeout", type=positive_float, default=float(env("CL_MCP_EVAL_TIMEOUT", "30")),
                        help="seconds before an evaluation is interrupted (default: 30)")
    parser.add_argument("--load-timeout", type=positive_float, default=300.0,
                        help="seconds load-system may take (default: 300)")
    parser.add_argument("--max-output", type=bounded_int(1_000, 1_000_000), default=1_000_000,
                        help="characters kept of each of stdout, stderr and the printed values "
                             "of one evaluation (1000 to 1000000; default: 1000000)")
    parser.add_argument("--max-suspended", type=bounded_int(0, 64), default=8,
                        help="evaluations that may wait at an error at once (0: none wait; default: 8)")
    parser.add_argument("--suspend-timeout", type=positive_float, default=600.0,
                        help="seconds an evaluation waits at an error, without a command for it, before it is aborted (default: 600)")
    parser.add_argument("--log-level", default=env("CL_MCP_LOG_LEVEL", "info"),
                        choices=["debug", "info", "warning", "error"],
                        help="stderr log level (default: info)")
    return parser


async def serve(config: SessionConfig, out_fd: int) -> int:
    from cl_mcp.server import McpServer

    session = LispSession(config)
    server = McpServer(session, lambda message: transport.write(jsonrpc.encode(message)))

    def receive_first(line: bytes | OversizedLine) -> None:
        # The image starts once the first message (initialize) is under way,
        # so that its start-up does not compete with the first answer.
        transport.on_line = server.receive
        server.receive(line)
        session.start_in_background()

    transport = StdioTransport(receive_first, 0, out_fd)
    await transport.open()
    logging.getLogger("cl_mcp").addHandler(ClientLogHandler(server))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, stop.set)

    reader = asyncio.create_task(transport.input_ended())
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait({reader, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        log.info("signal received; shutting down")
        await server.finish(timeout=0)
    else:
        log.info("stdin closed; shutting down")
        await server.finish(timeout=EOF_GRACE)
    reader.cancel()
    stopper.cancel()
    await session.close()
    await transport.drain()
    transport.close()
    return 0


COMMANDS = {
    "eval": "evaluate Lisp code in a fresh image and print the result",
    "repl": "an interactive Lisp REPL over cl-mcp",
    "tools": "list the tools of cl-mcp (or of another server, --server CMD)",
    "call": "call one tool: cl-mcp call TOOL JSON-ARGUMENTS [--server CMD]",
    "doctor": "check SBCL, Swank, Quicklisp and ASDF systems, and that an image starts",
    "serve": "serve MCP on stdio (what MCP hosts run; the default)",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS and argv[0] != "serve":
        return run_command(argv[0], argv[1:])
    return serve_main(argv[1:] if argv and argv[0] == "serve" else argv)


def run_command(name: str, argv: list[str]) -> int:
    logging.basicConfig(level="WARNING", stream=sys.stderr,
                        format="cl-mcp %(levelname)s %(name)s: %(message)s")
    if name == "repl":
        from cl_mcp.repl import repl_command
        return repl_command(argv)
    if name == "doctor":
        from cl_mcp.doctor import doctor_command
        return doctor_command(argv)
    from cl_mcp import commands
    return {"eval": commands.eval_command, "tools": commands.tools_command,
            "call": commands.call_command}[name](argv)


def serve_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s cl-mcp %(levelname)s %(name)s: %(message)s",
    )
    out_fd = claim_stdout()
    config = SessionConfig(
        image=ImageConfig(sbcl=args.sbcl, slime_dir=args.slime_dir,
                          saved_core=not args.no_saved_core),
        connect=args.connect,
        eval_timeout=args.eval_timeout,
        load_timeout=args.load_timeout,
        max_output=args.max_output,
        max_suspended=args.max_suspended,
        suspend_timeout=args.suspend_timeout,
    )
    try:
        with asyncio.Runner(loop_factory=idle_poll.new_event_loop) as runner:
            return runner.run(serve(config, out_fd))
    except KeyboardInterrupt:
        return 130
