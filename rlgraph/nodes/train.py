"""`train`: one optimizer step of the policy (GRPO / PPO loss, KL, importance weights)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlgraph.nodes.base import CostContext, NodeKind, NodeSpec, inputs_from_kinds
from rlgraph.nodes.parallel import ParallelNodeSpec


class TrainSpec(ParallelNodeSpec):
    """Optimizer settings of the policy (verl: actor_rollout_ref.actor.*)."""

    kind: Literal["train"] = "train"
    lr: float = Field(default=1e-6, gt=0)
    grad_clip: float = Field(default=1.0, gt=0)


def train_cost(node: NodeSpec, ctx: CostContext) -> float:
    """Forward + backward over every token: 6 * N * tokens FLOPs, compute-bound."""
    data = ctx.spec.data
    tokens = data.prompts_per_step * data.samples_per_prompt * (
        data.prompt_len + data.response_len.mean
    )
    return 6 * ctx.shape.active_params * tokens / (ctx.gpu.bf16_flops * ctx.gpus)


KIND = NodeKind(
    name="train",
    spec=TrainSpec,
    cost=train_cost,
    uses_gpu=True,
    default_edges=inputs_from_kinds("reward|logp|ref_logp", "generate"),
    doc="one optimizer step of the policy",
)
