"""What a session is configured with: the image's settings, the session's,
and the address to attach to, as the command line gives them.  Kept apart
from the modules that use them (image.py, link.py, session.py) so that the
command line and the server can be set up, and initialize answered, before
those are loaded."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


# The image's heap (SBCL's dynamic space), in MiB.  By default a quarter of
# the memory this machine (or its cgroup) has, at most 8 GiB, as the JVM
# sizes its default heap; never less than the 1 GiB SBCL itself starts with.
HEAP_SIZE_RANGE = (256, 1_048_576)
HEAP_SIZE_CAP = 8192
HEAP_SIZE_FLOOR = 1024
CGROUP_MEMORY_LIMIT = "/sys/fs/cgroup/memory.max"


def physical_memory() -> int:
    """The bytes of memory this process may use: the machine's, or its
    cgroup's limit when that is lower (a container's)."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open(CGROUP_MEMORY_LIMIT, encoding="ascii") as cgroup:
            limit = cgroup.read().strip()
    except OSError:
        return memory
    return min(memory, int(limit)) if limit.isdigit() else memory


def default_heap_size(memory: int) -> int:
    """The heap, in MiB, for a machine with MEMORY bytes."""
    return max(HEAP_SIZE_FLOOR, min(HEAP_SIZE_CAP, memory // 4 // 2**20))


@dataclass(frozen=True, slots=True)
class ImageConfig:
    sbcl: str = "sbcl"
    slime_dir: str | None = None
    startup_timeout: float = 120.0
    saved_core: bool = True  # start from a cached core with Swank and the agent
    # A build of the core may outlast a start (a busy machine): the start
    # goes on from fasls and the build goes on for the next start.
    core_build_timeout: float = 600.0
    heap_size: int | None = None  # MiB; None: default_heap_size of this machine

    def heap_mib(self) -> int:
        return self.heap_size or default_heap_size(physical_memory())

    def runtime_options(self) -> list[str]:
        """SBCL's runtime options for the image (they precede the toplevel
        ones; a core saved without :save-runtime-options takes any size)."""
        return ["--dynamic-space-size", f"{self.heap_mib()}MB"]


@dataclass(frozen=True, slots=True)
class SessionConfig:
    image: ImageConfig = ImageConfig()
    connect: tuple[str, int] | None = None  # attach to this Swank instead
    eval_timeout: float = 30.0
    load_timeout: float = 300.0
    # Hosts give up on a call after about 60 s: an evaluation still running
    # after this long is answered "still running" and runs on in the
    # background, at most max_background at once.
    answer_within: float = 45.0
    max_background: int = 4
    # Characters the image captures of each stream of one evaluation: each
    # costs it 4 bytes of a 1 GB heap while the evaluation runs.
    max_output: int = 16_000_000
    max_result_chars: int = 20_000  # what one tool result may hold (hosts' budgets)
    keep_output: int = 64 * 1024 * 1024  # characters of output kept for read-output
    max_suspended: int = 8
    suspend_timeout: float = 600.0


def shared_port_file() -> Path:
    """Where emacs/cl-mcp.el's `cl-mcp-share` saves the port it opened for
    assistants, which a bare --connect reads."""
    return Path.home() / ".cl-mcp-port"


def saved_address() -> tuple[str, int]:
    """The loopback address `cl-mcp-share` saved; ValueError saying what to
    do when there is none."""
    path = shared_port_file()
    try:
        text = path.read_text().strip()
    except OSError:
        raise ValueError(f"--connect without a port reads {path}, which M-x cl-mcp-share "
                         "(emacs/cl-mcp.el) writes, and there is none: run it in Emacs, "
                         "or give the port (--connect 4005)") from None
    try:
        return parse_address(text)
    except ValueError:
        raise ValueError(f"{path} holds {text[:40]!r}, not a port: run M-x cl-mcp-share "
                         "again") from None


def parse_address(text: str) -> tuple[str, int]:
    """`[HOST:]PORT` as (host, port); the host defaults to 127.0.0.1."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a [HOST:]PORT address: {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)
