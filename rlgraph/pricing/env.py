"""The cost model of a multi-turn generate (`env:` block): a trajectory is priced as its
turns, as `rlgraph.envs.rollout` runs them.

Turn counts follow `env.turns` (mean, default max_turns) clipped at `max_turns`, with the
shape (dist, sigma, alpha) of `data.response_len`; a turn's model tokens follow
`data.response_len` divided by the mean turns (response_len.mean is the model's tokens of a
whole trajectory). The runtime decodes in waves: every trajectory whose observation has come
back decodes one turn, until its longest ends; then each is prefilled again (prompt,
context and every earlier turn and observation re-encoded), and the wave's last trajectory
waits `env.latency_s` for its observation (the others' env steps overlap the decode). The
env pool steps `workers x threads` trajectories at once: more rows than that wait in turn.

- synchronous: the batch runs until its trajectory with the most turns ends: E[max turns
  over the replica's rows] waves, wave k over the rows still open at turn k;
- partial rollout: `oversample x` the batch's groups in flight; a round runs waves until a
  batch of groups is complete; a group completes after E[max turns of its samples] waves, so
  a round costs that many waves / oversample (at least one), each over every row in flight.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rlgraph import lengths
from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.passes import compute_units, efficiency, thread_slowdown

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec

SEGMENTS = 24  # pieces of a wave's survival curve the decode time integrates over


def turn_models(node: Any, ctx: CostContext) -> tuple[lengths.LengthModel, lengths.LengthModel]:
    """(turns per trajectory, model tokens per turn) as length distributions."""
    data, env = ctx.spec.data, node.env
    shape = {"dist": data.response_len.dist, "sigma": data.response_len.sigma,
             "alpha": data.response_len.alpha}
    turns = env.mean_turns()
    per_turn = lengths.LengthModel(mean=max(1.0, data.response_len.mean / turns),
                                   max=max(1.0, data.response_len.max / turns), **shape)
    return lengths.LengthModel(mean=turns, max=float(env.max_turns), **shape), per_turn


def wave_seconds(rows: float, offset: float, node: Any, ctx: CostContext,
                 turn: lengths.LengthModel) -> tuple[float, float]:
    """(seconds, steps) of one wave: `rows` trajectories decode a turn each (context: prompt +
    `offset` tokens before it) until the expected longest turn of them ends."""
    from rlgraph.pricing.generate import decode_step_seconds

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
    """Seconds of a multi-turn generate step (see the module): decode waves, the prefill of
    every wave's contexts and the env's latency; sets the detail, and a note when the
    environment bounds the step."""
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
