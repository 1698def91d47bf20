"""The cost model of `logp` and `ref_logp`: one forward over every token of the step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.passes import token_pass_cost

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec


def forward_cost(node: NodeSpec, ctx: CostContext) -> float:
    """One forward over every token of the step: 2 * N * tokens FLOPs plus attention's
    (`parallel.token_pass_cost`), compute-bound;
    0 where the compiler proves the forward redundant (`rlgraph.nodes.logp.skip_reason`)."""
    from rlgraph.nodes import logp as logp_kind  # the spec's rule (nodes import pricing)

    reason = logp_kind.skip_reason(ctx.spec)
    if reason is not None and node.kind == "logp":
        ctx.extra["detail"] = reason
        ctx.extra["note"] = f"{ctx.name}: {reason}"
        return 0.0
    return token_pass_cost(node, ctx, 2, COSTS.forward_mfu, response_bytes=8)
