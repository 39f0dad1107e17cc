"""The suite never touches the user's cl-mcp cache."""

import os
import tempfile
from pathlib import Path

from cl_mcp.lisp.image import cache_dir


def test_the_suite_keeps_a_cache_of_its_own():
    """tests/conftest.py points XDG_CACHE_HOME at a directory of this run's
    own, so a core build the tests time out never marks the user's cache."""
    cache = Path(os.environ["XDG_CACHE_HOME"])
    assert cache.parent == Path(tempfile.gettempdir()) and cache.name.startswith("cl-mcp-tests-cache-")
    assert cache_dir() == cache / "cl-mcp"
