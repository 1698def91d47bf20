"""The cost model of `critic`: PPO's value model, a forward then its own update."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.passes import token_pass_cost

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec


def critic_cost(node: NodeSpec, ctx: CostContext) -> float:
    """The value forward (2 * N * tokens FLOPs) plus `epochs` forward + backward passes
    (6 * N * tokens), each by `passes.token_pass_cost` as train's and logp's passes are
    priced (the critic has the policy's size; its fp32 head term, priced vocabulary-wide,
    overstates a one-wide value head)."""
    forward = token_pass_cost(node, ctx, 2, COSTS.forward_mfu, response_bytes=8)
    detail = ctx.extra.get("detail", "")
    update = token_pass_cost(node, ctx, 6, COSTS.train_mfu,
                             mini_batches=node.mini_batches,  # type: ignore[attr-defined]
                             response_bytes=16, epochs=node.epochs)  # type: ignore[attr-defined]
    ctx.extra["detail"] = f"value forward: {detail}; update: {ctx.extra.get('detail', '')}"
    return forward + update
