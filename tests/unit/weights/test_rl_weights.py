"""Weight sync between workspaces: buckets, staged receive, atomic commit, digests."""

from __future__ import annotations

import pytest
import torch
from rl_support import make_spec

from rlgraph.process.workspace import Workspace
from rlgraph.weights.buckets import WeightSyncError, digest, export_buckets


@pytest.fixture(scope="module")
def pair() -> tuple[Workspace, Workspace]:
    spec = make_spec(train={"lr": 1e-2})
    return Workspace(spec, ["train"], seed=0), Workspace(spec, ["generate"], seed=0)


def _train_once(ws: Workspace) -> None:
    """Change the trainer's weights the way a train step does (an optimizer step)."""
    loss = sum((p.float() ** 2).sum() for p in ws.policy.parameters())
    ws.optimizer.zero_grad()
    loss.backward()
    ws.optimizer.step()
    ws.policy_version += 1


def test_groups_start_identical(pair: tuple[Workspace, Workspace]) -> None:
    sender, receiver = pair
    assert sender.policy_version == receiver.policy_version == 0
    assert sender.weights_digest() == receiver.weights_digest()


def test_export_receive_commit_is_bit_exact_and_atomic(pair) -> None:
    sender, receiver = pair
    _train_once(sender)
    buckets = sender.export_weights(bucket_mb=0.005)
    assert len(buckets) > 2 and all(b["total"] == len(buckets) for b in buckets)
    assert all(b["version"] == sender.policy_version for b in buckets)
    before = receiver.weights_digest()
    for bucket in buckets[:-1]:
        receiver.receive_bucket(bucket)
        assert receiver.weights_digest() == before  # staged, never visible
    with pytest.raises(WeightSyncError, match="staged"):
        receiver.commit_weights(sender.policy_version)  # half-received: refused
    assert receiver.weights_digest() == before and receiver.policy_version == 0
    receiver.receive_bucket(buckets[-1])
    receiver.commit_weights(sender.policy_version)
    assert receiver.weights_digest() == sender.weights_digest()
    assert receiver.policy_version == sender.policy_version


def test_newer_version_replaces_an_unfinished_one(pair) -> None:
    sender, receiver = pair
    _train_once(sender)
    stale = sender.export_weights(bucket_mb=0.005)
    receiver.receive_bucket(stale[0])
    _train_once(sender)
    fresh = sender.export_weights(bucket_mb=0.005)
    for bucket in reversed(fresh):  # order within a version does not matter
        receiver.receive_bucket(bucket)
    with pytest.raises(WeightSyncError):
        receiver.receive_bucket(stale[1])  # an older version after a newer one
    receiver.commit_weights(sender.policy_version)
    assert receiver.weights_digest() == sender.weights_digest()


def test_bucket_sizes_and_digest() -> None:
    state = {"a": torch.zeros(1000), "b": torch.zeros(10), "c": torch.ones(5000)}
    buckets = export_buckets(state, version=3, bucket_mb=4100 / 2**20)
    assert [list(b["tensors"]) for b in buckets] == [["a", "b"], ["c"]]  # c alone: too big
    assert digest(state) != digest({**state, "b": torch.full((10,), 1e-30)})
    assert digest(state) == digest(dict(reversed(state.items())))


def test_checkpoint_roundtrip(pair) -> None:
    sender, _ = pair
    state = sender.state_for_checkpoint()
    digest_before, version = sender.weights_digest(), sender.policy_version
    _train_once(sender)
    assert sender.weights_digest() != digest_before
    sender.load_checkpoint(state)
    assert sender.weights_digest() == digest_before and sender.policy_version == version
    assert state["optimizer"]["state"]  # Adam moments travel with the checkpoint


def test_a_bucket_never_lands_while_another_thread_switches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Generate's thread (or a checkpoint) switches version v in while the receiver's thread
    already stages v+1: the switch finishes first, so v+1 arrives whole and v is not mixed
    with it (seen as 'staged 0/0 buckets' when the switch reset a buffer mid-receive)."""
    import threading
    import time

    from rlgraph.weights.dual_buffer import DualBuffer

    switching = threading.Event()
    plain_switch = DualBuffer.swap

    def slow_switch(self: DualBuffer) -> None:
        switching.set()
        time.sleep(0.2)  # the receiver's thread runs now
        plain_switch(self)

    monkeypatch.setattr(DualBuffer, "swap", slow_switch)
    spec = make_spec(train={"lr": 1e-2})
    sender, receiver = Workspace(spec, ["train"], seed=0), Workspace(spec, ["generate"], seed=0)
    _train_once(sender)
    for bucket in sender.export_weights(bucket_mb=0.005):
        receiver.receive_bucket(bucket)
    receiver.stage_weights(1)
    v1 = sender.weights_digest()
    _train_once(sender)
    v2 = sender.export_weights(bucket_mb=0.005)
    switcher = threading.Thread(target=receiver.swap_if_staged)
    switcher.start()
    assert switching.wait(5)
    for bucket in v2:
        receiver.receive_bucket(bucket)
    switcher.join()
    assert receiver.policy_version == 1 and receiver.weights_digest() == v1
    receiver.commit_weights(2)
    assert receiver.weights_digest() == sender.weights_digest()


def test_bucket_mb_is_mib_in_the_runtime_and_the_cost_model() -> None:
    """`bucket_mb: 1` is 2^20 bytes everywhere: the runtime cuts 3 MiB of weights into 3
    buckets of exactly 2^20 bytes (10^6 would make 4), and the cost model prices the same 3
    (not 4) for the same bytes."""
    from types import SimpleNamespace

    from rlgraph.nodes.param_update import ParamUpdateSpec
    from rlgraph.presets.gpus import GPU_PRESETS
    from rlgraph.pricing.context import CostContext
    from rlgraph.pricing.param_update import param_update_cost
    from rlgraph.weights import MIB, BucketMiB
    from rlgraph.weights.buckets import bucket_names
    from rlgraph.weights.nccl import WeightSender

    assert MIB == 2**20 and BucketMiB(1, 0.5).produce_bytes == 2**20
    state = {f"w{i}": torch.zeros(2**16) for i in range(12)}  # 12 x 2^18 bytes = 3 MiB
    sizes = [sum(state[n].numel() * 4 for n in names) for names in bucket_names(state, 1)]
    assert sizes == [2**20] * 3
    group = SimpleNamespace(device=torch.device("cpu"), is_cuda=False)
    sender = WeightSender(group, BucketMiB(2, 1))
    assert (sender.produce_bytes, sender.consume_bytes) == (2 * 2**20, 2**20)

    node = ParamUpdateSpec(bucket_mb={"produce": 1, "consume": 1}, transport="nccl")
    spec = SimpleNamespace(group_of=lambda task: {"train": "a", "generate": "b"}[task],
                           cluster=SimpleNamespace(local=False))  # priced as rlgraph's runtime
    shape = SimpleNamespace(params=3 * 2**20 / 2)  # bf16: 3 MiB of weights
    ctx = CostContext(spec, "param_update", shape, GPU_PRESETS["H100"], 1)
    param_update_cost(node, ctx)
    assert "+ 3 buckets" in ctx.extra["detail"]
