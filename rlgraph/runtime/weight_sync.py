"""param_update in the runtime: the sender streams buckets, the receiver stages them while
generation runs, and the new version is switched in between generate calls (dual buffer).

Two transports, one shape (the dots.rl overlapped sync: gather -> send -> load per bucket):

- `object_store`: the sender (train group's actor, its default group: it holds that group)
  cuts the policy into `bucket_mb.produce` buckets one at a time and puts each into the
  object store, at most `OUTBOX` ahead of the receiver; the receiver (generate group's actor,
  in its `sync` concurrency group, so it runs beside a generate call) pulls bucket i+1's
  reference (from the sender's `serve` group) while it copies bucket i into its second
  buffer `bucket_mb.consume` at a time.
- `nccl`: a private torch.distributed group per route (NCCL on GPUs, gloo on CPU), built
  once at start (`connect_route`); the sender broadcasts produce buckets in consume chunks
  (`nccl_sync.WeightSender`), the receiver receives into its staging buffer
  (`nccl_sync.WeightReceiver(dual_buffer=True)`), again in the `sync` group.

Either way the receiver's call ends when the version is staged whole
(`Workspace.stage_weights`): that is what the driver hears as param_update's completion, and
the live weights change only at `Workspace.switch_if_staged` (the generate worker calls it,
the actor calls it before every task). `auto` means `nccl` when the actors hold GPUs and
`object_store` on a local CPU cluster (where the object store is one shared-memory copy).
When train and generate share a workspace (a colocated group), nothing moves.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlgraph.weights.buckets import WeightSyncError, bucket_names, digest

if TYPE_CHECKING:
    from rlgraph.worker.workspace import Workspace

SYNC = "sync"  # the Ray concurrency group of the receiving halves (beside generate)
SERVE = "serve"  # the sender's group that hands bucket references out (one thread per
SERVE_THREADS = 8  # waiting receiver: a receiver of one route never blocks another's)
OUTBOX = 2  # produce buckets the sender may have in the object store ahead of the receiver
TIMEOUT_S = 3600.0  # a side that waits longer for the other fails with a clear error
# (a receiver may be sent while its sender still queues behind a long train step)


def resolve_transport(transport: str, device: str) -> str:
    """`auto` -> `nccl` on GPUs, `object_store` on CPU; the others as written."""
    if transport == "auto":
        return "object_store" if device == "cpu" else "nccl"
    return transport


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


def _to_store(bucket: dict) -> dict:
    """Tensors as numpy arrays: Ray stores them without pickling and the receiver reads them
    in place from shared memory (dtypes numpy lacks, e.g. bfloat16, travel as raw ints)."""
    import torch

    arrays, dtypes = {}, {}
    for name, tensor in bucket["tensors"].items():
        t = tensor.detach().cpu().contiguous()
        dtypes[name] = str(t.dtype).removeprefix("torch.")
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        arrays[name] = t.numpy()
    return {**{k: v for k, v in bucket.items() if k != "tensors"}, "arrays": arrays,
            "dtypes": dtypes}


def _from_store(stored: dict) -> dict:
    """The bucket back as tensors (read-only views of the stored arrays; staging copies)."""
    import torch

    tensors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only shared memory: never written
        for name, array in stored["arrays"].items():
            dtype = getattr(torch, stored["dtypes"][name])
            tensors[name] = torch.from_numpy(array).view(dtype)
    return {**{k: v for k, v in stored.items() if k not in ("arrays", "dtypes")},
            "tensors": tensors}


class Outbox:
    """Per sync key, the bucket references the sender produced and the receiver has not
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
            raise WeightSyncError(f"weight sync {key}: the receiver took no bucket for "
                                  f"{TIMEOUT_S:.0f} s") from None

    def take(self, key: str) -> dict:
        """The next item of `key` (waits for the sender); the key is forgotten after its last."""
        try:
            item = self._queue(key).get(timeout=TIMEOUT_S)
        except queue.Empty:
            raise WeightSyncError(f"weight sync {key}: the sender produced no bucket for "
                                  f"{TIMEOUT_S:.0f} s") from None
        if "ref" not in item:
            with self._lock:
                self._queues.pop(key, None)
        return item


def receiver_key(key: str, rank: int) -> str:
    """The outbox key of receiver `rank` (a receiving group's replica) of sync `key`."""
    return f"{key}#{rank}"


