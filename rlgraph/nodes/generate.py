"""`generate`: sample responses for the step's prompts with the current policy."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlgraph.nodes.base import CostContext, NodeKind, NodeSpec, no_inputs


class GenerateSpec(NodeSpec):
    """Rollout engine settings (verl: actor_rollout_ref.rollout.*)."""

    kind: Literal["generate"] = "generate"
    engine: Literal["native", "sglang"] = "native"
    tp: int = Field(default=1, ge=1, description="tensor-parallel size of one engine replica")
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)

    def model_parallel(self) -> int:
        """GPUs one engine replica spans."""
        return self.tp


def generate_cost(node: NodeSpec, ctx: CostContext) -> float:
    """Prefill (compute-bound) plus decode (memory-bound: weights + KV read once per step)."""
    data, shape, gpu = ctx.spec.data, ctx.shape, ctx.gpu
    batch = data.prompts_per_step * data.samples_per_prompt
    prefill = 2 * shape.active_params * batch * data.prompt_len / (gpu.bf16_flops * ctx.gpus)
    replicas = max(1, ctx.gpus // node.tp)
    steps = data.response_len.mean if ctx.spec.schedule.partial_rollout else data.response_len.max
    context = data.prompt_len + data.response_len.mean / 2
    per_replica = batch / replicas
    step_bytes = (2 * shape.params + per_replica * context * shape.kv_bytes_per_token()) / node.tp
    return prefill + steps * step_bytes / gpu.hbm_bytes_per_s


KIND = NodeKind(
    name="generate",
    spec=GenerateSpec,
    cost=generate_cost,
    uses_gpu=True,
    default_edges=no_inputs,
    doc="sample responses with the current policy",
)
