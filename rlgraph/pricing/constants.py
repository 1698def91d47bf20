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

    train_mfu: float = 0.62
    forward_mfu: float = 0.60
    prefill_mfu: float = 0.60
    gemm_efficiency: float = 0.80
    reference_mfu: float = 0.52
    reference_ridge_flop_per_byte: float = 312e12 / 2.039e12
    decode_hbm_efficiency: float = 0.70
    native_decode_overhead_per_layer_s: float = 0.68e-3
    local_decode_seconds_per_layer: float = 0.34e-3
    graph_decode_floor_per_layer_s: float = 47e-6
    graphs_only_decode_floor_per_layer_s: float = 133e-6
    tp_allreduce_latency_s: float = 10e-6
    nccl_tree_base_latency_s: float = 4.4e-6
    nccl_nvlink_hop_latency_s: float = 0.5e-6
    nccl_net_hop_latency_s: float = 5.0e-6
    sampling_logit_passes: float = 3.5
    generate_call_overhead_s: float = 0.046
    generate_host_seconds_per_row: float = 128e-6
    local_multithread_pass_speedup: float = 1.33
    local_thread_handoff_seconds_per_layer: float = 0.54e-3
    local_sole_process_speedup: float = 1.7
    local_extra_replica_efficiency: float = 0.34
    reward_seconds_per_sample: float = 50e-6
    bucket_overhead_s: float = 2e-3
    nccl_chunk_overhead_s: float = 60e-6
    object_store_bytes_per_s: float = 0.76 * GB
    train_state_bytes_per_param: float = 16.0
    usable_memory_fraction: float = 0.90
    logits_bytes_forward: float = 28.0
    split_kv_block_bytes_per_s: float = 8.41e9
    sdpa_decode_bytes_per_s_per_sm: float = 17.4e9
    logits_bytes_backward: float = 34.0
    eager_activation_bytes_per_hidden: float = 278.0
    eager_pass_host_seconds_per_layer: float = 1.53e-3
    replica_dispatch_s: float = 0.028
    moe_pass_factor: float = 0.55
    bias_attention_forward_efficiency: float = 0.093
    decode_floor_attention_seconds_per_layer: float = 24.5e-6
    bias_attention_backward_efficiency: float = 0.081


COSTS = CostConstants()


def pass_efficiency(bf16_flops: float, hbm_bytes_per_s: float) -> float:
    """Fraction of a GPU's dense peak a large-batch transformer pass (forward or forward +
    backward) sustains, from its roofline: the GEMMs run at COSTS.gemm_efficiency and the
    memory-bound rest (norms, activations, residuals, softmax, optimizer) moves a fixed number
    of bytes per FLOP at HBM speed. That byte count is fixed by the reference measurement
    (COSTS.reference_mfu at COSTS.reference_ridge_flop_per_byte), so a GPU with a low ridge
    point (H20: 37 FLOP/byte) sustains more of its peak than one with a high ridge (H100: 295).
    """
    memory_per_flop = ((1 / COSTS.reference_mfu - 1 / COSTS.gemm_efficiency)
                       / COSTS.reference_ridge_flop_per_byte)
    ridge = bf16_flops / hbm_bytes_per_s
    return 1 / (1 / COSTS.gemm_efficiency + ridge * memory_per_flop)

