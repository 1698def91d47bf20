"""The static decoder's device-side pieces: one-token attention with grouped heads and
sampling that needs no host sync (both run inside captured CUDA graphs)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def sdpa_without_cudnn() -> Any:
    """A context in which scaled-dot-product attention never picks cuDNN's kernel: cuDNN
    builds an execution plan for every new shape (rows, query and key lengths), measured on
    an H200 at +130-175 ms a first forward+backward against +15 ms for flash / efficient
    attention (bench/results/gpu-longtail-1gpu.json, train_shapes) and on an H100 at ~95 ms
    for a 4-token prefill of one row, whatever its rows (bench/results/gpu-agentic.json,
    kept_kv_check: observation_prefill_ms_*). A pass of a new shape every call (a
    long-tailed batch's widths, an observation's prefill, a dynamic-cache decode step whose
    key length grows) pays it every time."""
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, attention_mask: torch.Tensor | None, *,
              decode: str = "sdpa", **kwargs: Any):
    """transformers attention: one-token queries attend with grouped heads (one fused SDPA
    kernel, `decode="sdpa"`, or two batched GEMMs around a softmax, `"matmul"`, which spreads
    a long context over the whole GPU where few rows give SDPA few blocks); the rest is sdpa."""
    if query.shape[2] == 1 and attention_mask is not None and attention_mask.dtype == torch.bool:
        b, h, _, d = query.shape
        kv = key.shape[1]
        q = query.reshape(b, kv, h // kv, d)  # the g query heads of a KV head act as g queries
        if decode == "matmul":
            scale = kwargs.get("scaling") or d ** -0.5
            scores = torch.matmul(q, key.transpose(-1, -2)).float() * scale  # [b, kv, g, L]
            scores = scores.masked_fill(~attention_mask, float("-inf"))
            out = torch.matmul(torch.softmax(scores, -1).to(value.dtype), value)
        else:
            out = F.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask,
                                                 scale=kwargs.get("scaling"))
        return out.reshape(b, 1, h, d), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def attention_matmul(*args: Any, **kwargs: Any):
    """`attention` with one-token queries through batched GEMMs."""
    return attention(*args, decode="matmul", **kwargs)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor | None,
           greedy_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and their log-probs per row, on the device; temperature 0 means greedy.

    Sampling is an exponential race (argmax of p / Exp(1)), which needs no host sync and so can
    live inside a CUDA graph; `top_p=None` skips the sort that nucleus filtering needs and
    `greedy_only` (every row has temperature 0) skips the race.
    """
    logits = logits.float()
    if greedy_only:
        tokens = logits.argmax(-1)
        return tokens, torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1)
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, 1.0, temperature)[:, None]
    logp_all = torch.log_softmax(scaled, dim=-1)
    probs = logp_all.exp()
    if top_p is None:
        sampled = (probs / torch.empty_like(probs).exponential_()).argmax(-1)
    else:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < top_p[:, None]
        sorted_p = sorted_p.masked_fill(~keep, 0.0)
        choice = (sorted_p / torch.empty_like(sorted_p).exponential_()).argmax(-1)
        sampled = order.gather(-1, choice[:, None]).squeeze(-1)
    tokens = torch.where(greedy, logits.argmax(-1), sampled)
    return tokens, logp_all.gather(-1, tokens[:, None]).squeeze(-1)
