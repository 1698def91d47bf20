"""The cost model of `reward`: a rule-based verifier, per sample."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec


def reward_cost(node: NodeSpec, ctx: CostContext) -> float:
    """A rule-based verifier: reward_seconds_per_sample per sample, in one process; every
    sample dynamic sampling is expected to draw (`pricing.sampling.expected_draws`) and
    ReMax's greedy response per prompt count."""
    from rlgraph.pricing.sampling import expected_draws

    data, algo = ctx.spec.data, ctx.spec.algorithm
    per_draw = data.samples_per_step()
    if algo.advantage == "greedy_baseline":
        per_draw += data.prompts_per_step
    samples = per_draw * expected_draws(ctx.spec)
    ctx.extra["detail"] = (f"{samples:.4g} samples x "
                           f"{COSTS.reward_seconds_per_sample * 1e6:.3g} us")
    return COSTS.reward_seconds_per_sample * samples
