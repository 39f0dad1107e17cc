"""The cache holds code every start runs (the saved core, the compiled
agent), so cl-mcp keeps it private and loads nothing from it that another
user could have written.

The planted core and fasl append to $CL_MCP_TEST_MARKER when SBCL starts
from or loads them: a marker file proves that cl-mcp ran them.  These tests
run as root here, so what they vary is mode bits, and owners via os.chown.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from cl_mcp.lisp.image import agent_parts, find_bootstrap
from cl_mcp.wire.sexp import dumps

CL_MCP = str(Path(sys.executable).parent / "cl-mcp")
CORE_PATHNAME = "(namestring sb-ext:*core-pathname*)"
MARK = ('(let ((marker (sb-ext:posix-getenv "CL_MCP_TEST_MARKER")))'
        '  (when marker'
        '    (with-open-file (s marker :direction :output :if-exists :append'
        '                              :if-does-not-exist :create)'
        '      (write-line "planted code ran" s))))')
ANOTHER_UID = 4242


def cl_mcp_eval(cache_home: Path, *args: str, umask: int = 0o022,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`cl-mcp eval` printing the core the image started from."""
    return subprocess.run(
        [CL_MCP, "eval", CORE_PATHNAME, *args], capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL, umask=umask,
        env={**os.environ, "XDG_CACHE_HOME": str(cache_home), **(env or {})})


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@dataclass(frozen=True)
class Planted:
    """Stand-ins, at the names cl-mcp uses, for the saved core and the fasl
of the agent's first part (the first code a start without a core loads)."""
    core: Path
    fasl: Path
    core_name: str
    fasl_name: str
    all_fasl_names: list[str]  # of every part, as a real start leaves them

    def plant(self, cache: Path) -> tuple[Path, Path]:
        core, fasl = cache / self.core_name, cache / self.fasl_name
        shutil.copyfile(self.core, core)
        shutil.copyfile(self.fasl, fasl)
        core.chmod(0o600)
        fasl.chmod(0o600)
        return core, fasl


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Planted:
    # The names come from a real start, with the cl-mcp under test.
    real = tmp_path_factory.mktemp("real-cache")
    assert cl_mcp_eval(real).returncode == 0
    [core_name] = [p.name for p in (real / "cl-mcp").glob("image-*.core")]
    all_fasl_names = sorted(p.name for p in (real / "cl-mcp").glob("agent-*.fasl"))
    [fasl_name] = [name for name in all_fasl_names if "-output-" in name]  # *agent-parts*' first
    where = tmp_path_factory.mktemp("planted")
    source, core, fasl = where / "plant.lisp", where / "planted.core", where / "planted.fasl"
    source.write_text(MARK + "\n")
    subprocess.run(
        ["sbcl", "--noinform", "--non-interactive", "--no-sysinit", "--no-userinit",
         "--eval", f"(compile-file {dumps(str(source))} :output-file {dumps(str(fasl))})",
         "--eval", f"(push (lambda () {MARK}) sb-ext:*init-hooks*)",
         "--eval", f"(sb-ext:save-lisp-and-die {dumps(str(core))})"],
        check=True, capture_output=True, timeout=120)
    # The marker is the proof the tests rely on: both do leave it.
    marker = where / "marker"
    subprocess.run(["sbcl", "--core", str(core), "--non-interactive", "--no-sysinit",
                    "--no-userinit", "--eval", f"(load {dumps(str(fasl))})"],
                   env={**os.environ, "CL_MCP_TEST_MARKER": str(marker)},
                   check=True, capture_output=True, timeout=60)
    assert marker.read_text() == "planted code ran\n" * 2
    return Planted(core, fasl, core_name, fasl_name, all_fasl_names)


def test_a_new_cache_directory_is_private_whatever_the_umask(tmp_path):
    cache_home = tmp_path / "xdg"
    cache = cache_home / "cl-mcp"
    first = cl_mcp_eval(cache_home, umask=0o002)
    assert first.returncode == 0, first.stderr
    [core] = cache.glob("image-*.core")
    assert first.stdout == f'=> "{core}"\n'
    assert (mode(cache_home), mode(cache)) == (0o700, 0o700)
    files = sorted(cache.glob("*"))
    assert [f.suffix for f in files] == [".fasl"] * len(agent_parts(find_bootstrap())) + [".core", ".lock", ""]
    assert files[-1].name.startswith("swank-") and mode(files[-1]) == 0o700  # Swank's compiled files
    assert all(mode(f) & 0o022 == 0 for f in files), [oct(mode(f)) for f in files]
    # What cl-mcp wrote passes its own check; so does a directory of mode
    # 0755, as earlier versions made it: others may read, not write.
    cache.chmod(0o755)
    again = cl_mcp_eval(cache_home, umask=0o002)
    assert again.stdout == f'=> "{core}"\n'
    assert "ERROR" not in again.stderr


