"""The cost model's simulated partial-rollout rounds (`rlgraph.pricing.rollout_rounds`) against
the runtime's own rollout cache (`engines.partial_rollout.RolloutCache`) driven by a counting
decoder over the same seeded lengths, and the invariants of a round."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlgraph.engines.partial_rollout import RolloutCache
from rlgraph.lengths import LengthModel, expected_max, moments
from rlgraph.pricing.rollout_rounds import (
    PREFILL_TOKENS,
    ROUNDS,
    WARMUP,
    Forced,
    _alive,
    _Lengths,
    chunk_padding,
    pooled,
    simulate,
)


def cache_rounds(m: LengthModel, prompts: int, k: int, oversample: float, max_lag: int,
                 stale: str, check: int, prompt_len: int, stride: int = 1,
                 mix_versions: bool = True, lag: int = 0) -> tuple[float, float]:
    """(mean decode steps, mean re-encoded tokens) of the steady rounds of the runtime's
    cache, each round decoded one token a step for every unfinished sample (version = step,
    as in one colocated group) until `prompts` groups and the must-finish ones are complete,
    checked every `check` steps; lengths drawn in admission order with simulate's seed.
    `stride` K > 1: streaming, a call per mini-batch, version = call // K (as the worker
    builds the cache: oversample x K, prompts a mini-batch's; `mix_versions` False: streaming
    without partial rollout; `lag`: the weights' versions behind the step, as a split plan's
    generate runs)."""
    rng = random.Random(0)
    cache = RolloutCache(prompts_per_step=prompts, samples_per_prompt=k,
                         oversample=oversample * stride, stride=stride,
                         max_lag=max_lag, stale=stale, max_new_tokens=int(m.max),
                         prompt_of=lambda position: [1] * prompt_len,
                         length_of=lambda position, sample: m.length_at(rng.random()),
                         mix_versions=mix_versions)
    steps_total = reencoded_total = 0.0
    for t in range(ROUNDS * stride):
        version = t // stride - lag
        cache.evict(t, version)
        cache.refill(t, version)
        reencoded = sum(prompt_len + len(s.tokens) for g in cache.groups for s in g.samples
                        if s.tokens and not s.finished)
        must = cache.must_finish(t)

        def enough(must: set[int] = must) -> bool:
            complete = {i for i, g in enumerate(cache.groups) if g.complete}
            return len(complete) >= prompts and must <= complete

        live = [s for g in cache.groups for s in g.samples if not s.finished]
        steps = 0
        while live and not enough():
            for _ in range(check):  # the engine checks only every `check` steps
                for s in live:
                    s.tokens.append(0)
                    s.logps.append(0.0)
                    s.versions.append(version)
                    s.finished = len(s.tokens) >= s.budget
                live = [s for s in live if not s.finished]
                steps += 1
                if not live:
                    break
        cache.take()
        if t >= WARMUP * stride:
            steps_total += steps
            reencoded_total += reencoded
    rounds = (ROUNDS - WARMUP) * stride
    return steps_total / rounds, reencoded_total / rounds


@pytest.mark.parametrize(
    ("sigma", "oversample", "max_lag", "stale", "check", "stride", "mix", "lag"), [
        (1.5, 1.5, 3, "finish", 8, 1, True, 0), (1.0, 1.5, 1, "finish", 1, 1, True, 0),
        # generate on older weights than its step (a split plan): lag 1, in flight 2
        (1.5, 1.5, 3, "finish", 8, 1, True, 1), (1.0, 2.0, 3, "drop", 4, 1, True, 2),
        (1.0, 2.0, 2, "drop", 4, 1, True, 0), (1.5, 1.5, 2, "restart", 8, 1, True, 0),
        (1.0, 1.0, 0, "finish", 8, 1, True, 0), (1.5, 1.5, 3, "finish", 8, 4, True, 0),
        (1.0, 1.0, 1, "finish", 1, 2, True, 0),
        # streaming without partial rollout: a sample never spans versions
        (1.5, 1.0, 0, "finish", 8, 4, False, 0), (1.0, 1.0, 1, "finish", 1, 2, False, 0),
        (1.5, 1.0, 2, "drop", 8, 4, False, 0)])
def test_simulated_rounds_decode_what_the_rollout_cache_decodes(
        sigma: float, oversample: float, max_lag: int, stale: str, check: int,
        stride: int, mix: bool, lag: int) -> None:
    # the same lengths through the runtime's cache and the model's simulation: the same
    # decode steps and the same carried tokens re-encoded, round for round (streaming too)
    m = LengthModel(256, 2048, "lognormal", sigma)
    per_call = 16 // stride
    profile = simulate(m, per_call, 4, oversample, max_lag, stale, check, 8, stride=stride,
                       mix_versions=mix, generate_lag=lag)
    steps, reencoded = cache_rounds(m, per_call, 4, oversample, max_lag, stale, check, 8,
                                    stride, mix, lag)
    assert profile.steps == pytest.approx(steps)
    assert profile.reencoded_tokens == pytest.approx(reencoded)


def test_a_synchronous_round_decodes_until_its_expected_longest() -> None:
    # oversample 1, max_lag 0: nothing carried, each round runs its batch's longest sample
    for sigma in (0.5, 1.0, 1.5):
        m = LengthModel(512, 8192, "lognormal", sigma)
        profile = simulate(m, 32, 8, 1.0, 0, "finish", 1, 8)
        assert profile.carried_groups == 0 and profile.reencoded_tokens == 0
        assert profile.steps == pytest.approx(expected_max(m, 256), rel=0.2)


@settings(max_examples=12, deadline=None)
@given(sigma=st.floats(0.3, 1.8), oversample=st.sampled_from([1.25, 1.5, 2.0, 3.0]),
       max_lag=st.integers(1, 4), check=st.sampled_from([1, 8]))
def test_stale_finish_rounds_decode_each_batch_of_tokens_once(
        sigma: float, oversample: float, max_lag: int, check: int) -> None:
    # with stale: finish nothing is restarted and, while the groups that must finish fit a
    # batch, nothing dropped: in steady state a round decodes one batch's tokens, P * k * E[L]
    # (Little's law), more only for dropped groups; its live rows never exceed the groups in
    # flight, its contexts (mean and longest) lie between the prompt and prompt + max
    m = LengthModel(400, 4096, "lognormal", sigma)
    prompts, k, prompt = 16, 4, 8
    profile = simulate(m, prompts, k, oversample, max_lag, "finish", check, prompt)
    mean, _ = moments(m)
    if profile.dropped_samples == 0:
        assert profile.decoded_tokens == pytest.approx(prompts * k * mean, rel=0.35)
    assert profile.decoded_tokens > 0.65 * prompts * k * mean
    assert profile.steps <= m.max
    in_flight = -(-oversample * prompts // 1) * k
    for steps, live, context, longest in profile.segments:
        assert steps > 0 and 1 <= live <= in_flight
        assert prompt <= context <= prompt + m.max and prompt <= longest <= prompt + m.max
    busy = sum(steps for steps, *_ in profile.segments)
    assert busy <= profile.steps * (1 + 1e-9)


def inflight_rounds(m: LengthModel, prompts: int, k: int, oversample: float, max_lag: int,
                    stale: str, check: int, prompt_len: int, stride: int = 1,
                    slot_refill: bool = True, shares_device: bool = False) -> float:
    """Mean decode steps of the steady rounds of the runtime's cache driven as in-flight
    updates drive it (`engines.inflight`): rows are never interrupted (nothing re-encoded),
    the engine runs `check` steps between looks, and at each look (the first before any
    step) the engine's free slots (a slot for every row in flight) take whole new groups
    (`RolloutCache.refill(room=...)`), and must-finish counts unstarted groups at their
    admission version; `slot_refill` False: the earlier engines' rule, a group for each
    complete one (`taken`), the must-finish groups fixed at the round's start;
    `shares_device`: generate in train's group (refills leave the oversample's groups free)."""
    rng = random.Random(0)
    cache = RolloutCache(prompts_per_step=prompts, samples_per_prompt=k,
                         oversample=oversample * stride, stride=stride,
                         max_lag=max_lag, stale=stale, max_new_tokens=int(m.max),
                         prompt_of=lambda position: [1] * prompt_len,
                         length_of=lambda position, sample: m.length_at(rng.random()),
                         shares_device=shares_device)
    total = 0.0
    slots = cache.in_flight * k
    for t in range(ROUNDS * stride):
        version = t // stride
        cache.evict(t, version)
        cache.refill(t, version)
        must = cache.must_finish(t, started=slot_refill)

        def complete() -> set[int]:
            return {i for i, g in enumerate(cache.groups) if g.complete}

        steps, done = 0, complete()
        while not (len(done) >= prompts and must <= done):
            if not slot_refill:
                cache.refill(t, version, taken=min(len(done), prompts))
            busy = sum(1 for g in cache.groups for s in g.samples if not s.finished)
            if slot_refill and cache.refill(t, version, room=(slots - busy) // k):
                must = cache.must_finish(t, started=True)
            live = [s for g in cache.groups for s in g.samples if not s.finished]
            assert live, "the round ran out of rows"
            for _ in range(check):
                for s in live:
                    s.tokens.append(0)
                    s.logps.append(0.0)
                    s.versions.append(version)
                    s.finished = len(s.tokens) >= s.budget
                live = [s for s in live if not s.finished]
                steps += 1
            done = complete()
        cache.take()
        if t >= WARMUP * stride:
            total += steps
    return total / ((ROUNDS - WARMUP) * stride)


@pytest.mark.parametrize(
    ("sigma", "oversample", "max_lag", "stale", "check", "stride", "slot_refill", "shared"), [
        (1.5, 1.5, 3, "finish", 8, 1, True, False), (1.0, 2.0, 1, "drop", 4, 1, True, False),
        (1.0, 1.5, 2, "finish", 1, 1, True, False), (1.5, 1.5, 3, "finish", 8, 4, True, False),
        (1.0, 1.0, 1, "finish", 2, 2, True, False),
        # generate sharing train's GPU: the refills leave the oversample's groups free
        (1.5, 1.5, 3, "finish", 8, 4, True, True), (1.5, 1.5, 3, "finish", 8, 1, True, True),
        # the earlier engines' rule (engine revisions before slot_refill)
        (1.5, 1.5, 3, "finish", 8, 1, False, False), (1.0, 2.0, 1, "drop", 4, 1, False, False)])
def test_inflight_rounds_decode_what_the_runtime_decodes(
        sigma: float, oversample: float, max_lag: int, stale: str, check: int,
        stride: int, slot_refill: bool, shared: bool) -> None:
    # in-flight updates: the simulation's refill inside a round and its never-stopped rows
    # against the runtime's cache driven the way engines.inflight drives it, same lengths
    m = LengthModel(256, 2048, "lognormal", sigma)
    per_call = 16 // stride
    profile = simulate(m, per_call, 4, oversample, max_lag, stale, check, 8, stride=stride,
                       inflight=True, reencode=False, slot_refill=slot_refill,
                       shares_device=shared)
    assert profile.reencoded_tokens == 0
    assert profile.steps == pytest.approx(
        inflight_rounds(m, per_call, 4, oversample, max_lag, stale, check, 8, stride,
                        slot_refill, shared))
    if shared:  # the slack changes what the rounds decode (else the flag priced nothing)
        wide = simulate(m, per_call, 4, oversample, max_lag, stale, check, 8, stride=stride,
                        inflight=True, reencode=False, slot_refill=slot_refill)
        assert wide.steps != profile.steps
    again = simulate(m, per_call, 4, oversample, max_lag, stale, check, 8, stride=stride,
                     inflight=True, reencode=True,  # kv: recompute re-encodes carried rows
                     slot_refill=slot_refill, shares_device=shared)
    assert again.steps == profile.steps and (again.reencoded_tokens > 0 or max_lag == 0)


def test_prefill_chunk_padding_follows_the_static_engine() -> None:
    # the engine's chunk budget, read from its source (no torch import here)
    source = (Path(__file__).resolve().parents[3] / "rlgraph" / "engines"
              / "static_decode.py").read_text()
    (value,) = [node.value for node in ast.parse(source).body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", "") == "PREFILL_TOKENS" for t in node.targets)]
    assert ast.literal_eval(value) == PREFILL_TOKENS
    # StaticDecoder._admit: a chunk closes before a row that takes it past the budget, and
    # every row of a chunk is padded to its longest
    assert chunk_padding([8, 8, 8]) == 0
    assert chunk_padding([4000, 8, 8, 8]) == 3 * 3992  # 4 rows x 4000 fit 16384
    assert chunk_padding([4000, 8, 8, 8, 8]) == 3 * 3992  # the fifth opens a new chunk
    assert chunk_padding([10, 20], budget=30) == 0  # 2 x 20 > 30: two chunks


@settings(max_examples=30, deadline=None)
@given(rows=st.lists(st.integers(1, 9000), min_size=1, max_size=40))
def test_chunk_padding_is_never_negative_and_never_exceeds_the_chunks(rows: list[int]) -> None:
    padding = chunk_padding(rows)
    assert 0 <= padding <= len(rows) * max(rows) - sum(rows)


def test_generate_lag_follows_the_plan_structure() -> None:
    # colocated with train: fresh weights; a split plan: one version behind; in flight: two,
    # never more than the bound; and the lag costs decode steps (must-finish comes due sooner)
    from rlgraph.config.load import load_spec
    from rlgraph.pricing.context import CostContext
    from rlgraph.pricing.generate import generate_lag

    graph = Path(__file__).resolve().parents[3] / "bench" / "graphs_gpu" / "longtail-1gpu.yaml"

    def lag(overrides: list[str], colocated: set[str]) -> int:
        spec = load_spec(graph, ["schedule.partial_rollout=true", *overrides])
        ctx = CostContext(spec=spec, name="generate", shape=None, gpu=None, gpus=1,
                          colocated=frozenset(colocated))  # (the lag reads neither)
        return generate_lag(spec.nodes["generate"], ctx)

    one, split = {"generate", "logp", "train"}, {"generate"}
    assert lag(["schedule.max_lag=3"], one) == 0
    assert lag(["schedule.max_lag=3"], split) == 1
    assert lag(["schedule.max_lag=3", "nodes.generate.inflight=true"], split) == 2
    assert lag(["schedule.max_lag=1", "nodes.generate.inflight=true"], split) == 1
    assert lag(["schedule.max_lag=0", "schedule.partial_rollout=false"], split) == 0
    m = LengthModel(512, 8192, "lognormal", 1.0)
    steps = [simulate(m, 32, 8, 1.5, 3, "finish", 8, 8, generate_lag=g).steps for g in (0, 1)]
    assert steps[1] > steps[0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 60), st.integers(1, 300)),
                max_size=60), st.integers(1, 200), st.integers(1, 24))
def test_live_rows_by_bisection_are_the_filtered_rows_in_order(
        rows: list[tuple[int, int, int]], stop: int, segments: int) -> None:
    """`_alive` gives exactly the rows (and floats, in order) of the filter it replaces."""
    runs = sorted(rows)
    live = _alive(runs)
    for j in range(segments):
        s = (j + 0.5) * (stop / segments)
        assert live(s) == [c + s - a for a, r, c in runs if a <= s < a + r]


def test_shared_length_draws_are_the_seeded_quantiles() -> None:
    """Every simulation of one model and seed draws the lengths of Random(seed) in order,
    however its draws interleave with another simulation's."""
    m = LengthModel(mean=300.0, max=2048.0, sigma=1.2)
    rng = random.Random(3)
    expected = [m.length_at(rng.random()) for _ in range(50)]
    first, second = _Lengths(m, 3), _Lengths(m, 3)
    assert first.take(20) == expected[:20]
    assert second.take(7) + second.take(43) == expected
    assert first.take(30) == expected[20:]


