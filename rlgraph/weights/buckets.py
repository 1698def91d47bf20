"""Versioned weight transfer in buckets: export, object-store form and digest.

The sender cuts its state dict (name order) into buckets of at most `bucket_mb.produce` MiB
(a larger tensor travels alone). The receiver stages them in its second buffer
(`rlgraph.weights.dual_buffer.DualBuffer`) and swaps a version in only when every bucket arrived.
"""

from __future__ import annotations

import hashlib
import warnings

import torch

from rlgraph.errors import RLGraphError
from rlgraph.weights import BucketMiB


class WeightSyncError(RLGraphError):
    """A bucket or commit that does not fit the update in progress."""


def bucket_names(state: dict[str, torch.Tensor], bucket_mb: BucketMiB | float
                 ) -> list[list[str]]:
    """Names per bucket of at most `bucket_mb.produce` MiB (state-dict order; a larger tensor
    alone)."""
    limit = BucketMiB.of(bucket_mb).produce_bytes
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
                   bucket_mb: BucketMiB | float) -> list[dict]:
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


def to_arrays(bucket: dict) -> dict:
    """A bucket with its tensors as numpy arrays: Ray stores them without pickling and the
    receiver reads them in place from shared memory (dtypes numpy lacks, e.g. bfloat16,
    travel as raw ints)."""
    arrays, dtypes = {}, {}
    for name, tensor in bucket["tensors"].items():
        t = tensor.detach().cpu().contiguous()
        dtypes[name] = str(t.dtype).removeprefix("torch.")
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        arrays[name] = t.numpy()
    return {**{k: v for k, v in bucket.items() if k != "tensors"}, "arrays": arrays,
            "dtypes": dtypes}


def from_arrays(stored: dict) -> dict:
    """What `to_arrays` made, back as tensors (read-only views of the arrays; staging copies)."""
    tensors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only shared memory: never written
        for name, array in stored["arrays"].items():
            dtype = getattr(torch, stored["dtypes"][name])
            tensors[name] = torch.from_numpy(array).view(dtype)
    return {**{k: v for k, v in stored.items() if k not in ("arrays", "dtypes")},
            "tensors": tensors}
