"""Test-only group actors whose tasks sleep or raise at chosen steps: they put the runtime
into states that timing alone reaches only now and then (a train step queued behind slow
tasks when a stop arrives; a train step that fails inside a fused call). Defined inside a
function, the class travels to the Ray actor by value."""

from __future__ import annotations

import time
from typing import Any


def hooked_actor(sleep: dict[tuple[str, int], float] | None = None,
                 fail: set[tuple[str, int]] | None = None) -> type:
    """A `GroupActor` whose `(node, step)` tasks sleep `sleep[...]` seconds before running,
    and raise RuntimeError when in `fail` (before touching any state)."""
    from rlgraph.runtime.actors import GroupActor

    sleeps, failures = dict(sleep or {}), set(fail or ())

    class HookedActor(GroupActor):
        def run_replica(self, node: str, step: int, inputs: dict[str, Any]) -> Any:
            time.sleep(sleeps.get((node, step), 0.0))
            if (node, step) in failures:
                raise RuntimeError(f"injected failure of {node} at step {step}")
            return super().run_replica(node, step, inputs)

    return HookedActor
