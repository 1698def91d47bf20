"""The cost model of `reward`: a rule-based verifier, per sample."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec


def reward_cost(node: NodeSpec, ctx: CostContext) -> float:
    """A rule-based verifier: reward_seconds_per_sample per sample, in one process."""
    samples = ctx.spec.data.samples_per_step()
    ctx.extra["detail"] = f"{samples} samples x {COSTS.reward_seconds_per_sample * 1e6:.3g} us"
    return COSTS.reward_seconds_per_sample * samples
