"""The image cl-mcp owns: it dies, cl-mcp carries on; cl-mcp goes, it goes."""

import asyncio
import dataclasses
import fcntl
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from cl_mcp.lisp.config import ImageConfig, default_heap_size, physical_memory
from cl_mcp.lisp.image import LispImage, find_bootstrap, find_slime_dir, make_private_dirs, saved_core
from tests.integration.conftest import (McpProcess, cl_mcp, listening_ports, pid_alive, processes_naming,
                                         sbcl_children)


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def image_pid(process):
    text, _ = process.eval("(sb-posix:getpid)")
    return int(text.removeprefix("=> "))


def test_image_exit_during_a_call_then_a_fresh_image(server):
    server.eval("(defvar *lost* :here)")
    text, is_error = server.eval("(sb-ext:exit :abort t)")
    assert is_error
    assert text.startswith("[ERROR] CL-MCP:IMAGE-LOST\n")
    assert server.eval("(+ 1 2)") == ("=> 3", False)
    text, is_error = server.eval("*lost*")
    assert is_error and "UNBOUND-VARIABLE" in text
    assert any("state was lost" in line for line in server.stderr_lines)


def test_image_killed_during_a_call(server, tmp_path):
    pid = image_pid(server)
    running = tmp_path / "running"
    code = f'(progn (with-open-file (s "{running}" :direction :output)) (sleep 30))'
    slow = server.start_request("tools/call", {"name": "evaluate-lisp", "arguments": {"code": code}})
    assert wait_for(running.exists)
    os.kill(pid, signal.SIGKILL)
    result = server.response(slow, timeout=10)["result"]
    assert result["isError"] is True
    assert result["content"][0]["text"].startswith("[ERROR] CL-MCP:IMAGE-LOST")
    assert server.eval("(* 6 7)") == ("=> 42", False)
    assert image_pid(server) != pid


def test_image_is_stopped_when_stdin_closes():
    process = McpProcess()
    process.initialize()
    pid = image_pid(process)
    slow = process.start_request("tools/call", {"name": "evaluate-lisp",
                                                "arguments": {"code": "(sleep 100)", "timeout": 2}})
    time.sleep(0.3)
    started = time.monotonic()
    assert process.close(timeout=20) == 0
    assert time.monotonic() - started < 50  # the running call's own deadline, not the 100 s
    assert not [line for line in process.stderr_lines if "did not exit" in line]  # SBCL quit, unkilled
    assert wait_for(lambda: not pid_alive(pid), 2)
    # A request read before stdin closed is answered, within its deadline.
    assert process.response(slow, timeout=1)["result"]["content"][0]["text"].startswith("[ERROR] SB-EXT:TIMEOUT")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signals_stop_cl_mcp_and_its_image(signum):
    process = McpProcess()
    process.initialize()
    pid = image_pid(process)
    process.proc.send_signal(signum)
    assert process.proc.wait(timeout=3) == 0
    assert wait_for(lambda: not pid_alive(pid), 2)


def test_image_exits_on_its_own_when_cl_mcp_is_killed():
    process = McpProcess()
    process.initialize()
    pid = image_pid(process)
    process.proc.kill()
    process.proc.wait()
    assert wait_for(lambda: not pid_alive(pid), 5)


def test_no_stray_sbcl_after_a_normal_session():
    process = McpProcess()
    process.initialize()
    process.eval("1")
    children = sbcl_children(process.proc.pid)
    assert len(children) == 1
    process.close()
    assert wait_for(lambda: not any(pid_alive(p) for p in children), 3)


def test_the_listener_closes_once_cl_mcp_has_connected(server):
    # The accepting thread sees that cl-mcp is in within *accept-poll-seconds*.
    pid = image_pid(server)
    deadline = time.monotonic() + 5
    while listening_ports(pid):
        assert time.monotonic() < deadline, "the listener stayed open"
        time.sleep(0.05)


