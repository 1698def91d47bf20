"""Test-wide settings: hypothesis runs derandomized, so every run checks the same examples;
`cluster` starts one small local Ray cluster per test module that asks for it."""

import logging

import pytest
from hypothesis import settings

settings.register_profile("rlgraph", derandomize=True, deadline=None)
settings.load_profile("rlgraph")


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the whole module (the runtime joins it)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=96 * 2**20,
                 logging_level=logging.WARNING, log_to_driver=False)
    yield
    if started:
        ray.shutdown()