def export_to_store(workspace: Workspace, outbox: Outbox, key: str, bucket_mb: float,
                    receivers: int = 1, verify: bool = False) -> dict:
    """Sender half: each produce bucket into the object store as soon as it is cut, its
    reference into `outbox` for each of the `receivers`; returns the span and what was sent
    (with `verify`, the SHA-256 of the weights sent, which the receiver checks)."""
    import ray

    start = time.time()
    nbytes = 0
    try:
        with workspace.lock:
            state = workspace.policy.state_dict()
            version = workspace.policy_version
            groups = bucket_names(state, bucket_mb)
            for index, names in enumerate(groups):
                tensors = {n: state[n] for n in names}
                nbytes += sum(t.numel() * t.element_size() for t in tensors.values())
                ref = ray.put(_to_store({"version": version, "index": index,
                                         "total": len(groups), "tensors": tensors}))
                for rank in range(receivers):  # in a list: Ray passes it on unresolved
                    outbox.put(receiver_key(key, rank), {"ref": [ref]})
            sent = {"start": start, "end": time.time(), "version": version, "bytes": nbytes,
                    "buckets": len(groups)}
            if verify:
                sent["digest"] = digest(state)
    except BaseException as exc:
        for rank in range(receivers):
            outbox.put(receiver_key(key, rank), {"error": f"{type(exc).__name__}: {exc}"})
        raise
    for rank in range(receivers):
        outbox.put(receiver_key(key, rank), {"done": sent})
    return sent


def apply_from_store(workspace: Workspace, src_actor: Any, key: str,
                     consume_mb: float | None) -> dict:
    """Receiver half: pull bucket i+1 while bucket i is copied into the second buffer in
    `consume_mb` pieces; ends when the version is staged whole (not yet switched in)."""
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
        workspace.receive_bucket(_from_store(ray.get(item["ref"][0])), consume_mb)
        load_s += time.time() - began
    workspace.stage_weights(sent["version"])
    if sent.get("digest"):
        check_digest(workspace, key, sent)
    pieces, largest = workspace.staging_pieces()
    return _info(sent["start"], time.time(), sent["version"], sent["bytes"], sent["buckets"],
                 send_end=sent["end"], recv_start=recv_start, load_s=load_s, pieces=pieces,
                 largest_piece=largest)


def check_digest(workspace: Workspace, key: str, sent: dict) -> None:
    """The staged weights hash to what the sender sent, or a WeightSyncError naming the
    sync's step and version."""
    got = workspace.staged_digest()
    if got != sent["digest"]:
        node, _, step = key.split("#")[0].rpartition(":")
        raise WeightSyncError(
            f"{node} at step {step}: the weights of version {sent['version']} arrived changed "
            f"(sender SHA-256 {sent['digest'][:12]}..., receiver {got[:12]}...); the transfer "
            f"corrupted them, so the run stops before generate uses them")


# ----------------------------------------------------------------------------- nccl / gloo


def free_address() -> tuple[str, int]:
    """This node's IP and a free TCP port (for the rendezvous store of a sync group)."""
    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port


@dataclass
class NcclEnd:
    """One actor's side of a route's torch.distributed group."""

    group: Any
    produce_bytes: int
    sender: Any = None
    receiver: Any = None
    syncs: int = 0  # syncs so far: names the store key that starts the next one


def join_group(workspace: Workspace, rank: int, world: int, addr: str, port: int, backend: str,
               produce_mb: float, consume_mb: float) -> NcclEnd:
    """Join the route's group: rank 0 sends the policy, ranks 1.. receive into staging."""
    from rlgraph.weights import nccl as nccl_sync

    device = None if backend == "gloo" else workspace.device
    if device == "cuda":
        device = None  # the actor's one visible GPU
    group = nccl_sync.init(rank, world, addr, port, backend=backend, device=device)
    produce = int(produce_mb * 2**20)
    if rank == 0:
        return NcclEnd(group, produce, sender=nccl_sync.WeightSender(group, produce_mb,
                                                                     consume_mb))
    targets = workspace.policy.state_dict()
    receiver = nccl_sync.WeightReceiver(group, targets, consume_mb=consume_mb,
                                        dual_buffer=True, version=workspace.policy_version)
    return NcclEnd(group, produce, receiver=receiver)


