"""The cost model of `train`: forward + backward over every token of the step, per epoch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.passes import token_pass_cost
from rlgraph.pricing.system import hybrid_engine_priced

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec


def train_cost(node: NodeSpec, ctx: CostContext) -> float:
    """Forward + backward over every token: 6 * N * tokens FLOPs plus 3x attention's
    (`parallel.token_pass_cost`; MoE: active params and the expert all-to-all)
    per epoch, compute-bound, at the pace of the slowest data-parallel rank of each
    mini-batch (`parallel.data_parallel_imbalance`); plus a 2 * N forward for the proximal
    log-probs when rlgraph's runtime trains an off-policy batch without a logp node and
    `old_logp: proximal` (on-policy, its first forward is the proximal one; `rollout` and
    verl take them from the sampler). Priced as verl's hybrid engine with FSDP (backend
    torch), the forward runs twice: verl checkpoints activations by default
    (`enable_gradient_checkpointing: True` in verl/trainer/config/ppo_trainer.yaml, also set
    by the published 7B DAPO scripts), so
    8 * N * tokens; with `activation_checkpointing` on any system the same recompute is
    paid. verl's gradient all-reduce of each update overlaps the backward in
    buckets (DDP, FSDP), so only compute is priced there; rlgraph's replicas sum the
    gradients after the backward (`parallel.data_parallel_overhead`)."""
    sched = ctx.spec.schedule
    on_policy = (sched.max_lag == 0 and not sched.partial_rollout
                 and node.mini_batches == 1 and node.epochs == 1)
    proximal = (not any(n.kind == "logp" for n in ctx.spec.nodes.values())
                and not hybrid_engine_priced(ctx.spec)
                and node.old_logp == "proximal" and not on_policy)
    verl_default = hybrid_engine_priced(ctx.spec) and node.backend == "torch"
    recompute = 2 if verl_default or getattr(node, "activation_checkpointing", False) else 0
    seconds = token_pass_cost(node, ctx, (8 if proximal else 6) + recompute, COSTS.train_mfu,
                              mini_batches=node.mini_batches, response_bytes=16,
                              epochs=node.epochs)
    if proximal:
        ctx.extra["detail"] += " (incl. the proximal log-prob forward)"
    if recompute:
        ctx.extra["detail"] += (" (incl. verl's activation recompute)" if verl_default else
                                " (incl. the activation checkpointing's recomputed forward)")
    return seconds
