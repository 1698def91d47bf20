"""The cost model of `param_update`: the weight transfer between groups, and the dual-buffer
switch the receiving generate pays."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.system import system_of
from rlgraph.weights import MIB

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec


def param_update_cost(node: NodeSpec, ctx: CostContext) -> float:
    """The transfer, which holds the sender's group only: bf16 weights over the link (NVLink
    within a node, the network across nodes, the Ray object store, or a memory copy on a
    local CPU cluster), pipelined so gather, send and load overlap. NCCL (`nccl`, and `auto`
    on GPUs) gathers and loads one consume chunk at a time: one chunk to fill, one to drain
    at HBM speed, COSTS.nccl_chunk_overhead_s per chunk. The object store (and a local CPU
    cluster, where `auto` means it) puts whole produce buckets: one produce bucket to
    gather, one consume bucket to load, and COSTS.bucket_overhead_s per bucket of either
    size. The receiver stages the version in its second buffer while generation runs, so
    generate pays only `switch_cost`. Reads ctx.extra["local"] and ctx.extra["cross_node"].
    Within one group nothing moves (`ParamUpdateWorker.local`): 0 s. Bucket sizes are MiB
    (2^20 bytes), as the runtime cuts them (`rlgraph.weights.MIB`). A system that gathers its
    trainer's model-parallel shards before sending (`System.refit_gather_bytes_per_s`,
    NeMo-RL) pays that gather too."""
    gpu = ctx.gpu
    weight_bytes = 2 * ctx.shape.params
    home = ctx.spec.group_of(node.src)
    if home is not None and home == ctx.spec.group_of(node.dst):
        ctx.extra["detail"] = ("src and dst share a group: nothing moves (rlgraph's runtime "
                               "trains the weights generate decodes with; verl's reshard is "
                               "its switch)")
        return 0.0
    local = bool(ctx.extra.get("local"))
    if local:
        link, via = gpu.host_bytes_per_s, "memory copy"
    elif node.transport == "object_store":
        link, via = COSTS.object_store_bytes_per_s, "Ray object store"
    elif ctx.extra.get("cross_node"):
        link, via = gpu.network_bytes_per_s, "network (NCCL)"
    else:
        link, via = gpu.nvlink_bytes_per_s, "NVLink (NCCL)"
    produce = min(node.bucket_mb.produce * MIB, weight_bytes)
    consume = min(node.bucket_mb.consume * MIB, weight_bytes)
    if local or node.transport == "object_store":
        buckets = math.ceil(weight_bytes / produce) + math.ceil(weight_bytes / consume)
        gather = gpu.host_bytes_per_s if local else gpu.nvlink_bytes_per_s
        fill_drain = produce / gather + consume / gpu.hbm_bytes_per_s
        overhead = COSTS.bucket_overhead_s
    else:
        buckets = math.ceil(weight_bytes / consume)
        fill_drain = 2 * consume / gpu.hbm_bytes_per_s
        overhead = COSTS.nccl_chunk_overhead_s
    ctx.extra["detail"] = (f"{weight_bytes / 1e9:.3g} GB over {via} at {link / 1e9:.3g} GB/s + "
                           f"{buckets} buckets x {overhead * 1e3:.3g} ms")
    gather = 0.0
    system = system_of(ctx.spec)
    if system.refit_gather_bytes_per_s and not local:
        gather = weight_bytes / system.refit_gather_bytes_per_s
        ctx.extra["detail"] += (f" + {system.label}'s gather of the shards {gather:.3g} s at "
                                f"{system.refit_gather_bytes_per_s / 1e9:.3g} GB/s")
    return weight_bytes / link + fill_drain + buckets * overhead + gather


def switch_cost(node: NodeSpec, shape: object, gpu: object, local: bool) -> float:
    """The dual-buffer swap generate pays per step: the staged weights copied into the live
    ones in place (read + write of a replica's bf16 weights at HBM speed; a memory copy on a
    local CPU cluster)."""
    weights = 2 * shape.params / getattr(node, "tp", 1)
    if local:
        return weights / gpu.host_bytes_per_s
    return 2 * weights / gpu.hbm_bytes_per_s
