"""Versioned weight transfer in buckets: export and digest.

The sender cuts its state dict (name order) into buckets of at most `bucket_mb` (a larger
tensor travels alone). The receiver stages them in its second buffer
(`rlgraph.weights.dual_buffer.DualBuffer`) and swaps a version in only when every bucket arrived.
"""

from __future__ import annotations

import hashlib

import torch

from rlgraph.errors import RLGraphError


class WeightSyncError(RLGraphError):
    """A bucket or commit that does not fit the update in progress."""


def bucket_names(state: dict[str, torch.Tensor], bucket_mb: float) -> list[list[str]]:
    """Names per bucket of at most `bucket_mb` (state-dict order; a larger tensor alone)."""
    limit = max(1, int(bucket_mb * 2**20))
    groups: list[list[str]] = [[]]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def export_buckets(state: dict[str, torch.Tensor], version: int,
                   bucket_mb: float) -> list[dict]:
    """`state` -> [{"version", "index", "total", "tensors": {name: cpu tensor}}, ...]."""
    groups = bucket_names(state, bucket_mb)
    return [{"version": version, "index": i, "total": len(groups),
             "tensors": {n: state[n].detach().to("cpu", copy=True) for n in names}}
            for i, names in enumerate(groups)]


def digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and raw bytes, in name order (bit-for-bit equality)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