COST_SOURCES: dict[str, str] = {
    "train_mfu": "local CPU clusters only (GPUs: `pass_efficiency`): bench/results/"
                 "async_vs_sync.json (2026-11-26, quiet 2-core host, 3 interleaved repeats): "
                 "one_step_off's trainer (one core, both cores busy) trained the long-tail "
                 "batch (1.73e10 FLOP) in a median 167 ms, 103 GFLOP/s = 62% of the cpu "
                 "preset's 166 GFLOP/s; the quickstart's split (async_vs_sync-quickstart.json) "
                 "gave 100 GFLOP/s (60%). An earlier 46 GFLOP/s (2026-11-22) was measured "
                 "beside other load",
    "forward_mfu": "local CPU clusters only (GPUs: `pass_efficiency`): the same runs' logp "
                   "(one core, both busy): 57.5 ms for 5.75e9 FLOP, 100 GFLOP/s = 60% of "
                   "peak (the quickstart's ref_logp: 62%)",
    "prefill_mfu": "local CPU clusters only (GPUs: `pass_efficiency`): prefill is a "
                   "large-batch forward like logp",
    "local_decode_seconds_per_layer": "local CPU clusters only: bench/results/"
                                      "async_vs_sync.json (2026-11-26) sync_1core: the "
                                      "long-tail batch's generate took a median 134 ms on "
                                      "one core for its 79 decode steps of a 4-layer model, "
                                      "where the H200 host's 0.68 ms a layer priced 257 ms: "
                                      "0.34 ms of host work a layer and step on this CPU",
    "gemm_efficiency": "/work/.library/device/README.md (this workplace's lent H200): 'bf16 "
                       "matrix work at about 790 TFLOP/s' = 80% of the 989 TFLOP/s datasheet "
                       "peak; the GEMM share of a pass runs at it",
    "reference_mfu": "Megatron-LM sustains 52% of peak on A100 for large dense GPTs "
                     "(Narayanan et al., SC21): with GEMMs at 80%, the memory-bound rest "
                     "takes 0.67x the ideal compute time there, i.e. 0.0044 bytes per FLOP "
                     "at HBM speed; `pass_efficiency` carries that to other GPUs (H100 39%, "
                     "H200 46%, H20 71%)",
    "reference_ridge_flop_per_byte": "A100 80GB SXM datasheet: 312 TFLOP/s dense bf16 over "
                                     "2.039 TB/s HBM = 153 FLOP/byte, the GPU of the "
                                     "reference_mfu measurement",
    "decode_hbm_efficiency": "memory-bound decode (GEMV + paged attention) sustains 60-80% of "
                             "peak HBM bandwidth: 70% assumed",
    "native_decode_overhead_per_layer_s": "docs/measurements.md (2026-11-22): transformers "
                                          "generate of a "
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
    "graphs_only_decode_floor_per_layer_s": "bench/results/gpu-decode.json (H200, "
                                            "llama-374m, batch 64): the static engine with "
                                            "CUDA graphs but no torch.compile (unfused "
                                            "kernels; cuda_decode: graphs) took 3.50 ms per "
                                            "decode step against a 0.30 ms HBM roofline = "
                                            "133 us of fixed cost per layer and step",
    "tp_allreduce_latency_s": "sgl-project/sglang PR 2904 (H100, unit test without CUDA "
                              "graphs): vLLM's custom all-reduce took 8.5-11.8 us at tp "
                              "2/4/8 for data sizes 512-32768 (SGLang's own kernel "
                              "3.7-7.8 us); a tensor-parallel decode step all-reduces twice "
                              "per layer (attention and MLP outputs): 2 x layers x 10 us per "
                              "step, 0.56 ms for a 28-layer model at tp 2",
    "nccl_tree_base_latency_s": "NVIDIA/nccl src/graph/tuning.cc (NCCL 2.5 tuning model, "
                                "'Latencies in us'): baseLat[Tree][LL] = 4.4 us, the fixed "
                                "latency of a small all-reduce by the tree algorithm, which "
                                "NCCL picks across nodes for small messages; a tensor-parallel "
                                "group that spans nodes all-reduces through NCCL (vLLM's custom "
                                "all-reduce works inside one node only)",
    "nccl_nvlink_hop_latency_s": "NVIDIA/nccl src/graph/tuning.cc: hwLat[NVLINK][Tree][LL] = "
                                 "0.5 us a hop inside a node; the tree adds 2 x (ranks per node "
                                 "- 1) of them",
    "nccl_net_hop_latency_s": "NVIDIA/nccl src/graph/tuning.cc: hwLat[NET][Tree][LL] = 5.0 us a "
                              "hop over the network; the tree adds 2 x log2(nodes) of them "
                              "(tp 32 over 4 nodes: 4.4 + 2 x (7 x 0.5 + 2 x 5.0) = 31.4 us)",
    "sampling_logit_passes": "bench/results/gpu-decode.json, the compiled static engine's "
                             "kernel profile (H200, llama-374m, batch 64): the fused "
                             "log_softmax / sampling kernel took 8.5 us per decode step over "
                             "64 x 32000 fp32 logits (8.2 MB): 3.5 passes over them at 70% "
                             "of HBM speed; every decode step samples its rows over the whole "
                             "vocabulary on one GPU (not split by tp)",
    "generate_call_overhead_s": "least squares over the 8 synchronous GPU runs of "
                                "bench/results/gpu-e2e-dp-128, gpu-e2e-dp, gpu-e2e-static and "
                                "gpu-longtail (256-1024 rows per replica): generate's node "
                                "time less its decode steps x measured ms per step = 0.046 s "
                                "+ 0.128 ms per row of a replica (residuals within 0.046 s): "
                                "the static engine's admission, prefill launches and host "
                                "checks, then the batch's Python assembly (token lists, "
                                "response texts); rlgraph's runtime only (engine native)",
    "generate_host_seconds_per_row": "the same fit as generate_call_overhead_s: 0.128 ms of "
                                     "host work per row of a replica per generate call",
    "local_multithread_pass_speedup": "bench/results/async_vs_sync.json (2026-11-26, quiet "
                                      "2-core host, 3 interleaved repeats): the colocated "
                                      "sync (one process of 2 slots: runtime.threads chose 2 "
                                      "threads) trained the long-tail batch in a median 129 "
                                      "ms against sync_1core's 172 ms (1.33x); the "
                                      "quickstart's colocated train 150 ms against its "
                                      "split's 184 (1.23x). (On a host shared with other "
                                      "work two threads ran 1.38x slower; runtime.threads "
                                      "then keeps one)",
    "local_thread_handoff_seconds_per_layer": "the same runs' generate: 306 ms on the two "
                                              "threads against 134 ms on one, over the "
                                              "batch's 79 decode steps of a 4-layer model: "
                                              "+0.54 ms a layer and step (a decode step's "
                                              "ops are too small to split; each hands off "
                                              "between the threads)",
    "local_sole_process_speedup": "bench/results/vs_trl.json (2-core host, rounds 0-1, the "
                                  "same workload and torch thread): train took 64 / 62 ms a "
                                  "step in the sync plan, one process computing with the "
                                  "other core free, and 103 / 121 ms in one_step_off, two "
                                  "processes computing at once; generate 43 / 43 ms against "
                                  "68 / 79 ms: same-round ratios 1.60, 1.96, 1.58, 1.83, "
                                  "median 1.7; the other CPU figures (train_mfu, ...) are "
                                  "measured with every core busy",
    "local_extra_replica_efficiency": "bench/results/async_vs_sync.json (2-core host, "
                                      "longtail graph, side by side): the colocated plan "
                                      "took 0.741 s a step in one one-thread process and "
                                      "0.555 s as two (replicas: 2): a second process adds "
                                      "34% of a core; two torch threads in one process took "
                                      "1.02 s (no gain), as they did on the quickstart "
                                      "(docs/results/async_vs_sync.md)",
    "reward_seconds_per_sample": "a rule-based verifier (parse + exact match of the final "
                                 "answer) in Python: ~50 us per sample on one core",
    "bucket_overhead_s": "fixed cost per weight bucket (Python call, NCCL launch, engine "
                         "load_weights); verl PR #2231 reports Qwen2.5-3B weight sync mostly "
                         "under 300 ms on A100s: 2 ms per bucket assumed",
    "nccl_chunk_overhead_s": "bench/results/gpu4-nccl.json (`rlgraph run` on 4x H200): "
                             "1.01 GB per param_update in 3.4-3.5 ms with 128 MB chunks, and "
                             "0.72 GB in 2.3-2.5 ms on 2x H200 (the note this constant moved "
                             "from, nodes/param_update.py): about 60 us per consume chunk (one "
                             "broadcast launch and its copy plan) on top of 352 GB/s",
    "object_store_bytes_per_s": "docs/measurements.md (2026-11-22): 1 GiB through the "
                                "Ray object store "
                                "between two actors took 1.41 s (0.76 GB/s)",
    "train_state_bytes_per_param": "mixed-precision Adam: bf16 weights (2) + bf16 grads (2) + "
                                   "fp32 master weights, momentum and variance (12) = 16 B per "
                                   "parameter (ZeRO, Rajbhandari et al. 2020)",
    "logits_bytes_forward": "bytes moved per logit by rlgraph.engines.cpu_decode.token_logp's "
                            "forward, counted from its code: the lm_head writes bf16 logits "
                            "(2), `.float()` reads them and writes fp32 (2 + 4), the "
                            "temperature division reads and writes fp32 (4 + 4), log_softmax "
                            "reads them twice (max and sum) and writes once (12): 28 bytes "
                            "per vocabulary entry and position",
    "logits_bytes_backward": "the backward of the same ops, counted the same way: the gather's "
                             "gradient written into zeros (4), log_softmax's backward reads "
                             "the gradient and the output, reduces once and writes (16), the "
                             "division's backward reads and writes (8), the cast back to "
                             "bf16 reads fp32 and writes bf16 (6): 34 bytes",
    "split_kv_block_bytes_per_s": "bench/results/gpu-decode-grid.json (H200, "
                                  "`python bench/decode_grid.py`, the static engine's varlen "
                                  "attention, one captured step replayed): at widths 128, 256 "
                                  "and 512 (one KV split per slot and KV head, torch's "
                                  "get_split_k) a longest row of 8192 tokens took 2.97-2.99 "
                                  "ms a step more than one of 4096 beside the same fresh rows "
                                  "(512 or 2048 tokens; 1 or width / 16 long rows alike), and "
                                  "at width 64 (two splits) 1.50 ms: 4096 x 6144 B = 25.2 MB "
                                  "of one KV head streamed by one block (or 12.6 MB by each "
                                  "of two) in that time, 8.41 GB/s. The difference cancels "
                                  "every other term of the step. Consistent with the H100's "
                                  "gpu-longtail-1gpu.json decode_varlen: its partial mix took "
                                  "4.18-4.31 ms a step more than the sync mix at widths "
                                  "128-512, where its longest live row stood near 6500 "
                                  "tokens (carried prefixes to 3/4 of 8192) against ~700",
    "sdpa_decode_bytes_per_s_per_sm": "bench/results/gpu-longtail-1gpu.json step_sweep "
                                      "(H200) and step_sweep_varlen (H100), SDPA decode over "
                                      "every row at one attention length: at width 512 the "
                                      "step took 8.42 ms (H200) and 8.47 ms (H100) more at "
                                      "4096 than at 1024 positions, 512 x 3072 x 12288 B = "
                                      "19.3 GB in both, 2.30 / 2.28 TB/s; at width 256 4.20 / "
                                      "4.19 ms for 9.66 GB: the same on a GPU of 4.8 TB/s HBM "
                                      "and one of 3.35 TB/s, so the SMs bound it, not HBM: "
                                      "2.29 TB/s over 132 SMs, 17.4 GB/s an SM",
    "eager_activation_bytes_per_hidden": "bench/results/gpu-node-profile-h200x2.json "
                                         "`profile` (one H200, qwen2.5-0.5b shape with the "
                                         "character vocabulary: 24 layers, hidden 896, 358M "
                                         "matmul params; 512 rows of 40 tokens): logp's "
                                         "kernels took 55.7 ms and train's 164.3 ms, of "
                                         "which the matmuls at gemm_efficiency take 18.5 / "
                                         "55.6 ms; the rest, 37.2 ms a forward and 36.2 ms "
                                         "per forward-equivalent pass of train (74 ns per "
                                         "token, layer and pass), is the eager passes' "
                                         "memory-bound work at 70% of HBM speed: 249 KB = "
                                         "278 bytes per hidden unit (scaled by the hidden "
                                         "size: measured at 896 only); the same kernels "
                                         "priced 2048 rows of the 34-layer variant at 315 / "
                                         "931 ms against 311 / 943 ms measured "
                                         "(gpu4-nccl-dp.json separation)",
    "eager_pass_host_seconds_per_layer": "bench/results/gpu-node-profile-h200x2.json `rows` "
                                         "128 (host-bound: the device needs ~14 / 41 ms): "
                                         "logp took 29.2 ms (one forward) and train 112.4 "
                                         "ms (forward + backward + AdamW: 3 forward-"
                                         "equivalents) for 24 layers; least squares over "
                                         "24 and 72 layer-passes: 1.53 ms of Python and "
                                         "launches per layer and pass (1228 / 3967 kernels "
                                         "at ~24-28 us each, the profile's counts)",
    "replica_dispatch_s": "bench/results/gpu-longtail.json (2 H200, tiny preset, 512 rows, "
                          "host-bound calls): logp took 36.6 ms as two data-parallel "
                          "replicas (longtail-colocated; the leader's own share 8.4 ms, "
                          "then 17.6 ms waiting for the follower) against 8.3 ms on one GPU "
                          "(longtail-split), train 53.6 against 26.5 ms: 28.3 and 27.1 ms "
                          "a call for handing the follower its share through Ray, its "
                          "late start and the join",
    "moe_pass_factor": "docs.nvidia.com/nemo/megatron-bridge/nightly/skills/perf-techniques/"
                       "moe-hardware-configs/SKILL.html ('Rounded Performance Bands'): "
                       "Qwen3 30B(-A3B) pretraining on H100 (TP1 EP8 PP1, DeepEP) sustains "
                       "'low-200s TFLOPS/GPU' (~210) as Megatron counts FLOPs "
                       "(num_floating_point_operations: non-causal attention, 27.8 GFLOP a "
                       "token at 4096 tokens): 133 us a token; the dense model here gives "
                       "that recipe 59 us of passes (6 x 3.03e9 active params + causal "
                       "attention at pass_efficiency 39% of H100) + 24 us of expert "
                       "all-to-all at NVLink speed, so the passes of a fine-grained MoE "
                       "(small grouped GEMMs, router, token permutation) run at 59 / 108 = "
                       "0.55 of the dense figure (0.50-0.60 over the band 200-230); the "
                       "all-to-all stays its own term",
    "bias_attention_forward_efficiency": "bench/results/gpu-pass-profile.json (one H200, "
                                         "the qwen2.5-0.5b shape: 14 query heads of 64, 24 "
                                         "layers; the long-tail batch at sigma 1.5 as train "
                                         "and logp run it, `python bench/pass_profile.py`): "
                                         "the memory-efficient kernel with the padding "
                                         "mask's bias (fmha_cutlassF) took 0.641 s over "
                                         "train's passes (rows' summed squares 7.27e8) and "
                                         "1.113 s over logp's (1.14e9): the whole square's "
                                         "1.61e14 FLOP at 91.7 TFLOP/s, 9.3% of the 989 "
                                         "TFLOP/s bf16 peak (97.5 and 88.4 apart); "
                                         "bench/results/gpu-sdpa-bias.json, the same kernel "
                                         "alone with its K/V repeat: 57 / 77 / 84 TFLOP/s at "
                                         "rows of 512 / 2048 / 8192",
    "bias_attention_backward_efficiency": "bench/results/gpu-pass-profile.json, as the "
                                          "forward: the kernel's backward (fmha_cutlassB) "
                                          "took 1.565 s over train's passes, two forward-"
                                          "equivalents of the whole square (1.25e14 FLOP): "
                                          "79.9 TFLOP/s, 8.1% of peak",
    "decode_floor_attention_seconds_per_layer": "bench/results/gpu-decode.json (H200, "
                                                "llama-374m, 24 layers, the static engine "
                                                "compiled + CUDA graphs + fused, 64 rows of "
                                                "at most 160 tokens, its kernel profile): the "
                                                "attention kernel took 588.4 us a step over "
                                                "24 calls, 24.5 us a layer at short "
                                                "contexts, inside the per-layer floors "
                                                "measured at such contexts; the varlen "
                                                "engine's attention adds only what its KV "
                                                "reads or longest row's blocks take beyond "
                                                "it (gpu-longtail-1gpu.json decode_varlen, "
                                                "H100: 3.48-3.50 ms a step at 1-16 live rows "
                                                "whether the longest row holds 3626 or 8038 "
                                                "tokens); the H200 sync run of "
                                                "gpu-longtail-1gpu.json (sigma 1.5, varlen "
                                                "section) measured 3.41-3.45 device ms a "
                                                "decode step over 8192 steps "
                                                "(generate/decode_ms_per_step), priced 3.41 "
                                                "with this term, 3.77 without",
    "usable_memory_fraction": "CUDA context, NCCL buffers and fragmentation leave ~90% of a "
                              "GPU for model state (vLLM's gpu_memory_utilization default 0.9)",
}
