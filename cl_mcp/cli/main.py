"""The `cl-mcp` command: parse arguments, log to stderr, serve on stdio."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, NoReturn

from cl_mcp import __version__
from cl_mcp.lisp.config import HEAP_SIZE_RANGE, ImageConfig, SessionConfig, parse_address, saved_address
from cl_mcp.server.client_log import ClientLogHandler
from cl_mcp.wire import idle_poll, jsonrpc
from cl_mcp.wire.jsonrpc import OversizedLine
from cl_mcp.wire.stdio import StdioTransport, claim_stdout, reopen_closed_stdin

if TYPE_CHECKING:
    from cl_mcp.lisp.session import LispSession

log = logging.getLogger("cl_mcp")


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        message = f"must be an integer from {low} to {high}"
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(message) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(message)
        return value
    return parse


def address(text: str) -> tuple[str, int]:
    try:
        return parse_address(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be [HOST:]PORT, such as 4005 or 127.0.0.1:4005") from None


# --connect's value when it is given no port: the one `cl-mcp-share` saved.
# Not a string, which argparse would pass through `address`.
SAVED_PORT = object()


def connect_address(parser: argparse.ArgumentParser, value: object) -> tuple[str, int] | None:
    """--connect's address, the saved port read for a bare --connect."""
    if value is not SAVED_PORT:
        return value  # type: ignore[return-value]
    try:
        return saved_address()
    except ValueError as error:
        parser.error(str(error))


def positive_float(text: str) -> float:
    message = "must be a positive number of seconds"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(message) from None
    if not 0 < value <= 86400 * 365:  # false for nan too
        raise argparse.ArgumentTypeError(message)
    return value


def on_off(text: str) -> bool:
    """The value of a switch's environment variable (a flag on the command line)."""
    word = text.strip().lower()
    if word not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise argparse.ArgumentTypeError("must be 1 or 0")
    return word in ("1", "true", "yes", "on")


def env_variable(option: argparse.Action) -> str:
    """The environment variable named after OPTION: --eval-timeout is CL_MCP_EVAL_TIMEOUT."""
    return "CL_MCP_" + option.dest.upper()


def config_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """Exit 2 with one line on stderr (parser.error would add the usage)."""
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def environment_value(parser: argparse.ArgumentParser, option: argparse.Action, text: str) -> Any:
    """TEXT, the value of OPTION's variable, converted and checked as the
    flag's argument would be; a bad one names the variable and exits 2."""
    name = env_variable(option)
    shown = text if text.isprintable() else repr(text)
    convert = option.type or (on_off if option.nargs == 0 else str)
    try:
        value = convert(text)
    except argparse.ArgumentTypeError as error:
        config_error(parser, f"{name}={shown}: {error}")
    if option.choices is not None and value not in option.choices:
        config_error(parser, f"{name}={shown}: must be one of {', '.join(map(str, option.choices))}")
    return value


def read_environment(parser: argparse.ArgumentParser, options: list[argparse.Action],
                     environ: Mapping[str, str]) -> None:
    """Each option's default from its variable, when that is set and not empty
    (a flag on the command line still wins), and the variable in its help."""
    for option in options:
        option.help = f"{option.help} [env {env_variable(option)}]"
        text = environ.get(env_variable(option), "")
        if text:
            option.default = environment_value(parser, option, text)


def build_parser(environ: Mapping[str, str] = os.environ) -> argparse.ArgumentParser:
    """The server's options.  A CL_MCP_* variable in ENVIRON sets its option's
    default, checked as the flag is: a bad one exits 2, even before --help."""
    parser = argparse.ArgumentParser(
        prog="cl-mcp",
        usage="cl-mcp [serve] [options]  |  cl-mcp COMMAND ...",
        description="MCP server over stdio that evaluates Common Lisp in an SBCL image through\n"
                    "Swank. With no command it serves MCP on stdio, which is what MCP hosts run.\n\n"
                    "Each option can also be set by the environment variable named after it\n"
                    "(--eval-timeout 5: CL_MCP_EVAL_TIMEOUT=5; a switch: =1 or =0). The command\n"
                    "line wins; an empty variable counts as unset.",
        epilog="commands:\n" + "\n".join(f"  {name:<8} {text}" for name, text in COMMANDS.items())
               + "\n\n`cl-mcp COMMAND --help` describes each.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cl-mcp {__version__}")
    options = [
        parser.add_argument("--connect", metavar="[HOST:]PORT", type=address, nargs="?", const=SAVED_PORT,
                            help="attach to a running Swank (e.g. Emacs's M-x slime) instead of "
                                 "starting SBCL; presents ~/.slime-secret if it exists. Without "
                                 "a port, the one Emacs's M-x cl-mcp-share saved in ~/.cl-mcp-port"),
        parser.add_argument("--sbcl", default="sbcl", help="SBCL executable (default: sbcl)"),
        parser.add_argument("--slime-dir", help="directory with swank-loader.lisp "
                                                "(default: Debian's cl-swank)"),
        parser.add_argument("--no-saved-core", action="store_true",
                            help="start SBCL from fasls every time instead of from a core with "
                                 "Swank and the agent saved under ~/.cache/cl-mcp (~50 MB)"),
        parser.add_argument("--heap-size", metavar="MIB", type=bounded_int(*HEAP_SIZE_RANGE),
                            help="the image's heap (SBCL's dynamic space) in MiB (default: a "
                                 "quarter of physical memory, at most 8192 and at least 1024)"),
        parser.add_argument("--eval-timeout", type=positive_float, default=30.0,
                            help="seconds before an evaluation is interrupted (default: 30)"),
        parser.add_argument("--load-timeout", type=positive_float, default=300.0,
                            help="seconds load-system may take (default: 300)"),
        parser.add_argument("--answer-within", type=positive_float, default=45.0,
                            help="seconds an evaluation may take before its call is answered "
                                 "'still running' and it runs on in the background, within a "
                                 "host's tool timeout (default: 45)"),
        parser.add_argument("--max-background", type=bounded_int(0, 64), default=4,
                            help="evaluations that may run in the background at once "
                                 "(default: 4)"),
        parser.add_argument("--max-output", type=bounded_int(1_000, 64_000_000), default=16_000_000,
                            help="characters the image captures of each of stdout and stderr of "
                                 "one evaluation; the rest is counted, not kept (1000 to 64000000; "
                                 "default: 16000000)"),
        parser.add_argument("--max-result-chars", type=bounded_int(1_000, 10_000_000), default=20_000,
                            help="characters one tool result may hold, text and structured content "
                                 "each: long output keeps its start and its end, and read-output "
                                 "reads the rest (1000 to 10000000; default: 20000)"),
        parser.add_argument("--keep-output", type=bounded_int(0, 1_073_741_824), default=67_108_864,
                            help="characters of the session's evaluations' output kept for "
                                 "read-output, the oldest evaluations dropped first (default: "
                                 "67108864, 64 MiB)"),
        parser.add_argument("--max-suspended", type=bounded_int(0, 64), default=8,
                            help="evaluations that may wait at an error at once "
                                 "(0: none wait; default: 8)"),
        parser.add_argument("--suspend-timeout", type=positive_float, default=600.0,
                            help="seconds an evaluation waits at an error, without a command for "
                                 "it, before it is aborted (default: 600)"),
        parser.add_argument("--log-level", default="info",
                            choices=["debug", "info", "warning", "error"],
                            help="stderr log level (default: info)"),
    ]
    read_environment(parser, options, environ)
    return parser


