"""Fixtures of the compiler's tests."""

from __future__ import annotations

import functools

import pytest


@pytest.fixture
def memory_unchecked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The placement pass measures memory but refuses no plan for it: for tests of the cost
    model on shapes chosen for their arithmetic, not to fit a GPU (the memory check has its
    own tests, tests/unit/compiler/test_memory.py)."""
    from rlgraph.compiler import memory, placement

    monkeypatch.setattr(placement, "check_memory",
                        functools.partial(memory.check_memory, refuse=False))
