"""The version rule: which policy versions a call may still train, in one function.

Policy version v is the number of policy versions trained. Generate call (or step) m of a
plan whose versions span K mini-batches (K = 1 without streaming) feeds version m // K of
train, and the lag bound `max_lag` lets it train tokens sampled by versions
>= m // K - max_lag. Every place that gates on the bound asks `oldest_trainable`: the
pipeline's version gate, the rollout cache's evict / refill / must-finish rules and the
cost model's simulation of the same rounds. Pure: the compiler imports it too.
"""

from __future__ import annotations


def oldest_trainable(step: int, max_lag: int, mini_batches: int = 1) -> int:
    """The oldest policy version call `step` may train: `step // mini_batches - max_lag`."""
    return step // mini_batches - max_lag