def is_loopback(host: str) -> bool:
    """True for localhost and the loopback addresses (127.0.0.0/8, ::1);
    any other name counts as remote."""
    if host.lower() == "localhost":
        return True
    import ipaddress  # only for --connect: not on the way to initialize
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or ip).is_loopback


def warn_if_remote(connect: tuple[str, int] | None) -> None:
    """Swank has no encryption: off this machine, its secret and every
    evaluation can be read (and changed) on the way."""
    if connect is None or is_loopback(connect[0]):
        return
    host, port = connect
    log.warning("--connect %s:%d is not on this machine: the Swank secret and all code travel "
                "in clear text. Use an SSH tunnel instead: ssh -L %d:127.0.0.1:%d %s, "
                "then --connect %d", host, port, port, port, host, port)


async def first_of(*awaitables: Awaitable[object]) -> None:
    """Wait until one of AWAITABLES is done, and cancel the others."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


async def serve(config: SessionConfig, out_fd: int) -> int:
    from cl_mcp.server.server import McpServer

    def make_session() -> LispSession:
        from cl_mcp.lisp.session import LispSession
        # Made once initialize is answered (`receive_first`): the host's name is known.
        return LispSession(config, str(server.client_info.get("name", "")))

    server = McpServer(config, make_session, lambda message: transport.write(jsonrpc.encode(message)))

    def receive_first(line: bytes | OversizedLine) -> None:
        # The session (its modules) and the image are made once the first
        # message (initialize) is answered, so that neither delays it.
        transport.on_line = server.receive
        server.receive(line)
        asyncio.get_running_loop().call_soon(lambda: server.session.start_in_background())

    transport = StdioTransport(receive_first, 0, out_fd)
    await transport.open()
    logging.getLogger("cl_mcp").addHandler(ClientLogHandler(server))

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(signum, stop.set)

    await first_of(transport.input_ended(), stop.wait())
    if not stop.is_set():
        # Every request read before the end is answered, each within its own
        # deadline (a first start may first compile the agent), unless
        # nobody reads the answers any more or a signal says stop now.
        log.info("stdin closed; answering the requests under way, then shutting down")
        await first_of(server.finish(timeout=None), stop.wait(), transport.output_lost())
    if stop.is_set():
        log.info("signal received; shutting down")
    await server.finish(timeout=0)
    if server.has_session:
        await server.session.close()
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
    # A bad CL_MCP_* variable stops here, in one line, rather than in the
    # server the command starts.
    build_parser()
    logging.basicConfig(level="WARNING", stream=sys.stderr,
                        format="cl-mcp %(levelname)s %(name)s: %(message)s")
    if name == "repl":
        from cl_mcp.cli.repl import repl_command
        return repl_command(argv)
    if name == "doctor":
        from cl_mcp.cli.doctor import doctor_command
        return doctor_command(argv)
    from cl_mcp.cli import commands
    return {"eval": commands.eval_command, "tools": commands.tools_command,
            "call": commands.call_command}[name](argv)


def serve_main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.connect = connect_address(parser, args.connect)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s cl-mcp %(levelname)s %(name)s: %(message)s",
    )
    warn_if_remote(args.connect)
    reopen_closed_stdin()
    out_fd = claim_stdout()
    config = SessionConfig(
        image=ImageConfig(sbcl=args.sbcl, slime_dir=args.slime_dir,
                          saved_core=not args.no_saved_core, heap_size=args.heap_size),
        connect=args.connect,
        eval_timeout=args.eval_timeout,
        load_timeout=args.load_timeout,
        answer_within=args.answer_within,
        max_background=args.max_background,
        max_output=args.max_output,
        max_result_chars=args.max_result_chars,
        keep_output=args.keep_output,
        max_suspended=args.max_suspended,
        suspend_timeout=args.suspend_timeout,
    )
    try:
        with asyncio.Runner(loop_factory=idle_poll.new_event_loop) as runner:
            return runner.run(serve(config, out_fd))
    except KeyboardInterrupt:
        return 130
