"""The cost model's efficiency factors and overheads, each with the measurement or paper it
comes from (`COST_SOURCES`). The compiler applies them to a GPU preset's peaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlgraph.presets.gpus import GB


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
