"""One decode step's cost: its GEMMs (compute- or weight-bound) plus attention's KV reads, a
fixed floor per layer and the tp all-reduces.

A decode step over R live rows of context c runs its GEMMs (the larger of reading the
replica's weights W, the input embedding table aside, at HBM speed and 2 * N * R FLOPs at
the GEMM efficiency: H20's ridge point is ~37 FLOP/byte, so a large batch is compute-bound
there), then attention, which reads the rows' KV (R * c * kv bytes) at HBM speed. Every step
also pays a floor per layer (kernel launches of a CUDA-graph decode, or the host overhead of
a dynamic one) and, with tp > 1, two all-reduces per layer (`tp_allreduce_seconds`). A MoE
model's step reads only the routed experts its rows pick (`ModelShape.experts_read`).
"""

from __future__ import annotations

import math
from typing import Any

from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.engine_revisions import engine_of
from rlgraph.pricing.passes import (
    thread_handoff,
    thread_slowdown,
)


def per_layer_floor(node: Any, ctx: CostContext) -> tuple[float, str]:
    """Fixed seconds per layer and decode step, and what it is: the floor of a compiled
    CUDA-graph decode (SGLang, or engine native's static decoder with cuda_decode compiled),
    of an uncompiled one (cuda_decode graphs: unfused kernels) or the dynamic decode's host
    overhead (on a local CPU cluster, its own measured figure)."""
    if node.engine == "sglang" or (not ctx.local and node.cuda_decode == "compiled"):
        return COSTS.graph_decode_floor_per_layer_s, "compiled CUDA-graph floor"
    if not ctx.local and node.cuda_decode == "graphs":
        return COSTS.graphs_only_decode_floor_per_layer_s, "uncompiled CUDA-graph floor"
    if ctx.local:
        return COSTS.local_decode_seconds_per_layer, "CPU decode overhead"
    return COSTS.native_decode_overhead_per_layer_s, "dynamic-decode overhead"


def static_engine(node: Any, ctx: CostContext) -> bool:
    """Whether generate decodes on engine native's static engine (a GPU, CUDA graphs)."""
    return node.engine == "native" and not ctx.local and node.cuda_decode != "dynamic"


