"""Bucketed, overlapped, versioned weight sync from the train process to generate processes.

Design (the dots.rl nccl-sync recipe, expressed once):

- **One byte stream.** Sender and receivers agree on a `Layout`: every tensor's name, shape,
  dtype and byte offset in one virtual concatenation (16-byte aligned). The sender publishes
  the layout in the group's store under its hash; every sync starts with a small header
  broadcast `[magic, version, layout hash, total bytes, chunk bytes]`, so a receiver whose
  model differs fails loudly instead of loading garbage.
- **Produce / consume buckets.** The sender packs `bucket_mb.produce` bytes of the stream at a
  time into one of two flat buffers (gather); each packed bucket goes out as broadcasts of
  `bucket_mb.consume` bytes (the receiver's granularity). A tensor larger than a bucket simply
  spans several buckets; many small tensors share one.
- **Overlap.** On CUDA the sender packs on a side stream: bucket k+1 is packed while NCCL
  broadcasts bucket k, and a buffer is refilled only after the broadcasts that read it are done
  (stream waits, never host waits). A direct-loading receiver unpacks chunk j on its own stream
  while chunk j+1 arrives in the other buffer (load). The host only enqueues work.
- **Versions.** `WeightReceiver(dual_buffer=True)` receives into a staging copy of the weights
  while generation keeps using the live ones, and `commit()` copies staging into the live
  tensors in place (addresses never change, so captured CUDA graphs stay valid) and only then
  bumps `version`: generation never sees a half-updated model. `dual_buffer=False` loads straight
  into the live tensors with two consume-sized buffers (for a GPU without room for a second
  copy); the caller pauses generation, and the version is committed once every chunk arrived.

The group is a private torch.distributed backend over a TCPStore (rank 0 sends, ranks 1.. receive),
so actors that already own a default process group (FSDP, megatron) are not disturbed. `backend`
"nccl" needs CUDA; "gloo" runs the same protocol on CPU tensors (tests, CI).
"""

from __future__ import annotations

import bisect
import contextlib
import datetime
import hashlib
import json
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlgraph.errors import MissingDependencyError, RLGraphError

MB = 1 << 20
ALIGN = 16  # byte alignment of every tensor in the stream (vectorised copies)
MAGIC = 0x726C6772  # "rlgr"
BIG_COPY = 1 << 20  # pieces at least this large get their own copy; smaller ones are batched
_STORE_PREFIX = "rlgraph/weight_sync/"


class WeightSyncError(RLGraphError):
    """The two sides of a weight sync disagree (model layout, bucket sizes, protocol)."""


