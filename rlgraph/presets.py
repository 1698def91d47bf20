"""Hardware and model presets: the constants every cost model reads, each with its source.

Plain data only (no torch, no transformers) so `rlgraph compile` stays fast. The runtime
turns a model preset into a transformers config; the compiler reads its shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GPUPreset:
    """Peak figures of one accelerator (or of the local CPU, for the default cluster)."""

    name: str
    bf16_flops: float  # dense bf16 FLOP/s
    hbm_bytes_per_s: float
    memory_bytes: float
    nvlink_bytes_per_s: float  # per GPU, one direction, achievable broadcast
    network_bytes_per_s: float  # per GPU, across nodes
    source: str
    host_bytes_per_s: float = 50e9  # per GPU, GPU <-> host memory (PCIe): offload and reload


GB = 1e9
GIB = 2**30

GPU_PRESETS: dict[str, GPUPreset] = {
    "H200": GPUPreset(
        "H200", 989e12, 4.8e12, 141 * GB, 352 * GB, 50 * GB,
        "NVIDIA H200 SXM datasheet (989 TFLOP/s dense bf16, 4.8 TB/s, 141 GB); NVLink: NCCL "
        "broadcast measured 352 GB/s with 128 MB buckets on 2x H200 (DESIGN.md, 2026-11-22); "
        "network: 400 Gb/s InfiniBand per GPU; host: PCIe Gen5 x16, ~50 GB/s achieved",
        host_bytes_per_s=50 * GB,
    ),
    "H100": GPUPreset(
        "H100", 989e12, 3.35e12, 80 * GB, 340 * GB, 50 * GB,
        "NVIDIA H100 SXM datasheet (989 TFLOP/s dense bf16, 3.35 TB/s, 80 GB); NVLink 4 "
        "like H200; network: 400 Gb/s InfiniBand per GPU; host: PCIe Gen5 x16, ~50 GB/s",
        host_bytes_per_s=50 * GB,
    ),
    "A100": GPUPreset(
        "A100", 312e12, 2.039e12, 80 * GB, 230 * GB, 25 * GB,
        "NVIDIA A100 80GB SXM datasheet (312 TFLOP/s dense bf16, 2.04 TB/s); NVLink 3 "
        "600 GB/s bidirectional; network: 200 Gb/s HDR per GPU; host: PCIe Gen4 x16, "
        "~25 GB/s achieved",
        host_bytes_per_s=25 * GB,
    ),
    "H20": GPUPreset(
        "H20", 148e12, 4.0e12, 96 * GB, 340 * GB, 50 * GB,
        "NVIDIA H20 datasheet (148 TFLOP/s dense bf16, 4.0 TB/s, 96 GB); NVLink 900 GB/s "
        "bidirectional; network: 400 Gb/s per GPU; host: PCIe Gen5 x16, ~50 GB/s",
        host_bytes_per_s=50 * GB,
    ),
    "cpu": GPUPreset(
        "cpu", 1e11, 1e10, 4 * GB, 2 * GB, 1 * GB,
        "one x86 core running fp32 torch: 2 AVX2 FMA units x 8 lanes x 2 FLOP x ~3 GHz "
        "= ~96 GFLOP/s peak (the tiny quickstart measured 46 GFLOP/s in train, 2026-11-22; "
        "calibrate with `rlgraph compile --calibrate RUN/trace.json`); memory copies ~10 GB/s",
        host_bytes_per_s=10 * GB,
    ),
}

@dataclass(frozen=True)
class CostConstants:
    """Efficiency factors and overheads the analytic cost models apply to a preset's peaks.

    Every field has its source in `COST_SOURCES`; `rlgraph compile --calibrate` replaces the
    modelled time of each node with a measured one when these assumptions do not fit a machine.
    """

    train_mfu: float = 0.40
    forward_mfu: float = 0.50
    prefill_mfu: float = 0.50
    decode_hbm_efficiency: float = 0.70
    native_decode_overhead_per_layer_s: float = 0.68e-3
    graph_decode_floor_per_layer_s: float = 47e-6
    tp_allreduce_latency_s: float = 10e-6
    reshard_bytes_per_s: float = 32 * GB / 175
    local_extra_replica_efficiency: float = 0.34
    reward_seconds_per_sample: float = 50e-6
    bucket_overhead_s: float = 2e-3
    object_store_bytes_per_s: float = 0.76 * GB
    train_state_bytes_per_param: float = 16.0
    usable_memory_fraction: float = 0.90


COSTS = CostConstants()

COST_SOURCES: dict[str, str] = {
    "train_mfu": "Megatron-LM sustains 52% of peak on A100 for large dense GPTs (Narayanan et "
                 "al., SC21); RL actor updates with variable-length sequences run lower: 40% "
                 "assumed",
    "forward_mfu": "forward-only passes (logp, ref_logp) at large batch, no backward or "
                   "optimizer: 50% of dense peak assumed",
    "prefill_mfu": "rollout prefill is a large-batch forward like logp: 50% of peak assumed",
    "decode_hbm_efficiency": "memory-bound decode (GEMV + paged attention) sustains 60-80% of "
                             "peak HBM bandwidth: 70% assumed",
    "native_decode_overhead_per_layer_s": "DESIGN.md (2026-11-22): transformers generate of a "
                                          "24-layer 374M Llama on H200 took 16.8 ms per decode "
                                          "step (dynamic cache) against a 0.35 ms roofline: "
                                          "0.68 ms of host overhead per layer and step",
    "graph_decode_floor_per_layer_s": "bench/results/gpu-decode.json (H200, llama-374m, "
                                      "static engine, compile + CUDA graphs + fused): 1.43 ms "
                                      "per decode step at batch 64 against a 0.30 ms HBM "
                                      "roofline = 47 us of fixed cost per layer and step, "
                                      "the floor of a CUDA-graph decode (SGLang replays "
                                      "graphs the same way; published README, 'Decode on a "
                                      "lent H200')",
    "tp_allreduce_latency_s": "a tensor-parallel decode step all-reduces twice per layer "
                              "(attention and MLP outputs, a few KB per row): NCCL's "
                              "small-message all-reduce latency within an NVLink node is "
                              "~10 us (nccl-tests all_reduce_perf, 8 B - 64 KB)",
    "reshard_bytes_per_s": "published README, 'Switch and weight-sync costs reported "
                           "elsewhere': verl resharded Moonlight-16B-A3B's bf16 weights "
                           "(16B params, ~32 GB) into the rollout engine in 175 s on 8 H20 "
                           "(verl issue 2419): 0.19 GB/s; the same table's 16B MoE (~200 s) "
                           "and the one-step-off table's gen - generate_sequences (74 s "
                           "FSDP2 / 45 s Megatron for 7B) are of the same order",
    "local_extra_replica_efficiency": "bench/results/async_vs_sync.json (2-core host, "
                                      "longtail graph, side by side): the colocated plan "
                                      "took 0.741 s a step in one one-thread process and "
                                      "0.555 s as two (replicas: 2): a second process adds "
                                      "34% of a core; two torch threads in one process took "
                                      "1.02 s (no gain), as they did on the quickstart "
                                      "(issue 14 README)",
    "reward_seconds_per_sample": "a rule-based verifier (parse + exact match of the final "
                                 "answer) in Python: ~50 us per sample on one core",
    "bucket_overhead_s": "fixed cost per weight bucket (Python call, NCCL launch, engine "
                         "load_weights); verl PR #2231 reports Qwen2.5-3B weight sync mostly "
                         "under 300 ms on A100s: 2 ms per bucket assumed",
    "object_store_bytes_per_s": "DESIGN.md (2026-11-22): 1 GiB through the Ray object store "
                                "between two actors took 1.41 s (0.76 GB/s)",
    "train_state_bytes_per_param": "mixed-precision Adam: bf16 weights (2) + bf16 grads (2) + "
                                   "fp32 master weights, momentum and variance (12) = 16 B per "
                                   "parameter (ZeRO, Rajbhandari et al. 2020)",
    "usable_memory_fraction": "CUDA context, NCCL buffers and fragmentation leave ~90% of a "
                              "GPU for model state (vLLM's gpu_memory_utilization default 0.9)",
}


# Shapes in Hugging Face config keys. Sources: each model's config.json on its hub page;
# red-moe-16b is approximated by DeepSeek-MoE-16B's published shape (same size class).
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

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> float:
        """KV-cache bytes one token occupies across all layers (K and V)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_value


def model_shape(config: dict[str, Any]) -> ModelShape:
    """Parameter counts and KV geometry of a Hugging Face style config dict."""
    hidden = int(config["hidden_size"])
    layers = int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or hidden // heads)
    vocab = int(config["vocab_size"])
    attn = hidden * head_dim * (2 * heads + 2 * kv_heads)
    dense_mlp = 3 * hidden * int(config["intermediate_size"])
    experts = int(config.get("n_routed_experts", 0))
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
    embed = vocab * hidden * (1 if config.get("tie_word_embeddings") else 2)
    params = layers * attn + total_mlp + embed
    active = layers * attn + active_mlp + embed
    return ModelShape(float(params), float(active), layers, hidden, kv_heads, head_dim, vocab)
