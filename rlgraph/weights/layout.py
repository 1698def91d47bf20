"""The byte layout both sides of a weight sync agree on, and the copies planned from it.

A `Layout` lists every tensor's name, shape, dtype and byte offset in one virtual
concatenation (16-byte aligned), hashed so a receiver whose model differs fails loudly.
`CopyPlan` is a planned set of byte copies (big ones one by one, small ones batched), built
once per layout and reused by every sync.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlgraph.errors import RLGraphError

ALIGN = 16  # byte alignment of every tensor in the stream (vectorised copies)
BIG_COPY = 4 << 20  # pieces at least this large get their own copy; smaller ones are batched


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


@dataclass(frozen=True, eq=False)
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
            nbytes = numel * dtype.itemsize
            slots.append(TensorSlot(name, tuple(int(d) for d in shape), _dtype_name(dtype),
                                    offset, nbytes))
            offset += -(-nbytes // ALIGN) * ALIGN
        return cls(tuple(slots), offset)

    @classmethod
    def of(cls, named: Iterable[tuple[str, torch.Tensor]]) -> Layout:
        """Layout of named tensors, in the order given."""
        return cls.build((name, tuple(t.shape), t.dtype) for name, t in named)

    def copies(self, lo: int, hi: int, dst: Any, src: Any) -> CopyPlan:
        """The copies that move stream bytes [lo, hi): `dst(i, a, b)` / `src(i, a, b)` give the
        byte ranges for slot i's bytes [a, b)."""
        pairs = [(dst(i, a, b), src(i, a, b)) for i, a, b in self.pieces(lo, hi)]
        return CopyPlan([d for d, _ in pairs], [s for _, s in pairs])

    @functools.cached_property
    def json(self) -> str:
        """Serialised form published in the store."""
        return json.dumps([[s.name, list(s.shape), s.dtype] for s in self.slots])

    @classmethod
    def from_json(cls, text: str | bytes) -> Layout:
        """Inverse of `json`."""
        rows = json.loads(text)
        return cls.build((name, tuple(shape), getattr(torch, dtype)) for name, shape, dtype in rows)

    def __hash__(self) -> int:
        return self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.slots == other.slots

    @functools.cached_property
    def key(self) -> int:
        """A 60-bit hash of names, shapes and dtypes (fits the int64 header)."""
        return int(hashlib.sha1(self.json.encode()).hexdigest()[:15], 16)

    @functools.cached_property
    def _starts(self) -> list[int]:
        return [s.offset for s in self.slots]

    def pieces(self, lo: int, hi: int) -> Iterator[tuple[int, int, int]]:
        """(slot index, first byte, end byte) of each tensor's part inside stream bytes [lo, hi)."""
        i = max(bisect.bisect_right(self._starts, lo) - 1, 0)
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


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (a copy if it is not contiguous)."""
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def bytes_view(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view that aliases `t` (receivers write through it)."""
    return t.detach().view(-1).view(torch.uint8)


class CopyPlan:
    """Precomputed copies: large pieces one by one (memcpy), small ones in one batched call.

    Built once per layout and reused every sync, so a sync costs the host a few launches per
    chunk instead of slicing every tensor again.
    """

    def __init__(self, dsts: list[torch.Tensor], srcs: list[torch.Tensor]):
        big = [i for i, d in enumerate(dsts) if d.numel() >= BIG_COPY]
        small = [i for i, d in enumerate(dsts) if d.numel() < BIG_COPY]
        self.big = [(dsts[i], srcs[i]) for i in big]
        self.small_dst = [dsts[i] for i in small]
        self.small_src = [srcs[i] for i in small]

    def run(self) -> None:
        for d, s in self.big:
            d.copy_(s)
        if self.small_dst:
            torch._foreach_copy_(self.small_dst, self.small_src)
