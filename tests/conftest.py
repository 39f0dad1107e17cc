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
    """Give this run's cl-mcp starts a cache of their own (XDG_CACHE_HOME,
    which every child inherits): what the tests build, or cut short, never
    marks the user's ~/.cache/cl-mcp."""
    config.cl_mcp_cache = tempfile.mkdtemp(prefix="cl-mcp-tests-cache-")
    os.environ["XDG_CACHE_HOME"] = config.cl_mcp_cache


def pytest_unconfigure(config) -> None:
    shutil.rmtree(getattr(config, "cl_mcp_cache", ""), ignore_errors=True)
