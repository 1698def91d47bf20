"""The receiver's second copy of the policy: buckets land in it while generation runs.

Buckets of one version are copied into `staging` (tensors shaped like the live state dict,
on the live weights' device) in pieces of at most `bucket_mb.consume` MiB, the receiver's
granularity (dots.rl `param_update_consume_bucket_size_mb`: a bounded copy at a time, so a
GPU never holds a whole produce bucket twice). Once every bucket arrived, `swap` copies
staging into the live tensors in place (their addresses, and CUDA graphs captured on them,
stay valid): that copy is all a generation pause costs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from rlgraph.weights import BucketMiB
from rlgraph.weights.buckets import WeightSyncError


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (copies to make it contiguous if needed)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class DualBuffer:
    """Stages the buckets of one version beside `model`'s live weights; `swap` applies them."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.staging: dict[str, torch.Tensor] = {}
        self.version: int | None = None
        self.total = 0
        self.received: set[int] = set()
        self.names: set[str] = set()
        self.pieces = 0  # bucket_mb.consume-sized copies made for the version being staged
        self.largest_piece = 0  # bytes of the largest of them
        self._stream = (torch.cuda.Stream() if next(model.parameters()).is_cuda else None)

    def _live(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def _ensure_staging(self) -> None:
        if not self.staging:
            self.staging = {name: torch.empty_like(t) for name, t in self._live().items()}

    def receive(self, bucket: dict, bucket_mb: BucketMiB | None = None) -> None:
        """Copy one bucket into staging in pieces of <= `bucket_mb.consume` MiB (None: whole
        tensors); a bucket of a newer version discards an unfinished older one."""
        version, index, total = bucket["version"], bucket["index"], bucket["total"]
        if self.version is None or version > self.version:
            self.version, self.total, self.received, self.names = version, total, set(), set()
            self.pieces = self.largest_piece = 0
        elif version < self.version:
            raise WeightSyncError(f"bucket of version {version} arrived while staging "
                                  f"version {self.version}")
        if total != self.total or not 0 <= index < total:
            raise WeightSyncError(f"bucket {index}/{total} does not fit version {version} "
                                  f"({self.total} buckets)")
        self._ensure_staging()
        for name, src in bucket["tensors"].items():
            dst = self.staging.get(name)
            if dst is None:
                raise WeightSyncError(f"update of version {version} has tensor {name!r}, which "
                                      "the model lacks")
            if dst.shape != src.shape or dst.dtype != src.dtype:
                raise WeightSyncError(f"{name}: {src.dtype}{list(src.shape)} != "
                                      f"{dst.dtype}{list(dst.shape)}")
        with self._on_stream():
            consume_bytes = None if bucket_mb is None else bucket_mb.consume_bytes
            for copies in self._pieces(bucket["tensors"], consume_bytes):
                for d, s in copies:
                    d.copy_(s, non_blocking=self._stream is not None)
                self.pieces += 1
                self.largest_piece = max(self.largest_piece, sum(d.numel() for d, _ in copies))
        if self._stream is not None:
            self._stream.synchronize()  # the bucket's host memory may be released now
        self.received.add(index)
        self.names.update(bucket["tensors"])

    def _on_stream(self) -> contextlib.AbstractContextManager:
        """Copies on a side stream: they do not queue behind generation's kernels."""
        return torch.cuda.stream(self._stream) if self._stream is not None else \
            contextlib.nullcontext()

    def _pieces(self, tensors: dict[str, torch.Tensor], limit: int | None
                ) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
        """(dst bytes, src bytes) copies grouped so each group moves <= `limit` bytes; a big
        tensor is cut, small ones share a piece."""
        piece: list[tuple[torch.Tensor, torch.Tensor]] = []
        size = 0
        for name, src in tensors.items():
            d, s = _bytes(self.staging[name]), _bytes(src)
            if limit is None:
                yield [(d, s)]
                continue
            lo = 0
            while lo < s.numel():
                hi = min(s.numel(), lo + limit - size)
                piece.append((d[lo:hi], s[lo:hi]))
                size += hi - lo
                lo = hi
                if size >= limit:
                    yield piece
                    piece, size = [], 0
        if piece:
            yield piece

    def complete(self, version: int) -> bool:
        """Whether every bucket of `version` is staged."""
        return self.version == version and len(self.received) == self.total

    def check(self, version: int) -> None:
        """Refuse an incomplete or mismatched version before it may be swapped in."""
        if not self.complete(version):
            have = f"{len(self.received)}/{self.total} buckets of version {self.version}"
            raise WeightSyncError(f"cannot commit version {version}: staged {have}")
        missing = sorted(set(self.staging) - self.names)
        if missing:
            raise WeightSyncError(f"update of version {version} does not match the model: "
                                  f"missing {missing[:3]}")

    @torch.no_grad()
    def swap(self) -> None:
        """Copy the staged version into the live tensors, in place; staging is free again."""
        live = self._live()
        names = list(live)
        torch._foreach_copy_([live[n] for n in names], [self.staging[n] for n in names])
        if self._stream is not None:  # the next version's copies wait for these reads
            self._stream.wait_stream(torch.cuda.current_stream())
        self.version, self.total, self.received, self.names = None, 0, set(), set()
