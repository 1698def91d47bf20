"""`param_update`: move the new weights from `train` to `generate`, in buckets."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from rlgraph.nodes.base import CostContext, EdgeList, NodeKind, NodeSpec, StrictModel
from rlgraph.presets import COSTS


class BucketSizes(StrictModel):
    """Sender and receiver granularity (dots.rl: param_update_preduce/consume_bucket_size_mb)."""

    produce: float = Field(default=512, gt=0)
    consume: float = Field(default=128, gt=0)


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
    local CPU cluster), pipelined by buckets (gather, send and load overlap): one produce
    bucket to gather before the first send, one consume bucket to load after the last, and a
    fixed overhead per bucket. The receiver stages the version in its second buffer while
    generation runs, so generate pays only `switch_cost`. `auto` is NCCL on GPUs (priced as
    NVLink / network) and the object store's shared memory on a local CPU cluster (priced as
    a memory copy). Reads ctx.extra["local"] and ctx.extra["cross_node"]."""
    gpu = ctx.gpu
    weight_bytes = 2 * ctx.shape.params
    local = bool(ctx.extra.get("local"))
    if local:
        link, via = gpu.host_bytes_per_s, "memory copy"
    elif node.transport == "object_store":
        link, via = COSTS.object_store_bytes_per_s, "Ray object store"
    elif ctx.extra.get("cross_node"):
        link, via = gpu.network_bytes_per_s, "network"
    else:
        link, via = gpu.nvlink_bytes_per_s, "NVLink"
    produce = min(node.bucket_mb.produce * 1e6, weight_bytes)
    consume = min(node.bucket_mb.consume * 1e6, weight_bytes)
    buckets = math.ceil(weight_bytes / produce) + math.ceil(weight_bytes / consume)
    gather = gpu.host_bytes_per_s if local else gpu.nvlink_bytes_per_s
    fill_drain = produce / gather + consume / gpu.hbm_bytes_per_s
    ctx.extra["detail"] = (f"{weight_bytes / 1e9:.3g} GB over {via} at {link / 1e9:.3g} GB/s + "
                           f"{buckets} buckets x {COSTS.bucket_overhead_s * 1e3:.3g} ms")
    return weight_bytes / link + fill_drain + buckets * COSTS.bucket_overhead_s


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
