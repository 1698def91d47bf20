"""The static decoder's K/V cache: per-layer tensors of slots x positions, written per slot."""

from __future__ import annotations

from typing import Any

import torch


class SlotKVCache:
    """Preallocated K/V per layer, [slots, kv_heads, max_len, head_dim], written per slot.

    Implements the one method transformers' attention calls (`update`). In "prefill" mode it
    writes the new keys of rows `rows` at positions 0.. and returns them (the prompt attends to
    itself, causally); in "decode" mode it writes one key per slot at `pos[slot]` and returns the
    cache up to `attn_len`.
    """

    is_compileable = True

    def __init__(self, layers: int, slots: int, kv_heads: int, head_dim: int, max_len: int,
                 dtype: torch.dtype, device: torch.device, pos: torch.Tensor):
        shape = (slots, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.slot_index = torch.arange(slots, device=device)
        self.pos = pos
        self.mode = "decode"
        self.rows: torch.Tensor | None = None
        self.attn_len = max_len
        self.width = slots  # decode mode covers slots [0, width)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int,
               cache_kwargs: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new keys/values; return what the attention reads."""
        k, v = self.k[layer_idx], self.v[layer_idx]
        if self.mode == "prefill":
            t = key.shape[2]
            k[self.rows, :, :t] = key
            v[self.rows, :, :t] = value
            return key, value
        n = self.width
        k, v = k[:n], v[:n]
        k[self.slot_index[:n], :, self.pos[:n]] = key[:, :, 0]
        v[self.slot_index[:n], :, self.pos[:n]] = value[:, :, 0]
        return k[:, :, :self.attn_len], v[:, :, :self.attn_len]

    def move(self, src: torch.Tensor, dst: torch.Tensor, upto: int) -> None:
        """Copy the first `upto` positions of slots `src` to slots `dst`, every layer."""
        for k, v in zip(self.k, self.v):
            k[dst, :, :upto] = k[src, :, :upto]
            v[dst, :, :upto] = v[src, :, :upto]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Unused (positions are always passed explicitly); present for the Cache protocol."""
        return 0
