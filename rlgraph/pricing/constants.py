"""The cost model's efficiency factors and overheads, each with the measurement or paper it
comes from (`COST_SOURCES`, in `rlgraph.pricing.constant_sources`). The compiler applies them
to a GPU preset's peaks.
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