def test_a_colocated_group_whose_train_waits_on_reward_samples_with_the_schedules_lags() -> None:
    """Without a logp node, train(t) waits for reward(t) (its own actor) while generate(t + 1)
    may already run: the plan's schedule runs generate twice, then train twice, so every
    other round samples with one version older weights (lags (0, 1), as the run did:
    bench/results/gpu-longtail-1gpu.json rollout-logp lag 4 decoded 1104 + 1552 + 1440 + 4096
    steps over a must-finish cycle of four rounds, not five). With logp in the group it runs
    at once after generate and the rounds keep lag 0."""
    from rlgraph.compiler import _scheduled, compile_plan, modelled_costs
    from rlgraph.compiler.lag import schedule_lags
    from rlgraph.compiler.placement import place
    from rlgraph.config.load import load_spec
    from rlgraph.graph import build_graph

    graph = Path(__file__).resolve().parents[3] / "bench" / "graphs_gpu" / "longtail-1gpu.yaml"
    base = ["cluster.gpu=H200", "data.response_len.sigma=1.5", "schedule.partial_rollout=true",
            "schedule.max_lag=4", "nodes.generate.oversample=2.0"]
    rollout_logp = ['nodes={"generate": {"kind": "generate", "cuda_decode": "graphs", '
                    '"forced_lengths": true, "oversample": 2.0, "stale": "finish"}, '
                    '"reward": {"kind": "reward"}, "train": {"kind": "train", '
                    '"micro_tokens": 16384, "old_logp": "rollout"}, "param_update": '
                    '{"kind": "param_update", "src": "train", "dst": "generate"}}',
                    'groups={"all": {"share": 1.0, "tasks": ["generate", "train"]}}']

    def lags(overrides: list[str]) -> dict[str, tuple[int, ...]]:
        spec = load_spec(graph, [*base, *overrides])
        g, placement = build_graph(spec), place(spec)
        steady = _scheduled(g, modelled_costs(spec, g, placement), placement)[3]
        return schedule_lags(g, steady.sim, steady.cyclicity)

    assert lags(rollout_logp) == {"generate": (0, 1)}
    assert lags([]) == {"generate": (0,)}
    spec = load_spec(graph, [*base, *rollout_logp])
    priced = compile_plan(spec).costs["generate"]
    m = LengthModel(512, 8192, "lognormal", 1.5)
    cycles = [simulate(m, 64, 8, 2.0, 4, "finish", 8, 8, generate_lag=g).steps
              for g in (0, (0, 1))]
    assert cycles[1] > 1.1 * cycles[0]
    assert f"decode {cycles[1]:.0f} steps" in priced.detail
    # another system's loop runs generate, reward and train in turn: the structural lag
    verl = compile_plan(load_spec(graph, [*base, *rollout_logp, "pricing.system=verl"]))
    assert f"decode {cycles[0]:.0f} steps" in verl.costs["generate"].detail


