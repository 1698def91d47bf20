"""`logp`: recompute the proximal policy's log-probs of the sampled tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from rlgraph.nodes.base import CostContext, NodeKind, NodeSpec, inputs_from_kinds
from rlgraph.nodes.parallel import ParallelNodeSpec, token_pass_cost
from rlgraph.presets import COSTS

if TYPE_CHECKING:
    from rlgraph.batch import Batch
    from rlgraph.workspace import Workspace


class LogpSpec(ParallelNodeSpec):
    """Forward pass of the policy over prompt + response."""

    kind: Literal["logp"] = "logp"


def forward_cost(node: NodeSpec, ctx: CostContext) -> float:
    """One forward over every token of the step: 2 * N_active * tokens FLOPs, compute-bound."""
    return token_pass_cost(node, ctx, 2, COSTS.forward_mfu)


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
        from rlgraph.sampling import length_batches, token_logp, token_logp_passes

        batch = merge(inputs)
        check_step(batch, step, self.name)
        with self.ws.lock, torch.no_grad():
            model = getattr(self.ws, self.model_attr)
            device = next(model.parameters()).device
            seqs, mask = batch["sequences"].to(device), batch["attention_mask"].to(device)
            budget = getattr(self.node, "micro_tokens", None)
            if budget:
                passes = length_batches(batch["response_mask"], batch["prompt_len"], budget)
                logp = token_logp_passes(model, seqs, mask, batch["prompt_len"],
                                         batch["temperature"], passes)
            else:
                logp = token_logp(model, seqs, mask, batch["prompt_len"], batch["temperature"])
        batch[self.key] = (logp.cpu() * batch["response_mask"]).float()
        return batch
