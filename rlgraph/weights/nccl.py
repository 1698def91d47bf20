"""Bucketed, overlapped, versioned weight sync from the train process to generate processes.

Design (the dots.rl nccl-sync recipe, expressed once):

- **One byte stream.** Sender and receivers agree on a `Layout`: every tensor's name, shape,
  dtype and byte offset in one virtual concatenation (16-byte aligned). The sender publishes
  the layout in the group's store under its hash; every sync starts with a small header
  broadcast `[magic, version, layout hash, total bytes, chunk bytes]`, so a receiver whose
  model differs fails loudly instead of loading garbage.
- **Produce / consume buckets.** The sender gathers the stream into two flat buffers of
  `bucket_mb.produce` MiB (produce buckets) and broadcasts them in chunks of
  `bucket_mb.consume` MiB (the receiver's granularity; both in bytes: `produce_bytes`,
  `consume_bytes`). A tensor larger than a bucket simply
  spans several buckets; many small tensors share one.
- **Overlap.** On CUDA the sender gathers on a side stream, chunk by chunk: chunk j+1 is packed
  while NCCL broadcasts chunk j, and a produce buffer is refilled only after the broadcasts
  that read it are done (stream waits, never host waits). A direct-loading receiver unpacks
  chunk j on its own stream while chunk j+1 arrives in the other buffer (load). The host only
  enqueues work.
- **Versions.** `WeightReceiver(dual_buffer=True)` receives into a staging copy of the weights
  while generation keeps using the live ones, and `commit()` copies staging into the live
  tensors in place (addresses never change, so captured CUDA graphs stay valid) and only then
  bumps `version`: generation never sees a half-updated model. `dual_buffer=False` loads straight
  into the live tensors with two consume-sized buffers (for a GPU without room for a second
  copy); the caller pauses generation, and the version is committed once every chunk arrived.
- **Host cost.** Every slice and copy of a sync is planned once per layout and reused, so a sync
  costs the host a few launches per chunk and the GPU, not Python, sets the pace. Measured on
  2x H200 (bench/results/gpu-nccl-sync.json): a 1.5B bf16 model in 10.1 ms at 307 GB/s (87% of
  the raw 128 MB broadcast), a 7.6B one in 46 ms at 329 GB/s (93%), bit for bit; a dual-buffer
  receive of the 1.5B model lands in staging in 9.9 ms and its commit copy takes 2.1 ms.

The group (`weights.sync_group`: rank 0 sends, ranks 1.. receive) is its own torch.distributed
backend, so actors that already own a default process group (FSDP, megatron) are not disturbed.
`backend` "nccl" needs CUDA; "gloo" runs the same protocol on CPU tensors (tests, CI). The
runtime uses it for `param_update.transport: nccl` (rlgraph.runtime.weight_sync, the actor halves in
rlgraph.nodes.param_update): one group per route, the receive in the generate actor's `receive`
concurrency group, dual buffer, swap on request.
Through `rlgraph run` on 2x H200 (Ray actors, one GPU each, NCCL P2P/CUMEM over NVLink) a
716 MB bf16 policy synced in 2.3-2.5 ms (282-305 GB/s) and generate paused ~1 ms per switch.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlgraph.weights import MIB, BucketMiB
from rlgraph.weights.layout import (
    ALIGN,
    CopyPlan,
    Layout,
    WeightSyncError,
    as_bytes,
    bytes_view,
)
from rlgraph.weights.sync_group import SyncGroup

DEFAULT_BUCKET_MB = BucketMiB(512, 128)  # param_update's defaults (rlgraph.nodes.param_update)
MAGIC = 0x726C6772  # "rlgr"


# ----------------------------------------------------------------------------- group


@dataclass
class SyncStats:
    """What one sync moved and how long it took (host clock, after the device finished)."""

    version: int
    bytes: int
    seconds: float  # from the call (sender) or from the header's arrival (receiver) to done
    produce_buckets: int
    chunks: int
    host_seconds: float = 0.0  # of which the host spent enqueueing work

    @property
    def gbps(self) -> float:
        """Bytes per second in GB/s (1e9)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


