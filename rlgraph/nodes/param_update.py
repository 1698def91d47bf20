"""`param_update`: move the new weights from `train` to `generate`, in buckets."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from rlgraph.nodes.base import CostContext, EdgeList, NodeKind, NodeSpec, StrictModel
from rlgraph.presets.costs import COSTS


class BucketSizes(StrictModel):
    """Sender and receiver granularity (dots.rl: param_update_preduce/consume_bucket_size_mb)."""

    produce: float = Field(default=512, ge=0.01, le=1e6)
    consume: float = Field(default=128, ge=0.01, le=1e6)


class ParamUpdateSpec(NodeSpec):
    """Weight sync from `src` (a train node) to `dst` (a generate node)."""

    kind: Literal["param_update"] = "param_update"
    src: str = "train"
    dst: str = "generate"
    bucket_mb: BucketSizes = Field(default_factory=BucketSizes)
    transport: Literal["auto", "nccl", "object_store"] = "auto"


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
    Within one group nothing moves (`rlgraph.runtime.weight_sync.local_sync`): 0 s."""
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
    produce = min(node.bucket_mb.produce * 1e6, weight_bytes)
    consume = min(node.bucket_mb.consume * 1e6, weight_bytes)
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
    return weight_bytes / link + fill_drain + buckets * overhead


def switch_cost(node: NodeSpec, shape: object, gpu: object, local: bool) -> float:
    """The dual-buffer switch generate pays per step: the staged weights copied into the live
    ones in place (read + write of a replica's bf16 weights at HBM speed; a memory copy on a
    local CPU cluster)."""
    weights = 2 * shape.params / getattr(node, "tp", 1)
    if local:
        return weights / gpu.host_bytes_per_s
    return 2 * weights / gpu.hbm_bytes_per_s


def param_update_edges(name: str, node: NodeSpec, nodes: Mapping[str, NodeSpec]) -> EdgeList:
    """train -> param_update -> generate; the second is the back edge (max_lag + 1)."""
    return [(node.src, name), (name, node.dst)]


KIND = NodeKind(
    name="param_update",
    spec=ParamUpdateSpec,
    cost=param_update_cost,
    uses_gpu=False,
    default_edges=param_update_edges,
    carries_weights=True,
    doc="versioned weight transfer from train to generate",
)