def test_a_cache_directory_others_can_write_runs_nothing(planted, tmp_path):
    cache = tmp_path / "cl-mcp"
    cache.mkdir()
    core, fasl = planted.plant(cache)
    cache.chmod(0o777)
    marker, temp = tmp_path / "marker", tmp_path / "tmp"
    temp.mkdir()
    out = cl_mcp_eval(tmp_path, env={"CL_MCP_TEST_MARKER": str(marker), "TMPDIR": str(temp)})
    assert not marker.exists()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith('=> "') and str(core) not in out.stdout
    assert f"{cache} is writable by group or others" in out.stderr
    assert f"fix: chmod go-w {cache}" in out.stderr
    assert sorted(cache.iterdir()) == sorted([core, fasl])  # nothing written there either
    assert not list(temp.glob("cl-mcp-*"))  # the private directory is gone


def test_a_parent_others_can_write_is_refused_unless_sticky(planted, tmp_path):
    """Whoever can write the directory above could swap the cache for theirs."""
    cache_home = tmp_path / "xdg"
    cache = cache_home / "cl-mcp"
    cache.mkdir(parents=True)
    planted.plant(cache)
    cache_home.chmod(0o777)
    marker = tmp_path / "marker"
    out = cl_mcp_eval(cache_home, "--no-saved-core", env={"CL_MCP_TEST_MARKER": str(marker)})
    assert not marker.exists()
    assert out.returncode == 0, out.stderr
    assert f"fix: chmod go-w {cache_home}" in out.stderr
    # With the sticky bit (as /tmp) others cannot rename or remove the cache.
    cache_home.chmod(0o1777)
    for planted_file in cache.iterdir():
        planted_file.unlink()
    out = cl_mcp_eval(cache_home, "--no-saved-core")
    assert out.returncode == 0 and "ERROR" not in out.stderr, out.stderr
    names = sorted(f.name for f in cache.iterdir())
    assert names[:-1] == planted.all_fasl_names and names[-1].startswith("swank-"), names


def test_a_cache_reached_through_a_symlink_is_checked_where_it_points(planted, tmp_path):
    shared = tmp_path / "shared"
    cache = shared / "xdg" / "cl-mcp"
    cache.mkdir(parents=True)
    planted.plant(cache)
    shared.chmod(0o777)  # others could swap xdg/, which the link leads to
    (tmp_path / "link").symlink_to(shared / "xdg")
    marker = tmp_path / "marker"
    out = cl_mcp_eval(tmp_path / "link", env={"CL_MCP_TEST_MARKER": str(marker)})
    assert not marker.exists()
    assert out.returncode == 0, out.stderr
    assert f"fix: chmod go-w {shared}" in out.stderr


def make_unsafe(path: Path, fault: str) -> None:
    if fault == "another user's":
        if os.geteuid() != 0:
            pytest.fail("giving a file to another user needs root")
        os.chown(path, ANOTHER_UID, -1)
    else:
        path.chmod({"group-writable": 0o620, "world-writable": 0o602}[fault])


# Both kinds of file, each fault (one start each, compiling the agent: ~3 s).
@pytest.mark.parametrize("which, fault", [("core", "group-writable"), ("core", "another user's"),
                                          ("fasl", "world-writable"), ("fasl", "another user's")])
def test_a_cached_file_others_could_have_written_is_not_loaded(planted, tmp_path, which, fault):
    cache = tmp_path / "cl-mcp"
    cache.mkdir(mode=0o700)
    core, fasl = planted.plant(cache)
    if which == "fasl":
        core.unlink()  # and --no-saved-core below: the fasl is what would load
    unsafe = {"core": core, "fasl": fasl}[which]
    make_unsafe(unsafe, fault)
    marker = tmp_path / "marker"
    args = ["--no-saved-core"] if which == "fasl" else []
    out = cl_mcp_eval(tmp_path, *args, env={"CL_MCP_TEST_MARKER": str(marker)})
    assert not marker.exists()
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith('=> "') and str(core) not in out.stdout
    expected = (f"{unsafe} belongs to uid {ANOTHER_UID}" if fault == "another user's"
                else f"fix: chmod go-w {unsafe}")
    assert expected in out.stderr
    assert unsafe.exists()  # refused, not silently replaced


def test_doctor_names_an_unsafe_cache_and_the_fix(tmp_path):
    cache = tmp_path / "cl-mcp"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    out = subprocess.run([CL_MCP, "doctor"], capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL,
                         env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert out.returncode == 1
    assert f"[FAIL] cache: {cache} is writable by group or others" in out.stdout
    assert f"fix: chmod go-w {cache}" in out.stdout
