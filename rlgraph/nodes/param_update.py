"""`param_update`: move the new weights from `train` to `generate`, in buckets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from rlgraph.nodes.base import CostContext, EdgeList, NodeKind, NodeSpec, StrictModel


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
    """bf16 weight bytes over the link, pipelined by buckets (one bucket of fill latency)."""
    weight_bytes = 2 * ctx.shape.params
    link = ctx.gpu.nvlink_bytes_per_s
    bucket = node.bucket_mb.produce * 1e6
    return weight_bytes / link + min(bucket, weight_bytes) / link


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