def split_kv_seconds(rows: float, longest: float, node: Any, ctx: CostContext) -> float:
    """The static engine's varlen attention (flex decoding, engines/varlen_attention) runs
    one block per (slot, KV head) and KV split, splits = SMs // (width x KV heads) x 2 and
    at least 1 (torch's `flex_decoding.get_split_k`; width: the engine's compacted slot
    count, the power of two >= rows, 16 at least), each split reading its share of its own
    row's blocks: the step's attention lasts at least the longest row's K/V of one KV head
    over its splits at one block's streaming rate (COSTS.split_kv_block_bytes_per_s). An
    engine revision without the varlen kernel (`sdpa`) has no such term: its SDPA reads
    every row over the padded attention length (`decode_step_seconds`)."""
    shape, gpu = ctx.shape, ctx.gpu
    if (not static_engine(node, ctx) or not gpu.sms or longest <= 0
            or not engine_of(ctx.spec).varlen_attention):
        return 0.0
    heads = max(1, shape.kv_heads // node.tp)
    width = max(16, 2 ** math.ceil(math.log2(max(1.0, rows))))
    splits = max(1, gpu.sms // (width * heads) * 2)
    per_head = longest * shape.kv_bytes_per_token() / node.tp / heads
    return per_head / splits / COSTS.split_kv_block_bytes_per_s


def decode_step_seconds(rows: float, context: float, node: Any, ctx: CostContext,
                        longest: float = 0.0) -> float:
    """One decode step of a replica over `rows` live rows whose context is `context` tokens, kernel
    by kernel on a GPU: the GEMMs take the larger of reading the weights at HBM speed and their
    FLOPs at COSTS.gemm_efficiency; attention then reads the rows' KV at HBM speed (the two run
    one after the other, so they add) — on transformers' SDPA (the dynamic decode; the static
    engine.s split-KV varlen kernel does not pay it: bench/results/gpu-longtail-1gpu.json
    decode_varlen, sync/varlen, H100: 3.48-3.54 ms a step at 1-16 live rows against 3.46 ms at
    32), which runs one block per (row, KV head) and does not split a row's KV, only that many
    of the GPU's SMs stream it (measured on an H200, `gpu-longtail-1gpu.json` step_sweep: 16
    rows x 2 KV heads read their KV at 0.24x the bandwidth of 128+ rows, 32 / 132 SMs), each at
    most COSTS.sdpa_decode_bytes_per_s_per_sm (the SMs, not HBM, bound SDPA's decode: the same
    2.3 TB/s on an H100 and an H200); sampling reads the rows' fp32 logits over the vocabulary
    COSTS.sampling_logit_passes times; plus layers x (floor + 2 all-reduces when tp > 1,
    `tp_allreduce_seconds`); a MoE model reads only the routed experts its rows pick
    (`ModelShape.experts_read`); on an engine revision without the varlen kernel (`sdpa`) SDPA
    reads every slot of the compacted width (the power of two >= rows, 16 at least) to the
    longest row, its CUDA graph's padded batch; the varlen engine's attention lasts at least its
    longest row's split-KV blocks (`split_kv_seconds`, `longest`: that row's context), and only
    what it takes beyond the attention kernel's own time, which the per-layer floor already
    holds (COSTS.decode_floor_attention_seconds_per_layer), is added; the host spends the engine
    revision's `host_seconds_per_step` between its steps (`inflight_host_seconds_per_step` with
    in-flight updates, whose looks overlap the launched steps;
    `rlgraph.pricing.engine_revisions.ENGINE_REVISIONS`). A local CPU cluster: max(compute at
    COSTS.forward_mfu, memory), slower in a process of several threads
    (`parallel.thread_slowdown`)."""
    shape, gpu, tp = ctx.shape, ctx.gpu, node.tp
    hbm = gpu.hbm_bytes_per_s * COSTS.decode_hbm_efficiency
    unread = shape.routed_expert_params * (1.0 - shape.experts_read(rows))
    weights = 2 * (shape.matmul_params - unread) / tp / hbm
    varlen = static_engine(node, ctx) and engine_of(ctx.spec).varlen_attention
    attended = rows
    if static_engine(node, ctx) and not varlen:  # SDPA over the graph's padded batch:
        context = max(context, longest)  # every slot of the compacted width, to the longest
        attended = max(16, 2 ** math.ceil(math.log2(max(1.0, rows))))
    kv = attended * context * shape.kv_bytes_per_gpu_token(tp) / hbm
    if node.engine == "native" and gpu.sms and not varlen:  # SDPA: one block per (row, KV
        blocks = attended * max(1, shape.kv_heads // tp)  # head) on as many SMs, each at most
        rate = min(hbm, min(blocks, gpu.sms) * COSTS.sdpa_decode_bytes_per_s_per_sm)  # its rate
        kv = attended * context * shape.kv_bytes_per_gpu_token(tp) / rate
    if varlen:  # the longest row's blocks; the per-layer floor holds the kernel's own time
        kv = max(kv, split_kv_seconds(rows, longest, node, ctx))
        kv = max(0.0, kv - shape.layers * COSTS.decode_floor_attention_seconds_per_layer)
    flops = 2 * shape.matmul_active * rows / tp
    sampling = rows * shape.vocab * 4 * COSTS.sampling_logit_passes / hbm
    floor, _ = per_layer_floor(node, ctx)
    allreduce = 2 * tp_allreduce_seconds(rows, node, ctx)
    fixed = shape.layers * (floor + allreduce + thread_handoff(ctx))
    if ctx.local:
        compute = max(weights + kv, flops / (gpu.bf16_flops * COSTS.forward_mfu))
        return (compute + sampling) * thread_slowdown(ctx) + fixed
    gemms = max(weights, flops / (gpu.bf16_flops * COSTS.gemm_efficiency))
    host = 0.0
    if static_engine(node, ctx):  # in flight, the host's looks overlap the launched steps
        engine = engine_of(ctx.spec)
        host = (engine.inflight_host_seconds_per_step if getattr(node, "inflight", False)
                else engine.host_seconds_per_step)
    return gemms + kv + sampling + fixed + host


def tp_allreduce_seconds(rows: float, node: Any, ctx: CostContext) -> float:
    """One all-reduce of a decode step's `rows` hidden states (bf16) over a tensor-parallel
    replica of tp GPUs (0 at tp 1): inside one node the engine's custom all-reduce, its
    measured latency (COSTS.tp_allreduce_latency_s) plus a ring's 2 (tp - 1) / tp of the bytes
    over NVLink; a replica wider than a node spans tp / gpus_per_node nodes and all-reduces
    through NCCL, whose tree costs its base latency plus 2 x (hops inside a node and log2 of
    the nodes across the network, NCCL's own latency model) and whose bytes cross the network
    at the preset's per-GPU bandwidth."""
    tp = node.tp
    if tp <= 1 or ctx.local:
        return 0.0
    message = rows * ctx.shape.hidden * 2 * 2 * (tp - 1) / tp
    per_node = ctx.spec.cluster.gpus_per_node
    if tp <= per_node:
        return COSTS.tp_allreduce_latency_s + message / ctx.gpu.nvlink_bytes_per_s
    nodes = math.ceil(tp / per_node)
    latency = COSTS.nccl_tree_base_latency_s + 2 * (
        (per_node - 1) * COSTS.nccl_nvlink_hop_latency_s
        + math.ceil(math.log2(nodes)) * COSTS.nccl_net_hop_latency_s)
    return latency + message / ctx.gpu.network_bytes_per_s
