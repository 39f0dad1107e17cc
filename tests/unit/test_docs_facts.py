"""What the docs say of the code's shape, read from the code (issue 49,
item 8): the agent's parts, the modules architecture.md's table names, the
number of tools in interop.md's sample run. Each drifted once unseen."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def agent_parts() -> list[str]:
    """`*agent-parts*` of swank-bootstrap.lisp, in order."""
    text = (ROOT / "swank-bootstrap.lisp").read_text(encoding="utf-8")
    block = text[text.index("(defparameter *agent-parts*"):]
    block = block[:block.index("))")]
    return re.findall(r'"([a-z-]+)"', block)


def test_architecture_lists_the_agents_parts_in_their_order():
    listed = re.search(r"the agent's parts, one concern each \(([^)]*)\)", ARCHITECTURE)
    assert listed, "architecture.md's image-side row"
    assert re.findall(r"`([a-z-]+)`", listed.group(1)) == agent_parts()
    assert sorted(agent_parts()) == sorted(path.stem for path in (ROOT / "agent").glob("*.lisp"))


def table_modules() -> set[str]:
    """The cl_mcp/ modules architecture.md's table of modules names (its
    `tools/` row stands for every tool module, by `*.py`)."""
    table = ARCHITECTURE[ARCHITECTURE.index("## Modules"):]
    table = table[:table.index("\n\n", table.index("| folder |"))]
    modules, folder = set(), ""
    for row in table.splitlines():
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if len(cells) < 2 or not cells[0] and not cells[1].startswith("`"):
            continue
        if cells[0].startswith("`"):
            folder = cells[0].strip("`")
            if folder.endswith(".py"):
                modules.add(folder)
                continue
        if cells[1].startswith("`") and cells[1].endswith(".py`") and folder.endswith("/") and "*" not in cells[1]:
            modules.add(folder + cells[1].strip("`"))
    return modules


def test_architecture_names_every_module_and_only_modules_that_exist():
    existing = {str(path.relative_to(ROOT / "cl_mcp")) for path in (ROOT / "cl_mcp").rglob("*.py")
                if path.name not in ("__init__.py", "__main__.py") and path.parent.name != "tools"}
    assert table_modules() == existing


def test_interops_sample_run_has_the_tools_there_are():
    tools = len(json.loads((ROOT / "cl_mcp" / "schemas" / "tools.json").read_text(encoding="utf-8")))
    sample = (ROOT / "docs" / "interop.md").read_text(encoding="utf-8")
    assert re.findall(r"tools/list: (\d+) tools, (\d+) with outputSchema, (\d+) with annotations", sample) == [
        (str(tools),) * 3]
