"""param_update in the runtime, the Ray half: routes, actor calls, the object store. The
halves that run inside the actors (torch: cut, stage, broadcast) are the kind's worker,
`rlgraph.nodes.param_update.ParamUpdateWorker`; the bytes move through `rlgraph.weights`.

Two transports, one shape (the dots.rl overlapped transfer: gather -> send -> load per
bucket), both sized by the node's `bucket_mb` (MiB, carried as `rlgraph.weights.BucketMiB`):

- `object_store`: the sender (train group's actor, its default group: it holds that group)
  cuts the policy into `bucket_mb.produce` buckets one at a time and puts each into the
  object store, at most `OUTBOX` ahead of the receiver; the receiver (generate group's actor,
  in its `RECEIVE` concurrency group, so it runs beside a generate call) pulls bucket i+1's
  reference (from the sender's `SERVE` group) while it copies bucket i into its second
  buffer `bucket_mb.consume` at a time.
- `nccl`: a private torch.distributed group per route (NCCL on GPUs, gloo on CPU), built
  once at start (`connect_route`); the sender broadcasts produce buckets in consume chunks
  (`weights.nccl.WeightSender`), the receiver receives into its staging buffer
  (`weights.nccl.WeightReceiver(dual_buffer=True)`), again in the `RECEIVE` group.

Either way the receiver's call ends when the version is staged whole
(`Workspace.stage_weights`): that is what the driver hears as param_update's completion, and
the live weights change only at `Workspace.swap_if_staged` (the generate worker calls it,
the actor calls it before every task). `auto` means `nccl` when the actors hold GPUs and
`object_store` on a local CPU cluster (where the object store is one shared-memory copy).
When train and generate share a workspace (a colocated group), nothing moves.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlgraph.weights import BucketMiB
from rlgraph.weights.buckets import WeightSyncError

if TYPE_CHECKING:
    from rlgraph.nodes.param_update import ParamUpdateWorker

RECEIVE = "receive"  # the Ray concurrency group of the receiving halves (beside generate)
SERVE = "serve"  # the sender's group that hands bucket references out (one thread per
SERVE_THREADS = 8  # waiting receiver: a receiver of one route never blocks another's)
OUTBOX = 2  # produce buckets the sender may have in the object store ahead of the receiver
TIMEOUT_S = 3600.0  # a side that waits longer for the other fails with a clear error
# (a receiver may be sent while its sender still queues behind a long train step)


def backend_for(device: str) -> str:
    """torch.distributed backend of the nccl transport: NCCL on GPUs, gloo on CPU."""
    return "gloo" if device == "cpu" else "nccl"


def _metrics(start: float, end: float, nbytes: int) -> dict[str, float]:
    seconds = max(end - start, 1e-9)
    return {"time/param_update_s": end - start, "sync/bytes": float(nbytes),
            "sync/GBps": nbytes / seconds / 1e9}


def _info(start: float, end: float, version: int, nbytes: int, buckets: int,
          **extra: Any) -> dict[str, Any]:
    """The dict the driver reads: span, version delivered, and the metrics of the row."""
    return {"start": start, "end": end, "version": version, "bytes": nbytes,
            "buckets": buckets, **extra,
            "summary": {"policy_version": version, "bytes": nbytes, "buckets": buckets,
                        "metrics": _metrics(start, end, nbytes)}}


# ----------------------------------------------------------------------------- object store


class Outbox:
    """Per transfer key, the bucket references the sender produced and the receiver has not
    pulled yet (bounded: the sender waits when the receiver is OUTBOX buckets behind)."""

    def __init__(self) -> None:
        self._queues: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()

    def _queue(self, key: str) -> queue.Queue:
        with self._lock:
            return self._queues.setdefault(key, queue.Queue(maxsize=OUTBOX))

    def put(self, key: str, item: dict) -> None:
        """Hand over one item; waits while the receiver is behind."""
        try:
            self._queue(key).put(item, timeout=TIMEOUT_S)
        except queue.Full:
            raise WeightSyncError(f"weight transfer {key}: the receiver took no bucket for "
                                  f"{TIMEOUT_S:.0f} s") from None

    def take(self, key: str) -> dict:
        """The next item of `key` (waits for the sender); the key is forgotten after its last."""
        try:
            item = self._queue(key).get(timeout=TIMEOUT_S)
        except queue.Empty:
            raise WeightSyncError(f"weight transfer {key}: the sender produced no bucket for "
                                  f"{TIMEOUT_S:.0f} s") from None
        if "ref" not in item:
            with self._lock:
                self._queues.pop(key, None)
        return item


def receiver_key(key: str, rank: int) -> str:
    """The outbox key of receiver `rank` (a receiving group's replica) of transfer `key`."""
    return f"{key}#{rank}"


def export_to_store(worker: ParamUpdateWorker, outbox: Outbox, key: str, bucket_mb: BucketMiB,
                    receivers: int = 1, verify: bool = False) -> dict:
    """Sender half: each produce bucket into the object store as soon as the worker cuts it,
    its reference into `outbox` for each of the `receivers`; returns the span and what was
    sent (with `verify`, the SHA-256 of the weights sent, which the receiver checks)."""
    import ray

    def put(bucket: dict) -> None:
        ref = ray.put(bucket)
        for rank in range(receivers):  # in a list: Ray passes it on unresolved
            outbox.put(receiver_key(key, rank), {"ref": [ref]})

    try:
        sent = worker.export(bucket_mb, put, verify)
    except BaseException as exc:
        for rank in range(receivers):
            outbox.put(receiver_key(key, rank), {"error": f"{type(exc).__name__}: {exc}"})
        raise
    for rank in range(receivers):
        outbox.put(receiver_key(key, rank), {"done": sent})
    return sent


def apply_from_store(worker: ParamUpdateWorker, src_actor: Any, key: str,
                     bucket_mb: BucketMiB | None) -> dict:
    """Receiver half: pull bucket i+1 while bucket i is copied into the second buffer
    `bucket_mb.consume` MiB at a time; ends when the version is staged whole (not yet
    swapped in)."""
    import ray

    def pull() -> Any:
        return src_actor.next_bucket.options(concurrency_group=SERVE).remote(key)

    recv_start = time.time()
    nxt = pull()
    load_s = 0.0
    while True:
        item = ray.get(nxt)
        if "error" in item:
            raise WeightSyncError(f"the sender of {key} failed: {item['error']}")
        if "done" in item:
            sent = item["done"]
            break
        nxt = pull()  # the next bucket travels while this one is loaded
        began = time.time()
        worker.receive(ray.get(item["ref"][0]), bucket_mb)
        load_s += time.time() - began
    node, _, step = key.split("#")[0].rpartition(":")
    pieces, largest = worker.staged(sent, f"{node} at step {step}")
    return _info(sent["start"], time.time(), sent["version"], sent["bytes"], sent["buckets"],
                 send_end=sent["end"], recv_start=recv_start, load_s=load_s, pieces=pieces,
                 largest_piece=largest)


# ----------------------------------------------------------------------------- nccl / gloo


def free_address() -> tuple[str, int]:
    """This node's IP and a free TCP port (for the rendezvous store of a transfer's group or
    of a group's replicas)."""
    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port


def receive_nccl(worker: ParamUpdateWorker) -> dict:
    """Receiver half of the nccl transport: the next version staged whole, as the driver's
    info."""
    got = worker.receive_broadcast(TIMEOUT_S)
    return _info(got.pop("start"), got.pop("end"), got.pop("version"), got.pop("bytes"),
                 got.pop("buckets"), **got)


# ----------------------------------------------------------------------------- driver side


def local_update_info(version: int) -> dict:
    """The info of a param_update inside one workspace: nothing moves, `version` is live."""
    now = time.time()
    return _info(now, now, version, 0, 0)


@dataclass
class Route:
    """Where a param_update node moves weights, and how."""

    name: str  # the param_update node (its worker runs the halves in each actor)
    src_actor: Any
    dst_actor: Any
    bucket_mb: BucketMiB  # (a number: the produce size, whole tensors loaded)
    transport: str = "object_store"  # resolved: object_store | nccl
    receivers: int = 1  # replicas of the receiving group (its leader is dst_actor)
    verify: bool = False  # the receiver checks the sender's digest (object-store transport)

    def __post_init__(self) -> None:
        self.bucket_mb = BucketMiB.of(self.bucket_mb)


def connect_route(route: Route, backend: str) -> None:
    """Build the route's torch.distributed group once, before the first transfer (all ranks
    join at the same time: rank 0 hosts the rendezvous store on a free port of its node; the
    receiving leader brings in its followers)."""
    import ray

    addr, port = ray.get(route.src_actor.free_address.remote())
    world = 1 + route.receivers
    try:
        ray.get([
            route.src_actor.join_route.remote(route.name, 0, world, addr, port, backend,
                                              route.bucket_mb),
            route.dst_actor.join_route.options(concurrency_group=RECEIVE).remote(
                route.name, 1, world, addr, port, backend, route.bucket_mb),
        ])
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        raise WeightSyncError(f"{route.name}: the {backend} weight-sync group between its "
                              f"actors could not be built ({addr}:{port}): "
                              f"{type(cause).__name__}: {cause}") from None


def start_param_update(route: Route, step: int) -> tuple[Any, Any]:
    """Start one transfer; returns (receiver's info reference: the version staged whole,
    sender's reference: watched for failures only)."""
    src, dst = route.src_actor, route.dst_actor
    if src is dst:
        ref = src.local_param_update.remote(route.name)
        return ref, None
    if route.transport == "nccl":
        sent = src.send_weights.remote(route.name)
        return dst.receive_weights.options(concurrency_group=RECEIVE).remote(route.name), sent
    key = f"{route.name}:{step}"
    sent = src.export_weights.remote(key, route.bucket_mb, route.receivers, route.verify)
    info = dst.apply_weights.options(concurrency_group=RECEIVE).remote(src, key,
                                                                       route.bucket_mb)
    return info, sent


def submit_param_update(src_actor: Any, dst_actor: Any, node: str,
                        bucket_mb: BucketMiB | float, step: int = 0) -> Any:
    """Start an object-store transfer of param_update `node` from `src_actor` to `dst_actor`;
    returns the reference of its info dict (the version staged whole on the receiver)."""
    route = Route(node, src_actor, dst_actor, bucket_mb)
    return start_param_update(route, step)[0]
