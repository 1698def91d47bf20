"""Weight sync protocol on CPU: a sender and a receiver process over gloo, bit for bit."""

from __future__ import annotations

import pytest
import torch
from rank_support import free_port, run_ranks

from rlgraph.errors import MissingDependencyError
from rlgraph.weights import BucketMiB, sync_group
from rlgraph.weights import nccl as nccl_sync
from rlgraph.weights.nccl import ALIGN, Layout, WeightSyncError

PRODUCE_MB = 64 / 1024  # 64 KiB produce buckets
CONSUME_MB = 16 / 1024  # 16 KiB consume chunks


def _weights(seed: int) -> dict[str, torch.Tensor]:
    """A big tensor (many buckets), many small ones of mixed dtypes, odd sizes, a scalar."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 700, (150,), generator=torch.Generator().manual_seed(0)).tolist()
    out = {"embed.weight": torch.randn(300, 200, generator=g)}  # 240000 B > one bucket
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool]
    for i, n in enumerate(sizes):
        dt = dtypes[i % len(dtypes)]
        if dt is torch.bool:
            t = torch.rand(n, generator=g) > 0.5
        elif dt is torch.int64:
            t = torch.randint(-(2**40), 2**40, (n,), generator=g)
        else:
            t = torch.randn(n, generator=g).to(dt)
        out[f"layers.{i}.w"] = t
    out["scale"] = torch.tensor(seed, dtype=torch.float32)
    out["head.weight"] = torch.randn(97, 33, generator=g).to(torch.bfloat16)
    return out


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def _run(rank: int, port: int) -> None:
    group = sync_group.init(rank, 2, "127.0.0.1", port, backend="gloo", timeout_s=60)
    v1, v2 = _weights(1), _weights(2)
    if rank == 0:
        sender = nccl_sync.WeightSender(group, BucketMiB(PRODUCE_MB, CONSUME_MB))
        stats = sender.send(v1.items(), version=1)
        total = Layout.of(v1.items()).total
        assert stats.bytes == total
        assert stats.chunks == -(-total // int(CONSUME_MB * 2**20))
        assert stats.produce_buckets == -(-total // int(PRODUCE_MB * 2**20))
        # a non-contiguous tensor is gathered correctly too
        v2t = dict(v2)
        v2t["head.weight"] = v2["head.weight"].t().contiguous().t()
        sender.send(v2t.items(), version=2)
        group.barrier()
        return
    live = {name: torch.zeros_like(t) for name, t in v1.items()}
    before = {name: t.clone() for name, t in live.items()}
    staged = nccl_sync.WeightReceiver(group, live, BucketMiB(PRODUCE_MB, CONSUME_MB),
                                      dual_buffer=True)
    stats = staged.receive()
    assert stats.version == 1 and staged.pending_version == 1
    # staged, not committed: generation still sees the old weights, all of them
    assert staged.version == 0
    assert all(_same_bits(live[n], before[n]) for n in live)
    assert all(_same_bits(t, v1[n]) for n, t in staged.staged_tensors().items())
    assert staged.commit() == 1 and staged.version == 1 and staged.pending_version is None
    assert all(_same_bits(live[n], v1[n]) for n in live), "v1 differs after commit"
    ptrs = {n: t.data_ptr() for n, t in live.items()}
    direct = nccl_sync.WeightReceiver(group, live, BucketMiB(PRODUCE_MB, CONSUME_MB),
                                      dual_buffer=False,
                                      version=1)
    assert direct.receive().version == 2 and direct.version == 2
    assert all(_same_bits(live[n], v2[n]) for n in live), "v2 differs after direct load"
    assert all(t.data_ptr() == ptrs[n] for n, t in live.items()), "live tensors moved"
    group.barrier()


def test_gloo_sync_bit_exact_versioned_and_bucketed() -> None:
    run_ranks(_run, 2, collect=False)


def test_layout_pieces_cover_every_byte_once() -> None:
    w = _weights(3)
    layout = Layout.of(w.items())
    assert all(s.offset % ALIGN == 0 for s in layout.slots)
    step = 5000  # not a divisor of anything: pieces straddle tensors and buckets
    covered = {name: 0 for name in w}
    for lo in range(0, layout.total, step):
        for i, a, b in layout.pieces(lo, min(lo + step, layout.total)):
            covered[layout.slots[i].name] += b - a
    assert covered == {n: t.numel() * t.element_size() for n, t in w.items()}
    assert Layout.from_json(layout.json) == layout


def test_layout_mismatch_is_a_clear_error() -> None:
    w = _weights(4)
    layout = Layout.of(w.items())
    missing = dict(w)
    del missing["scale"]
    with pytest.raises(WeightSyncError, match="does not have"):
        layout.match(missing)
    reshaped = dict(w)
    reshaped["embed.weight"] = torch.zeros(200, 300)
    with pytest.raises(WeightSyncError, match=r"embed.weight.*float32\[300, 200\]"):
        layout.match(reshaped)
    extra = dict(w)
    extra["lora.A"] = torch.zeros(3)
    with pytest.raises(WeightSyncError, match="never sent"):
        layout.match(extra)
    assert len(layout.match(extra, strict=False)) == len(w)


def test_bucket_sizes_checked() -> None:
    group = sync_group.SyncGroup(0, 1, "gloo", torch.device("cpu"), None, None, True)
    with pytest.raises(WeightSyncError, match=r"multiple of bucket_mb\.consume"):
        nccl_sync.WeightSender(group, BucketMiB(100, 64))
    with pytest.raises(WeightSyncError, match="positive"):
        nccl_sync.WeightSender(group, BucketMiB.of(0))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_nccl_without_gpu_names_what_is_missing() -> None:
    with pytest.raises(MissingDependencyError, match="CUDA GPU"):
        sync_group.init(0, 2, "127.0.0.1", free_port(), backend="nccl")
