"""The cost model of a multi-turn generate (`env:` block): a trajectory is priced as its
turns, as the runtime runs them.

Turn counts follow `env.turns` (mean, default max_turns) clipped at `max_turns`, with the
shape (dist, sigma, alpha) of `data.response_len`; a turn's model tokens follow
`data.response_len` divided by the mean turns (response_len.mean is the model's tokens of a
whole trajectory), and a trajectory stops at response_len.max tokens, observations included.

The turn engine (`engine_turns_cost`; `rlgraph.engines.turn_decode`, every `cuda_decode` but
dynamic) keeps each trajectory's KV in its slot: a trajectory is its turns one after the
other, each turn decoded in the engine's chunks of `sync_every` steps (the host sees a turn's
end at the chunk's end), its env step (`env.latency_s`; the pool steps `workers x threads`
at once), then its observation waits for the running chunk and is prefilled alone (an eager
forward of a few tokens, which holds up every slot). Trajectories' turns and lengths are
drawn (seeded) as the runtime's forced lengths and the `delay` env draw them:
- synchronous: the batch lasts its slowest trajectory, plus every observation prefill;
- partial rollout: `oversample x` the batch's groups in flight, rounds simulated as the
  rollout cache runs them (a round ends when a batch of groups is complete, and with
  `stale: finish` every group the next batch could not train; the rest carry on, their
  context prefilled again under the new weights; with in-flight updates and `kv: keep` they
  go on in their slots instead, nothing prefilled again).
The turn engine's decode step is the static engine's (its host time is the host's looks of
the static engine, `inflight` or not: the turn engine does not launch ahead of its looks).

Waves (`multi_turn_cost` with `cuda_decode: dynamic`, `rlgraph.envs.rollout`): every
trajectory whose observation has come back decodes one turn, until its longest ends; then
each is prefilled again (prompt, context and every earlier turn and observation
re-encoded), and the wave's last trajectory waits `env.latency_s` for its observation.
- synchronous: E[max turns over the replica's rows] waves, wave k over the rows still open;
- partial rollout: a round costs E[max turns of a group] / oversample waves (at least one),
  each over every row in flight.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from rlgraph import lengths
from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.passes import compute_units, efficiency, thread_slowdown
from rlgraph.rollout_rules import RolloutRules

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec

SEGMENTS = 24  # pieces of a wave's survival curve the decode time integrates over
DRAWS = 4096  # trajectories drawn for the turn engine's pricing (batches x rows)
ROUNDS, WARMUP = 24, 6  # partial rollout: rounds simulated, the first WARMUP left out


def turn_models(node: Any, ctx: CostContext) -> tuple[lengths.LengthModel, lengths.LengthModel]:
    """(turns per trajectory, model tokens per turn) as length distributions."""
    data, env = ctx.spec.data, node.env
    response = lengths.of(data.response_len)
    turns = env.mean_turns()
    return (replace(response, mean=turns, max=float(env.max_turns)),
            response.per_turn(turns))


def wave_seconds(rows: float, offset: float, node: Any, ctx: CostContext,
                 turn: lengths.LengthModel) -> tuple[float, float]:
    """(seconds, steps) of one wave: `rows` trajectories decode a turn each (context: prompt +
    `offset` tokens before it) until the expected longest turn of them ends."""
    from rlgraph.pricing.decode_step import decode_step_seconds

    if rows <= 0:
        return 0.0, 0.0
    prompt = ctx.spec.data.prompt_len + offset
    end = lengths.expected_max(turn, max(1, round(rows)))
    width = end / SEGMENTS
    seconds = 0.0
    for i in range(SEGMENTS):
        t = (i + 0.5) * width
        alive = max(1.0, rows * turn.survival(t))
        seconds += width * decode_step_seconds(min(alive, rows), prompt + t, node, ctx,
                                               longest=prompt + t)
    return seconds, end


def env_wait_seconds(rows: float, node: Any) -> float:
    """Seconds a wave waits for observations: one env step, more when the rows outnumber what
    the pool steps at once."""
    env = node.env
    return env.latency_s * max(1.0, math.ceil(rows / (env.workers * env.threads)))


def multi_turn_cost(node: NodeSpec, ctx: CostContext, per_replica: int, replicas: int) -> float:
    """Seconds of a multi-turn generate step (see the module): on the turn engine
    (`engine_turns_cost`), or in waves (cuda_decode: dynamic): decode waves, the prefill of
    every wave's contexts and the env's latency; sets the detail, and a note when the
    environment bounds the step."""
    if node.cuda_decode != "dynamic":
        return engine_turns_cost(node, ctx, per_replica, replicas)
    data, shape, gpu, env = ctx.spec.data, ctx.shape, ctx.gpu, node.env
    turns, turn = turn_models(node, ctx)
    mean_turn, _ = lengths.moments(turn)
    step_tokens = mean_turn + env.observation_len  # one turn and its observation
    schedule = ctx.spec.schedule
    decode = steps = env_s = 0.0
    prefill_tokens = float(data.prompts_per_step * data.samples_per_prompt * data.prompt_len)
    if schedule.partial_rollout:
        live = per_replica * float(node.oversample)
        group_turns = lengths.expected_max(turns, data.samples_per_prompt)
        waves = max(1.0, group_turns / float(node.oversample))
        offset = step_tokens * (lengths.moments(turns)[0] - 1) / 2  # a row's mean progress
        seconds, wave_steps = wave_seconds(live, offset, node, ctx, turn)
        decode, steps = waves * seconds, waves * wave_steps
        prefill_tokens += waves * live * replicas * (data.prompt_len + offset)
        env_s = waves * env_wait_seconds(live, node)
        how = (f"partial rollout: {waves:.2g} waves a step over {live:.0f} trajectories in "
               f"flight")
    else:
        waves = lengths.expected_max(turns, max(1, per_replica))
        for k in range(math.ceil(waves)):
            share = min(1.0, waves - k)  # the last wave happens with this probability
            rows = per_replica * turns.survival(k) if k else float(per_replica)
            seconds, wave_steps = wave_seconds(rows, k * step_tokens, node, ctx, turn)
            decode += share * seconds
            steps += share * wave_steps
            if k:
                prefill_tokens += share * rows * replicas * (data.prompt_len + k * step_tokens)
            env_s += share * env_wait_seconds(rows, node)
        how = f"synchronous: {waves:.2g} waves, until its trajectory with the most turns ends"
    prefill = (2 * shape.matmul_active * prefill_tokens
               / (gpu.bf16_flops * efficiency(ctx, COSTS.prefill_mfu) * compute_units(ctx))
               * thread_slowdown(ctx))
    ctx.extra["detail"] = (f"multi-turn ({env.fn}, {turns.mean:g} turns of {mean_turn:.3g} "
                           f"tokens): prefill {prefill:.3g} s + decode {steps:.0f} steps "
                           f"{decode:.3g} s + env {env_s:.3g} s ({how})")
    if env_s > decode + prefill:
        ctx.extra["note"] = (f"{ctx.name}: the environment bounds the step: {env_s:.3g} s of "
                             f"env latency against {decode + prefill:.3g} s of decoding; more "
                             f"env workers or threads help only when the pool is full")
    return prefill + decode + env_s


def draw_trajectory(rng: random.Random, turns: lengths.LengthModel,
                    turn: lengths.LengthModel, budget: float, observation: float
                    ) -> list[int]:
    """One trajectory's model tokens per turn, drawn as the runtime's forced lengths do; it
    stops at `budget` tokens, observations included."""
    out, used = [], 0.0
    for _ in range(turns.length_at(rng.random())):
        n = min(turn.length_at(rng.random()), max(0, int(budget - used)))
        if n <= 0:
            break
        out.append(n)
        used += n + observation
    return out or [1]


@lru_cache(maxsize=64)
def drawn_trajectories(turns: lengths.LengthModel, turn: lengths.LengthModel, budget: float,
                       observation: float, count: int) -> tuple[tuple[int, ...], ...]:
    """`count` trajectories drawn by `draw_trajectory` from `random.Random(0)`: the same
    draws for every plan of one data shape, so they are drawn once (a compile prices the
    plan and its synchronous baseline; tune prices many candidates)."""
    rng = random.Random(0)
    return tuple(tuple(draw_trajectory(rng, turns, turn, budget, observation))
                 for _ in range(count))


@lru_cache(maxsize=64)
def _means(turns: lengths.LengthModel, turn: lengths.LengthModel, budget: float,
           observation: float, count: int) -> tuple[float, float]:
    """(model tokens, turns) of a trajectory of `drawn_trajectories(...)`, on average."""
    drawn = drawn_trajectories(turns, turn, budget, observation, count)
    return sum(sum(t) for t in drawn) / len(drawn), sum(len(t) for t in drawn) / len(drawn)


@lru_cache(maxsize=64)
def drawn_chunks(turns: lengths.LengthModel, turn: lengths.LengthModel, budget: float,
                 observation: float, count: int, chunk: int) -> tuple[tuple[int, int], ...]:
    """(decode chunks, turns) of each of `drawn_trajectories(...)`, `chunk` steps a chunk."""
    return tuple((_chunks(t, chunk), len(t))
                 for t in drawn_trajectories(turns, turn, budget, observation, count))


def _chunks(tokens: Sequence[int], chunk: int) -> int:
    """Decode chunks of a trajectory's turns: each turn is its own chunks."""
    return sum(math.ceil(n / chunk) for n in tokens)


