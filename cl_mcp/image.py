"""The SBCL image cl-mcp owns: spawn it with Swank and the agent, learn its
port, and make sure it never outlives cl-mcp.

Why a pipe on stdin: the image's main thread blocks reading it.  The first
line is the per-run Swank secret (so it never appears in argv or the
environment); after that, end of file means cl-mcp is gone, even if cl-mcp
was killed with SIGKILL, and the image exits at once.

The child's stdout and stderr are drained into cl-mcp's log (stderr), never
onto the MCP stdout.  It runs in a session of its own so that a Ctrl-C in
cl-mcp's terminal does not land in its debugger; cl-mcp stops it itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from cl_mcp import sexp
from cl_mcp.errors import ImageError

log = logging.getLogger("cl_mcp.image")

PORT_MARKER = b";; cl-mcp swank port "
SLIME_SEARCH_PATH = (
    Path("/usr/share/common-lisp/source/slime"),
    Path("/usr/local/share/common-lisp/source/slime"),
)


def find_bootstrap() -> Path:
    """The agent file: inside the installed package, or at the repository top."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "swank-bootstrap.lisp", here.parent / "swank-bootstrap.lisp"):
        if candidate.is_file():
            return candidate
    raise ImageError("swank-bootstrap.lisp is missing from the cl-mcp installation")


def find_slime_dir(explicit: str | None = None) -> Path:
    """The directory holding swank-loader.lisp."""
    candidates = [Path(explicit)] if explicit else list(SLIME_SEARCH_PATH)
    for directory in candidates:
        if (directory / "swank-loader.lisp").is_file():
            return directory
    where = explicit or ", ".join(str(p) for p in SLIME_SEARCH_PATH)
    raise ImageError(
        f"Swank sources not found (looked in {where}); install Debian's cl-swank "
        "or pass --slime-dir / set CL_MCP_SLIME_DIR"
    )


@dataclass(frozen=True, slots=True)
class ImageConfig:
    sbcl: str = "sbcl"
    slime_dir: str | None = None
    startup_timeout: float = 120.0


def _lisp_string(text: str) -> str:
    return sexp.dumps(text)


