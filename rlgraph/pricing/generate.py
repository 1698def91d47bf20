"""The cost model of `generate`: prefill, then decode steps that each cost their GEMMs
(compute- or weight-bound) plus attention's KV reads, a fixed floor per layer and the tp
all-reduces.

A decode step over R live rows of context c runs its GEMMs (the larger of reading the
replica's weights W, the input embedding table aside, at HBM speed and 2 * N * R FLOPs at
the GEMM efficiency: H20's ridge point is ~37 FLOP/byte, so a large batch is compute-bound
there), then attention,
which reads the rows' KV (R * c * kv bytes) at HBM speed. Every step also pays a floor per
layer (kernel launches of a CUDA-graph decode, or the host overhead of a dynamic one) and,
with tp > 1, two all-reduces per layer (`tp_allreduce_seconds`). A MoE model's step reads
only the routed experts its rows pick (`ModelShape.experts_read`). Lengths follow
`data.response_len` (dist / sigma / alpha, clipped at max, `rlgraph.lengths`): rows
finish along its survival curve, so KV reads go with E[L^2] and a synchronous batch decodes
until the expected longest of its samples, not always max.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from rlgraph import lengths
from rlgraph.pricing import rollout_rounds
from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.engine_revisions import engine_of
from rlgraph.pricing.passes import (
    bias_attention_seconds,
    compute_units,
    eager_activation_traffic,
    efficiency,
    padding_mask,
    runtime_pass_hbm,
    thread_handoff,
    thread_slowdown,
)

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec

SEGMENTS = 48  # pieces of a batch's survival curve the decode time integrates over
# seeded draws a run's first rounds are averaged over where its policy chooses the lengths
# (a sample size of the simulation, not a cost)
WINDOW_SEEDS = 8


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


def _batch_decode(rows: float, held: float, node: Any, ctx: CostContext,
                  model: lengths.LengthModel, paged_tokens: float = 0.0,
                  batch: float = 0.0) -> tuple[float, float]:
    """(seconds, steps) of a synchronous batch of `rows` per replica when the KV cache holds
    `held` of them: continuous batching streams the surplus at `held` rows, then the last
    `held` rows finish along the survival curve until the expected longest of the call's
    whole `batch` (all replicas' rows; at least this replica's `held`): the call returns
    when its slowest replica does, and that replica decodes the batch's longest sample
    (the longest of R replicas' longests is the longest of all their rows). A paged KV
    cache of `paged_tokens` tokens (engine sglang: vLLM and SGLang allocate a row's blocks
    as it grows) holds only paged_tokens / (prompt + t) rows of context t: where the live
    rows outgrow it, the engine preempts the rest and decodes them later, so that stretch of
    the tail runs at the rows the cache holds, for as many more steps."""
    mean, second = lengths.moments(model)
    prompt = ctx.spec.data.prompt_len
    seconds = steps = 0.0
    live = min(rows, held)
    if held < rows:
        steps = (rows - held) * mean / held
        seconds = steps * decode_step_seconds(held, prompt + second / (2 * mean), node, ctx)
    end = lengths.expected_max(model, max(1, round(max(live, batch))))
    width = end / SEGMENTS
    stretched = 0.0
    for i in range(SEGMENTS):
        t = (i + 0.5) * width
        alive = min(live, max(1.0, live * model.survival(t)) if t < end else 1.0)
        fit = max(1.0, paged_tokens / (prompt + t)) if paged_tokens > 0 else alive
        if fit < alive:  # the cache holds `fit` rows: the segment's row-steps at fit a step
            stretched += width * (alive / fit - 1)
            seconds += width * alive / fit * decode_step_seconds(fit, prompt + t, node, ctx,
                                                                 longest=prompt + t)
            continue
        seconds += width * decode_step_seconds(alive, prompt + t, node, ctx,
                                               longest=prompt + t)
    return seconds, steps + end + stretched


def generate_lag(node: Any, ctx: CostContext) -> int | tuple[int, ...]:
    """Versions generate's weights lag the step whose batch it samples, from the plan's
    structure: 0 where generate shares train's group (the group runs it after the previous
    train step, on the newest weights); else 1, a split plan's call t running beside train
    t - 1 on version t - 1; with in-flight updates one more, since a call's refills admit
    later batches' groups (`RolloutRules.target` with `taken`), so a later call can find its
    batch complete and return at once and the generator's next call starts beside the same
    train step (bench/results/gpu-inflight.json, split pair on 2x H200: the trained tokens'
    mean age `lag/mean` 1.2-1.4 versions a step without in-flight updates, 1.5-2.3 with
    them; their one-GPU colocated runs 0.5-1.0, the carried tokens' age alone); never more
    than max_lag. Where the compiler read the lags off the plan's own simulated schedule
    (`compiler.costs.schedule_lags`: a colocated group whose train waits on a batch from
    outside the group runs the next generate first), that cycle of lags, one per round."""
    if "generate_lag" in ctx.extra:
        return tuple(ctx.extra["generate_lag"])
    max_lag = int(ctx.spec.schedule.max_lag)
    if "train" in ctx.colocated or max_lag <= 0:
        return 0
    return min(max_lag, 2 if getattr(node, "inflight", False) else 1)


def partial_rounds(per_replica: int, node: Any, ctx: CostContext,
                   model: lengths.LengthModel
                   ) -> tuple[float, float, float, float, float, float]:
    """(decode seconds, decode steps, mean live rows, re-encoded tokens with the padding of
    the engine's prefill chunks, `rollout_rounds.chunk_padding`, the sum of the
    re-encoded rows' squared lengths, and the unfinished rows handed the engine) of one
    steady-state
    partial-rollout round of a replica: the simulated round's stretches (live rows, their
    mean context) each priced by `decode_step_seconds`; the static engine checks for
    complete groups every `sync_every` steps (engine native on a GPU), the CPU decoder
    every step. Streaming (`schedule.stream`): the version's mini-batch calls, K of them.
    In-flight updates (`inflight`): rows never stop (kept rows are not re-encoded, except
    with kv: recompute) and a completed group's place is refilled inside the round.
    Generate's weights lag the batch it samples by `generate_lag` versions (a round that
    holds the oldest version the bound allows admits no spares, and the must-finish groups
    come due sooner)."""
    data, schedule = ctx.spec.data, ctx.spec.schedule
    k = data.samples_per_prompt
    stride = schedule.mini_batches if schedule.stream is not None else 1
    prompts = max(1, math.ceil(per_replica / k / stride))
    check = node.sync_every if static_engine(node, ctx) else 1
    inflight = bool(getattr(node, "inflight", False))
    mix = bool(schedule.partial_rollout or inflight)  # else a sample never spans versions
    engine = engine_of(ctx.spec)
    rounds = functools.partial(
        rollout_rounds.simulate, model, prompts, k,
        float(node.oversample) if schedule.partial_rollout else 1.0,
        int(schedule.max_lag), str(node.stale), check, int(data.prompt_len),
        generate_lag=generate_lag(node, ctx), stride=stride, inflight=inflight,
        slots=int(ctx.extra.get("engine_slots") or 0) or None,
        slot_refill=engine.slot_refill,
        shares_device=engine.shared_gpu_reserve and "train" in ctx.colocated,
        reencode=getattr(node, "kv", "keep") == "recompute", mix_versions=mix)
    window = ctx.extra.get("rounds_window")
    if window is None:
        profile = rounds()
    else:  # a run's first rounds (`compiler.first_steps`): its lengths where it forces them
        first, last, first_lags, after_on_policy = window
        steady = generate_lag(node, ctx)
        cycle = steady if isinstance(steady, tuple) else (steady,)
        lags = tuple(first_lags) or tuple(  # a round never lags more versions than exist
            min(t, cycle[t % len(cycle)]) for t in range(last))
        kept = dict(window=(first, last), first_lags=lags, after_on_policy=after_on_policy)
        if getattr(node, "forced_lengths", False):
            profile = rounds(forced=rollout_rounds.Forced(
                int(data.seed), int(data.prompts_per_step), 0, prompts * stride), **kept)
        else:  # policy lengths: the window's expected rounds over seeded draws
            profile = rollout_rounds.pooled([rounds(seed=seed, **kept)
                                             for seed in range(WINDOW_SEEDS)])
    seconds = sum(steps * decode_step_seconds(rows, context, node, ctx, longest)
                  for steps, rows, context, longest in profile.segments)
    busy = sum(steps for steps, *_ in profile.segments)
    live = sum(steps * rows for steps, rows, *_ in profile.segments) / max(busy, 1e-12)
    return (seconds * stride, profile.steps * stride, live,
            (profile.reencoded_tokens + profile.padding_tokens) * stride,
            profile.reencoded_square * stride, profile.submitted_rows * stride)


def eager_prefill_seconds(tokens: float, square: float, calls: int, node: Any,
                          ctx: CostContext) -> float | None:
    """The static engine's prefill of carried rows on a GPU: an eager forward of the model
    over its padded chunks (`StaticDecoder._prefill`, the transformers model with the padding
    mask), priced as rlgraph's own passes are (`passes.runtime_pass_cost`): the matmuls at
    COSTS.gemm_efficiency, attention under the mask's bias at the kernel's measured rate
    (`passes.bias_attention_seconds`), the eager activation traffic at HBM speed, while the
    host launches the layers of `calls` chunks a replica, one after the other
    (COSTS.eager_pass_host_seconds_per_layer): the longer of the two. `tokens` and `square`
    (the rows' summed squared lengths) are the group's. None off the static engine, or where
    rlgraph's passes are not priced this way (a CPU cluster, another system)."""
    if not static_engine(node, ctx) or runtime_pass_hbm(ctx) is None or tokens <= 0:
        return None
    shape, gpu = ctx.shape, ctx.gpu
    model = lengths.of(ctx.spec.data.response_len)
    flops = 2 * shape.matmul_active * tokens
    if padding_mask(ctx, model):
        attention = bias_attention_seconds(ctx, square, backward=False)
    else:
        flops += shape.attention_flops(1.0) * square
        attention = 0.0
    device = (flops / (gpu.bf16_flops * COSTS.gemm_efficiency * compute_units(ctx))
              + attention + eager_activation_traffic(ctx, tokens, 1.0))
    host = max(0, calls) * shape.layers * COSTS.eager_pass_host_seconds_per_layer
    return max(device, host)


def generate_cost(node: NodeSpec, ctx: CostContext) -> float:
    """Prefill (compute-bound, 2 * N * prompt tokens, N = `ModelShape.matmul_active`) plus
    decode (see the module).

    A multi-turn node (`env:`) is priced by `rlgraph.pricing.env`, turn by turn.

    Partial rollout (engines/partial_rollout): `partial_rounds`, the decode steps, live rows
    and their contexts of the cache's rounds as `rollout_rounds.simulate` finds them, and the
    carried rows' prompt + prefix re-encoded every round (prefill).
    """
    data, shape, gpu = ctx.spec.data, ctx.shape, ctx.gpu
    tp = node.tp
    batch = data.samples_per_step()
    replicas = max(1, ctx.gpus // tp)
    if ctx.local:  # one engine per process, threads aside
        replicas = min(replicas, int(ctx.extra.get("replicas", 1)))
    # a replica samples whole prompts, the shares within one prompt (rl.batch.shard_bounds):
    # the slowest holds the larger share
    per_replica = math.ceil(data.prompts_per_step / replicas) * data.samples_per_prompt
    if getattr(node, "env", None) is not None:  # multi-turn: priced turn by turn
        from rlgraph.pricing.env import multi_turn_cost

        return multi_turn_cost(node, ctx, per_replica, replicas)
    model = lengths.of(data.response_len)
    mean, second = lengths.moments(model)
    weights = 2 * shape.params / tp
    kv_token = shape.kv_bytes_per_gpu_token(tp)
    share = getattr(node, "memory_fraction", None) or COSTS.usable_memory_fraction
    free = gpu.memory_bytes * share - weights
    seq_kv = kv_token * (data.prompt_len + second / (2 * mean))  # paged KV of a live row

    slots = ctx.extra.get("engine_slots")  # the native engine's, from the memory pass

    def held(rows: float) -> float:
        rows_held = rows if free <= 0 else max(1, min(rows, free // seq_kv))
        return min(rows_held, slots) if slots else rows_held

    concurrent = held(per_replica)
    paged = free / kv_token if node.engine == "sglang" and not ctx.local and free > 0 else 0.0
    decode, steps = _batch_decode(per_replica, concurrent, node, ctx, model, paged,
                                  batch=min(batch, per_replica * replicas))
    how = ("synchronous batch streamed through the KV cache, then its longest tail"
           if concurrent < per_replica else "synchronous batch: until its expected longest")
    prefill_tokens = batch * data.prompt_len
    reencoded = reencoded_square = 0.0  # carried rows' prompt + prefix, the group's
    inflight = getattr(node, "inflight", False)
    handed_rows = float(per_replica)  # rows a call hands the engine (a request in, a row out)
    if ctx.spec.schedule.partial_rollout or inflight:
        partial, partial_steps, live, reencode, square, handed = partial_rounds(
            per_replica, node, ctx, model)
        decode, steps = partial, partial_steps
        how = (f"partial rollout: {node.oversample:g}x groups in flight, {live:.0f} rows "
               f"decoding on average (rounds simulated, `rollout_rounds`); carried rows' "
               f"{reencode:.3g} tokens re-encoded in padded prefill chunks")
        if inflight:
            how = (f"in-flight updates (kv {node.kv}): rows never stop, finished groups "
                   f"refilled inside the call, {live:.0f} rows decoding on average; "
                   f"{reencode:.3g} tokens re-encoded; the swap's pause is switch_cost")
        reencoded, reencoded_square = reencode * replicas, square * replicas
        if not inflight:  # every unfinished row held, carried or new, goes in and out again
            handed_rows = max(handed_rows, handed)
    if (ctx.spec.schedule.stream is not None and not ctx.spec.schedule.partial_rollout
            and not inflight):  # the cache's mini-batch calls, a sample within one version
        decode, steps, live, reencode, *_ = partial_rounds(per_replica, node, ctx, model)
        how = (f"streaming: {ctx.spec.schedule.mini_batches} calls a version, finished groups "
               f"refilled while the version can train them, {live:.0f} rows decoding on "
               f"average (rounds simulated, `rollout_rounds`)")
    # the new prompts' prefill: its FLOPs (its launches are in the call's host overhead,
    # generate_call_overhead_s, fitted over synchronous runs whose calls prefill once)
    prefill = (2 * shape.matmul_active * prefill_tokens
               / (gpu.bf16_flops * efficiency(ctx, COSTS.prefill_mfu) * compute_units(ctx))
               * thread_slowdown(ctx))
    if reencoded:  # the carried rows' re-encode: chunks of long prefixes
        chunks = math.ceil((prefill_tokens + reencoded) / replicas
                           / rollout_rounds.PREFILL_TOKENS)
        eager = eager_prefill_seconds(reencoded, reencoded_square, chunks - 1, node, ctx)
        prefill += eager if eager is not None else (
            2 * shape.matmul_active * reencoded
            / (gpu.bf16_flops * efficiency(ctx, COSTS.prefill_mfu) * compute_units(ctx))
            * thread_slowdown(ctx))
    host = 0.0
    if node.engine == "native" and not ctx.local:
        host = COSTS.generate_call_overhead_s + COSTS.generate_host_seconds_per_row * handed_rows
    _, floor_kind = per_layer_floor(node, ctx)
    waves = "" if concurrent >= per_replica else f"; KV holds {concurrent:.0f}/{per_replica}"
    ctx.extra["detail"] = (f"prefill {prefill:.3g} s + decode {steps:.0f} steps x "
                           f"{decode / max(steps, 1e-12) * 1e3:.3g} ms ({how}{waves}; "
                           f"{floor_kind} per layer)"
                           + (f" + host {host:.3g} s (rlgraph runtime: call + rows)" if host
                              else ""))
    if concurrent < per_replica:
        ctx.extra["note"] = (f"{ctx.name}: the KV cache holds {concurrent:.0f} of the "
                             f"{per_replica} sequences of each replica at a time; more GPUs "
                             f"(share) or a larger tp would decode them together")
    return prefill + decode + host
