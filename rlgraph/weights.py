"""Versioned weight transfer in buckets: export, staged receive, atomic commit, digest.

The sender cuts its state dict (name order) into buckets of at most `bucket_mb` (a larger
tensor travels alone). The receiver stages buckets in a second buffer (the dual buffer of
the async-rl seed) and only `commit` copies them into the live model, all at once, after
checking that every bucket of that version arrived: a half-received update is never visible.
"""

from __future__ import annotations

import hashlib

import torch

from rlgraph.errors import RLGraphError


class WeightSyncError(RLGraphError):
    """A bucket or commit that does not fit the update in progress."""


def export_buckets(state: dict[str, torch.Tensor], version: int,
                   bucket_mb: float) -> list[dict]:
    """`state` -> [{"version", "index", "total", "tensors": {name: cpu tensor}}, ...]."""
    limit = max(1, int(bucket_mb * 2**20))
    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > limit:
            groups.append({})
            size = 0
        groups[-1][name] = tensor.detach().to("cpu", copy=True)
        size += nbytes
    return [{"version": version, "index": i, "total": len(groups), "tensors": g}
            for i, g in enumerate(groups)]


def digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over names, dtypes, shapes and raw bytes, in name order (bit-for-bit equality)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class WeightReceiver:
    """Stages the buckets of one version; `commit` applies them to a model in one go."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.total = 0
        self.received: set[int] = set()
        self.staged: dict[str, torch.Tensor] = {}

    def receive(self, bucket: dict) -> None:
        """Stage a bucket; a bucket of a newer version discards an unfinished older update."""
        version, index, total = bucket["version"], bucket["index"], bucket["total"]
        if self.version is None or version > self.version:
            self.version, self.total, self.received, self.staged = version, total, set(), {}
        elif version < self.version:
            raise WeightSyncError(f"bucket of version {version} arrived while staging "
                                  f"version {self.version}")
        if total != self.total or not 0 <= index < total:
            raise WeightSyncError(f"bucket {index}/{total} does not fit version {version} "
                                  f"({self.total} buckets)")
        self.staged.update(bucket["tensors"])
        self.received.add(index)

    def complete(self, version: int) -> bool:
        """Whether every bucket of `version` is staged."""
        return self.version == version and len(self.received) == self.total

    @torch.no_grad()
    def commit(self, model: torch.nn.Module, version: int) -> None:
        """Copy the staged weights into `model`; refuses an incomplete or mismatched update."""
        if not self.complete(version):
            have = f"{len(self.received)}/{self.total} buckets of version {self.version}"
            raise WeightSyncError(f"cannot commit version {version}: staged {have}")
        live = model.state_dict()
        missing = sorted(set(live) - set(self.staged))
        unknown = sorted(set(self.staged) - set(live))
        if missing or unknown:
            raise WeightSyncError(f"update of version {version} does not match the model: "
                                  f"missing {missing[:3]}, unknown {unknown[:3]}")
        for name, tensor in live.items():
            if tensor.shape != self.staged[name].shape:
                raise WeightSyncError(f"{name}: shape {tuple(self.staged[name].shape)} "
                                      f"!= {tuple(tensor.shape)}")
        for name, tensor in live.items():
            tensor.copy_(self.staged[name])
        self.version, self.total, self.received, self.staged = None, 0, set(), {}
