"""Model presets (shapes in Hugging Face config keys) and the `ModelShape` the cost model reads.

Plain data only (no torch, no transformers): the runtime turns a preset into a transformers
config; the compiler reads its shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PASS_WIDTH_BLOCK = 256  # response widths of a length-sorted pass are multiples of it (few shapes)

# Shapes in Hugging Face config keys. Sources: each model's config.json on its hub page;
# red-moe-16b is approximated by DeepSeek-MoE-16B's published shape (same size class);
# qwen3-30b-a3b is Qwen/Qwen3-30B-A3B's config.json (qwen3_moe: 128 experts, top-8, no shared
# expert, every layer sparse), 30.5B parameters = 61.1 GB in bf16 (its safetensors: 56.9 GiB).
# qwen3-235b-a22b is Qwen/Qwen3-235B-A22B's config.json (qwen3_moe: 94 layers, 128 experts of
# 1536, top-8, 4 KV heads; 235B parameters, 22B active). deepseek-v3 is
# deepseek-ai/DeepSeek-V3's config.json (deepseek_v3: 61 layers, multi-head latent attention
# with q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128,
# v_head_dim 128 over 128 heads; 256 routed experts of 2048 + 1 shared, top-8, the first 3
# layers dense at 18432; 671B parameters, 37B active; the MTP layer aside).
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        model_type="llama", vocab_size=64, hidden_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=512,
        max_position_embeddings=512, tie_word_embeddings=True,
    ),
    "llama-374m": dict(
        model_type="llama", vocab_size=32000, hidden_size=1024, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=16, intermediate_size=2816,
        max_position_embeddings=4096, tie_word_embeddings=False,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=896, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
        max_position_embeddings=32768, tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
        max_position_embeddings=32768, tie_word_embeddings=True,
    ),
    "qwen2.5-3b": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=2048, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, intermediate_size=11008,
        max_position_embeddings=32768, tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=3584, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
        max_position_embeddings=32768, tie_word_embeddings=False,
    ),
    "qwen2.5-32b": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=5120, num_hidden_layers=64,
        num_attention_heads=40, num_key_value_heads=8, intermediate_size=27648,
        max_position_embeddings=32768, tie_word_embeddings=False,
    ),
    "qwen3-4b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=2560, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=9728,
        max_position_embeddings=40960, tie_word_embeddings=True,
    ),
    "qwen3-8b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=4096, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=12288,
        max_position_embeddings=40960, tie_word_embeddings=False,
    ),
    "qwen3-14b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=5120, num_hidden_layers=40,
        num_attention_heads=40, num_key_value_heads=8, head_dim=128, intermediate_size=17408,
        max_position_embeddings=40960, tie_word_embeddings=False,
    ),
    "qwen3-32b": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=5120, num_hidden_layers=64,
        num_attention_heads=64, num_key_value_heads=8, head_dim=128, intermediate_size=25600,
        max_position_embeddings=40960, tie_word_embeddings=False,
    ),
    "llama-3.1-8b": dict(
        model_type="llama", vocab_size=128256, hidden_size=4096, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
        max_position_embeddings=131072, tie_word_embeddings=False,
    ),
    "qwen3-30b-a3b": dict(
        model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144,
        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        max_position_embeddings=40960, tie_word_embeddings=False,
    ),
    "qwen3-235b-a22b": dict(
        model_type="qwen3_moe", vocab_size=151936, hidden_size=4096, num_hidden_layers=94,
        num_attention_heads=64, num_key_value_heads=4, head_dim=128, intermediate_size=12288,
        moe_intermediate_size=1536, num_experts=128, num_experts_per_tok=8,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        max_position_embeddings=40960, tie_word_embeddings=False,
    ),
    "deepseek-v3": dict(
        model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, num_hidden_layers=61,
        num_attention_heads=128, num_key_value_heads=128, intermediate_size=18432,
        q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, moe_intermediate_size=2048, n_routed_experts=256, n_shared_experts=1,
        num_experts_per_tok=8, first_k_dense_replace=3, max_position_embeddings=163840,
        tie_word_embeddings=False,
    ),
    "red-moe-16b": dict(
        model_type="deepseek_v2-like", vocab_size=102400, hidden_size=2048,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=16,
        intermediate_size=10944, moe_intermediate_size=1408, n_routed_experts=64,
        n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1,
        max_position_embeddings=4096, tie_word_embeddings=False,
    ),
}


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of a model: sizes in parameters and bytes per token."""

    params: float  # all parameters (memory, weight sync)
    active_params: float  # parameters touched per token (FLOPs)
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    vocab: int
    heads: int = 0  # query heads (attention FLOPs); 0: as many as kv_heads
    embedding_params: float = 0.0  # an input table apart from the output head (no FLOPs)
    moe_layers: int = 0  # layers whose MLP routes each token to top_k experts
    top_k: int = 0
    experts: int = 0  # routed experts of a MoE layer (a decode step reads those its rows pick)
    # values one token keeps per layer in the KV cache: 0 for K and V of every KV head
    # (2 x kv_heads x head_dim); multi-head latent attention keeps one latent of
    # kv_lora_rank + qk_rope_head_dim, shared by every head (kv_heads 1 then)
    kv_values: int = 0
    attention_width: int = 0  # query width QK^T and AV multiply by (0: heads x head_dim)

    @property
    def matmul_params(self) -> float:
        """Parameters a forward multiplies by (weights a decode step reads): all but an input
        embedding table that is not also the output head (a lookup of one row per token)."""
        return self.params - self.embedding_params

    @property
    def matmul_active(self) -> float:
        """Parameters touched per token by a matmul: 2 x this is a token's forward FLOPs
        outside attention (MoE: the routed experts only; no input embedding lookup)."""
        return self.active_params - self.embedding_params

    @property
    def routed_expert_params(self) -> float:
        """Parameters of every routed expert of every MoE layer (0 for a dense model): the
        part of the weights a decode step reads only for the experts its rows are routed to."""
        if not self.moe_layers or self.experts <= self.top_k:
            return 0.0
        return (self.params - self.active_params) * self.experts / (self.experts - self.top_k)

    def experts_read(self, rows: float) -> float:
        """Fraction of the routed experts a forward over `rows` tokens reads: each token picks
        top_k of the experts, so (tokens spread evenly) an expert is left unread with
        probability (1 - top_k / experts)^rows; 1 for a dense model."""
        if not self.routed_expert_params:
            return 1.0
        return 1.0 - (1.0 - self.top_k / self.experts) ** max(1.0, rows)

    def attention_flops(self, length: float) -> float:
        """Forward FLOPs of causal self-attention over one sequence of `length` tokens beyond
        the projections: QK^T and AV each 2 x (length^2 / 2) x query width per layer."""
        width = self.attention_width or (self.heads or self.kv_heads) * self.head_dim
        return 2 * self.layers * width * length ** 2

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> float:
        """KV-cache bytes one token occupies across all layers (K and V of every KV head, or
        the latent of multi-head latent attention)."""
        values = self.kv_values or 2 * self.kv_heads * self.head_dim
        return self.layers * values * bytes_per_value

    def kv_bytes_per_gpu_token(self, tp: int, bytes_per_value: int = 2) -> float:
        """KV-cache bytes one token occupies on each GPU of a tensor-parallel replica of `tp`
        GPUs: its share of the KV heads, at least one whole head, since an engine replicates
        a KV head over the ranks when tp exceeds them (vLLM: num_key_value_heads < tp; the
        latent of multi-head latent attention is one head, kept whole on every rank)."""
        per_head = self.kv_bytes_per_token(bytes_per_value) / max(1, self.kv_heads)
        return per_head * math.ceil(self.kv_heads / max(1, tp))


