"""Test-wide settings: hypothesis runs derandomized, so every run checks the same examples;
`cluster` (2 CPUs) and `cluster4` start one small local Ray cluster per test module that
asks for it."""

import logging

import pytest
from hypothesis import settings

settings.register_profile("rlgraph", derandomize=True, deadline=None)
settings.load_profile("rlgraph")


def local_ray(num_cpus: int):
    """A small local Ray cluster of `num_cpus` logical CPUs for the caller's scope (none is
    started when one runs already)."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=num_cpus, include_dashboard=False, object_store_memory=96 * 2**20,
                 logging_level=logging.WARNING, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the whole module (the runtime joins it)."""
    yield from local_ray(2)


@pytest.fixture(scope="module")
def cluster4():
    """The same with 4 logical CPUs (e.g. a trainer slot and two rollout replicas)."""
    yield from local_ray(4)


@pytest.fixture
def memory_unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The placement pass measures memory but refuses no plan for it: for tests of the cost
    model on shapes chosen for their arithmetic, not to fit a GPU (the memory check has its
    own tests, tests/unit/compiler/test_memory.py)."""
    from rlgraph.compiler import memory_check, placement

    def measure_only(*args: object, **kwargs: object) -> object:
        return memory_check.check_memory(*args, **{**kwargs, "refuse": False})

    monkeypatch.setattr(placement, "check_memory", measure_only)
