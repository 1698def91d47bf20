"""`logp`: recompute the proximal policy's log-probs of the sampled tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from rlgraph.nodes.base import CostContext, NodeKind, NodeSpec, inputs_from_kinds
from rlgraph.nodes.parallel import ParallelNodeSpec
from rlgraph.presets import COSTS

if TYPE_CHECKING:
    from rlgraph.batch import Batch
    from rlgraph.workspace import Workspace


class LogpSpec(ParallelNodeSpec):
    """Forward pass of the policy over prompt + response."""

    kind: Literal["logp"] = "logp"


def pipeline_bubble(node: NodeSpec, ctx: CostContext) -> float:
    """Time factor of a pp-stage pipeline over one-sequence micro-batches: (m + pp - 1) / m."""
    pp = getattr(node, "pp", 1)
    if pp <= 1:
        return 1.0
    data_parallel = max(1, ctx.gpus // node.model_parallel())
    micro = max(1, ctx.spec.data.samples_per_step() // data_parallel)
    return (micro + pp - 1) / micro


def forward_cost(node: NodeSpec, ctx: CostContext) -> float:
    """One forward over every token of the step: 2 * N_active * tokens FLOPs, compute-bound,
    at forward_mfu of the group's peak (times the pipeline bubble when pp > 1)."""
    data = ctx.spec.data
    tokens = data.samples_per_step() * (data.prompt_len + data.response_len.mean)
    flops = 2 * ctx.shape.active_params * tokens
    peak = ctx.gpu.bf16_flops * COSTS.forward_mfu * ctx.gpus
    ctx.extra["detail"] = (f"2 x {ctx.shape.active_params:.3g} params x {tokens:.3g} tokens at "
                           f"{COSTS.forward_mfu:.0%} of {ctx.gpus} x {ctx.gpu.name}")
    return flops / peak * pipeline_bubble(node, ctx)


KIND = NodeKind(
    name="logp",
    spec=LogpSpec,
    cost=forward_cost,
    uses_gpu=True,
    default_edges=inputs_from_kinds("generate"),
    worker="rlgraph.nodes.logp:LogpWorker",
    doc="proximal-policy log-probs of the sampled tokens",
)


class LogpWorker:
    """Adds `old_logp`: the sampled tokens' log-probs under the policy train will start from
    (the proximal policy of decoupled PPO), at the generate temperature."""

    model_attr, key = "policy", "old_logp"

    def __init__(self, name: str, node: NodeSpec, workspace: Workspace):
        self.name, self.node, self.ws = name, node, workspace

    def run(self, step: int, inputs: dict[str, Batch]) -> Batch:
        """Forward the batch of `step` (no gradient) and add this node's log-probs."""
        import torch

        from rlgraph.batch import check_step, merge
        from rlgraph.sampling import token_logp

        batch = merge(inputs)
        check_step(batch, step, self.name)
        with self.ws.lock, torch.no_grad():
            model = getattr(self.ws, self.model_attr)
            device = next(model.parameters()).device
            logp = token_logp(model, batch["sequences"].to(device),
                              batch["attention_mask"].to(device), batch["prompt_len"],
                              batch["temperature"])
        batch[self.key] = (logp.cpu() * batch["response_mask"]).float()
        return batch
