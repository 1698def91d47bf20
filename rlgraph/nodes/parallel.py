"""What the model-running kinds share: parallelism fields (tp / pp / ep, backend) and the
compute-bound cost of a pass over every token of the step."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlgraph.nodes.base import CostContext, NodeSpec


class ParallelNodeSpec(NodeSpec):
    """A node that runs the policy or reference model on its group's GPUs."""

    backend: Literal["torch", "megatron"] = "torch"
    tp: int = Field(default=1, ge=1, description="tensor-parallel size")
    pp: int = Field(default=1, ge=1, description="pipeline-parallel size")
    ep: int = Field(default=1, ge=1, description="expert-parallel size (MoE)")
    micro_tokens: int | None = Field(
        default=None, ge=1, description="tokens per forward (padding included): rows sorted "
        "by response length, each pass trimmed to its longest response rounded up to 256 "
        "(verl: use_dynamic_bsz); none: the whole batch (train: micro_batch rows) at once")

    def model_parallel(self) -> int:
        """GPUs one model replica spans; the group's GPUs divided by it is the DP size."""
        return self.tp * self.pp


def pipeline_bubble(node: NodeSpec, ctx: CostContext) -> float:
    """Time factor of a pp-stage pipeline over one-sequence micro-batches: (m + pp - 1) / m."""
    pp = getattr(node, "pp", 1)
    if pp <= 1:
        return 1.0
    data_parallel = max(1, ctx.gpus // node.model_parallel())
    micro = max(1, ctx.spec.data.samples_per_step() // data_parallel)
    return (micro + pp - 1) / micro


def token_pass_cost(node: NodeSpec, ctx: CostContext, flops_per_param: int, mfu: float) -> float:
    """A compute-bound pass over every token of the step: flops_per_param * N_active * tokens
    FLOPs at `mfu` of the group's peak (times the pipeline bubble when pp > 1)."""
    data = ctx.spec.data
    tokens = data.samples_per_step() * (data.prompt_len + data.response_len.mean)
    flops = flops_per_param * ctx.shape.active_params * tokens
    peak = ctx.gpu.bf16_flops * mfu * ctx.gpus
    ctx.extra["detail"] = (f"{flops_per_param} x {ctx.shape.active_params:.3g} params x "
                           f"{tokens:.3g} tokens at {mfu:.0%} of {ctx.gpus} x {ctx.gpu.name}")
    return flops / peak * pipeline_bubble(node, ctx)