# ----------------------------------------------------------------------------- streams


class _Streams:
    """Side streams and events on CUDA; no-ops on CPU (gloo works finish on the host)."""

    def __init__(self, group: SyncGroup, names: Iterable[str]):
        self.cuda = group.is_cuda
        self.s = {n: torch.cuda.Stream(group.device) for n in names} if self.cuda else {}

    def on(self, name: str) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(self.s[name]) if self.cuda else contextlib.nullcontext()

    def wait_current(self, name: str) -> None:
        """Stream `name` waits for the work already queued on the caller's stream."""
        if self.cuda:
            self.s[name].wait_stream(torch.cuda.current_stream())

    def join(self, name: str) -> None:
        """The caller's stream waits for everything queued on stream `name`."""
        if self.cuda:
            torch.cuda.current_stream().wait_stream(self.s[name])

    def event(self) -> Any:
        """An event recorded on the current stream (None on CPU)."""
        if not self.cuda:
            return None
        ev = torch.cuda.Event()
        ev.record()
        return ev

    @staticmethod
    def wait_event(ev: Any) -> None:
        if ev is not None:
            torch.cuda.current_stream().wait_event(ev)


def _aligned_bytes(mb: float, what: str) -> int:
    """`bucket_mb.<what>` MiB in bytes, rounded up to the layout's alignment."""
    n = int(mb * MIB)
    if n <= 0:
        raise WeightSyncError(f"bucket_mb.{what} must be positive, got {mb}")
    return -(-n // ALIGN) * ALIGN


def _consume_mb(bucket_mb: BucketMiB) -> float:
    """The broadcast chunk: `bucket_mb.consume`, or whole produce buckets when it is None."""
    return bucket_mb.produce if bucket_mb.consume is None else bucket_mb.consume


# ----------------------------------------------------------------------------- sender


class WeightSender:
    """Rank 0: gathers weights into produce buckets and broadcasts them in consume chunks."""

    def __init__(self, group: SyncGroup, bucket_mb: BucketMiB | float = DEFAULT_BUCKET_MB):
        bucket_mb = BucketMiB.of(bucket_mb)
        self.group = group
        self.consume_bytes = _aligned_bytes(_consume_mb(bucket_mb), "consume")
        produce = _aligned_bytes(bucket_mb.produce, "produce")
        if produce < self.consume_bytes or produce % self.consume_bytes:
            raise WeightSyncError(
                f"bucket_mb.produce ({bucket_mb.produce}) must be a multiple of "
                f"bucket_mb.consume ({bucket_mb.consume}): the sender cuts each produce "
                "bucket into consume chunks")
        self.produce_bytes = produce
        self._bufs: list[torch.Tensor] = []
        self._layouts: dict[tuple, Layout] = {}
        self._published: set[int] = set()
        self._streams = _Streams(group, ["pack"])
        self._plan_key: tuple | None = None
        self._plan: list[tuple[int, torch.Tensor, CopyPlan]] = []
        self._keep: list[Any] = []

    def _layout(self, items: list[tuple[str, torch.Tensor]]) -> Layout:
        spec = tuple((name, tuple(t.shape), t.dtype) for name, t in items)
        if spec not in self._layouts:
            self._layouts[spec] = Layout.build(spec)
        return self._layouts[spec]

    def _make_plan(self, layout: Layout, tensors: list[torch.Tensor]
                   ) -> list[tuple[int, torch.Tensor, CopyPlan]]:
        """Per consume chunk: its produce bucket, its slice of the bucket buffer, the copies
        that gather its bytes. Cached while the tensors stay where they are."""
        key = (layout.key, tuple(t.data_ptr() for t in tensors))
        if key == self._plan_key:
            return self._plan
        size = min(self.produce_bytes, -(-layout.total // ALIGN) * ALIGN) or ALIGN
        if not self._bufs or self._bufs[0].numel() < size:
            self._bufs = [torch.empty(size, dtype=torch.uint8, device=self.group.device)
                          for _ in range(2)]
        srcs = [as_bytes(t) for t in tensors]  # a non-contiguous tensor is copied here
        plan = []
        for c in range(0, layout.total, self.consume_bytes):
            k = c // self.produce_bytes
            base, buf = k * self.produce_bytes, self._bufs[k % 2]
            hi = min(c + self.consume_bytes, layout.total)
            copies = layout.copies(
                c, hi,
                lambda i, a, b, buf=buf, base=base: buf[layout.slots[i].offset + a - base:
                                                        layout.slots[i].offset + b - base],
                lambda i, a, b: srcs[i][a:b])
            plan.append((k, buf[c - base:hi - base], copies))
        if all(t.is_contiguous() for t in tensors):
            self._plan_key, self._plan = key, plan
        return plan

    def send(self, named: Iterable[tuple[str, torch.Tensor]], version: int,
             wait: bool = True) -> SyncStats:
        """Broadcast `named` tensors as policy `version`; every receiver must call `receive`."""
        start = time.perf_counter()
        items = list(named)
        dev = self.group.device
        for name, t in items:
            if t.device != dev:
                raise WeightSyncError(f"tensor {name!r} is on {t.device}, the group on {dev}")
        layout = self._layout(items)
        if layout.key not in self._published:
            self.group.store.set(f"layout/{layout.key}", layout.json)
            self._published.add(layout.key)
        header = torch.tensor([MAGIC, version, layout.key, layout.total, self.consume_bytes],
                              dtype=torch.int64, device=dev)
        st = self._streams
        st.wait_current("pack")  # the optimizer's writes to the weights come first
        works: dict[int, list[Any]] = {}
        with st.on("pack"):
            self.group.broadcast(header).wait()
            plan = self._make_plan(layout, [t for _, t in items])
            for k, view, copies in plan:
                if k not in works:
                    for w in works.pop(k - 2, []):  # the buffer's last broadcasts are done
                        w.wait()
                    works[k] = []
                copies.run()
                works[k].append(self.group.broadcast(view))
            for bucket in works.values():
                for w in bucket:
                    w.wait()
        st.join("pack")  # later writes to the weights wait for the gather
        self._keep = [header]
        host = time.perf_counter() - start
        if wait and self.group.is_cuda:
            torch.cuda.current_stream().synchronize()
        n_buckets = -(-layout.total // self.produce_bytes)
        return SyncStats(version, layout.total, time.perf_counter() - start, n_buckets, len(plan),
                         host)


    def send_gathered(self, specs: list[tuple[str, tuple[int, ...], torch.dtype]],
                      buckets: Iterator[dict[str, torch.Tensor]], version: int,
                      wait: bool = True) -> SyncStats:
        """Broadcast weights that become whole a bucket at a time (a sharded policy gathers
        each bucket as it is reached): `specs` are their (name, shape, dtype) in the order
        `buckets` yields them. Receivers see the same header and consume chunks as `send`'s;
        the sender holds the buckets a chunk spans and two chunk buffers, never the model."""
        start = time.perf_counter()
        dev = self.group.device
        layout = Layout.build(specs)
        if layout.key not in self._published:
            self.group.store.set(f"layout/{layout.key}", layout.json)
            self._published.add(layout.key)
        header = torch.tensor([MAGIC, version, layout.key, layout.total, self.consume_bytes],
                              dtype=torch.int64, device=dev)
        self.group.broadcast(header).wait()
        index = {slot.name: i for i, slot in enumerate(layout.slots)}
        held: dict[int, torch.Tensor] = {}  # slot -> its whole tensor's bytes
        bufs = [torch.empty(self.consume_bytes, dtype=torch.uint8, device=dev) for _ in range(2)]
        works: list[Any] = [None, None]
        chunks = gathered = 0
        for c in range(0, layout.total, self.consume_bytes):
            hi = min(c + self.consume_bytes, layout.total)
            buf = bufs[chunks % 2]
            if works[chunks % 2] is not None:
                works[chunks % 2].wait()  # the broadcast that read this buffer is done
            for i, a, b in layout.pieces(c, hi):
                while i not in held:
                    bucket = next(buckets)
                    gathered += 1
                    for name, tensor in bucket.items():
                        if tensor.device != dev:
                            raise WeightSyncError(f"tensor {name!r} is on {tensor.device}, "
                                                  f"the group on {dev}")
                        held[index[name]] = as_bytes(tensor)
                offset = layout.slots[i].offset
                buf[offset + a - c:offset + b - c].copy_(held[i][a:b])
            works[chunks % 2] = self.group.broadcast(buf[:hi - c])
            chunks += 1
            for i in [i for i in held if layout.slots[i].offset + layout.slots[i].nbytes <= hi]:
                del held[i]  # its last byte has gone out
        for work in works:
            if work is not None:
                work.wait()
        for _ in buckets:  # every rank of a sharded policy gathers every bucket
            gathered += 1
        self._keep = [header]
        host = time.perf_counter() - start
        if wait and self.group.is_cuda:
            torch.cuda.current_stream().synchronize()
        return SyncStats(version, layout.total, time.perf_counter() - start, gathered, chunks,
                         host)


# ----------------------------------------------------------------------------- receiver


class WeightReceiver:
    """Ranks 1..: receives a sync into staging (dual buffer) or straight into the live weights.

    `targets` maps names to the live tensors (e.g. `dict(model.named_parameters())`); they are
    updated in place, so their addresses, and CUDA graphs captured on them, stay valid.
    """

    def __init__(self, group: SyncGroup, targets: Mapping[str, torch.Tensor] | torch.nn.Module,
                 bucket_mb: BucketMiB | float = DEFAULT_BUCKET_MB, dual_buffer: bool = True,
                 strict: bool = True, version: int = 0):
        if isinstance(targets, torch.nn.Module):
            targets = dict(targets.named_parameters())
        self.group = group
        self.targets = dict(targets)
        self.consume_bytes = _aligned_bytes(_consume_mb(BucketMiB.of(bucket_mb)), "consume")
        self.dual_buffer = dual_buffer
        self.strict = strict
        self.version = version  # the version the live tensors hold
        self.pending_version: int | None = None  # received into staging, not yet committed
        self._plans: dict[int, tuple[Layout, list[Any], CopyPlan | None]] = {}
        self._staging: torch.Tensor | None = None
        self._bufs: list[torch.Tensor] = []
        self._streams = _Streams(group, ["recv", "unpack"])
        self._recv_done: Any = None
        self._commit_done: Any = None
        self._pending: Layout | None = None

    def _plan(self, key: int) -> tuple[Layout, list[Any], CopyPlan | None]:
        """For a layout: its chunks (staged: views of staging; direct: (buffer view, unpack
        copies)) and, staged, the commit copies. Built once per layout."""
        if key in self._plans:
            return self._plans[key]
        layout = Layout.from_json(self.group.store.get(f"layout/{key}"))
        dsts = [bytes_view(t) for t in layout.match(self.targets, self.strict)]
        dev, total, step = self.group.device, layout.total, self.consume_bytes
        ranges = [(c, min(c + step, total)) for c in range(0, total, step)]
        commit = None
        if self.dual_buffer:
            if self._staging is None or self._staging.numel() < total:
                self._staging = torch.empty(max(total, ALIGN), dtype=torch.uint8, device=dev)
                self._plans.clear()  # their views point into the old staging buffer
            staging = self._staging
            chunks = [staging[lo:hi] for lo, hi in ranges]
            commit = CopyPlan(dsts, [staging[s.offset:s.offset + s.nbytes] for s in layout.slots])
        else:
            if not self._bufs:
                self._bufs = [torch.empty(step, dtype=torch.uint8, device=dev) for _ in range(2)]
            chunks = []
            for j, (lo, hi) in enumerate(ranges):
                buf = self._bufs[j % 2]
                copies = layout.copies(
                    lo, hi, lambda i, a, b: dsts[i][a:b],
                    lambda i, a, b, buf=buf, lo=lo: buf[layout.slots[i].offset + a - lo:
                                                        layout.slots[i].offset + b - lo])
                chunks.append((buf[:hi - lo], copies))
        self._plans[key] = (layout, chunks, commit)
        return self._plans[key]

    def receive(self, wait: bool = True) -> SyncStats:
        """Receive one sync. Dual buffer: staged until `commit()`; direct: committed on return."""
        # On the receive stream, not behind generation's kernels on the caller's stream; the
        # header is zeroed there too, or a zero fill queued behind those kernels could land
        # after the broadcast has written it.
        with self._streams.on("recv"):
            header = torch.zeros(5, dtype=torch.int64, device=self.group.device)
            self.group.broadcast(header).wait()
            magic, version, key, total, chunk = header.tolist()  # waits for the sender
        start = time.perf_counter()
        if magic != MAGIC:
            raise WeightSyncError(f"bad weight-sync header {header.tolist()}: the ranks are out "
                                  "of step (every send needs exactly one receive)")
        if chunk != self.consume_bytes:
            raise WeightSyncError(
                f"the sender broadcasts {chunk} B chunks, this receiver expects "
                f"{self.consume_bytes} B: "
                "give both sides the same bucket_mb.consume")
        with self._streams.on("recv"):  # a new staging buffer is the receive stream's memory
            layout, chunks, _ = self._plan(key)
        if self.dual_buffer:
            self._receive_staged(chunks)
            self.pending_version, self._pending = version, layout
        else:
            self._receive_direct(chunks)
            self.version = version
        host = time.perf_counter() - start
        if wait and self.group.is_cuda:
            torch.cuda.current_stream().synchronize()
            self._streams.s["recv"].synchronize()
        return SyncStats(version, total, time.perf_counter() - start, 0, len(chunks), host)

    def _receive_staged(self, chunks: list[torch.Tensor]) -> None:
        st = self._streams
        with st.on("recv"):
            st.wait_event(self._commit_done)  # the last commit has finished reading staging
            works = [self.group.broadcast(view) for view in chunks]
            for w in works:
                w.wait()
            self._recv_done = st.event()

    def _receive_direct(self, chunks: list[tuple[torch.Tensor, CopyPlan]]) -> None:
        st = self._streams
        st.wait_current("recv")
        st.wait_current("unpack")  # generation's reads of the live weights come first
        unpacked: list[Any] = [None, None]
        for j, (view, copies) in enumerate(chunks):
            with st.on("recv"):
                st.wait_event(unpacked[j % 2])  # buffer free once chunk j-2 is unpacked
                work = self.group.broadcast(view)
            with st.on("unpack"):
                work.wait()
                copies.run()
                unpacked[j % 2] = st.event()
        st.join("unpack")

    def commit(self) -> int:
        """Copy the staged version into the live tensors (in place) and make it current."""
        if not self.dual_buffer:
            return self.version
        if self._pending is None or self.pending_version is None:
            raise WeightSyncError("commit() without a received version: call receive() first")
        _, _, copies = self._plan(self._pending.key)
        self._streams.wait_event(self._recv_done)
        with torch.no_grad():
            copies.run()
        return self.mark_committed()

    def staged_tensors(self) -> dict[str, torch.Tensor]:
        """The staged version as tensors (views of the staging buffer), for an engine that loads
        weights itself (sglang); call `mark_committed()` once it has."""
        if self._pending is None or self._staging is None:
            raise WeightSyncError("no staged version: call receive() with dual_buffer=True")
        self._streams.wait_event(self._recv_done)
        return {s.name: self._staging[s.offset:s.offset + s.nbytes].view(getattr(torch, s.dtype))
                .view(s.shape) for s in self._pending.slots}

    def mark_committed(self) -> int:
        """The staged version is now the live one (staging may be overwritten by the next sync)."""
        if self.pending_version is None:
            raise WeightSyncError("nothing staged to commit: call receive() first")
        self._commit_done = self._streams.event()
        self.version, self.pending_version, self._pending = self.pending_version, None, None
        return self.version
