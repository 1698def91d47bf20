"""Decode attention that reads only each row's own K/V: flex attention over a block
mask built on the device from the per-slot positions.

The static decoder's slots hold sequences of very different lengths (in partial rollout,
carried rows are thousands of tokens long and fresh rows a few hundred). Slicing the cache to
the longest row makes every row of a step read that many positions; here each row reads the
K/V blocks up to its own position (finished rows one block), and flex attention's decode
kernel splits long rows over the GPU (split-KV) and combines the partial softmaxes. The mask is
built from the slot tensors with no host sync, so a captured CUDA graph replays it with the
positions of the moment. On CUDA the flex call is compiled (one compile per decode width); on
the CPU it runs eagerly (tests compare it with `static_ops.attention`).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch

from rlgraph.engines.static_ops import attention as sliced_attention

BLOCK = 128  # K/V positions per mask block (flex attention's default block)

try:  # flex attention: torch >= 2.5
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # pragma: no cover - older torch
    BlockMask = flex_attention = None  # type: ignore[assignment,misc]

_compiled: Any = None


MIN_HEAD_DIM = 16  # flex attention's kernels need q/k/v heads of at least 16 (torch 2.11)


def available(head_dim: int = MIN_HEAD_DIM) -> bool:
    """Whether this torch has flex attention and its kernels take heads of `head_dim`."""
    return flex_attention is not None and head_dim >= MIN_HEAD_DIM


def padded_len(max_len: int) -> int:
    """Cache positions to allocate so that the K/V length is a whole number of mask blocks."""
    return -(-max_len // BLOCK) * BLOCK


class RowLengthMask:
    """Builds, per decode step, the block mask of slots [0, width): slot b attends positions
    0..pos[b] (blocks up to its own position; a finished slot one block). `pos` and `done` are
    the decoder's static slot tensors (read when the mask is built and when the kernel runs);
    `group`: query heads per K/V head, which attend as that many queries of one head."""

    def __init__(self, pos: torch.Tensor, done: torch.Tensor, kv_len: int, group: int = 1):
        if flex_attention is None:
            raise RuntimeError("attention 'varlen' needs torch.nn.attention.flex_attention "
                               "(torch >= 2.5); use attention_kind='sdpa'")
        if kv_len % BLOCK:
            raise ValueError(f"kv_len {kv_len} is not a multiple of {BLOCK} (use padded_len)")
        self.pos, self.done, self.kv_len, self.group = pos, done, kv_len, group
        self.indices = torch.arange(kv_len // BLOCK, device=pos.device, dtype=torch.int32)
        params = inspect.signature(BlockMask.from_kv_blocks).parameters
        self._q_blocks = "compute_q_blocks" in params  # forward only: skip the transpose
        positions = pos

        def row_causal(b, h, q_idx, kv_idx):
            return kv_idx <= positions[b]

        self.mask_mod = row_causal

    def build(self, width: int) -> Any:
        """The BlockMask of one decode step over slots [0, width)."""
        pos, done = self.pos[:width], self.done[:width]
        blocks = torch.where(done, 0, pos) // BLOCK + 1
        num = blocks.to(torch.int32).view(width, 1, 1)
        idx = self.indices.view(1, 1, 1, -1).expand(width, 1, 1, -1).contiguous()
        extra = {"compute_q_blocks": False} if self._q_blocks else {}
        return BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=BLOCK, mask_mod=self.mask_mod,
                                        seq_lengths=(self.group, self.kv_len), **extra)


def _flex() -> Any:
    """flex_attention, compiled once per process for CUDA tensors (eager on the CPU)."""
    global _compiled
    if _compiled is None:
        cfg = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):  # one compile per decode width
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), 64))
        _compiled = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    return _compiled


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, attention_mask: Any, **kwargs: Any):
    """transformers attention: one-token queries under a `RowLengthMask` block mask go through
    flex attention (grouped heads, each row its own length); the rest as `static_ops`."""
    if query.shape[2] == 1 and BlockMask is not None and isinstance(attention_mask, BlockMask):
        b, h, _, d = query.shape
        kv = key.shape[1]
        # the g query heads of a K/V head act as g queries of it: flex's split-KV decode kernel
        # takes grouped heads only when g is a power of two (qwen2.5-0.5b: 14 / 2 = 7)
        q = query.reshape(b, kv, h // kv, d)
        run = _flex() if query.is_cuda else flex_attention
        with warnings.catch_warnings():  # the CPU's eager flex warns that it is unfused
            warnings.simplefilter("ignore", UserWarning)
            out = run(q, key, value, block_mask=attention_mask, scale=kwargs.get("scaling"))
        return out.reshape(b, 1, h, d), None
    return sliced_attention(module, query, key, value, attention_mask, **kwargs)
