"""Data parallelism inside a group: its replicas (one process per GPU, or `replicas` CPU
processes) hold the same weights, each runs a share of a task's rows, and train sums their
gradients over a private process group, so every replica takes the same optimizer step and
the group acts as one process with W times the hardware (verl's FSDP data parallelism, minus
the sharding).

Which rows a replica takes is the kind's business (`DATA_PARALLEL` of its worker, read by
rlgraph.runtime.actors); this module only knows ranks and collectives.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

BUCKET_BYTES = 64 << 20  # gradients are summed this many bytes at a time


@dataclass
class Replicas:
    """This process's place among its group's replicas, and their process group once joined."""

    rank: int = 0
    world: int = 1
    group: Any = field(default=None, repr=False)  # rlgraph.runtime.nccl_sync.SyncGroup

    @property
    def tag(self) -> tuple[int, ...]:
        """What tells replicas' random streams apart: () alone, (rank,) among several."""
        return () if self.world == 1 else (self.rank,)

    def join(self, addr: str, port: int, backend: str, device: str) -> None:
        """Build the replicas' process group (every replica calls this at the same time)."""
        from rlgraph.runtime import nccl_sync

        self.group = nccl_sync.init(self.rank, self.world, addr, port, backend=backend,
                                    device=None if backend == "gloo" else 0)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the replicas, in place (unchanged when alone)."""
        if self.world > 1:
            self.group.all_reduce(tensor)
        return tensor

    def sum_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Every parameter's gradient summed over the replicas (a missing one counts as zero),
        a bucket of flat gradients at a time."""
        if self.world == 1:
            return
        bucket: list[torch.Tensor] = []
        size = 0
        for p in params:
            if not p.requires_grad:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            bucket.append(p.grad)
            size += p.grad.numel() * p.grad.element_size()
            if size >= BUCKET_BYTES:
                self._sum_flat(bucket)
                bucket, size = [], 0
        if bucket:
            self._sum_flat(bucket)

    def _sum_flat(self, grads: list[torch.Tensor]) -> None:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for g in grads:
            by_dtype.setdefault(g.dtype, []).append(g)
        for same in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in same])
            self.group.all_reduce(flat)
            for g, part in zip(same, flat.split([g.numel() for g in same])):
                g.copy_(part.view_as(g))

    def copy_from_first(self, modules: Iterable[torch.nn.Module | None]) -> None:
        """Every replica takes rank 0's weights and buffers (so replicas that built or warmed
        up their models apart start identical)."""
        if self.world == 1:
            return
        with torch.no_grad():
            for module in modules:
                if module is None:
                    continue
                for tensor in [*module.parameters(), *module.buffers()]:
                    data = tensor.data if tensor.is_contiguous() else tensor.data.contiguous()
                    self.group.broadcast(data, 0).wait()
                    if data is not tensor.data:
                        tensor.data.copy_(data)
