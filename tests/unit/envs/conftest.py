"""The environment unit tests step their environments in this process (a thread pool), as a
run without Ray does. The session's Ray cluster, started by the integration tests that run
before them, would otherwise host the environments in Ray actors, whose reply order varies
from run to run and with it which turns decode together."""

import pytest

from rlgraph.envs.pool import EnvPool


@pytest.fixture(autouse=True)
def envs_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """`EnvPool.of` builds the in-process pool whether or not Ray is running."""
    monkeypatch.setattr(EnvPool, "of", classmethod(
        lambda cls, spec, base_dir: cls(spec, base_dir, use_ray=False)))
