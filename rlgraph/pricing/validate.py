"""The cost model of `validate`: one synchronous greedy batch of its prompts, decoded by
generate's cost model and amortized over `every` steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgraph.pricing.context import CostContext
from rlgraph.pricing.generate import generate_cost

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec


def validate_cost(node: NodeSpec, ctx: CostContext) -> float:
    """A greedy synchronous batch of `prompts` decoded by generate's cost model, / `every`."""
    from rlgraph.nodes.validate import engine_of  # the spec's rule (nodes import pricing)

    engine = engine_of(ctx.spec, ctx.name)
    data = ctx.spec.data.model_copy(update={"prompts_per_step": node.prompts,
                                            "samples_per_prompt": 1})
    schedule = ctx.spec.schedule.model_copy(update={"partial_rollout": False})
    spec = ctx.spec.model_copy(update={"data": data, "schedule": schedule})
    sub = CostContext(spec=spec, name=engine, shape=ctx.shape, gpu=ctx.gpu, gpus=ctx.gpus,
                      colocated=ctx.colocated)
    decode = generate_cost(ctx.spec.nodes[engine], sub)
    ctx.extra["detail"] = (f"{node.prompts} prompts, {sub.extra['detail']} = {decode:.3g} s "
                           f"every {node.every} steps")
    return decode / node.every