def test_driven_with_a_runs_forced_lengths_the_rounds_are_the_runs_rounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulation's rules are the runtime's: fed the lengths two GPU runs forced
    (benchmark mode, seeded by data position and sample), it decodes their rounds one for
    one, to within a look (sync_every, 8 steps) or four. The one-GPU rollout-logp run at
    max_lag 4 (bench/results/gpu-longtail-1gpu.json), whose group ran two generate calls
    before their two train steps (lags (0, 1), `compiler.lag.schedule_lags`): its must-finish
    cycle spans four rounds (1104 + 1552 + 1440 + 4096 = 8192 steps, the longest row), not
    the five of lag 0. The one-GPU streamed in-flight run (gpu-inflight-1gpu.json, mini-batch
    calls): its 4456-step call, the stall the table's mean does not show, is in the rules."""
    import json

    import rlgraph.pricing.rollout_rounds as rounds_module
    from rlgraph.bench_mode import forced_length

    results = Path(__file__).resolve().parents[3] / "bench" / "results"

    def drive(response_len: LengthModel, prompts: int, oversample: float, max_lag: int, lag,
              rounds: int, **kw) -> list[int]:
        steps: list[int] = []
        alive = rounds_module._alive

        class Forced:  # the lengths `generate` forces, group by group in data order
            def __init__(self, *_: object) -> None:
                self.position = 0

            def take(self, n: int) -> list[int]:
                out = [forced_length(0, self.position, s, response_len) for s in range(n)]
                self.position += 1
                return out

        def recording(runs):  # each round's last step
            steps.append(max((a + r for a, r, _ in runs), default=0))
            return alive(runs)

        monkeypatch.setattr(rounds_module, "_Lengths", Forced)
        monkeypatch.setattr(rounds_module, "_alive", recording)
        monkeypatch.setattr(rounds_module, "WARMUP", 0)
        monkeypatch.setattr(rounds_module, "ROUNDS", rounds)
        simulate.__wrapped__(response_len, prompts, 8, oversample, max_lag, "finish", 8,
                             8, generate_lag=lag, **kw)
        return steps

    tail = LengthModel(512, 8192, "lognormal", 1.5)
    run = json.loads((results / "gpu-longtail-1gpu.json").read_text())[
        "throughput_sigma_1.5_rolloutlogp"]["partial-lag4-rolloutlogp-os2"]
    measured = [int(s) for s in run["per_step"]["rollout/decode_steps"]]
    simulated = drive(tail, 64, 2.0, 4, (0, 1), len(measured))
    assert all(abs(a - b) <= 8 for a, b in zip(simulated, measured, strict=True))
    assert abs(drive(tail, 64, 2.0, 4, 0, 5)[4] - measured[4]) > 1000  # lag 0: not this run

    run = json.loads((results / "gpu-inflight-1gpu.json").read_text())[
        "modes"]["stream4-colocated-lag3-inflight"]
    measured = [int(s or 0) for s in run["per_step"]["rollout/decode_steps"]]
    simulated = drive(LengthModel(512, 8192, "lognormal", 1.0), 8, 1.5, 3, 0,
                      len(measured) // 4, stride=4, inflight=True)
    assert all(abs(a - b) <= 32 for a, b in zip(simulated, measured, strict=True))
    assert max(measured) == 4456 and max(simulated) >= 4456 - 32


def test_a_runs_first_rounds_from_an_empty_cache_are_the_runs_rounds() -> None:
    """A short run's window holds its first rounds, not the steady ones: from an empty cache,
    fed the lengths the runs forced (`Forced`), the round of batch 1 (after the on-policy batch
    0) at lag 1 (its old-log-prob forward skipped, the next generate ran before train 0), the
    simulation
    decodes the one-GPU `sdpa` runs' rounds exactly (bench/results/gpu-longtail-1gpu.json):
    max_lag 2's long third round finishes the groups both version-0 rounds began; max_lag 1
    finishes every group each round its version cannot carry, so each such batch is
    on-policy again and the next round lags again (8192, the longest row, every other)."""
    import json

    results = Path(__file__).resolve().parents[3] / "bench" / "results"
    sections = json.loads((results / "gpu-longtail-1gpu.json").read_text())
    tail = LengthModel(512, 8192, "lognormal", 1.5)
    forced = Forced(seed=0, per_step=64, first=0, prompts=64)

    def rounds(max_lag: int, count: int, after_on_policy: int | None) -> list[float]:
        return [simulate(tail, 64, 8, 1.5, max_lag, "finish", 8, 8, forced=forced,
                         first_lags=(0, 1) + (0,) * count, window=(t, t + 1),
                         after_on_policy=after_on_policy).steps for t in range(count)]

    for name, max_lag in (("partial-lag2", 2), ("partial-lag1", 1)):
        run = sections["throughput_sigma_1.5"][name]
        measured = run["per_step"]["rollout/decode_steps"]
        assert rounds(max_lag, len(measured), after_on_policy=1) == measured
    assert rounds(1, 4, after_on_policy=None)[3] < 8192  # the rule makes the fourth's length
    steady = simulate(tail, 64, 8, 1.5, 2, "finish", 8, 8).steps
    assert steady < sum(rounds(2, 4, 1)[2:]) / 2 - 500  # the window's rounds, not the steady


def test_seeded_profiles_pool_into_their_mean_round() -> None:
    tail = LengthModel(512, 8192, "lognormal", 1.0)
    profiles = [simulate(tail, 16, 4, 1.5, 2, "finish", 8, 8, seed=s, window=(1, 3))
                for s in range(3)]
    mean = pooled(profiles)
    assert mean.steps == pytest.approx(sum(p.steps for p in profiles) / 3)
    assert sum(s for s, *_ in mean.segments) == pytest.approx(
        sum(s for p in profiles for s, *_ in p.segments) / 3)


def test_a_round_hands_the_engine_its_new_rows_and_every_unfinished_carried_one() -> None:
    """`StaticRollout.resume` takes one request per unfinished row the cache holds: the
    batch's new rows, plus the carried rows still decoding; never the finished ones."""
    tail = LengthModel(16, 128, "lognormal", 1.0)
    profile = simulate(tail, 64, 8, 2.0, 2, "finish", 8, 8)
    assert 64 * 8 < profile.submitted_rows < 128 * 8
    fixed = simulate(LengthModel(32, 32, "lognormal", 1.0), 64, 8, 1.0, 1, "finish", 8, 8)
    assert fixed.submitted_rows == 64 * 8  # every row finishes in its own round