def model_shape(config: dict[str, Any]) -> ModelShape:
    """Parameter counts and KV geometry of a Hugging Face style config dict."""
    hidden = int(config["hidden_size"])
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    vocab = int(config["vocab_size"])
    attn = hidden * head_dim * (2 * heads + 2 * kv_heads)
    kv_values = attention_width = 0
    if config.get("kv_lora_rank"):  # multi-head latent attention (DeepSeek V2 / V3)
        latent, rope = int(config["kv_lora_rank"]), int(config["qk_rope_head_dim"])
        qk = int(config["qk_nope_head_dim"]) + rope
        v = int(config["v_head_dim"])
        q_rank = config.get("q_lora_rank")
        query = (hidden * int(q_rank) + int(q_rank) * heads * qk if q_rank
                 else hidden * heads * qk)
        attn = (query + hidden * (latent + rope)
                + latent * heads * (int(config["qk_nope_head_dim"]) + v) + heads * v * hidden)
        kv_heads, head_dim, kv_values = 1, latent + rope, latent + rope
        attention_width = heads * (qk + v) // 2
    dense_mlp = 3 * hidden * int(config["intermediate_size"])
    experts = int(config.get("n_routed_experts") or config.get("num_experts") or 0)
    if experts:
        expert_mlp = 3 * hidden * int(config["moe_intermediate_size"])
        shared = int(config.get("n_shared_experts", 0)) * expert_mlp
        dense_layers = int(config.get("first_k_dense_replace", 0))
        moe_layers = layers - dense_layers
        top_k = int(config["num_experts_per_tok"])
        total_mlp = dense_layers * dense_mlp + moe_layers * (experts * expert_mlp + shared)
        active_mlp = dense_layers * dense_mlp + moe_layers * (top_k * expert_mlp + shared)
    else:
        total_mlp = active_mlp = layers * dense_mlp
    tied = bool(config.get("tie_word_embeddings"))
    embed = vocab * hidden * (1 if tied else 2)
    params = layers * attn + total_mlp + embed
    active = layers * attn + active_mlp + embed
    return ModelShape(float(params), float(active), layers, hidden, kv_heads, head_dim, vocab,
                      heads=heads, embedding_params=0.0 if tied else float(vocab * hidden),
                      moe_layers=moe_layers if experts else 0,
                      top_k=int(config["num_experts_per_tok"]) if experts else 0,
                      experts=experts, kv_values=kv_values,
                      attention_width=attention_width)
