"""The static decoder's K/V cache: per-layer tensors of slots x positions, written per slot."""

from __future__ import annotations

from typing import Any

import torch


class SlotKVCache:
    """Preallocated K/V per layer, [slots, kv_heads, max_len, head_dim], written per slot.

    Implements the one method transformers' attention calls (`update`). In "prefill" mode it
    writes the new keys of rows `rows` at positions 0.. and returns them (the prompt attends to
    itself, causally); in "extend" mode (`extend_at`) row i's new keys go to positions
    starts[i].. (its first `counts[i]`, the rest is padding) and the rows' cache up to
    `attn_len` is returned (new tokens attend to the positions the slot kept); in "decode"
    mode it writes one key per slot at `pos[slot]` and returns the cache up to `attn_len`.
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

    def extend_at(self, starts: list[int], counts: list[int]) -> None:
        """The next "extend" forward's (row, position) pairs: row i's first counts[i] new
        tokens at positions starts[i].."""
        dev = self.slot_index.device
        self.extend_row = torch.tensor([i for i, c in enumerate(counts) for _ in range(c)],
                                       device=dev, dtype=torch.long)
        self.extend_col = torch.tensor([j for c in counts for j in range(c)], device=dev,
                                       dtype=torch.long)
        self.extend_pos = torch.tensor([a + j for a, c in zip(starts, counts) for j in range(c)],
                                       device=dev, dtype=torch.long)

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int,
               cache_kwargs: Any = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new keys/values; return what the attention reads."""
        k, v = self.k[layer_idx], self.v[layer_idx]
        if self.mode == "prefill":
            t = key.shape[2]
            k[self.rows, :, :t] = key
            v[self.rows, :, :t] = value
            return key, value
        if self.mode == "extend":
            slots = self.rows[self.extend_row]
            k[slots, :, self.extend_pos] = key[self.extend_row, :, self.extend_col]
            v[slots, :, self.extend_pos] = value[self.extend_row, :, self.extend_col]
            return k[self.rows, :, :self.attn_len], v[self.rows, :, :self.attn_len]
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
