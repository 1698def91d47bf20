"""The cost model of a `generate` call: prefill, then decode steps (one step's physics:
`rlgraph.pricing.decode_step`) over the rows still decoding. Lengths follow
`data.response_len` (dist / sigma / alpha, clipped at max, `rlgraph.lengths`): rows finish
along its survival curve, so KV reads go with E[L^2] and a synchronous batch decodes until
the expected longest of its samples, not always max; partial rollout, streaming and
in-flight updates decode the rounds `rollout_rounds` simulates.
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

from rlgraph import lengths
from rlgraph.pricing import rollout_rounds
from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.decode_step import (
    decode_step_seconds,
    per_layer_floor,
    static_engine,
)
from rlgraph.pricing.engine_revisions import engine_of
from rlgraph.pricing.passes import (
    bias_attention_seconds,
    compute_units,
    eager_activation_traffic,
    efficiency,
    padding_mask,
    runtime_pass_hbm,
    thread_slowdown,
)

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec

SEGMENTS = 48  # pieces of a batch's survival curve the decode time integrates over
# seeded draws a run's first rounds are averaged over where its policy chooses the lengths
# (a sample size of the simulation, not a cost)
WINDOW_SEEDS = 8


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
