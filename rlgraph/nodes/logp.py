"""`logp`: recompute the proximal policy's log-probs of the sampled tokens."""

from __future__ import annotations

from typing import Literal

from rlgraph.nodes.base import CostContext, NodeKind, NodeSpec, inputs_from_kinds
from rlgraph.nodes.parallel import ParallelNodeSpec


class LogpSpec(ParallelNodeSpec):
    """Forward pass of the policy over prompt + response."""

    kind: Literal["logp"] = "logp"


def forward_cost(node: NodeSpec, ctx: CostContext) -> float:
    """One forward over every token of the step: 2 * N * tokens FLOPs, compute-bound."""
    data = ctx.spec.data
    tokens = data.prompts_per_step * data.samples_per_prompt * (
        data.prompt_len + data.response_len.mean
    )
    return 2 * ctx.shape.active_params * tokens / (ctx.gpu.bf16_flops * ctx.gpus)


KIND = NodeKind(
    name="logp",
    spec=LogpSpec,
    cost=forward_cost,
    uses_gpu=True,
    default_edges=inputs_from_kinds("generate"),
    doc="proximal-policy log-probs of the sampled tokens",
)
