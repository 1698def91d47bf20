"""Data parallelism inside a group: its replicas (one process per GPU, or `replicas` CPU
processes) start from the same weights, each data-parallel rank runs a share of a task's
rows, and train sums their gradients, so every replica takes the same optimizer step and the
group acts as one process with W times the hardware (verl's FSDP data parallelism, minus
the sharding).

The group's processes form torch.distributed's default process group (megatron-core builds
its tensor-parallel groups inside it). With a megatron `tp` of k, k consecutive ranks hold
one model between them and see the same rows: the data-parallel size is world / k, and
gradients are summed over megatron's data-parallel group. Which rows a rank takes is the
kind's business (`DATA_PARALLEL` of its worker, read by rlgraph.runtime.actors).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

BUCKET_BYTES = 64 << 20  # gradients are summed this many bytes at a time
TIMEOUT_S = 1800.0


@dataclass
class Replicas:
    """This process's place among its group's replicas."""

    rank: int = 0
    world: int = 1
    model_parallel: int = 1  # consecutive ranks that hold one model (megatron tp x pp)

    @property
    def dp_rank(self) -> int:
        """Which data-parallel share of the rows this process runs."""
        return self.rank // self.model_parallel

    @property
    def dp_world(self) -> int:
        """How many shares the rows are cut into."""
        return self.world // self.model_parallel

    @property
    def model_rank(self) -> int:
        """This process's rank within its model (its tensor-parallel shard)."""
        return self.rank % self.model_parallel

    @property
    def tag(self) -> tuple[int, ...]:
        """What tells data-parallel ranks' random streams apart: () alone, (dp_rank,) else."""
        return () if self.dp_world == 1 else (self.dp_rank,)

    def join(self, addr: str, port: int, backend: str) -> None:
        """Join the group's processes as torch.distributed's default group (every replica
        calls this at the same time; rank 0 hosts the rendezvous on `addr:port`)."""
        import torch.distributed as dist

        if backend == "nccl":
            torch.cuda.set_device(0)  # Ray shows each replica its one GPU
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                world_size=self.world,
                                timeout=datetime.timedelta(seconds=TIMEOUT_S))

    def _dp_group(self) -> Any:
        """The data-parallel peers' group: the whole world, or megatron's data-parallel one."""
        if self.model_parallel == 1:
            return None
        from megatron.core import parallel_state

        return parallel_state.get_data_parallel_group()

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the data-parallel ranks, in place (unchanged when alone)."""
        if self.dp_world > 1:
            import torch.distributed as dist

            dist.all_reduce(tensor, group=self._dp_group())
        return tensor

    def sum_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Every parameter's gradient summed over the data-parallel ranks (a missing one
        counts as zero), a bucket of flat gradients at a time."""
        if self.dp_world == 1:
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
            flat = self.all_reduce(torch.cat([g.reshape(-1) for g in same]))
            for g, part in zip(same, flat.split([g.numel() for g in same])):
                g.copy_(part.view_as(g))

    def copy_from_first(self, module: torch.nn.Module) -> None:
        """Every replica takes rank 0's weights and buffers of `module` (a whole, unsharded
        model), so replicas that built or warmed it up apart start identical."""
        if self.world == 1:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                data = tensor.data.contiguous()
                dist.broadcast(data, 0)
                if data.data_ptr() != tensor.data.data_ptr():
                    tensor.data.copy_(data)


def model_parallel_of(spec: Any, tasks: list[str]) -> int:
    """Processes one model copy of the group spans: megatron's tp x pp, else 1."""
    sizes = [spec.nodes[t].tp * spec.nodes[t].pp for t in tasks
             if getattr(spec.nodes[t], "backend", "torch") == "megatron"]
    return max(sizes, default=1)
