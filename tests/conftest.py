"""Settings for the whole suite."""

import os
import shutil
import tempfile

from hypothesis import settings

# Hypothesis fails an example that takes over 200 ms, and CI machines stall
# that long now and then; the property tests check behaviour, not speed
# (bench/ measures speed).
settings.register_profile("cl-mcp", deadline=None)
settings.load_profile("cl-mcp")


def pytest_configure(config) -> None:
    """Give this process's cl-mcp starts a cache of their own (XDG_CACHE_HOME,
    which every child inherits): what the tests build, or cut short, never
    marks the user's ~/.cache/cl-mcp, nor another xdist worker's (each
    worker runs this hook itself)."""
    config.cl_mcp_cache = tempfile.mkdtemp(prefix="cl-mcp-tests-cache-")
    os.environ["XDG_CACHE_HOME"] = config.cl_mcp_cache


def pytest_unconfigure(config) -> None:
    shutil.rmtree(getattr(config, "cl_mcp_cache", ""), ignore_errors=True)


# The files that take longest, measured with 4 workers (seconds of wall
# time, whole file): started first, so that none of them is left running
# alone at the end while the other workers have nothing to do.
LONGEST_FIRST = (
    "tests/integration/test_truth.py",  # 272
    "tests/integration/test_image.py",  # 150
    "tests/integration/test_run_tests.py",  # 135
    "tests/integration/test_cache_security.py",  # 135
    "tests/integration/test_background.py",  # 130
    "tests/integration/test_truth_tests.py",  # 116
    "tests/integration/test_edit_form.py",  # 101
    "tests/integration/test_places_after_edits.py",  # 90
    "tests/integration/test_notes_sized.py",  # 76
    "tests/integration/test_profile_isolation.py",  # 58
    "tests/integration/test_attach.py",  # 55
    "tests/integration/test_run_tests_places.py",  # 48
)


def pytest_collection_modifyitems(items) -> None:
    """The longest files first, each file's tests in their own order."""
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))
