"""What the model-running kinds share in their spec: parallelism fields (tp / pp / ep,
backend, sharding) and the pass size. Their cost physics is `rlgraph.pricing.passes`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlgraph.nodes.base import MAX_COUNT, MAX_PARALLEL, MAX_TOKENS, NodeSpec


class ParallelNodeSpec(NodeSpec):
    """A node that runs the policy or reference model on its group's GPUs."""

    backend: Literal["torch", "megatron"] = "torch"
    tp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="tensor-parallel size")
    pp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="pipeline-parallel size")
    ep: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="expert-parallel size (MoE)")
    cp: int = Field(default=1, ge=1, le=MAX_PARALLEL, description="context-parallel size "
                    "(megatron: each sequence split over cp GPUs, which attend to each "
                    "other's keys and values)")
    micro_tokens: int | None = Field(
        default=None, ge=1, le=MAX_COUNT * MAX_TOKENS,
        description="tokens per forward (padding included): rows sorted "
        "by response length, each pass trimmed to its longest response rounded up to 256 "
        "(verl: use_dynamic_bsz); none: the whole batch (train: micro_batch rows) at once")
    sharding: Literal["none", "fsdp"] = Field(
        default="none", description="how a group's data-parallel ranks hold the model: "
        "'none' keeps a whole copy on each (replicated); 'fsdp' shards parameters, "
        "gradients and optimizer states over them with torch's FSDP2 (fully_shard), bf16 "
        "compute and fp32 master weights on GPUs (verl: actor.strategy fsdp2)")
    activation_checkpointing: bool = Field(
        default=False, description="recompute each decoder layer's activations in the "
        "backward instead of keeping them (verl: enable_gradient_checkpointing)")

    @model_validator(mode="after")
    def _sharding_needs_torch(self) -> ParallelNodeSpec:
        if self.sharding == "fsdp" and self.backend != "torch":
            raise ValueError("sharding: fsdp runs on backend: torch (megatron shards by tp)")
        return self

    @model_validator(mode="after")
    def _context_parallel_needs_megatron(self) -> ParallelNodeSpec:
        if self.cp > 1 and self.backend != "megatron":
            raise ValueError("cp (context parallelism) runs on backend: megatron")
        return self

    def model_parallel(self) -> int:
        """GPUs one model replica spans (tp x pp x cp); the group's GPUs divided by it is the
        DP size."""
        return self.tp * self.pp * self.cp