def test_stdout_of_the_image_goes_to_the_log(server):
    # A user's thread's output is kept for the model (test_thread_news.py);
    # the image's own stdout, and its threads', go to the log.
    server.eval('(sb-thread:make-thread (lambda () (format sb-sys:*stdout* "from-a-thread~%") '
                '(finish-output sb-sys:*stdout*)))')
    assert wait_for(lambda: any("from-a-thread" in line for line in server.stderr_lines), 5)
    server.eval('(sb-thread:make-thread (lambda () (format t "from-its-own~%") (finish-output)) '
                ':name "cl-mcp test thread")')
    assert wait_for(lambda: any("from-its-own" in line for line in server.stderr_lines), 5)
    assert server.eval("(+ 1 1)") == ("=> 2", False)


def test_an_error_in_a_thread_of_cl_mcps_own_is_logged_and_harmless(server):
    # A user's thread stops at its error instead (test_thread_news.py).
    server.eval('(sb-thread:make-thread (lambda () (error "bg failure")) :name "cl-mcp test thread")')
    assert wait_for(lambda: any("bg failure" in line for line in server.stderr_lines), 5)
    assert server.eval("(+ 1 1)") == ("=> 2", False)


def test_a_call_after_the_image_died_between_calls_says_state_was_lost(server):
    server.eval("(defvar *gone* 1)")
    pid = image_pid(server)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not pid_alive(pid))
    time.sleep(0.5)  # for cl-mcp to see its image go
    text, is_error = server.eval("(+ 1 2)")
    assert not is_error
    assert text.startswith("=> 3\n\n; Evaluation 1\n\n[session]\nThe Lisp image had exited")
    assert server.eval("(+ 1 2)") == ("=> 3", False)  # said once


def image_command_line(process):
    return Path(f"/proc/{image_pid(process)}/cmdline").read_bytes().split(b"\0")


