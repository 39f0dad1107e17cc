"""`cl-mcp doctor`: check what cl-mcp needs, and say what to install."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from cl_mcp.errors import ClMcpError
from cl_mcp.lisp.config import HEAP_SIZE_CAP, HEAP_SIZE_FLOOR, ImageConfig, physical_memory
from cl_mcp.lisp.image import (LispImage, cache_dir, cache_problem, cached_code, core_failure, find_bootstrap,
                               find_slime_dir, forget_core_failure, saved_core)
from cl_mcp.lisp.swank.connection import SwankConnection
from cl_mcp.wire.sexp import Symbol, plist

# Where Debian's cl-* packages and local projects keep .asd files.
SYSTEM_GLOBS = ("/usr/share/common-lisp/source/*/*.asd", "/usr/share/common-lisp/systems/*.asd")


def line(ok: bool | None, what: str, detail: str) -> bool:
    mark = {True: "ok  ", False: "FAIL", None: "note"}[ok]
    print(f"[{mark}] {what}: {detail}")
    return ok is not False


def check_sbcl(sbcl: str) -> bool:
    path = shutil.which(sbcl)
    if path is None:
        return line(False, "SBCL", f"{sbcl!r} not on PATH; install it: apt-get install sbcl")
    version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.strip()
    return line(True, "SBCL", f"{version} ({path})")


def check_swank(slime_dir: str | None) -> bool:
    try:
        directory = find_slime_dir(slime_dir)
    except ClMcpError as error:
        return line(False, "Swank", str(error))
    version_file = directory / "slime-version"
    version = version_file.read_text().strip() if version_file.exists() else "unknown version"
    return line(True, "Swank", f"{version} ({directory})")


def check_quicklisp() -> bool:
    setup = Path.home() / "quicklisp" / "setup.lisp"
    if setup.exists():
        return line(True, "Quicklisp", f"{setup} (load-system uses it)")
    return line(None, "Quicklisp", "not installed; load-system uses ASDF and Debian's cl-* packages")


def check_systems() -> bool:
    found = sorted({asd.stem for pattern in SYSTEM_GLOBS
                    for asd in Path("/").glob(pattern.lstrip("/"))})
    if not found:
        return line(None, "ASDF systems", "none registered; e.g. apt-get install cl-alexandria")
    shown = ", ".join(found[:12]) + (f" and {len(found) - 12} more" if len(found) > 12 else "")
    return line(True, "ASDF systems", f"{len(found)} registered: {shown}")


HEAP_MIB = "(ash (sb-ext:dynamic-space-size) -20)"


async def start_image(config: ImageConfig) -> tuple[Any, Any]:
    """The printed values of (+ 1 2) and of the heap's size in MiB, in a
    fresh image, as the agent gives them."""
    image = LispImage(config)
    try:
        port = await image.start()
        connection = await SwankConnection.open("127.0.0.1", port, secret=image.secret)
        answers = [plist(await connection.rex([Symbol("cl-mcp-agent:evaluate"), code])).get("values")
                   for code in ("(+ 1 2)", HEAP_MIB)]
        await connection.close()
        return answers[0], answers[1]
    finally:
        await image.stop()


def heap_origin(config: ImageConfig) -> str:
    if config.heap_size is not None:
        return "--heap-size or CL_MCP_HEAP_SIZE"
    return (f"a quarter of the {physical_memory() // 2**20} MiB of memory, at most {HEAP_SIZE_CAP} "
            f"and at least {HEAP_SIZE_FLOOR}; --heap-size or CL_MCP_HEAP_SIZE sets it")


def check_image(config: ImageConfig) -> bool:
    try:
        values, heap = asyncio.run(asyncio.wait_for(start_image(config), 180))
    except (ClMcpError, OSError, asyncio.TimeoutError) as error:
        return line(False, "image", f"could not start SBCL with Swank and the agent: {error}")
    if values != ["3"]:
        return line(False, "image", f"started, but (+ 1 2) gave {str(values)[:200]}")
    line(True, "image", "SBCL starts with Swank and the agent, and (+ 1 2) => 3")
    if heap != [str(config.heap_mib())]:
        return line(False, "heap", f"asked for {config.heap_mib()} MiB, the image has {str(heap)[:200]}")
    return line(True, "heap", f"{config.heap_mib()} MiB ({heap_origin(config)})")


def check_cache(config: ImageConfig) -> bool:
    """Whether cl-mcp may keep and run code in its cache: the same check as
    every start's (the image check above has made the directory)."""
    cache = cache_dir()
    core = configured_core(config)
    problem = cache_problem(cache, cached_code(find_bootstrap(), cache, core))
    if problem is not None:
        return line(False, "cache", f"{problem}; until then no saved core is used, "
                                    "and every start compiles the agent afresh")
    return line(True, "cache", f"{cache}: nobody else can write it or what it holds")


def configured_core(config: ImageConfig) -> Path | None:
    sbcl = shutil.which(config.sbcl)
    return saved_core(sbcl, find_slime_dir(config.slime_dir), find_bootstrap()) if sbcl else None


def check_saved_core(config: ImageConfig) -> None:
    """Where the saved core is (the image check above builds it if missing)."""
    core = configured_core(config)
    if core is None:
        return
    if core.is_file():
        line(True, "saved core", f"{core} ({core.stat().st_size / 2**20:.0f} MB): images start in ~30 ms")
    else:
        reason = core_failure(core) or "its build is still under way"
        line(None, "saved core", f"none ({reason}); images start from fasls (~250 ms)")


def doctor_command(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="cl-mcp doctor", description="Check what cl-mcp needs.")
    parser.add_argument("--sbcl", default=os.environ.get("CL_MCP_SBCL", "sbcl"))
    parser.add_argument("--slime-dir", default=os.environ.get("CL_MCP_SLIME_DIR"))
    # A bad CL_MCP_HEAP_SIZE has already stopped `cl-mcp` (cli.run_command).
    parser.add_argument("--heap-size", type=int, default=os.environ.get("CL_MCP_HEAP_SIZE") or None)
    args = parser.parse_args(argv)
    print(f"Python {sys.version.split()[0]} ({sys.executable})")
    essentials = [check_sbcl(args.sbcl), check_swank(args.slime_dir)]
    check_quicklisp()
    check_systems()
    if all(essentials):
        config = ImageConfig(sbcl=args.sbcl, slime_dir=args.slime_dir, heap_size=args.heap_size)
        if core := configured_core(config):
            # Starts wait a day before they build a failed core again;
            # doctor is asked to look now.
            forget_core_failure(core)
        essentials.append(check_image(config) and check_cache(config))
        if essentials[-1]:
            check_saved_core(config)
    if all(essentials):
        print("cl-mcp is ready.")
        return 0
    print("cl-mcp is not ready: fix what is marked FAIL (make run installs what is missing on Debian).")
    return 1