def send_nccl(workspace: Workspace, end: NcclEnd) -> dict:
    """Sender half: broadcast the policy as its current version (produce buckets, consume
    chunks, gather overlapped with the send on GPUs)."""
    start = time.time()
    with workspace.lock:
        version = workspace.policy_version
        end.syncs += 1
        end.group.store.set(f"go/{end.syncs}", str(version))  # the receiver may enter
        stats = end.sender.send(workspace.policy.state_dict().items(), version)
    return {"start": start, "end": time.time(), "version": version, "bytes": stats.bytes,
            "buckets": stats.produce_buckets}


def receive_nccl(workspace: Workspace, end: NcclEnd) -> dict:
    """Receiver half: the next version into the staging buffer, then staged whole."""
    import datetime

    end.syncs += 1
    # wait on the host for the sender to start: a collective entered early would spin on
    # the GPU beside generation (and run into the communicator's timeout) while train runs
    end.group.store.wait([f"go/{end.syncs}"], datetime.timedelta(seconds=TIMEOUT_S))
    workspace.switch_if_staged()  # staging is about to be overwritten
    stats = end.receiver.receive()
    finish = time.time()
    workspace.stage_weights(stats.version, end.receiver.commit)
    return _info(finish - stats.seconds, finish, stats.version, stats.bytes,
                 -(-stats.bytes // max(end.produce_bytes, 1)), recv_start=finish - stats.seconds,
                 pieces=stats.chunks)


# ----------------------------------------------------------------------------- driver side


def local_sync(workspace: Workspace) -> dict:
    """param_update inside one workspace: the policy is already the trained one."""
    return local_update_info(workspace.policy_version)


def local_update_info(version: int) -> dict:
    """The info of a param_update inside one workspace: nothing moves, `version` is live."""
    now = time.time()
    return _info(now, now, version, 0, 0)


@dataclass
class Route:
    """Where a param_update node moves weights, and how."""

    name: str
    src_actor: Any
    dst_actor: Any
    produce_mb: float
    consume_mb: float | None = None
    transport: str = "object_store"  # resolved: object_store | nccl
    receivers: int = 1  # replicas of the receiving group (its leader is dst_actor)
    verify: bool = False  # the receiver checks the sender's digest (object-store transport)


def connect_route(route: Route, backend: str) -> None:
    """Build the route's torch.distributed group once, before the first sync (all ranks join
    at the same time: rank 0 hosts the rendezvous store on a free port of its node; the
    receiving leader brings in its followers)."""
    import ray

    addr, port = ray.get(route.src_actor.free_address.remote())
    consume = route.consume_mb or route.produce_mb
    world = 1 + route.receivers
    try:
        ray.get([
            route.src_actor.join_sync.remote(route.name, 0, world, addr, port, backend,
                                             route.produce_mb, consume),
            route.dst_actor.join_sync.options(concurrency_group=SYNC).remote(
                route.name, 1, world, addr, port, backend, route.produce_mb, consume),
        ])
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        raise WeightSyncError(f"{route.name}: the {backend} weight-sync group between its "
                              f"actors could not be built ({addr}:{port}): "
                              f"{type(cause).__name__}: {cause}") from None


def start_param_update(route: Route, step: int) -> tuple[Any, Any]:
    """Start one sync; returns (receiver's info reference: the version staged whole, sender's
    reference: watched for failures only)."""
    src, dst = route.src_actor, route.dst_actor
    if src is dst:
        ref = src.local_sync.remote()
        return ref, None
    if route.transport == "nccl":
        sent = src.send_weights.remote(route.name)
        return dst.receive_weights.options(concurrency_group=SYNC).remote(route.name), sent
    key = f"{route.name}:{step}"
    sent = src.export_weights.remote(key, route.produce_mb, route.receivers, route.verify)
    info = dst.apply_weights.options(concurrency_group=SYNC).remote(src, key, route.consume_mb)
    return info, sent


def submit_param_update(src_actor: Any, dst_actor: Any, bucket_mb: float,
                        consume_mb: float | None = None, step: int = 0) -> Any:
    """Start an object-store sync from `src_actor` to `dst_actor`; returns the reference of
    its info dict (the version staged whole on the receiver)."""
    route = Route("param_update", src_actor, dst_actor, bucket_mb, consume_mb)
    return start_param_update(route, step)[0]