def agent_fasl(bootstrap: Path) -> Path:
    """Where the compiled agent is cached: keyed by the source's hash, so an
    edited agent is recompiled (the SBCL version is added on the Lisp side)."""
    digest = hashlib.sha256(bootstrap.read_bytes()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "cl-mcp" / f"agent-{digest}"


STALE_FASL_SECONDS = 30 * 86400


def remove_stale_fasls(current: Path) -> None:
    """Delete compiled agents of other versions of the agent file that have
    not been used for a month.  (Recent ones may belong to another cl-mcp
    installation of this user, running now.)"""
    now = time.time()
    for old in current.parent.glob("agent-*.fasl"):
        if old.name.startswith(current.name + "-"):
            continue
        try:
            if now - old.stat().st_atime > STALE_FASL_SECONDS:
                old.unlink()
        except OSError:
            pass


def _load_compiled_form(bootstrap: Path) -> str:
    """Compile the agent once per version (one compilation unit, so its
    forward references are fine), then load the fasl.  It is compiled to a
    name of its own and renamed, so two images starting at once never load
    a half-written file."""
    source = _lisp_string(str(bootstrap))
    stem = _lisp_string(str(agent_fasl(bootstrap)))
    return (
        f"(let* ((fasl (format nil \"~A-~A.fasl\" {stem} (lisp-implementation-version)))"
        "        (temp (format nil \"~A.~D.tmp\" fasl (sb-posix:getpid))))"
        "  (unless (probe-file fasl)"
        "    (ensure-directories-exist fasl)"
        f"    (compile-file {source} :output-file temp)"
        "    (rename-file temp fasl))"
        "  (load fasl))"
    )


def startup_forms(slime_dir: Path, bootstrap: Path) -> list[str]:
    """The --eval forms that turn a bare SBCL into cl-mcp's image."""
    return [
        "(require :asdf)",
        f"(load {_lisp_string(str(slime_dir / 'swank-loader.lisp'))})",
        "(swank-loader:init :setup nil :quiet t)",
        _load_compiled_form(bootstrap),
        "(cl-mcp-agent:prepare-embedded-image (read-line *standard-input*))",
        # :dont-close nil: the listener closes after cl-mcp's one connection.
        '(format t "~&;; cl-mcp swank port ~D~%" (swank:create-server :port 0'
        ' :interface "127.0.0.1" :style :spawn :dont-close nil))',
        "(finish-output)",
        "(loop (unless (read-char *standard-input* nil nil) (sb-ext:exit :abort t)))",
    ]


class LispImage:
    """One running SBCL child.  `start` returns once Swank listens."""

    def __init__(self, config: ImageConfig) -> None:
        self._config = config
        self._process: asyncio.subprocess.Process | None = None
        self._drains: list[asyncio.Task[None]] = []
        self.port: int | None = None
        self.secret = secrets.token_hex(24)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process else None

    async def start(self) -> int:
        """Spawn SBCL and return the Swank port once it listens."""
        sbcl = shutil.which(self._config.sbcl)
        if sbcl is None:
            raise ImageError(
                f"SBCL not found ({self._config.sbcl!r} is not on PATH); "
                "install it (apt-get install sbcl) or pass --sbcl"
            )
        slime_dir = find_slime_dir(self._config.slime_dir)
        remove_stale_fasls(agent_fasl(find_bootstrap()))
        argv = [
            sbcl, "--noinform", "--disable-ldb",
            "--end-runtime-options",
            "--no-sysinit", "--no-userinit", "--disable-debugger",
        ]
        for form in startup_forms(slime_dir, find_bootstrap()):
            argv += ["--eval", form]
        self._process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        log.info("started SBCL (pid %s)", self._process.pid)
        assert self._process.stdin and self._process.stdout and self._process.stderr
        self._process.stdin.write(self.secret.encode("ascii") + b"\n")
        self._drains.append(asyncio.create_task(self._drain(self._process.stderr, "stderr")))
        try:
            self.port = await asyncio.wait_for(
                self._read_port(self._process.stdout), self._config.startup_timeout
            )
        except (asyncio.TimeoutError, ImageError) as error:
            await self.stop()
            raise ImageError(f"SBCL did not start Swank: {error or 'timed out'}") from None
        self._drains.append(asyncio.create_task(self._drain(self._process.stdout, "stdout")))
        return self.port

    async def _read_port(self, stream: asyncio.StreamReader) -> int:
        while True:
            line = await stream.readline()
            if not line:
                await self._process.wait()  # type: ignore[union-attr]
                raise ImageError(f"SBCL exited with code {self.returncode} (see the log above)")
            if line.startswith(PORT_MARKER):
                return int(line[len(PORT_MARKER):].strip())
            log.info("lisp stdout: %s", line.decode("utf-8", "replace").rstrip())

    async def _drain(self, stream: asyncio.StreamReader, name: str) -> None:
        """Copy the child's output into the log, line by line."""
        while True:
            try:
                line = await stream.readline()
            except ValueError:  # a line longer than the stream limit
                line = await stream.read(65536)
            if not line:
                return
            log.info("lisp %s: %s", name, line.decode("utf-8", "replace").rstrip())

    async def stop(self, grace: float = 2.0) -> None:
        """Stop the image: close its stdin (it exits by itself), then kill it."""
        process = self._process
        if process is None:
            return
        if process.returncode is None:
            if process.stdin is not None:
                process.stdin.close()
            try:
                await asyncio.wait_for(process.wait(), grace)
            except asyncio.TimeoutError:
                log.warning("SBCL (pid %s) did not exit; killing it", process.pid)
                process.kill()
                await process.wait()
        for task in self._drains:
            task.cancel()
        self._drains.clear()

    def kill_now(self) -> None:
        """Kill the process without waiting (last resort at exit)."""
        if self._process is not None and self._process.returncode is None:
            try:
                os.killpg(self._process.pid, 9)
            except ProcessLookupError:
                pass
