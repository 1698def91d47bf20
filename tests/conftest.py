"""Test-wide settings: hypothesis runs derandomized, so every run checks the same examples;
`cluster` and `cluster4` give a test one small local Ray cluster, started once for the whole
session on first use (each start costs seconds of both cores) and shut down at its end."""

import logging
from pathlib import Path

import pytest
import torch
from hypothesis import settings

settings.register_profile("rlgraph", derandomize=True, deadline=None)
settings.load_profile("rlgraph")

# One torch thread in the test process (Ray actors pick their own): the tiny models gain
# nothing from a second, and two threads spinning on a shared 2-core machine cost 2-3x the
# CPU (test_partial_rollout's decode tests: 15 s user CPU on one thread, 40-50 s on two).
torch.set_num_threads(1)


RAY_CPUS = 4  # logical CPUs: a trainer slot and two rollout replicas; 2-slot plans fit too


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


@pytest.fixture(scope="session")
def ray_session():
    """The session's one local Ray cluster (RAY_CPUS logical CPUs), started on first use."""
    yield from local_ray(RAY_CPUS)


@pytest.fixture(scope="module")
def cluster(ray_session):
    """The session's Ray cluster, for a module whose runs need 2 logical CPUs (the runtime
    joins it)."""
    yield


@pytest.fixture(scope="module")
def cluster4(ray_session):
    """The same cluster, for runs that need 4 logical CPUs (e.g. a trainer slot and two
    rollout replicas)."""
    yield


@pytest.fixture
def memory_unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The placement pass measures memory but refuses no plan for it: for tests of the cost
    model on shapes chosen for their arithmetic, not to fit a GPU (the memory check has its
    own tests, tests/unit/compiler/test_memory.py)."""
    from rlgraph.compiler import memory_check, placement

    def measure_only(*args: object, **kwargs: object) -> object:
        return memory_check.check_memory(*args, **{**kwargs, "refuse": False})

    monkeypatch.setattr(placement, "check_memory", measure_only)


@pytest.fixture(scope="session")
def warm_start_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One warm-start cache for the session's learning tests (not the user's ~/.cache): the
    quickstart's 30-step warm start of the tiny preset is computed once and read by every
    test that builds the same model on the same data (the cache key says when it is)."""
    return tmp_path_factory.mktemp("warm_start_cache")


@pytest.fixture
def warm_cache(warm_start_folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """RLGRAPH_CACHE pointed at the session's warm-start cache for one test."""
    monkeypatch.setenv("RLGRAPH_CACHE", str(warm_start_folder))
    return warm_start_folder
