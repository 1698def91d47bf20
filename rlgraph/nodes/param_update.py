"""`param_update`: move the new weights from `train` to `generate`, in buckets.

Its spec (`bucket_mb` in MiB, `transport`), its cost model, and its worker: the halves of
a weight transfer that run inside the sender's and the receiver's actors (torch only; the Ray
half, routes and actor calls, is `rlgraph.runtime.weight_sync`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from rlgraph.nodes.base import EdgeList, NodeKind, NodeSpec
from rlgraph.pricing.param_update import param_update_cost
from rlgraph.weights import BucketMiB

if TYPE_CHECKING:
    from rlgraph.process.workspace import Workspace


class ParamUpdateSpec(NodeSpec):
    """Weight sync from `src` (a train node) to `dst` (a generate node)."""

    kind: Literal["param_update"] = "param_update"
    src: str = "train"
    dst: str = "generate"
    bucket_mb: BucketMiB = Field(default_factory=BucketMiB)
    transport: Literal["auto", "nccl", "object_store"] = "auto"


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
    colour="#e15759",
    worker="rlgraph.nodes.param_update:ParamUpdateWorker",
    doc="versioned weight transfer from train to generate",
)


# ----------------------------------------------------------------------------- worker


@dataclass
class NcclEnd:
    """One actor's side of a route's torch.distributed group."""

    group: Any
    bucket_mb: BucketMiB
    sender: Any = None
    receiver: Any = None
    transfers: int = 0  # so far: names the store key that starts the next one


class ParamUpdateWorker:
    """The halves of one param_update node's transfer that run in an actor, on the workspace
    of its group: the sender's (the train group) and the receiver's (the generate group).
    Each returns the transfer's span and size; `rlgraph.runtime.weight_sync` moves the data
    between actors and reads nothing else."""

    def __init__(self, name: str, node: ParamUpdateSpec, workspace: Workspace):
        self.name, self.node, self.ws = name, node, workspace
        self.nccl: NcclEnd | None = None  # this actor's side of the nccl route, once joined

    def local(self) -> dict[str, Any]:
        """A transfer inside one workspace (train and generate colocated): the policy is
        already the trained one and nothing moves, except where the group streams: then
        generate decodes from a snapshot of the weights, which this refreshes in place (a
        device copy) to the current version."""
        start = time.time()
        receiver = self.ws.worker(self.node.dst)
        refresh = getattr(receiver, "refresh_snapshot", None)
        version = self.ws.policy_version if refresh is None else refresh()
        moved = 0 if getattr(receiver, "snapshot", None) is None else sum(
            t.numel() * t.element_size() for t in self.ws.policy.state_dict().values())
        return {"start": start, "end": time.time(), "version": version, "bytes": moved,
                "buckets": 0}

    # ------------------------------------------------------------ object store

    def export(self, bucket_mb: BucketMiB, put: Callable[[dict], None],
               verify: bool = False) -> dict[str, Any]:
        """Sender: cut the policy into buckets of `bucket_mb.produce` MiB, one at a time, and
        `put` each (tensors as numpy arrays); with `verify`, the SHA-256 of what was sent."""
        import torch

        from rlgraph.weights.buckets import bucket_names, to_arrays

        start, nbytes = time.time(), 0
        with self.ws.lock:
            version = self.ws.policy_version
            specs = self.ws.weight_specs()
            produce = BucketMiB.of(bucket_mb).produce_bytes
            total = len(bucket_names({n: torch.empty(shape, dtype=dtype, device="meta")
                                      for n, shape, dtype in specs}, bucket_mb))
            # a sharded policy gathers each bucket as it is reached (never the whole model)
            for index, tensors in enumerate(self.ws.weight_buckets(produce)):
                nbytes += sum(t.numel() * t.element_size() for t in tensors.values())
                put(to_arrays({"version": version, "index": index, "total": total,
                               "tensors": tensors}))
            sent = {"start": start, "end": time.time(), "version": version, "bytes": nbytes,
                    "buckets": total}
            if verify:
                sent["digest"] = self.ws.weights_digest()
        return sent

    def receive(self, stored: dict, bucket_mb: BucketMiB | None) -> None:
        """Receiver: one bucket (as `export` put it) into the second buffer,
        `bucket_mb.consume` MiB at a time."""
        from rlgraph.weights.buckets import from_arrays

        self.ws.receive_bucket(from_arrays(stored), bucket_mb)

    def staged(self, sent: dict[str, Any], where: str) -> tuple[int, int]:
        """Receiver: every bucket of `sent` arrived; stage the version whole (checked against
        the sender's digest when it sent one). Returns (copies made, bytes of the largest)."""
        self.ws.stage_weights(sent["version"])
        if sent.get("digest"):
            self.check_digest(sent, where)
        return self.ws.staging_pieces()

    def check_digest(self, sent: dict[str, Any], where: str) -> None:
        """The staged weights hash to what the sender sent, or a WeightSyncError naming
        `where` (the node and step) and the version."""
        from rlgraph.weights.buckets import WeightSyncError

        got = self.ws.staged_digest()
        if got != sent["digest"]:
            raise WeightSyncError(
                f"{where}: the weights of version {sent['version']} arrived changed "
                f"(sender SHA-256 {sent['digest'][:12]}..., receiver {got[:12]}...); the "
                f"transfer corrupted them, so the run stops before generate uses them")

    # ------------------------------------------------------------ nccl / gloo

    def join(self, rank: int, world: int, addr: str, port: int, backend: str,
             bucket_mb: BucketMiB) -> None:
        """Join the route's group: rank 0 sends the policy, ranks 1.. receive into staging."""
        from rlgraph.weights import nccl, sync_group

        device = None if backend == "gloo" else self.ws.device
        if device == "cuda":
            device = None  # the actor's one visible GPU
        group = sync_group.init(rank, world, addr, port, backend=backend, device=device)
        if rank == 0:
            self.nccl = NcclEnd(group, bucket_mb, sender=nccl.WeightSender(group, bucket_mb))
            return
        receiver = nccl.WeightReceiver(group, self.ws.policy.state_dict(), bucket_mb,
                                       dual_buffer=True, version=self.ws.policy_version)
        self.nccl = NcclEnd(group, bucket_mb, receiver=receiver)

    def send(self) -> dict[str, Any]:
        """Sender: broadcast the policy as its current version (produce buckets, consume
        chunks, gather overlapped with the send on GPUs)."""
        end = self._joined()
        start = time.time()
        with self.ws.lock:
            version = self.ws.policy_version
            end.transfers += 1
            end.group.store.set(f"go/{end.transfers}", str(version))  # the receiver may enter
            if self.ws.sharded["policy"]:  # gathered a bucket at a time as it goes out
                stats = end.sender.send_gathered(
                    self.ws.weight_specs(),
                    self.ws.weight_buckets(end.sender.produce_bytes), version)
            else:
                stats = end.sender.send(self.ws.policy.state_dict().items(), version)
        return {"start": start, "end": time.time(), "version": version, "bytes": stats.bytes,
                "buckets": stats.produce_buckets}

    def receive_broadcast(self, timeout_s: float) -> dict[str, Any]:
        """Receiver: the next version into the staging buffer, then staged whole."""
        import datetime

        end = self._joined()
        end.transfers += 1
        # wait on the host for the sender to start: a collective entered early would spin on
        # the GPU beside generation (and run into the communicator's timeout) while train runs
        end.group.store.wait([f"go/{end.transfers}"], datetime.timedelta(seconds=timeout_s))
        self.ws.swap_if_staged()  # staging is about to be overwritten
        stats = end.receiver.receive()
        finish = time.time()
        self.ws.stage_weights(stats.version, end.receiver.commit)
        return {"start": finish - stats.seconds, "end": finish, "version": stats.version,
                "bytes": stats.bytes,
                "buckets": -(-stats.bytes // end.bucket_mb.produce_bytes),
                "recv_start": finish - stats.seconds, "pieces": stats.chunks}

    def _joined(self) -> NcclEnd:
        from rlgraph.weights.buckets import WeightSyncError

        if self.nccl is None:
            raise WeightSyncError(f"{self.name}: this actor never joined the route's group")
        return self.nccl
