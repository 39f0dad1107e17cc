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
import fcntl
import hashlib
import logging
import os
import secrets
import shlex
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path

from cl_mcp.errors import ImageError
from cl_mcp.lisp.config import ImageConfig
from cl_mcp.wire import sexp

log = logging.getLogger("cl_mcp.image")

PORT_MARKER = b";; cl-mcp swank port "
SLIME_SEARCH_PATH = (
    Path("/usr/share/common-lisp/source/slime"),
    Path("/usr/local/share/common-lisp/source/slime"),
)


def find_bootstrap() -> Path:
    """The agent file: inside the installed package, or at the repository top."""
    package = Path(__file__).resolve().parents[1]  # cl_mcp/, above cl_mcp/lisp/
    for candidate in (package / "swank-bootstrap.lisp", package.parent / "swank-bootstrap.lisp"):
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


def _lisp_string(text: str) -> str:
    return sexp.dumps(text)


def cache_dir() -> Path:
    """Where the compiled agent and the saved core are kept (not created here)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cl-mcp"


def agent_parts(bootstrap: Path) -> list[Path]:
    """The agent's parts, agent/*.lisp beside BOOTSTRAP, which loads them
    in the order its `*agent-parts*' gives."""
    return sorted((bootstrap.parent / "agent").glob("*.lisp"))


def agent_digest(bootstrap: Path) -> str:
    """The SHA-256 of the whole agent: BOOTSTRAP and every part, by name."""
    digest = hashlib.sha256(bootstrap.read_bytes())
    for part in agent_parts(bootstrap):
        digest.update(f"\0{part.name}\0".encode())
        digest.update(part.read_bytes())
    return digest.hexdigest()


def agent_fasl(bootstrap: Path, directory: Path) -> Path:
    """The stem of the compiled agent's files in DIRECTORY: keyed by the
    agent's hash, so an edited agent is recompiled (the part's name, the
    SBCL version and `.fasl` are added on the Lisp side)."""
    return directory / f"agent-{agent_digest(bootstrap)[:16]}"


def cached_code(bootstrap: Path, directory: Path, core: Path | None) -> list[Path]:
    """The files of DIRECTORY a start may load: the saved core, the compiled
    agent (one per SBCL version) and the directories of Swank's compiled
    files (`swank_fasl_dir`, made mode 0700), those that exist."""
    stem = agent_fasl(bootstrap, directory)
    fasls = sorted(directory.glob(f"{stem.name}-*.fasl"))
    swank = sorted(path for path in directory.glob("swank-*") if not path.name.endswith(".tmp"))
    return [*([core] if core is not None and core.exists() else []), *fasls, *swank]


# Every start runs code from the cache, so whoever can write there, or
# replace the directory, can run code as this user.
PRIVATE_DIR_MODE = 0o700  # the XDG base directory spec's mode
WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def make_private_dirs(directory: Path) -> None:
    """Create DIRECTORY, and any missing directory above it, with mode 0700.
    One that exists already keeps its mode (0755 is fine: reading is harmless)."""
    missing: list[Path] = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, PRIVATE_DIR_MODE)
        except FileExistsError:  # made by a concurrent start: checked like any other
            continue
        os.chmod(path, PRIVATE_DIR_MODE)  # mkdir's mode went through the umask


def _directories_above(directory: Path) -> list[Path]:
    """Every directory whose owner could replace DIRECTORY, from / down: the
    chain as spelled (that covers the directories holding symlinks) and with
    symlinks resolved (that covers where they point)."""
    spelled = Path(os.path.abspath(directory))
    return list(dict.fromkeys([*reversed(spelled.parents), *reversed(spelled.resolve().parents)]))


def _ownership_problem(path: Path, owners: tuple[int, ...], shared_ok: bool, fix: str) -> str | None:
    """Why another user could change PATH (following symlinks), or None.
    SHARED_OK: group and others may write a directory with the sticky bit
    (as /tmp), which keeps them from renaming or removing what is not theirs."""
    info = path.stat()
    if info.st_uid not in owners:
        return (f"{path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}), "
                f"who could plant code there that cl-mcp runs; fix: {fix}")
    if info.st_mode & WRITABLE_BY_OTHERS and not (shared_ok and info.st_mode & stat.S_ISVTX):
        return (f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}), "
                f"who could plant code there that cl-mcp runs; fix: chmod go-w {shlex.quote(str(path))}")
    return None


def cache_problem(directory: Path, loaded: list[Path]) -> str | None:
    """Why cl-mcp must not keep or load code in DIRECTORY, or None.  It
    creates DIRECTORY first when missing (mode 0700).  DIRECTORY and the
    LOADED files in it must be the user's and writable by nobody else; every
    directory above must be the user's or root's, and not writable by group
    or others unless sticky."""
    try:
        make_private_dirs(directory)
        for parent in _directories_above(directory):
            if problem := _ownership_problem(
                    parent, owners=(os.geteuid(), 0), shared_ok=True,
                    fix=f"chown {os.geteuid()} {shlex.quote(str(parent))}"):
                return problem
        for path in (directory, *loaded):
            if problem := _ownership_problem(
                    path, owners=(os.geteuid(),), shared_ok=False,
                    fix=f"remove it (rm -r {shlex.quote(str(path))}); cl-mcp makes a new one"):
                return problem
    except OSError as error:
        return f"cannot use {error.filename or directory}: {error.strerror or error}"
    return None


def _runtime_lines(sbcl: str, slime_dir: Path) -> bytes:
    """The path, size and mtime of the SBCL binary and of every Swank
    source, a line each: what Swank's compiled files depend on."""
    lines = []
    for path in [Path(sbcl).resolve(), *sorted(slime_dir.glob("*.lisp")),
                 *sorted(slime_dir.glob("swank/*.lisp"))]:
        info = path.stat()
        lines.append(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\n")
    return "".join(lines).encode()


def saved_core(sbcl: str, slime_dir: Path, bootstrap: Path) -> Path:
    """Where the saved core with Swank and the agent loaded is cached.  Its
    name is a hash of the agent's text and of `_runtime_lines`, so a new
    agent, an upgraded SBCL or another Swank gets a core of its own."""
    digest = hashlib.sha256(agent_digest(bootstrap).encode())
    digest.update(_runtime_lines(sbcl, slime_dir))
    return cache_dir() / f"image-{digest.hexdigest()[:16]}.core"


def swank_fasl_dir(sbcl: str, slime_dir: Path, directory: Path) -> Path:
    """Where Swank's compiled files for this SBCL and Swank are kept in
    DIRECTORY: a directory that only ever appears whole (`loading_forms`).
    Swank's loader compiles in place into ASDF's cache, so an SBCL killed
    while it compiled (a host closing cl-mcp during its first start) left a
    half-written file there, which every later start loaded and died on."""
    return directory / f"swank-{hashlib.sha256(_runtime_lines(sbcl, slime_dir)).hexdigest()[:16]}"


STALE_FASL_SECONDS = 30 * 86400
STALE_CORE_SECONDS = 86400  # a core is ~50 MB: others go once unused for a day
# A core that could not be built, or would not start, is not tried again for
# a while: each try costs a build on every start.
CORE_RETRY_SECONDS = 86400


def remove_stale_caches(fasl: Path, core: Path | None) -> None:
    """Delete compiled agents and saved cores of other versions that have
    not been used for a while, and the core files and Swank directories a
    build or a start left half-written.
    (Recent ones may belong to another cl-mcp installation of this user,
    running now.)"""
    now = time.time()
    for pattern, current, limit in (("agent-*.fasl", fasl.name + "-", STALE_FASL_SECONDS),
                                    ("image-*.core", core.name if core else None, STALE_CORE_SECONDS),
                                    ("image-*.core.*.tmp", None, 3600),
                                    ("swank-*.*.tmp", None, 3600),
                                    ("image-*.core.lock", core.name if core else None, 3600),
                                    ("image-*.core.failed", core.name if core else None,
                                     CORE_RETRY_SECONDS)):
        for old in fasl.parent.glob(pattern):
            if current and old.name.startswith(current):
                continue
            try:
                if now - max(old.stat().st_atime, old.stat().st_mtime) > limit:
                    if old.is_dir():  # Swank, compiled by an SBCL that was killed
                        shutil.rmtree(old, ignore_errors=True)
                    else:
                        old.unlink()
            except OSError:
                pass


def _load_agent_forms(bootstrap: Path, directory: Path) -> list[str]:
    """Load the agent's entry file, then its parts, each compiled once per
    version into DIRECTORY (made and checked by Python)."""
    parts = _lisp_string(f"{bootstrap.parent / 'agent'}/")
    stem = _lisp_string(str(agent_fasl(bootstrap, directory)))
    return [f"(load {_lisp_string(str(bootstrap))})",
            f"(cl-mcp-agent::load-parts {parts} {stem})"]


def loading_forms(sbcl: str, slime_dir: Path, bootstrap: Path, fasl_dir: Path) -> list[str]:
    """The --eval forms that load Swank and the agent (both compiled into
    FASL_DIR) into a bare SBCL.  Swank's loader puts its files where ASDF's
    output translations say: for the load, they say its directory
    (`swank_fasl_dir`) or, when that is not there yet, one of this SBCL's
    own, renamed into place once Swank has loaded from it."""
    swank = _lisp_string(str(swank_fasl_dir(sbcl, slime_dir, fasl_dir)))
    sources = _lisp_string(f"{slime_dir}/")
    return [
        "(require :asdf)",
        "(require :sb-posix)",
        f"(load {_lisp_string(str(slime_dir / 'swank-loader.lisp'))})",
        f"(let* ((ready (probe-file (concatenate 'string {swank} \"/\")))"
        f" (into (if ready {swank} (format nil \"~A.~D.tmp\" {swank} (sb-posix:getpid)))))"
        # Made private before Swank's loader makes anything inside it.
        " (unless ready (sb-posix:mkdir into #o700))"
        " (asdf:initialize-output-translations"
        f" (list :output-translations (list {sources} (concatenate 'string into \"/\"))"
        " :inherit-configuration))"
        " (unwind-protect (swank-loader:init :setup nil :quiet t)"
        " (asdf:clear-output-translations))"
        f" (unless ready (ignore-errors (sb-posix:rename into {swank}))))",
        *_load_agent_forms(bootstrap, fasl_dir),
    ]


def core_building_forms(sbcl: str, slime_dir: Path, bootstrap: Path, output: Path) -> list[str]:
    """The --eval forms that load Swank and the agent and save the image
    at OUTPUT (the agent's fasl is kept beside it)."""
    return [*loading_forms(sbcl, slime_dir, bootstrap, output.parent),
            # UIOP's hooks for saved images: forget what belongs to this
            # machine state (ASDF's source registry and output translations,
            # the user cache) so that each start computes it afresh.
            "(uiop:call-image-dump-hook)",
            f"(sb-ext:save-lisp-and-die {_lisp_string(str(output))})"]


def restoring_forms() -> list[str]:
    """The --eval forms that bring a saved core up to date with this start's
    environment (CL_SOURCE_REGISTRY, HOME, ...) before anything else runs."""
    return ["(uiop:call-image-restore-hook)", "(asdf:clear-configuration)"]


def serving_forms() -> list[str]:
    """The --eval forms that start Swank in an image with the agent loaded."""
    return [
        "(cl-mcp-agent:prepare-embedded-image (read-line *standard-input*))",
        # A loopback listener that only cl-mcp can take (see the agent's
        # `accept-cl-mcp`), closed once cl-mcp has connected.
        '(format t "~&;; cl-mcp swank port ~D~%" (cl-mcp-agent:serve-cl-mcp))',
        "(finish-output)",
        "(loop (unless (read-char *standard-input* nil nil) (sb-ext:exit :abort t)))",
    ]


def sbcl_command(runtime: list[str], forms: list[str]) -> list[str]:
    """SBCL (RUNTIME: the executable and runtime options) without init files
    or debugger, evaluating FORMS in order."""
    argv = [*runtime, "--noinform", "--disable-ldb", "--end-runtime-options",
            "--no-sysinit", "--no-userinit", "--disable-debugger"]
    for form in forms:
        argv += ["--eval", form]
    return argv


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
        """Spawn SBCL and return the Swank port once it listens.

        With a saved core (the default) the image starts in a few tens of
        milliseconds instead of a few hundred.  When there is none yet, it
        is built first (about as long as a start from fasls, once); when it
        cannot be built or will not start, or its build outlasts the start
        (`_await_core`), the image starts from fasls.  A
        cache others could have written is not used at all (`cache_problem`)."""
        sbcl = shutil.which(self._config.sbcl)
        if sbcl is None:
            raise ImageError(
                f"SBCL not found ({self._config.sbcl!r} is not on PATH); "
                "install it (apt-get install sbcl) or pass --sbcl"
            )
        slime_dir = find_slime_dir(self._config.slime_dir)
        bootstrap = find_bootstrap()
        cache = cache_dir()
        core = saved_core(sbcl, slime_dir, bootstrap) if self._config.saved_core else None
        problem = cache_problem(cache, cached_code(bootstrap, cache, core))
        if problem is not None:
            # Not a failed start: an MCP host often shows no more than that
            # the server died, and the user would lose the REPL over a cache.
            # A working cl-mcp that runs nothing from the unsafe place, and
            # says at every start how to make it safe, is what users expect.
            log.error("%s; until then cl-mcp uses no saved core and compiles its agent "
                      "afresh at every start, in a private temporary directory", problem)
            return await self._start_from_private_fasl(sbcl, slime_dir, bootstrap)
        remove_stale_caches(agent_fasl(bootstrap, cache), core)
        if core is not None and not core.is_file() and not _failed_lately(core):
            await self._await_core(sbcl, slime_dir, bootstrap, core)
        refused = None
        if core is not None and core.is_file():
            try:
                return await self._spawn([sbcl, "--core", str(core)],
                                         restoring_forms() + serving_forms())
            except ImageError as error:
                log.warning("the saved core %s did not start (%s); starting from fasls", core, error)
                refused = (str(error), self.returncode)
        port = await self._spawn([sbcl], loading_forms(sbcl, slime_dir, bootstrap, cache) + serving_forms())
        if core is not None and refused is not None and _crashed(refused[1]):
            # The core's own fault only when SBCL gave up on it and fasls
            # start: an image killed as it started (a user's kill, the OOM
            # killer), or too slow on a busy machine, says nothing of the core.
            log.warning("SBCL starts from fasls but not from %s: removing the core", core)
            core.unlink(missing_ok=True)
            _note_failure(core, f"the saved core did not start: {refused[0]}")
        return port

    async def _await_core(self, sbcl: str, slime_dir: Path, bootstrap: Path, core: Path) -> None:
        """Build CORE and wait for it as long as a start may take.  A build
        still running then (a busy machine) goes on, within a timeout of its
        own, for the next start; this one starts from fasls, and so does a
        start while it runs (a reset), without waiting again."""
        if core in _builds:
            log.info("the core is still being saved; starting from fasls meanwhile")
            return
        build = asyncio.create_task(build_core(sbcl, slime_dir, bootstrap, core,
                                               self._config.core_build_timeout))
        _builds[core] = build
        build.add_done_callback(lambda _: _builds.pop(core, None))
        try:
            await asyncio.wait_for(asyncio.shield(build), self._config.startup_timeout)
        except asyncio.TimeoutError:
            log.info("the core is still being saved after %g s; starting from fasls meanwhile",
                     self._config.startup_timeout)

    async def _start_from_private_fasl(self, sbcl: str, slime_dir: Path, bootstrap: Path) -> int:
        """Start from an agent compiled into a fresh directory of mode 0700
        (mkdtemp's), removed once the image has loaded it (before it
        prints its port)."""
        with tempfile.TemporaryDirectory(prefix="cl-mcp-", ignore_cleanup_errors=True) as name:
            private = Path(name)
            if problem := cache_problem(private, []):
                raise ImageError(f"no private directory to compile the agent in: {problem}")
            return await self._spawn([sbcl], loading_forms(sbcl, slime_dir, bootstrap, private)
                                     + serving_forms())

    async def _spawn(self, runtime: list[str], forms: list[str]) -> int:
        """Start SBCL (RUNTIME: the executable and a core, if any) with the
        configured heap, evaluating FORMS."""
        self._process = await asyncio.create_subprocess_exec(
            *sbcl_command([*runtime, *self._config.runtime_options()], forms),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        log.info("started SBCL (pid %s) with a %d MiB heap", self._process.pid,
                 self._config.heap_mib())
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


# This process's core builds under way, by core: a start while one runs (a
# reset) neither builds again nor waits.
_builds: dict[Path, asyncio.Task[None]] = {}


async def build_core(sbcl: str, slime_dir: Path, bootstrap: Path, core: Path,
                     timeout: float) -> None:
    """Save a core with Swank and the agent loaded at CORE, in a directory
    `cache_problem` has made and passed.  It is written to a name of its own
    and renamed, so a concurrent start never sees half a core.  A failure is
    logged: the image then starts from fasls."""
    # Locked while it builds: a concurrent start does not build too.  The
    # lock goes with its holder however that ends, so a build that never
    # finished (cl-mcp was killed, as a host may kill a first start that
    # seems slow) is retried by the next start.  A build that fails is marked
    # failed and not retried at every start; one that runs out of time (a
    # busy machine) or whose builder was killed is not a failure.
    lock = _lock_build(core)
    if lock is None:
        log.info("another cl-mcp is saving the core at %s; starting from fasls", core)
        return
    try:
        if not core.is_file():  # saved by the build that held the lock before
            await _build_core(sbcl, slime_dir, bootstrap, core, timeout)
    finally:
        os.close(lock)


async def _build_core(sbcl: str, slime_dir: Path, bootstrap: Path, core: Path,
                      timeout: float) -> None:
    """`build_core`, holding the lock."""
    temp = core.with_name(f"{core.name}.{os.getpid()}.tmp")
    argv = sbcl_command([sbcl], core_building_forms(sbcl, slime_dir, bootstrap, temp))
    log.info("saving an SBCL core with Swank and the agent at %s (once)", core)
    started = time.monotonic()
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
    except OSError as error:
        _note_failure(core, f"could not run SBCL to save a core: {error}")
        log.warning("could not save a core (%s); starting from fasls", error)
        return
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout)
    except asyncio.TimeoutError:
        await _abandon_build(process, temp)
        log.warning("saving a core took over %g s; the next start tries again", timeout)
        return
    except asyncio.CancelledError:  # cl-mcp is stopping: the builder goes too
        await _abandon_build(process, temp)
        raise
    if process.returncode != 0 or not temp.is_file():
        tail = " / ".join(output.decode("utf-8", "replace").strip().splitlines()[-3:])
        log.warning("could not save a core (exit code %s): %s", process.returncode, tail)
        temp.unlink(missing_ok=True)
        if process.returncode == 0 or _crashed(process.returncode):  # not killed from outside
            _note_failure(core, f"saving a core failed (exit code {process.returncode}): {tail}")
        return
    temp.chmod(0o600)  # whatever the umask: the next start refuses a core others can write
    temp.replace(core)
    forget_core_failure(core)
    log.info("saved the core in %.1f s", time.monotonic() - started)


async def _abandon_build(process: asyncio.subprocess.Process, temp: Path) -> None:
    if process.returncode is None:
        process.kill()
        await process.wait()
    temp.unlink(missing_ok=True)


def _failure_marker(core: Path) -> Path:
    return core.with_name(core.name + ".failed")


def _note_failure(core: Path, reason: str) -> None:
    """Mark CORE failed, with REASON for `cl-mcp doctor` (the log that said
    it is gone with the start that wrote it)."""
    try:
        _failure_marker(core).write_text(reason + "\n")
    except OSError:
        pass


def core_failure(core: Path) -> str | None:
    """Why CORE was marked failed lately, if it was."""
    if not _failed_lately(core):
        return None
    try:
        return _failure_marker(core).read_text(errors="replace").strip() or "no reason recorded"
    except OSError:
        return None


def forget_core_failure(core: Path) -> None:
    """Let the next start build CORE again, whenever it was marked failed."""
    try:
        _failure_marker(core).unlink(missing_ok=True)
    except OSError:
        pass


# Signals by which SBCL itself dies (with --disable-ldb a fatal error exits
# with code 1); SIGKILL, SIGTERM and their like come from outside.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL, signal.SIGFPE})


def _crashed(returncode: int | None) -> bool:
    """Whether an SBCL that ended with RETURNCODE gave up by itself."""
    return returncode is not None and (returncode > 0 or -returncode in CRASH_SIGNALS)


def _lock_build(core: Path) -> int | None:
    """A descriptor of CORE's lock file, locked (flock) by this process for
    its build; None while another process holds it.  The kernel releases it
    when its holder exits, however it ends, and no pid is trusted."""
    path = core.with_name(core.name + ".lock")
    try:
        lock = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as error:
        log.warning("cannot lock %s (%s)", path, error.strerror)
        return None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        return None
    os.utime(lock)  # in use: not a leftover for remove_stale_caches
    return lock


def _failed_lately(core: Path) -> bool:
    try:
        return time.time() - _failure_marker(core).stat().st_mtime < CORE_RETRY_SECONDS
    except OSError:
        return False
