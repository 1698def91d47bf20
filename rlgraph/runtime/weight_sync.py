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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlgraph.workspace import Workspace


def export_to_store(workspace: Workspace, bucket_mb: float) -> tuple[list[Any], dict]:
    """Sender half: the policy's buckets into the object store; their references back."""
    import ray

    start = time.time()
    buckets = workspace.export_weights(bucket_mb)
    refs = [ray.put(bucket) for bucket in buckets]
    version = buckets[0]["version"] if buckets else workspace.policy_version
    nbytes = sum(t.numel() * t.element_size() for b in buckets for t in b["tensors"].values())
    return refs, {"start": start, "end": time.time(), "version": version,
                  "buckets": len(refs), "bytes": nbytes}


def apply_from_store(workspace: Workspace, refs: list[Any], sent: dict) -> dict:
    """Receiver half: stage every bucket in the second buffer, then commit the version."""
    import ray

    for ref in refs:
        workspace.receive_bucket(ray.get(ref))
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
