"""Test-wide settings: hypothesis runs derandomized, so every run checks the same examples."""

from hypothesis import settings

settings.register_profile("rlgraph", derandomize=True, deadline=None)
settings.load_profile("rlgraph")
