"""Settings for the whole suite."""

from hypothesis import settings

# Hypothesis fails an example that takes over 200 ms, and CI machines stall
# that long now and then; the property tests check behaviour, not speed
# (bench/ measures speed).
settings.register_profile("cl-mcp", deadline=None)
settings.load_profile("cl-mcp")