def _seconds(chunks: int, turns: int, chunk: int, step_s: float, env_s: float) -> float:
    """A trajectory of `turns` turns in `chunks` chunks on the turn engine, its own
    observation prefills aside: its chunks of decode steps, each env step, and each
    observation's wait for the running chunk (half of one on average)."""
    return chunks * chunk * step_s + turns * env_s + (turns - 1) * chunk * step_s / 2


def _trajectory_seconds(tokens: Sequence[int], chunk: int, step_s: float,
                        env_s: float) -> float:
    """`_seconds` of one trajectory's model tokens per turn."""
    return _seconds(_chunks(tokens, chunk), len(tokens), chunk, step_s, env_s)


def engine_turns_cost(node: NodeSpec, ctx: CostContext, per_replica: int,
                      replicas: int) -> float:
    """Seconds of a multi-turn generate step on the turn engine (see the module)."""
    from rlgraph.pricing.decode_step import decode_step_seconds

    data, shape, gpu, env = ctx.spec.data, ctx.shape, ctx.gpu, node.env
    schedule = ctx.spec.schedule
    turns, turn = turn_models(node, ctx)
    chunk = node.sync_every
    k = data.samples_per_prompt
    partial = bool(schedule.partial_rollout)
    rows = per_replica * (float(node.oversample) if partial else 1.0)
    kept = partial and node.inflight and node.kv == "keep"  # carried trajectories' KV kept
    node = node.model_copy(update={"inflight": False})  # the turn engine's steps (module)
    draw = (turns, turn, data.response_len.max, env.observation_len,
            max(DRAWS, per_replica * 8))
    drawn = drawn_trajectories(*draw)
    tokens, turns_mean = _means(*draw)  # a trajectory's model tokens and turns
    env_s = env.latency_s * max(1.0, math.ceil(rows / (env.workers * env.threads)))
    context = data.prompt_len + (tokens + turns_mean * env.observation_len) / 2
    longest = data.prompt_len + data.response_len.max
    # rows decoding at once: the trajectories in flight, less the share waiting for the env
    live = rows
    for _ in range(2):
        step_s = decode_step_seconds(max(1.0, live), context, node, ctx, longest=longest)
        busy = tokens * step_s
        live = rows * busy / max(1e-12, busy + turns_mean * env_s)
    step_s = decode_step_seconds(max(1.0, live), context, node, ctx, longest=longest)

    def prefill_call(tokens_: float) -> float:
        """One eager forward over `tokens_` tokens (an observation's, or a batch's prompts)."""
        flops = 2 * shape.matmul_active * tokens_ / (
            gpu.bf16_flops * efficiency(ctx, COSTS.prefill_mfu) * compute_units(ctx))
        if ctx.local:
            return flops * thread_slowdown(ctx) + decode_step_seconds(1.0, context, node, ctx)
        return flops + shape.layers * COSTS.native_decode_overhead_per_layer_s

    observe_s = prefill_call(env.observation_len + 1)
    if partial:
        period, decode_steps, extends, carried = _partial_rounds(
            drawn, per_replica // k, k, float(node.oversample), int(schedule.max_lag),
            str(node.stale), chunk, step_s, env_s)
        extends = min(extends, decode_steps / chunk)  # at most one prefill call a chunk
        prefill = prefill_call(per_replica * data.prompt_len + (0 if kept else carried)
                               * context)
        into = "in their slots (in flight, KV kept)" if kept else "and prefilled again"
        how = (f"partial rollout: {rows:.0f} trajectories in flight, {carried:.3g} carried "
               f"into a round {into}")
    else:
        batches = max(1, len(drawn) // per_replica)
        shapes = drawn_chunks(*draw, chunk)
        period = sum(max(_seconds(c, n, chunk, step_s, env_s)
                         for c, n in shapes[b * per_replica:(b + 1) * per_replica])
                     for b in range(batches)) / batches
        decode_steps = (period - turns_mean * env_s) / step_s
        extends = min(per_replica * (turns_mean - 1), decode_steps / chunk)
        prefill = prefill_call(per_replica * data.prompt_len)
        how = "synchronous: until its slowest trajectory ends"
    observations = extends * observe_s
    host = 0.0
    if node.engine == "native" and not ctx.local:
        host = COSTS.generate_call_overhead_s + COSTS.generate_host_seconds_per_row * per_replica
    ctx.extra["detail"] = (
        f"multi-turn on the turn engine ({env.fn}, {turns_mean:.3g} turns, {tokens:.3g} model "
        f"tokens a trajectory; KV kept across turns): {period:.3g} s of turns (decode steps "
        f"of {step_s * 1e3:.3g} ms at {live:.2g} rows, env steps of {env_s:.3g} s) + "
        f"{extends:.3g} observation prefills {observations:.3g} s + prefill {prefill:.3g} s"
        + (f" + host {host:.3g} s" if host else "") + f" ({how})")
    env_share = turns_mean * env_s
    if env_share > tokens * step_s:
        ctx.extra["note"] = (f"{ctx.name}: the environment bounds the step: {env_share:.3g} s "
                             f"of env steps a trajectory against {tokens * step_s:.3g} s of "
                             f"decoding; more env workers or threads help only when the pool "
                             f"is full")
    return period + observations + prefill + host


def _partial_rounds(drawn: Sequence[Sequence[int]], prompts: int, k: int, oversample: float,
                    max_lag: int, stale: str, chunk: int, step_s: float, env_s: float
                    ) -> tuple[float, float, float, float]:
    """(seconds, decode steps, observation prefills, carried trajectories) of a steady
    round of partial rollout on the turn engine: the rollout cache's rounds, each
    trajectory its remaining seconds on the engine (`_trajectory_seconds`)."""
    rules = RolloutRules.of(prompts=max(1, prompts), oversample=oversample, max_lag=max_lag,
                            stale=stale)  # the rollout cache's (rlgraph.rollout_rules)
    prompts, in_flight = rules.prompts, rules.in_flight
    supply = iter(drawn * (1 + (ROUNDS * in_flight * k) // max(1, len(drawn))))
    groups: list[dict] = []
    totals = [0.0, 0.0, 0.0, 0.0]
    for t in range(ROUNDS):
        if rules.drops_stale:  # evict: a group begun under a version too old for batch t
            groups = [g for g in groups if not rules.is_stale(g["version"], t)]
        carried = sum(1 for g in groups for r in g["left"] if r > 0)
        while len(groups) < rules.target(t, t):  # colocated: round t runs version t
            samples = [next(supply) for _ in range(k)]
            groups.append({"version": t, "turns": [len(s) for s in samples],
                           "full": [_trajectory_seconds(s, chunk, step_s, env_s)
                                    for s in samples]})
            groups[-1]["left"] = list(groups[-1]["full"])
        need = [max(g["left"]) for g in groups]
        end = sorted(need)[prompts - 1]
        must = rules.must_finish([g["version"] for g in groups], t)
        end = max([end, *(need[i] for i in must)])
        end = math.ceil(end / (chunk * step_s)) * chunk * step_s  # the host looks per chunk
        turns_done = 0.0
        for g in groups:
            for i, r in enumerate(g["left"]):
                ran = min(r, end)
                turns_done += g["turns"][i] * ran / max(g["full"][i], 1e-12)
                g["left"][i] = r - ran
        complete = [i for i, g in enumerate(groups) if max(g["left"]) <= 0][:prompts]
        groups = [g for i, g in enumerate(groups) if i not in set(complete)]
        if t >= WARMUP:
            decoding = end - env_s * turns_done / max(1.0, in_flight * k)
            totals = [a + b for a, b in zip(totals, (end, max(0.0, decoding) / step_s,
                                                    turns_done, carried))]
    n = ROUNDS - WARMUP
    return tuple(x / n for x in totals)  # type: ignore[return-value]
