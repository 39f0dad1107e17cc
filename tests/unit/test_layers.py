"""The layout's one rule: cl_mcp's imports run only down the table of
folders in docs/architecture.md ("Folders"), and no module comes back to
itself through its imports.

Every import counts, also one inside a function or under TYPE_CHECKING,
and one made by importlib.import_module or __import__:
a lazy import still makes the module above depend on the one below.  The
rule is read from the table, so the table and the code cannot disagree."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cl_mcp"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SHARED = "every folder may import"  # the phrase of the table's row that all rows may import


def folder_rules() -> tuple[dict[str, set[str]], set[str]]:
    """From the table under "## Folders": each folder's (or top-level
    file's) name, as `cli/` or `errors.py`, and the names it may import;
    and the names every one may import."""
    section = ARCHITECTURE.read_text(encoding="utf-8").split("\n## Folders\n", 1)[1].split("\n## ", 1)[0]
    rules: dict[str, set[str]] = {}
    shared: set[str] = set()
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or not cells[0].startswith("`"):
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        for name in names:
            rules[name] = set(re.findall(r"`([^`]+)`", cells[2]))
        if SHARED in cells[2]:
            shared.update(names)
    assert rules, f"no table of folders under '## Folders' in {ARCHITECTURE}"
    return rules, shared


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def folder_of(path: Path) -> str:
    """The table's name for the folder or top-level file PATH belongs to."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] + "/" if len(parts) > 1 else parts[0]


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The cl_mcp modules that module NAME imports anywhere in its text."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, or level - 1 above it
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:  # a submodule by that name, else a name of the module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
        elif isinstance(node, ast.Call) and called_name(node.func) in DYNAMIC_IMPORTS:
            found.add(dynamic_import(name, node))
    return {each for each in found if each in known}


# importlib.import_module and __import__: an import made by a call.
DYNAMIC_IMPORTS = {"import_module", "__import__"}


def called_name(function: ast.expr) -> str | None:
    """The name a call calls: `f` of f(...) or of m.f(...)."""
    if isinstance(function, ast.Name):
        return function.id
    return function.attr if isinstance(function, ast.Attribute) else None


def dynamic_import(name: str, call: ast.Call) -> str:
    """The module CALL (an import_module or __import__ in module NAME)
    imports; a name computed at run time fails the check, which could not
    see where it points."""
    target = call.args[0] if call.args else None
    if not (isinstance(target, ast.Constant) and isinstance(target.value, str)):
        pytest.fail(f"{name} imports a module named at run time (line {call.lineno}): "
                    "the layer check cannot see it; name it with a string")
    if target.value.startswith(".") and len(call.args) > 1 and isinstance(call.args[1], ast.Constant):
        level = len(target.value) - len(target.value.lstrip("."))
        anchor = str(call.args[1].value).rsplit(".", level - 1)[0]
        return f"{anchor}.{target.value.lstrip('.')}"
    return target.value


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) - {name} for name, path in known.items()}


def upward_imports(graph: dict[str, set[str]], folders: dict[str, str],
                   rules: dict[str, set[str]], shared: set[str]) -> list[str]:
    """Each import from one module to another whose folder its own folder's
    row does not list (its own folder and the shared rows aside)."""
    return [f"{name} ({folders[name]}) imports {target} ({folders[target]})"
            for name, targets in sorted(graph.items()) for target in sorted(targets)
            if folders[target] not in rules.get(folders[name], set()) | shared | {folders[name]}]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A path of imports that comes back to where it started, if any."""
    state: dict[str, str] = {}  # "open" while on the path, "done" after
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = "open"
        path.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state and (cycle := visit(name)):
            return cycle
    return None


def test_every_module_has_a_row() -> None:
    rules, _ = folder_rules()
    missing = sorted({folder_of(path) for path in modules().values()} - set(rules))
    assert not missing, f"add these to the table of folders in docs/architecture.md: {missing}"


def test_imports_run_only_down() -> None:
    rules, shared = folder_rules()
    folders = {name: folder_of(path) for name, path in modules().items()}
    upward = upward_imports(import_graph(), folders, rules, shared)
    assert not upward, "imports that run up or across the table of folders:\n" + "\n".join(upward)


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or [])


def test_the_checks_catch_an_upward_import_and_a_cycle(tmp_path: Path) -> None:
    # A made-up package whose low module imports its high one, lazily.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "low.py").write_text("def late():\n    from pkg import high\n")
    (tmp_path / "pkg" / "high.py").write_text("from pkg.low import late\n")
    known = {"pkg.low": tmp_path / "pkg" / "low.py", "pkg.high": tmp_path / "pkg" / "high.py"}
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert graph == {"pkg.low": {"pkg.high"}, "pkg.high": {"pkg.low"}}
    folders = {"pkg.low": "low/", "pkg.high": "high/"}
    assert upward_imports(graph, folders, {"high/": {"low/"}, "low/": set()}, set()) == [
        "pkg.low (low/) imports pkg.high (high/)"]
    assert find_cycle(graph) == ["pkg.high", "pkg.low", "pkg.high"]


def test_the_checks_see_an_import_made_by_a_call(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "low.py").write_text(
        "import importlib\ndef late():\n    return importlib.import_module('pkg.high')\n")
    (tmp_path / "pkg" / "other.py").write_text("def late():\n    return __import__('pkg.high')\n")
    (tmp_path / "pkg" / "high.py").write_text("")
    known = {f"pkg.{each}": tmp_path / "pkg" / f"{each}.py" for each in ("low", "other", "high")}
    assert imports_of("pkg.low", known["pkg.low"], known) == {"pkg.high"}
    assert imports_of("pkg.other", known["pkg.other"], known) == {"pkg.high"}
    (tmp_path / "pkg" / "computed.py").write_text(
        "from importlib import import_module\ndef late(n):\n    return import_module('pkg.' + n)\n")
    with pytest.raises(pytest.fail.Exception, match="named at run time"):
        imports_of("pkg.computed", tmp_path / "pkg" / "computed.py", known)
