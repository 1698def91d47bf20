"""The two halves of a param_update on a group's Ray actor (`runtime.actors.GroupActor`).

Ray calls land on actor methods, so each half of a transfer has one here; each only adds
what replicas need (a sender's tp peers join the gather; a receiving leader fans the call
out to its followers) and hands over to the node's worker
(rlgraph.nodes.param_update.ParamUpdateWorker) through rlgraph.runtime.weight_sync. The
sender's halves run in the actor's default concurrency group (they hold the group), the
receiver's in `weight_sync.RECEIVE` beside the running task, `next_bucket` in
`weight_sync.SERVE`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlgraph.runtime import weight_sync as ws_sync
from rlgraph.weights import BucketMiB


class WeightEndpoints:
    """The param_update methods of `GroupActor`: they use its `workspace`, `outbox`,
    `_fan_out` (its followers) and `_with_model_peers` (its model's other ranks)."""

    workspace: Any
    outbox: ws_sync.Outbox
    _fan_out: Callable[..., list[Any]]
    _with_model_peers: Callable[..., Any]

    def _param_update(self, node: str) -> Any:
        """The worker of param_update `node` on this actor's workspace."""
        return self.workspace.worker(node)

    def export_weights(self, key: str, bucket_mb: BucketMiB, receivers: int = 1,
                       verify: bool = False) -> dict:
        """Sender half of an object-store param_update (default group: holds the group)."""
        worker = self._param_update(key.rpartition(":")[0])
        return self._with_model_peers(lambda: ws_sync.export_to_store(
            worker, self.outbox, key, bucket_mb, receivers, verify), passes=1 + int(verify))

    def next_bucket(self, key: str) -> dict:
        """The next bucket reference of transfer `key` for its receiver (`serve` group)."""
        return self.outbox.take(key)

    def apply_weights(self, src_actor: Any, key: str, bucket_mb: BucketMiB | None,
                      rank: int = 0) -> dict:
        """Receiver half of an object-store param_update (`receive` group: beside generate);
        the leader's call starts its followers' too."""
        import ray

        refs = self._fan_out("apply_weights", group=ws_sync.RECEIVE,
                             per_rank=lambda r: (src_actor, key, bucket_mb, r))
        info = ws_sync.apply_from_store(self._param_update(key.rpartition(":")[0]), src_actor,
                                        ws_sync.receiver_key(key, rank), bucket_mb)
        ray.get(refs)
        return info

    def free_address(self) -> tuple[str, int]:
        """IP and free port for a rendezvous hosted by this actor (a transfer's group, or
        the replicas' process group)."""
        return ws_sync.free_address()

    def join_route(self, route: str, rank: int, world: int, addr: str, port: int, backend: str,
                   bucket_mb: BucketMiB) -> int:
        """Join route's torch.distributed group (rank 0 sends; ranks 1.. receive: a receiving
        leader brings its followers in as the ranks after its own)."""
        import ray

        refs = [] if rank == 0 else self._fan_out(
            "join_route", group=ws_sync.RECEIVE, per_rank=lambda r: (
                route, rank + r, world, addr, port, backend, bucket_mb))
        self._param_update(route).join(rank, world, addr, port, backend, bucket_mb)
        ray.get(refs)
        return rank

    def send_weights(self, route: str) -> dict:
        """Sender half of an nccl param_update (default group)."""
        return self._with_model_peers(self._param_update(route).send)

    def receive_weights(self, route: str) -> dict:
        """Receiver half of an nccl param_update (`receive` group), followers' receives too."""
        import ray

        refs = self._fan_out("receive_weights", route, group=ws_sync.RECEIVE)
        info = ws_sync.receive_nccl(self._param_update(route))
        ray.get(refs)
        return info

    def local_param_update(self, node: str) -> dict:
        """param_update `node` within this workspace (train and generate colocated): the
        version live, or the streaming engine's snapshot refreshed to it."""
        return ws_sync.local_update_info(self.workspace.worker(node).local()["version"])