# ----------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class TensorSlot:
    """One tensor's place in the byte stream."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "bfloat16", "float32", ...
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """The agreed order and byte offsets of every tensor that a sync moves."""

    slots: tuple[TensorSlot, ...]
    total: int

    @classmethod
    def build(cls, specs: Iterable[tuple[str, tuple[int, ...], torch.dtype]]) -> Layout:
        """Layout of (name, shape, dtype) in the given order, each start aligned to 16 bytes."""
        slots, offset, seen = [], 0, set()
        for name, shape, dtype in specs:
            if name in seen:
                raise WeightSyncError(f"tensor {name!r} appears twice in the weights to sync")
            seen.add(name)
            numel = 1
            for dim in shape:
                numel *= int(dim)
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            slots.append(TensorSlot(name, tuple(int(d) for d in shape), _dtype_name(dtype),
                                    offset, nbytes))
            offset += -(-nbytes // ALIGN) * ALIGN
        return cls(tuple(slots), offset)

    @classmethod
    def of(cls, named: Iterable[tuple[str, torch.Tensor]]) -> Layout:
        """Layout of named tensors, in the order given."""
        return cls.build((name, tuple(t.shape), t.dtype) for name, t in named)

    def to_json(self) -> str:
        """Serialised form published in the store."""
        return json.dumps([[s.name, list(s.shape), s.dtype] for s in self.slots])

    @classmethod
    def from_json(cls, text: str | bytes) -> Layout:
        """Inverse of `to_json`."""
        rows = json.loads(text)
        return cls.build((name, tuple(shape), getattr(torch, dtype)) for name, shape, dtype in rows)

    @property
    def key(self) -> int:
        """A 60-bit hash of names, shapes and dtypes (fits the int64 header)."""
        return int(hashlib.sha1(self.to_json().encode()).hexdigest()[:15], 16)

    def pieces(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """(slot index, first byte, end byte) of each tensor's part inside stream bytes [lo, hi)."""
        starts = [s.offset for s in self.slots]
        i = max(bisect.bisect_right(starts, lo) - 1, 0)
        while i < len(self.slots) and self.slots[i].offset < hi:
            slot = self.slots[i]
            a = max(lo, slot.offset) - slot.offset
            b = min(hi, slot.offset + slot.nbytes) - slot.offset
            if b > a:
                yield i, a, b
            i += 1

    def match(self, targets: Mapping[str, torch.Tensor], strict: bool = True) -> list[torch.Tensor]:
        """The receiver's tensor for each slot; a clear error when the two models differ."""
        missing = [s.name for s in self.slots if s.name not in targets]
        if missing:
            raise WeightSyncError(
                f"the sender sends {len(missing)} tensor(s) this receiver does not have, e.g. "
                f"{missing[:3]}: train and generate must hold the same model (names as in the "
                "generate engine's layout)")
        extra = [n for n in targets if n not in {s.name for s in self.slots}]
        if strict and extra:
            raise WeightSyncError(
                f"{len(extra)} receiver tensor(s) are never sent, e.g. {extra[:3]}: they would "
                "keep stale weights (pass strict=False to allow)")
        out = []
        for slot in self.slots:
            t = targets[slot.name]
            if tuple(t.shape) != slot.shape or _dtype_name(t.dtype) != slot.dtype:
                raise WeightSyncError(
                    f"tensor {slot.name!r}: sender has {slot.dtype}{list(slot.shape)}, receiver "
                    f"has {_dtype_name(t.dtype)}{list(t.shape)}")
            if not t.is_contiguous():
                raise WeightSyncError(f"receiver tensor {slot.name!r} is not contiguous")
            out.append(t)
        return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (a copy if it is not contiguous)."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def _copy_all(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """Copy srcs into dsts: large pieces one by one (memcpy), small ones in one batched kernel."""
    small_d, small_s = [], []
    for d, s in zip(dsts, srcs):
        if d.numel() >= BIG_COPY:
            d.copy_(s)
        else:
            small_d.append(d)
            small_s.append(s)
    if small_d:
        try:
            torch._foreach_copy_(small_d, small_s)
        except (RuntimeError, NotImplementedError):  # a torch without a batched copy for bytes
            for d, s in zip(small_d, small_s):
                d.copy_(s)


# ----------------------------------------------------------------------------- group


@dataclass
class SyncStats:
    """What one sync moved and how long it took (host clock, after the device finished)."""

    version: int
    bytes: int
    seconds: float
    produce_buckets: int
    chunks: int

    @property
    def gbps(self) -> float:
        """Bytes per second in GB/s (1e9)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


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
        """All ranks meet here (a one-element broadcast, finished on the host)."""
        t = torch.zeros(1, device=self.device)
        self.broadcast(t).wait()
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


