"""param_update over Ray's object store: versioned buckets, staged receive, atomic commit.

The sender (the train group's actor) cuts its policy into buckets of `bucket_mb.produce`
and puts each into the object store; the receiver (the generate group's actor) fetches
them one by one into its second buffer (`Workspace.receive_bucket`) and swaps the whole
version in at once (`Workspace.commit_weights`), so generate never samples from a
half-updated model. The driver submits both halves back to back without waiting: the
receiver's call takes the sender's result as an argument, so Ray starts it the moment the
buckets exist, and the driver hears of the update once, when the commit is done.

When train and generate share a workspace (a colocated group), nothing moves.
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlgraph.workspace import Workspace


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
    """The bucket back as tensors (read-only views of the stored arrays; commit copies)."""
    import torch

    tensors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only shared memory: never written
        for name, array in stored["arrays"].items():
            dtype = getattr(torch, stored["dtypes"][name])
            tensors[name] = torch.from_numpy(array).view(dtype)
    return {**{k: v for k, v in stored.items() if k not in ("arrays", "dtypes")},
            "tensors": tensors}


def export_to_store(workspace: Workspace, bucket_mb: float) -> tuple[list[Any], dict]:
    """Sender half: the policy's buckets into the object store; their references back."""
    import ray

    start = time.time()
    buckets = workspace.export_weights(bucket_mb)
    refs = [ray.put(_to_store(bucket)) for bucket in buckets]
    version = buckets[0]["version"] if buckets else workspace.policy_version
    nbytes = sum(t.numel() * t.element_size() for b in buckets for t in b["tensors"].values())
    return refs, {"start": start, "end": time.time(), "version": version,
                  "buckets": len(refs), "bytes": nbytes}


def apply_from_store(workspace: Workspace, refs: list[Any], sent: dict) -> dict:
    """Receiver half: stage every bucket in the second buffer, then commit the version."""
    import ray

    for ref in refs:
        workspace.receive_bucket(_from_store(ray.get(ref)))
    workspace.commit_weights(sent["version"])
    return {**sent, "end": time.time(), "send_end": sent["end"],
            "summary": {"policy_version": sent["version"], "bytes": sent["bytes"],
                        "buckets": sent["buckets"]}}


def local_sync(workspace: Workspace) -> dict:
    """param_update inside one workspace: the policy is already the trained one."""
    now = time.time()
    version = workspace.policy_version
    return {"start": now, "end": now, "version": version,
            "summary": {"policy_version": version, "bytes": 0, "buckets": 0}}


def submit_param_update(src_actor: Any, dst_actor: Any, bucket_mb: float) -> Any:
    """Start a sync from `src_actor` to `dst_actor`; returns the reference of its info dict."""
    if src_actor is dst_actor:
        return src_actor.local_sync.remote()
    refs, sent = src_actor.export_weights.options(num_returns=2).remote(bucket_mb)
    return dst_actor.apply_weights.remote(refs, sent)
