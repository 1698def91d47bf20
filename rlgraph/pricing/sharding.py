"""What FSDP2 (`sharding: fsdp`) adds to a pass on rlgraph's runtime: its all-gathers and
reduce-scatters (the memory they save is the compiler's memory pass, rlgraph.compiler.memory).

rlgraph.process.sharding wraps every decoder layer as one FSDP unit and the root (embeddings,
norm, head) as another, with MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32). Every micro-batch pass therefore all-gathers each unit's parameters
in bf16 before its forward, again before its backward (FSDP2 reshards after the forward),
and reduce-scatters its gradients in fp32 after the backward. A ring collective over W ranks
moves (W - 1) / W of the gathered (or reduced) bytes through each GPU's link: NVLink when the
group sits inside one machine, else the network (the GPU preset's figures). FSDP2 prefetches
the next unit's all-gather while the current one computes, so the collectives overlap the
pass's compute: a pass lasts the longer of the two, plus the first unit's gather, which
nothing hides.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rlgraph.pricing.context import CostContext

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec

GATHER_BYTES = 2  # bf16 parameters after the all-gather
REDUCE_BYTES = 4  # fp32 gradients reduce-scattered


def sharded(node: NodeSpec) -> bool:
    """Whether the node's model is sharded with FSDP."""
    return getattr(node, "sharding", "none") == "fsdp"


def link_bytes_per_s(ctx: CostContext) -> float:
    """Per-GPU bandwidth of the group's collectives: NVLink inside a machine, else the
    network."""
    within = ctx.gpus <= ctx.spec.cluster.gpus_per_node
    return ctx.gpu.nvlink_bytes_per_s if within else ctx.gpu.network_bytes_per_s


def pass_count(node: NodeSpec, ctx: CostContext, tokens: float, mini_batches: int) -> int:
    """Micro-batch passes one data-parallel rank runs per call: of each update's share,
    `micro_tokens` tokens (or `micro_batch` rows) at a time."""
    ranks = max(1, ctx.gpus // node.model_parallel())
    rows = ctx.spec.data.samples_per_step()
    share = math.ceil(rows / mini_batches / ranks)
    budget = getattr(node, "micro_tokens", None)
    if budget:
        per_update = math.ceil(tokens / mini_batches / ranks / budget)
    else:
        per_update = math.ceil(share / (getattr(node, "micro_batch", None) or share))
    return mini_batches * max(1, per_update)


def fsdp_collective_bytes(node: NodeSpec, ctx: CostContext, backward: bool) -> float:
    """Bytes through one GPU's link for one pass: the bf16 all-gather of every parameter
    (twice with a backward) and the fp32 reduce-scatter of every gradient, each times
    (W - 1) / W; 0 for one rank."""
    ranks = max(1, ctx.gpus // node.model_parallel())
    if ranks <= 1:
        return 0.0
    params = ctx.shape.params
    moved = GATHER_BYTES * params * (2 if backward else 1)
    if backward:
        moved += REDUCE_BYTES * params
    return moved * (ranks - 1) / ranks


def fsdp_collectives(node: NodeSpec, ctx: CostContext, backward: bool, tokens: float,
                     mini_batches: int) -> tuple[float, float]:
    """(seconds of the collectives of a call, of which not hidden behind compute at the
    least): every pass's gathers and reduce-scatters at the link's speed, and the first
    unit's gather of each pass (1 / (layers + 1) of its gathers). (0, 0) unless sharded on
    GPUs."""
    if not sharded(node) or ctx.local:
        return 0.0, 0.0
    passes = pass_count(node, ctx, tokens, mini_batches)
    per_pass = fsdp_collective_bytes(node, ctx, backward) / link_bytes_per_s(ctx)
    return passes * per_pass, passes * per_pass / (ctx.shape.layers + 1)
