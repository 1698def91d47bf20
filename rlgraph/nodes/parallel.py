"""Parallelism fields shared by the model-running kinds (tp / pp / ep, backend)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlgraph.nodes.base import NodeSpec


class ParallelNodeSpec(NodeSpec):
    """A node that runs the policy or reference model on its group's GPUs."""

    backend: Literal["torch", "megatron"] = "torch"
    tp: int = Field(default=1, ge=1, description="tensor-parallel size")
    pp: int = Field(default=1, ge=1, description="pipeline-parallel size")
    ep: int = Field(default=1, ge=1, description="expert-parallel size (MoE)")

    def model_parallel(self) -> int:
        """GPUs one model replica spans; the group's GPUs divided by it is the DP size."""
        return self.tp * self.pp