def _mb_to_bytes(mb: float, what: str) -> int:
    n = int(mb * MB)
    if n <= 0:
        raise WeightSyncError(f"bucket_mb.{what} must be positive, got {mb}")
    return -(-n // ALIGN) * ALIGN


# ----------------------------------------------------------------------------- sender


class WeightSender:
    """Rank 0: gathers weights into produce buckets and broadcasts them in consume chunks."""

    def __init__(self, group: SyncGroup, produce_mb: float = 512, consume_mb: float = 128):
        self.group = group
        self.chunk = _mb_to_bytes(consume_mb, "consume")
        produce = _mb_to_bytes(produce_mb, "produce")
        if produce < self.chunk or produce % self.chunk:
            raise WeightSyncError(
                f"bucket_mb.produce ({produce_mb}) must be a multiple of bucket_mb.consume "
                f"({consume_mb}): the sender cuts each produce bucket into consume chunks")
        self.produce = produce
        self._bufs: list[torch.Tensor] = []
        self._published: set[int] = set()
        self._streams = _Streams(group, ["pack"])
        self._keep: list[Any] = []

    def send(self, named: Iterable[tuple[str, torch.Tensor]], version: int,
             wait: bool = True) -> SyncStats:
        """Broadcast `named` tensors as policy `version`; every receiver must call `receive`."""
        items = list(named)
        layout = Layout.of(items)
        if layout.key not in self._published:
            self.group.store.set(f"layout/{layout.key}", layout.to_json())
            self._published.add(layout.key)
        dev = self.group.device
        for name, t in items:
            if t.device != dev:
                raise WeightSyncError(f"tensor {name!r} is on {t.device}, the group on {dev}")
        start = time.perf_counter()
        header = torch.tensor([MAGIC, version, layout.key, layout.total, self.chunk],
                              dtype=torch.int64, device=dev)
        st = self._streams
        st.wait_current("pack")  # the optimizer's writes to the weights come first
        with st.on("pack"):
            self.group.broadcast(header).wait()
        size = min(self.produce, -(-layout.total // ALIGN) * ALIGN) or ALIGN
        if not self._bufs or self._bufs[0].numel() < size:
            self._bufs = [torch.empty(size, dtype=torch.uint8, device=dev) for _ in range(2)]
        works: list[list[Any]] = []
        chunks = 0
        n_buckets = -(-layout.total // self.produce)
        with st.on("pack"):
            srcs = [_bytes(t) for _, t in items]  # a non-contiguous tensor is copied here
            for k in range(n_buckets):
                lo, hi = k * self.produce, min((k + 1) * self.produce, layout.total)
                buf = self._bufs[k % 2]
                if k >= 2:  # the broadcasts that last read this buffer must be done
                    for w in works[k - 2]:
                        w.wait()
                dsts, pieces = [], []
                for i, a, b in layout.pieces(lo, hi):
                    off = layout.slots[i].offset + a - lo
                    dsts.append(buf[off:off + b - a])
                    pieces.append(srcs[i][a:b])
                _copy_all(dsts, pieces)
                bucket = []
                for c in range(lo, hi, self.chunk):
                    bucket.append(self.group.broadcast(buf[c - lo:min(c + self.chunk, hi) - lo]))
                    chunks += 1
                works.append(bucket)
            for bucket in works[-2:]:
                for w in bucket:
                    w.wait()
        st.join("pack")  # later writes to the weights wait for the gather
        self._keep = [header, srcs]
        if wait and self.group.is_cuda:
            torch.cuda.current_stream().synchronize()
        return SyncStats(version, layout.total, time.perf_counter() - start, n_buckets, chunks)


# ----------------------------------------------------------------------------- receiver


class WeightReceiver:
    """Ranks 1..: receives a sync into staging (dual buffer) or straight into the live weights.

    `targets` maps names to the live tensors (e.g. `dict(model.named_parameters())`); they are
    updated in place, so their addresses, and CUDA graphs captured on them, stay valid.
    """

    def __init__(self, group: SyncGroup, targets: Mapping[str, torch.Tensor] | torch.nn.Module,
                 consume_mb: float = 128, dual_buffer: bool = True, strict: bool = True,
                 version: int = 0):
        if isinstance(targets, torch.nn.Module):
            targets = dict(targets.named_parameters())
        self.group = group
        self.targets = dict(targets)
        self.chunk = _mb_to_bytes(consume_mb, "consume")
        self.dual_buffer = dual_buffer
        self.strict = strict
        self.version = version  # the version the live tensors hold
        self.pending_version: int | None = None  # received into staging, not yet committed
        self._layouts: dict[int, tuple[Layout, list[torch.Tensor]]] = {}
        self._staging: torch.Tensor | None = None
        self._bufs: list[torch.Tensor] = []
        self._streams = _Streams(group, ["recv", "unpack"])
        self._recv_done: Any = None
        self._commit_done: Any = None
        self._pending: tuple[Layout, list[torch.Tensor]] | None = None

    def _layout(self, key: int) -> tuple[Layout, list[torch.Tensor]]:
        if key not in self._layouts:
            layout = Layout.from_json(self.group.store.get(f"layout/{key}"))
            self._layouts[key] = (layout, layout.match(self.targets, self.strict))
        return self._layouts[key]

    def receive(self, wait: bool = True) -> SyncStats:
        """Receive one sync. Dual buffer: staged until `commit()`; direct: committed on return."""
        dev = self.group.device
        header = torch.zeros(5, dtype=torch.int64, device=dev)
        with self._streams.on("recv"):  # not behind generation's kernels on the main stream
            self.group.broadcast(header).wait()
            magic, version, key, total, chunk = header.tolist()  # waits for the sender
        start = time.perf_counter()
        if magic != MAGIC:
            raise WeightSyncError(f"bad weight-sync header {header.tolist()}: the ranks are out "
                                  "of step (every send needs exactly one receive)")
        if chunk != self.chunk:
            raise WeightSyncError(
                f"the sender broadcasts {chunk} B chunks, this receiver expects {self.chunk} B: "
                "give both sides the same bucket_mb.consume")
        layout, dsts = self._layout(key)
        if self.dual_buffer:
            chunks = self._receive_staged(layout, total)
            self.pending_version = version
            self._pending = (layout, dsts)
        else:
            chunks = self._receive_direct(layout, dsts, total)
            self.version = version
        if wait and self.group.is_cuda:
            torch.cuda.current_stream().synchronize()
            self._streams.s["recv"].synchronize()
        return SyncStats(version, total, time.perf_counter() - start, 0, chunks)

    def _receive_staged(self, layout: Layout, total: int) -> int:
        st = self._streams
        if self._staging is None or self._staging.numel() < total:
            self._staging = torch.empty(max(total, ALIGN), dtype=torch.uint8,
                                        device=self.group.device)
        chunks = 0
        with st.on("recv"):
            st.wait_event(self._commit_done)  # the last commit has finished reading staging
            works = []
            for c in range(0, total, self.chunk):
                works.append(self.group.broadcast(self._staging[c:min(c + self.chunk, total)]))
                chunks += 1
            for w in works:
                w.wait()
            self._recv_done = st.event()
        return chunks

    def _receive_direct(self, layout: Layout, dsts: list[torch.Tensor], total: int) -> int:
        st = self._streams
        dev = self.group.device
        if not self._bufs or self._bufs[0].numel() < self.chunk:
            self._bufs = [torch.empty(self.chunk, dtype=torch.uint8, device=dev)
                          for _ in range(2)]
        targets = [_bytes_view(t) for t in dsts]
        st.wait_current("recv")
        st.wait_current("unpack")  # generation's reads of the live weights come first
        unpacked: list[Any] = [None, None]
        chunks = 0
        for j, c in enumerate(range(0, total, self.chunk)):
            hi = min(c + self.chunk, total)
            buf = self._bufs[j % 2]
            with st.on("recv"):
                st.wait_event(unpacked[j % 2])  # buffer free once chunk j-2 is unpacked
                work = self.group.broadcast(buf[:hi - c])
            with st.on("unpack"):
                work.wait()
                d, s = [], []
                for i, a, b in layout.pieces(c, hi):
                    off = layout.slots[i].offset + a - c
                    d.append(targets[i][a:b])
                    s.append(buf[off:off + b - a])
                _copy_all(d, s)
                unpacked[j % 2] = st.event()
            chunks += 1
        st.join("unpack")
        return chunks

    def commit(self) -> int:
        """Copy the staged version into the live tensors (in place) and make it current."""
        if not self.dual_buffer:
            return self.version
        if self._pending is None or self.pending_version is None:
            raise WeightSyncError("commit() without a received version: call receive() first")
        layout, dsts = self._pending
        self._streams.wait_event(self._recv_done)
        staging = self._staging
        with torch.no_grad():
            _copy_all([_bytes_view(t) for t in dsts],
                      [staging[s.offset:s.offset + s.nbytes] for s in layout.slots])
        return self.mark_committed()

    def staged_tensors(self) -> dict[str, torch.Tensor]:
        """The staged version as tensors (views of the staging buffer), for an engine that loads
        weights itself (sglang); call `mark_committed()` once it has."""
        if self._pending is None or self._staging is None:
            raise WeightSyncError("no staged version: call receive() with dual_buffer=True")
        self._streams.wait_event(self._recv_done)
        layout, _ = self._pending
        return {s.name: self._staging[s.offset:s.offset + s.nbytes].view(getattr(torch, s.dtype))
                .view(s.shape) for s in layout.slots}

    def mark_committed(self) -> int:
        """The staged version is now the live one (staging may be overwritten by the next sync)."""
        if self.pending_version is None:
            raise WeightSyncError("nothing staged to commit: call receive() first")
        self._commit_done = self._streams.event()
        self.version, self.pending_version, self._pending = self.pending_version, None, None
        return self.version


def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view that aliases `t` (receivers write through it)."""
    return t.detach().view(-1).view(torch.uint8)
