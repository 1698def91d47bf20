"""What a cost model may read: the whole spec, the model's shape, the hardware, the group."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlgraph.nodes.base import GraphSpec
    from rlgraph.presets.gpus import GPUPreset
    from rlgraph.presets.models import ModelShape


@dataclass
class CostContext:
    """What a cost model may read: the whole spec, the model's shape, the hardware, the group."""

    spec: GraphSpec
    name: str
    shape: ModelShape
    gpu: GPUPreset
    gpus: int  # GPUs (or CPU slots) of the node's group; 1 for a node in no group
    colocated: frozenset[str] = frozenset()  # kinds sharing the node's group
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def local(self) -> bool:
        """Whether the node runs on a local CPU cluster (the compiler's placement says; a
        bare context on the cpu preset counts as one)."""
        return bool(self.extra.get("local", self.gpu.name == "cpu"))
