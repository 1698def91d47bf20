"""The weight-sync group: the process group spanning the train process (rank 0, the sender)
and the generate processes (ranks 1.., the receivers) of one `param_update` route.

`init(..., private=True)` builds a standalone torch.distributed backend (ProcessGroupNCCL or
ProcessGroupGloo) over a TCPStore, so actors that already own a default process group (FSDP,
megatron) are not disturbed; `private=False` joins torch's default group instead. The sync
protocol over it is `weights.nccl` (`WeightSender`, `WeightReceiver`).
"""

from __future__ import annotations

import datetime
from typing import Any

import torch

from rlgraph.errors import MissingDependencyError
from rlgraph.weights.layout import WeightSyncError

_STORE_PREFIX = "rlgraph/weight_sync/"


class SyncGroup:
    """The process group spanning the train process (rank 0) and the generate processes."""

    def __init__(self, rank: int, world: int, backend: str, device: torch.device,
                 store: Any, pg: Any, private: bool):
        self.rank, self.world, self.backend, self.device = rank, world, backend, device
        self.store, self._pg, self.private = store, pg, private

    @property
    def is_cuda(self) -> bool:
        """Whether tensors of this group live on a GPU (streams and events apply)."""
        return self.device.type == "cuda"

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> Any:
        """Start broadcasting `tensor` from `src`; returns the work (call `.wait()`)."""
        if self.private:
            opts = torch.distributed.BroadcastOptions()
            opts.rootRank = src
            opts.rootTensor = 0
            return self._pg.broadcast([tensor], opts)
        return torch.distributed.broadcast(tensor, src, async_op=True)

    def barrier(self) -> None:
        """All ranks meet here: a one-element broadcast from every rank in turn (a single
        broadcast would let its root leave before the others arrive), finished on the host."""
        t = torch.zeros(1, device=self.device)
        for src in range(self.world):
            self.broadcast(t, src).wait()
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def close(self) -> None:
        """Release the communicator."""
        if not self.private and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        self._pg = None


def init(rank: int, world: int, master_addr: str, port: int, *, backend: str = "nccl",
         device: torch.device | str | int | None = None, timeout_s: float = 600.0,
         private: bool = True) -> SyncGroup:
    """Join the weight-sync group: rank 0 is the train process, ranks 1.. the generate processes.

    Every member calls this with the same `world`, `master_addr` and `port` (rank 0 listens).
    `private=True` builds a standalone backend over a TCPStore and leaves torch's default group
    alone; `private=False` uses `torch.distributed.init_process_group` instead.
    """
    if backend not in ("nccl", "gloo"):
        raise WeightSyncError(f"backend must be 'nccl' or 'gloo', not {backend!r}")
    if not torch.distributed.is_available():
        raise MissingDependencyError("weight sync needs torch.distributed, which this torch "
                                     "build lacks")
    if backend == "nccl":
        require_cuda_nccl()
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    timeout = datetime.timedelta(seconds=timeout_s)
    if not private:
        torch.distributed.init_process_group(
            backend, init_method=f"tcp://{master_addr}:{port}", rank=rank, world_size=world,
            timeout=timeout)
        store = torch.distributed.distributed_c10d._get_default_store()
        return SyncGroup(rank, world, backend, device,
                         torch.distributed.PrefixStore(_STORE_PREFIX, store), None, False)
    store = torch.distributed.TCPStore(master_addr, port, world, rank == 0, timeout=timeout)
    store = torch.distributed.PrefixStore(_STORE_PREFIX, store)
    if backend == "gloo":
        pg = torch.distributed.ProcessGroupGloo(store, rank, world, timeout)
    else:
        opts = torch.distributed.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = torch.distributed.ProcessGroupNCCL(torch.distributed.PrefixStore("nccl/", store),
                                                rank, world, opts)
    if hasattr(pg, "_set_sequence_number_for_group"):  # as torch does for its own groups
        pg._set_sequence_number_for_group()
    return SyncGroup(rank, world, backend, device, store, pg, True)


def require_cuda_nccl() -> None:
    """Raise MissingDependencyError naming what is missing for the NCCL path."""
    if not torch.cuda.is_available():
        raise MissingDependencyError(
            "NCCL weight sync needs a CUDA GPU, but torch.cuda.is_available() is False on this "
            f"machine (torch {torch.__version__}); use backend='gloo' to sync CPU tensors")
    if not torch.distributed.is_nccl_available():
        raise MissingDependencyError(
            f"NCCL weight sync needs NCCL, but this torch build ({torch.__version__}) has none")