def test_the_image_starts_from_a_saved_core_built_on_first_use(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    with cl_mcp(env=env) as first:
        assert first.eval("(+ 1 2)") == ("=> 3", False)
        cores = list((tmp_path / "cl-mcp").glob("image-*.core"))
        assert len(cores) == 1
        assert str(cores[0]).encode() in image_command_line(first)
    with cl_mcp(env=env) as second:
        assert str(cores[0]).encode() in image_command_line(second)
        assert second.eval("(swank:connection-info)")[1] is False
        # reset-session starts a fresh image from the same core
        second.call("reset-session")
        assert str(cores[0]).encode() in image_command_line(second)


def test_a_start_killed_while_swank_compiles_leaves_nothing_half_written_behind(tmp_path):
    """Swank's loader writes its files in place: killed as the first of them
    appeared (a host closing cl-mcp during its first start), it left that
    file half-written, and every later start loaded it and died
    (END-OF-FILE in SB-FASL::FOP-LOAD-CODE)."""
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    first = McpProcess(env=env)
    try:
        first.initialize()
        assert wait_for(lambda: any("swank" in str(path) for path in tmp_path.rglob("*.fasl")), 60)
        first.proc.kill()
        first.proc.wait()
    finally:
        for pid in processes_naming(str(tmp_path)):  # its image and builder, in sessions of their own
            os.kill(pid, signal.SIGKILL)
        first.close()  # its pipes
    with cl_mcp(env=env) as second:
        assert second.eval("(+ 1 2)") == ("=> 3", False), "".join(second.stderr_lines[-40:])


def test_a_core_build_that_never_finished_is_tried_again(tmp_path):
    """A host may kill cl-mcp while its first start saves the core (a first
    start takes seconds): the next start builds it again and starts from it,
    rather than taking the unfinished build for a failed one and starting
    from fasls (300 ms slower) for a day."""
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    cache = tmp_path / "cl-mcp"
    first = McpProcess(env=env)
    try:
        first.initialize()
        assert wait_for(lambda: list(cache.glob("image-*.core.lock")), 30)
        first.proc.kill()
        first.proc.wait()
    finally:
        for pid in processes_naming(str(tmp_path)):  # its builder, in a session of its own
            os.kill(pid, signal.SIGKILL)
        first.close()  # its pipes
    assert not list(cache.glob("image-*.core"))
    with cl_mcp(env=env) as second:
        assert second.eval("(+ 1 2)") == ("=> 3", False), "".join(second.stderr_lines[-40:])
        core = next(cache.glob("image-*.core"))
        assert str(core).encode() in image_command_line(second)
    assert not list(cache.glob("image-*.core.failed"))


def test_a_build_is_kept_from_running_twice_by_a_lock_not_a_pid(tmp_path, monkeypatch):
    """A start while another holds the build's lock starts from fasls; a
    pid in a marker stops nothing (a `.building` marker naming any live
    process, a reused pid, used to stop core builds for ten minutes)."""
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    core = saved_core(shutil.which("sbcl"), find_slime_dir(), find_bootstrap())
    make_private_dirs(core.parent)
    core.with_name(core.name + ".building").write_text(str(os.getpid()))
    lock = os.open(core.with_name(core.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with cl_mcp(env=env) as process:
            assert b"--core" not in image_command_line(process)
            assert any("another cl-mcp is saving the core" in line for line in process.stderr_lines)
    finally:
        os.close(lock)
    with cl_mcp(env=env) as process:
        assert str(core).encode() in image_command_line(process)


def slow_sbcl(directory: Path, seconds: float) -> Path:
    """An `sbcl` that waits SECONDS before it saves a core (as on a busy
    machine) and runs anything else at once."""
    script = directory / "sbcl"
    script.write_text(f'#!/bin/sh\ncase "$*" in *save-lisp-and-die*) sleep {seconds};; esac\n'
                      f'exec {shutil.which("sbcl")} "$@"\n')
    script.chmod(0o755)
    return script


def test_a_core_build_that_outlasts_the_start_goes_on_for_the_next(tmp_path, monkeypatch):
    """A build slower than a start may wait (a busy machine) is no failure:
    the start goes on from fasls, the build within a timeout of its own, and
    the next start uses the core (it used to be cut at the start's limit
    and marked failed, so starts came from fasls for a day)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    config = ImageConfig(sbcl=str(slow_sbcl(tmp_path, 20)), startup_timeout=10)
    core = saved_core(config.sbcl, find_slime_dir(), find_bootstrap())

    async def body():
        # The fasls compiled (in the start's default time: a compilation on a
        # busy machine may outlast 10 s), so the starts below are quick.
        warm = LispImage(dataclasses.replace(config, saved_core=False,
                                             startup_timeout=ImageConfig().startup_timeout))
        await warm.start()
        await warm.stop()
        first = LispImage(config)
        await first.start()
        try:
            assert b"--core" not in Path(f"/proc/{first.pid}/cmdline").read_bytes()
            assert not core.with_name(core.name + ".failed").exists()
            meanwhile = LispImage(config)  # a reset while the build goes on: no second wait
            started = time.monotonic()
            await meanwhile.start()
            try:
                assert time.monotonic() - started < config.startup_timeout
                assert b"--core" not in Path(f"/proc/{meanwhile.pid}/cmdline").read_bytes()
            finally:
                await meanwhile.stop()
            deadline = time.monotonic() + 120
            while not core.is_file():
                assert time.monotonic() < deadline, "the core was never saved"
                await asyncio.sleep(0.2)
        finally:
            await first.stop()
        second = LispImage(config)
        await second.start()
        try:
            assert str(core).encode() in Path(f"/proc/{second.pid}/cmdline").read_bytes()
        finally:
            await second.stop()

    asyncio.run(body())


def test_a_core_that_will_not_start_is_replaced_by_fasls(tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    with cl_mcp(env=env) as first:
        first.eval("1")
    core = next((tmp_path / "cl-mcp").glob("image-*.core"))
    core.write_bytes(b"not a core")
    with cl_mcp(env=env) as process:
        assert process.eval("(+ 1 2)") == ("=> 3", False)
        assert b"--core" not in image_command_line(process)
        assert any("did not start" in line for line in process.stderr_lines)
    assert not core.exists()


def test_an_image_killed_as_it_starts_from_the_core_leaves_the_core_in_use(tmp_path, monkeypatch):
    """A kill from outside while the image starts (the user's, the OOM
    killer's) says nothing of the core: the start goes on from fasls, and
    the next start uses the core again (it was removed and marked failed,
    so every start came from fasls for a day)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    core = saved_core(shutil.which("sbcl"), find_slime_dir(), find_bootstrap())
    read_port = LispImage._read_port
    kills = []

    async def killed_once(self, stream):
        if not kills:
            kills.append(self.pid)
            os.kill(self.pid, signal.SIGKILL)
        return await read_port(self, stream)

    async def started_from(image: LispImage) -> bytes:
        await image.start()
        try:
            return Path(f"/proc/{image.pid}/cmdline").read_bytes()
        finally:
            await image.stop()

    async def body():
        assert str(core).encode() in await started_from(LispImage(ImageConfig()))  # built, then used
        monkeypatch.setattr(LispImage, "_read_port", killed_once)
        assert b"--core" not in await started_from(LispImage(ImageConfig()))
        assert kills and core.is_file() and not core.with_name(core.name + ".failed").exists()
        monkeypatch.setattr(LispImage, "_read_port", read_port)
        assert str(core).encode() in await started_from(LispImage(ImageConfig()))

    asyncio.run(body())


def test_no_saved_core_starts_from_fasls(tmp_path):
    with cl_mcp("--no-saved-core", env={"XDG_CACHE_HOME": str(tmp_path)}) as process:
        assert process.eval("(+ 1 2)") == ("=> 3", False)
        assert b"--core" not in image_command_line(process)
    assert not list((tmp_path / "cl-mcp").glob("image-*.core"))


def test_an_image_from_the_saved_core_sees_this_starts_asdf_configuration(tmp_path):
    """The core forgets ASDF's and UIOP's configuration when it is saved, so
    a system registered after the core was built is found."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    with cl_mcp(env=env) as first:
        first.eval("1")
    systems = tmp_path / "systems"
    systems.mkdir()
    (systems / "clmcp-late-system.asd").write_text('(asdf:defsystem "clmcp-late-system")\n')
    registry = f'(:source-registry (:directory "{systems}/") :inherit-configuration)'
    with cl_mcp(env={**env, "CL_SOURCE_REGISTRY": registry}) as process:
        assert b"--core" in image_command_line(process)
        text, is_error = process.eval('(not (null (asdf:find-system "clmcp-late-system" nil)))')
        assert (text, is_error) == ("=> T", False)


HEAP_MIB = "(ash (sb-ext:dynamic-space-size) -20)"


def runtime_options(process):
    """The image's runtime options: what comes before --end-runtime-options."""
    argv = image_command_line(process)
    return argv[:argv.index(b"--end-runtime-options")]


def test_the_default_heap_is_a_quarter_of_memory():
    with cl_mcp() as process:
        expected = default_heap_size(physical_memory())
        assert process.eval(HEAP_MIB) == (f"=> {expected}", False)
        assert f"{expected}MB".encode() in runtime_options(process)


@pytest.mark.parametrize("start", [(), ("--no-saved-core",)])
def test_heap_size_sets_the_heap_from_a_saved_core_or_fasls(start, tmp_path):
    """The saved core takes any size: the cache holds one core for all."""
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    for size in ("1280", "1536"):
        with cl_mcp("--heap-size", size, *start, env=env) as process:
            assert process.eval(HEAP_MIB) == (f"=> {size}", False)
            assert (b"--core" in runtime_options(process)) is not bool(start)
    assert len(list((tmp_path / "cl-mcp").glob("image-*.core"))) == (0 if start else 1)


def test_the_heap_size_variable_sets_the_heap():
    with cl_mcp(env={"CL_MCP_HEAP_SIZE": "1400"}) as process:
        assert process.eval(HEAP_MIB) == ("=> 1400", False)
