"""Weights between the transformers layout and megatron-core's GPTModel layout, exactly.

transformers (what generate, checkpoints and weight sync use) keeps q/k/v and gate/up as
separate matrices; megatron-core fuses them: `linear_qkv` holds, for each of the `kv_heads`
query groups in turn, that group's query heads, then its key head, then its value head;
`linear_fc1` holds gate over up. Tensor parallelism cuts column-parallel weights (qkv, fc1,
embedding, output) by rows and row-parallel ones (attention proj, fc2) by columns; fc1 is
cut so that each rank keeps its own [gate; up] pair. The vocabulary is padded to a multiple
of tp (the padded rows are zero and never reach the caller). Only reshapes and copies: a
round trip returns the same bytes. Needs torch only, not megatron-core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rlgraph.errors import SpecError

SUPPORTED = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True)
class MegatronLayout:
    """The shape facts of a dense Llama-family model that the conversion needs."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    padded_vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    norm_eps: float
    rope_theta: float

    @property
    def group_rows(self) -> int:
        """Rows of linear_qkv per query group: its query heads, one key and one value head."""
        return (self.heads // self.kv_heads + 2) * self.head_dim


def _rope_theta(config: Any) -> float:
    """RoPE base of a transformers config (v5 keeps it in `rope_parameters`); only plain
    RoPE is supported."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    params = dict(params or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise SpecError(f"backend megatron supports plain RoPE, not rope_type '{kind}'",
                        ("model",), hint="use backend: torch for this model")
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def layout_of(config: Any, tp: int = 1) -> MegatronLayout:
    """The layout of a transformers config (llama / qwen2 / qwen3, dense) cut `tp` ways."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        raise SpecError(f"backend megatron does not convert model_type '{model_type}'",
                        ("model",), hint=f"use one of {', '.join(SUPPORTED)} or backend: torch")
    if getattr(config, "mlp_bias", False) or getattr(config, "hidden_act", "silu") != "silu":
        raise SpecError("backend megatron expects a SwiGLU MLP without bias", ("model",),
                        hint="use backend: torch for this model")
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    hidden = int(config.hidden_size)
    vocab = int(config.vocab_size)
    for what, size in (("num_attention_heads", heads), ("num_key_value_heads", kv_heads)):
        if size % tp:
            raise SpecError(f"tp={tp} does not divide {what}={size}", ("model",),
                            hint=f"choose tp among the divisors of {size}")
    return MegatronLayout(
        layers=int(config.num_hidden_layers), hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=int(getattr(config, "head_dim", None) or hidden // heads),
        ffn=int(config.intermediate_size), vocab=vocab, padded_vocab=-(-vocab // tp) * tp,
        tied=bool(getattr(config, "tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
        qk_norm=model_type == "qwen3",
        norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)), rope_theta=_rope_theta(config))


# per-layer names: transformers suffix -> megatron suffix (1:1 tensors)
_PLAIN = {
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
}


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t.clone()
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])])


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              lay: MegatronLayout) -> torch.Tensor:
    """[q; k; v] of transformers -> megatron's per-group [q heads of g, k_g, v_g]."""
    g, d = lay.kv_heads, lay.head_dim
    rest = q.shape[1:]
    parts = [q.reshape(g, lay.heads // g * d, *rest), k.reshape(g, d, *rest),
             v.reshape(g, d, *rest)]
    return torch.cat(parts, dim=1).reshape(g * lay.group_rows, *rest)


def _split_qkv(qkv: torch.Tensor, lay: MegatronLayout) -> tuple[torch.Tensor, ...]:
    g, d = lay.kv_heads, lay.head_dim
    rest = qkv.shape[1:]
    q, k, v = qkv.reshape(g, lay.group_rows, *rest).split([lay.heads // g * d, d, d], dim=1)
    return (q.reshape(lay.heads * d, *rest), k.reshape(g * d, *rest),
            v.reshape(g * d, *rest))


def hf_to_megatron(state: dict[str, torch.Tensor], lay: MegatronLayout) -> dict[str, torch.Tensor]:
    """A transformers state dict -> the full (unsharded) megatron GPTModel state dict."""
    out = {"embedding.word_embeddings.weight":
           _pad_rows(state["model.embed_tokens.weight"], lay.padded_vocab),
           "decoder.final_layernorm.weight": state["model.norm.weight"].clone()}
    if not lay.tied:
        out["output_layer.weight"] = _pad_rows(state["lm_head.weight"], lay.padded_vocab)
    for i in range(lay.layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        for src, dst in _PLAIN.items():
            if hf + src in state:
                out[mg + dst] = state[hf + src].clone()
        attn = hf + "self_attn."
        for kind in ("weight", "bias") if lay.qkv_bias else ("weight",):
            out[f"{mg}self_attention.linear_qkv.{kind}"] = _fuse_qkv(
                *(state[f"{attn}{p}_proj.{kind}"] for p in "qkv"), lay)
        out[mg + "mlp.linear_fc1.weight"] = torch.cat(
            [state[hf + "mlp.gate_proj.weight"], state[hf + "mlp.up_proj.weight"]])
    return out


def megatron_to_hf(state: dict[str, torch.Tensor], lay: MegatronLayout,
                   with_lm_head: bool = True) -> dict[str, torch.Tensor]:
    """The full megatron state dict -> the transformers one (`lm_head.weight` also when tied,
    as transformers' own state_dict lists it, unless `with_lm_head` is False)."""
    embed = state["embedding.word_embeddings.weight"][:lay.vocab].clone()
    out = {"model.embed_tokens.weight": embed}
    for i in range(lay.layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        for src, dst in _PLAIN.items():
            if mg + dst in state:
                out[hf + src] = state[mg + dst].clone()
        for kind in ("weight", "bias") if lay.qkv_bias else ("weight",):
            q, k, v = _split_qkv(state[f"{mg}self_attention.linear_qkv.{kind}"], lay)
            for name, t in zip("qkv", (q, k, v)):
                out[f"{hf}self_attn.{name}_proj.{kind}"] = t.clone()
        gate, up = state[mg + "mlp.linear_fc1.weight"].chunk(2)
        out[hf + "mlp.gate_proj.weight"], out[hf + "mlp.up_proj.weight"] = gate.clone(), up.clone()
    out["model.norm.weight"] = state["decoder.final_layernorm.weight"].clone()
    if with_lm_head:
        out["lm_head.weight"] = (embed if lay.tied
                                 else state["output_layer.weight"][:lay.vocab].clone())
    return out


def _tp_rule(name: str) -> str:
    """How a megatron tensor is cut across tp ranks: rows, cols, fc1 (per-rank gate/up) or
    none (replicated)."""
    if name.endswith("linear_fc1.weight"):
        return "fc1"
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return "cols"
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight",
                      "output_layer.weight")):
        return "rows"
    return "none"


def split_tp(state: dict[str, torch.Tensor], tp: int) -> list[dict[str, torch.Tensor]]:
    """The full megatron state dict -> one state dict per tensor-parallel rank."""
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]
    for name, t in state.items():
        rule = _tp_rule(name)
        if rule == "fc1":
            gates, ups = t.chunk(2)[0].chunk(tp), t.chunk(2)[1].chunk(tp)
            parts = [torch.cat([g, u]) for g, u in zip(gates, ups)]
        elif rule == "rows":
            parts = list(t.chunk(tp, dim=0))
        elif rule == "cols":
            parts = list(t.chunk(tp, dim=1))
        else:
            parts = [t] * tp
        for shard, part in zip(shards, parts):
            shard[name] = part.clone()
    return shards


def merge_tp(shards: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """One state dict per tensor-parallel rank -> the full megatron state dict."""
    out: dict[str, torch.Tensor] = {}
    for name in shards[0]:
        parts = [s[name] for s in shards]
        rule = _tp_rule(name)
        if rule == "fc1":
            halves = [p.chunk(2) for p in parts]
            out[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves])
        elif rule == "rows":
            out[name] = torch.cat(parts, dim=0)
        elif rule == "cols":
            out[name] = torch.cat(parts, dim=1)
        else:
            out[name] = parts[0].clone()
    return out
