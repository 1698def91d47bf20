"""The cost model of `train`: forward + backward over every token of the step, per epoch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.passes import token_pass_cost
from rlgraph.pricing.system import System, system_of

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec


def train_cost(node: NodeSpec, ctx: CostContext) -> float:
    """Forward + backward over every token: 6 * N * tokens FLOPs plus 3x attention's
    (`parallel.token_pass_cost`; MoE: active params and the expert all-to-all)
    per epoch, compute-bound, at the pace of the slowest data-parallel rank of each
    mini-batch (`parallel.data_parallel_imbalance`); plus a 2 * N forward for the proximal
    log-probs when rlgraph's runtime trains an off-policy batch without a logp node and
    `old_logp: proximal` (on-policy, its first forward is the proximal one; `rollout` and
    verl take them from the sampler). With activation checkpointing the forward runs twice
    (+2 * N): the node's `activation_checkpointing` where the graph sets it, else the
    system's habit for backend torch (verl: `enable_gradient_checkpointing: True` in
    verl/trainer/config/ppo_trainer.yaml and the published 7B DAPO scripts). verl's
    gradient all-reduce of each update overlaps the backward in buckets (DDP, FSDP), so
    only compute is priced there; rlgraph's replicas sum the gradients after the backward
    (`passes.data_parallel_overhead`)."""
    sched = ctx.spec.schedule
    on_policy = (sched.max_lag == 0 and not sched.partial_rollout
                 and node.mini_batches == 1 and node.epochs == 1)
    system = system_of(ctx.spec)
    proximal = (not any(n.kind == "logp" for n in ctx.spec.nodes.values())
                and system.runs_here and node.old_logp == "proximal" and not on_policy)
    recompute = 2 if checkpoints_activations(node, system) else 0
    seconds = token_pass_cost(node, ctx, (8 if proximal else 6) + recompute, COSTS.train_mfu,
                              mini_batches=node.mini_batches, response_bytes=16,
                              epochs=node.epochs)
    if proximal:
        ctx.extra["detail"] += " (incl. the proximal log-prob forward)"
    if recompute:
        stated = "activation_checkpointing" in node.model_fields_set
        ctx.extra["detail"] += (" (incl. the activation checkpointing's recomputed forward)"
                                if stated else f" (incl. {system.name}'s activation recompute)")
    return seconds


def checkpoints_activations(node: NodeSpec, system: System) -> bool:
    """Whether train recomputes activations in its backward: the node's
    `activation_checkpointing` where the graph sets it, else the system's habit (verl: on,
    for backend torch)."""
    if "activation_checkpointing" in node.model_fields_set:
        return bool(node.activation_checkpointing)
    return system.activation_recompute and getattr(node, "backend", "torch") == "torch"
