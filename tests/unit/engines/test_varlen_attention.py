"""Varlen decode attention (flex over a per-row block mask) against the sliced attention."""

from __future__ import annotations

import pytest
import torch

from rlgraph.engines import varlen_attention
from rlgraph.engines.static_ops import attention as sliced

pytestmark = pytest.mark.skipif(not varlen_attention.available(), reason="no flex attention")


@pytest.mark.parametrize("seed", [0, 1])
def test_each_row_reads_its_own_blocks_and_matches_the_sliced_attention(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    rows, heads, kv_heads, d = 6, 4, 2, 16
    kv_len = varlen_attention.padded_len(300)  # 384: three mask blocks
    pos = torch.tensor([0, 5, 127, 128, 200, 383])[torch.randperm(rows, generator=g)]
    done = torch.tensor([False, False, True, False, False, False])
    q = torch.randn(rows, heads, 1, d, generator=g)
    k = torch.randn(rows, kv_heads, kv_len, d, generator=g)
    v = torch.randn(rows, kv_heads, kv_len, d, generator=g)
    beyond = torch.arange(kv_len)[None, :] > pos[:, None]  # stale K/V a bug would read
    k[beyond[:, None].expand_as(k[..., 0])] = 50.0
    v[beyond[:, None].expand_as(v[..., 0])] = 1e3
    mask = varlen_attention.RowLengthMask(pos, done, kv_len, heads // kv_heads).build(rows)
    want_blocks = torch.where(done, 0, pos) // varlen_attention.BLOCK + 1
    assert mask.kv_num_blocks.flatten().tolist() == want_blocks.tolist()
    out, _ = varlen_attention.attention(None, q, k, v, mask, scaling=d ** -0.5)
    bool_mask = ~beyond[:, None, None, :]
    ref, _ = sliced(None, q, k, v, bool_mask, scaling=d ** -0.5)
    live = ~done
    assert out.shape == ref.shape == (rows, 1, heads, d)
    assert torch.isfinite(out[live]).all()
    torch.testing.assert_close(out[live], ref[live], rtol=1e-5, atol=1e-5)


def test_kv_length_must_be_whole_blocks() -> None:
    with pytest.raises(ValueError, match="multiple of 128"):
        varlen_attention.RowLengthMask(torch.zeros(2, dtype=torch.long),
                                       torch.zeros(2, dtype=torch.bool), 200)
