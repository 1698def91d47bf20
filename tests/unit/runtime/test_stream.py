"""Streaming (`schedule.stream.mini_batches` K): keys and their errors, the lag proof per
mini-batch, the simulator at mini-batch granularity, the pipeline against it (one policy),
the rollout cache's continuous refill, and a serial run whose every token is within the bound.

No Ray here; `tests/integration/ray/test_streaming.py` runs it on Ray and resumes it.
"""

from __future__ import annotations

import heapq
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_support import assert_groups_never_overlap
from test_runtime_pipeline import check_invariants as check_unstreamed
from test_runtime_pipeline import drive as drive_unstreamed

from rlgraph.compiler import compile_plan
from rlgraph.compiler.schedule import simulate
from rlgraph.compiler.timed_graph import timed_graph
from rlgraph.config.load import load_spec
from rlgraph.engines.partial_rollout import RolloutCache, generate_round
from rlgraph.errors import SpecError
from rlgraph.graph import build_graph
from rlgraph.model.build import build_model
from rlgraph.model.tokenizer import CharTokenizer
from rlgraph.runtime.pipeline import Pipeline
from rlgraph.runtime.serial import run_serial

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "graphs" / "quickstart.yaml"
LONGTAIL = ROOT / "graphs" / "longtail.yaml"
STEPS = 6


COLOCATED = "groups={all: {share: 1, tasks: [generate, logp, ref_logp, train]}}"


def streamed(k: int, max_lag: int, *more: str):
    return load_spec(QUICKSTART, [f"schedule.stream.mini_batches={k}",
                                  f"schedule.max_lag={max_lag}", *more])


# ---------------------------------------------------------------- keys and the compiler


def test_mini_batches_must_split_the_batch_and_generate_must_be_fed() -> None:
    with pytest.raises(SpecError, match="mini_batches 5 does not divide") as err:
        compile_plan(streamed(5, 1))
    assert err.value.key == ("schedule", "stream", "mini_batches")
    assert "use mini_batches: 4" in err.value.render()
    unfed = streamed(2, 1, COLOCATED)
    del unfed.nodes["param_update"]
    with pytest.raises(SpecError, match="receive weights from a param_update") as err:
        compile_plan(unfed)
    assert err.value.key == ("schedule", "stream", "mini_batches")
    foreign = streamed(2, 0, COLOCATED, "nodes.generate.engine=sglang")
    with pytest.raises(SpecError, match="engine sglang cannot hold"):
        compile_plan(foreign)
    with pytest.raises(SpecError):
        streamed(0, 1)  # at least one mini-batch


def test_plan_proves_the_lag_per_mini_batch_and_times_every_mini_batch() -> None:
    plan = compile_plan(streamed(4, 1))
    assert plan.lag.mini_batches == 4 and plan.lag.max_policy_lag == 1
    assert "version <= v + 1" in plan.lag.per_mini_batch
    assert plan.channels["generate->reward"] == 8 and plan.channels["train->param_update"] == 2
    events = plan.schedule.events
    trains = [e for e in events if e["node"] == "train" and e["step"] == 0]
    assert [e["mini_batch"] for e in trains] == [0, 1, 2, 3]
    gens = {e["mini_batch"]: e for e in events if e["node"] == "generate" and e["step"] == 0}
    for e in trains:  # train's mini-batch j starts once generate's mini-batch j is done
        assert e["start"] >= gens[e["mini_batch"]]["end"] - 1e-12
    sync = [e for e in events if e["node"] == "param_update" and e["step"] == 0]
    assert len(sync) == 1 and "mini_batch" not in sync[0]
    assert sync[0]["start"] >= max(e["end"] for e in trains) - 1e-12
    plain = compile_plan(load_spec(QUICKSTART))
    assert plan.schedule.sync_period_s == pytest.approx(plain.schedule.sync_period_s)


def test_a_colocated_group_streams_time_sliced_from_a_snapshot() -> None:
    """Generate beside train: the proof says the engine samples from a snapshot refreshed once
    per version, and the group's period is its pieces' sum (nothing overlaps)."""
    plan = compile_plan(streamed(4, 1, COLOCATED))
    assert plan.lag.max_policy_lag == 1 and "snapshot" in plan.lag.per_mini_batch
    events = plan.schedule.events
    assert_groups_never_overlap(events)
    step = [e for e in events if e["step"] == 2 and e["node"] != "reward"]
    busy = sum(e["end"] - e["start"] for e in step)
    assert plan.schedule.period_s == pytest.approx(busy, rel=0.05)


def test_a_version_streamed_at_max_lag_0_still_decodes_its_tail() -> None:
    """Without partial rollout a sample never spans versions, and at max_lag 0 every group of
    a version ends inside it: the version's calls decode its longest tail as the plain batch
    does (measured on 2 GPUs, split: 37 s a version streamed, 39 s unstreamed), and the
    period gains only train's overlap with the tail."""
    plain = compile_plan(load_spec(LONGTAIL, ["schedule.max_lag=0"]))
    stream = compile_plan(load_spec(LONGTAIL, ["schedule.max_lag=0",
                                               "schedule.stream.mini_batches=4"]))
    assert stream.costs["generate"].seconds == pytest.approx(
        plain.costs["generate"].seconds, rel=0.2)
    assert "rounds simulated" in stream.costs["generate"].detail
    assert stream.schedule.period_s <= plain.schedule.period_s * 1.05


# ---------------------------------------------------------------- pipeline vs simulator

durations = st.fixed_dictionaries({
    n: st.sampled_from([0.05, 0.3, 1.0, 2.0, 3.5])
    for n in ("generate", "reward", "logp", "ref_logp", "train", "param_update")})


def drive(pipeline: Pipeline, seconds: dict[str, float], stop_after_train: int | None = None
          ) -> list[dict]:
    """`test_runtime_pipeline.drive` for streaming: a weight sync's input is the train call
    that ends its version (no chaining: every task starts when the pipeline says)."""
    k, now, running, events, order = pipeline.k, 0.0, [], [], 0
    while True:
        for task in pipeline.startable():
            assert task.behind is None
            for payload in task.inputs.values():
                carrier = task.kind == "param_update"
                assert payload["step"] == (task.step * k + k - 1 if carrier else task.step)
            order += 1
            heapq.heappush(running, (now + seconds[task.node], order, task, now,
                                     pipeline.versions.get(task.node)))
        if not running:
            return events
        now = running[0][0]
        while running and running[0][0] <= now + 1e-12:
            end, _, task, start, version = heapq.heappop(running)
            events.append({"node": task.node, "step": task.step, "start": start, "end": end,
                           "occupies": list(task.occupies), "version": version})
            pipeline.complete(task.node, task.step, {"step": task.step, "node": task.node})
            if (stop_after_train is not None and task.kind == "train"
                    and task.step + 1 == stop_after_train):
                pipeline.stop()


def check_streaming(graph, events, k: int, max_lag: int, versions: int) -> None:
    """Order, data, exclusivity; the gate per mini-batch; one weight sync per version."""
    by = {(e["node"], e["step"]): e for e in events}
    calls = sorted(e["step"] for e in events if e["node"] == "train")
    assert calls == list(range(versions * k))
    syncs = sorted(e["step"] for e in events if e["node"] == "param_update")
    assert syncs == list(range(len(syncs))) and len(syncs) <= versions
    for e in events:
        node, m = e["node"], e["step"]
        assert e["start"] >= by.get((node, m - 1), {"end": 0})["end"] - 1e-9
        if node == "param_update":  # after the version's last mini-batch
            assert e["start"] >= by[("train", m * k + k - 1)]["end"] - 1e-9
        for src, _, dist in graph.in_edges(node, data="distance"):
            if dist == 0 and node != "param_update":
                assert e["start"] >= by[(src, m)]["end"] - 1e-9
        if node == "generate":
            assert e["version"] >= m // k - max_lag
            if m // k - max_lag - 1 >= 0:  # the weights it waited for were synced
                sync = by[("param_update", m // k - max_lag - 1)]
                assert e["start"] >= sync["end"] - 1e-9
    assert_groups_never_overlap(events)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(seconds=durations, max_lag=st.integers(0, 2), k=st.sampled_from([2, 4]))
def test_streaming_pipeline_equals_the_compilers_simulation(seconds, max_lag, k):
    graph = build_graph(streamed(k, max_lag))
    seconds = {n: seconds[graph.nodes[n]["kind"]] for n in graph}
    per_call = {n: s if n == "param_update" else s / k for n, s in seconds.items()}
    events = drive(Pipeline(graph, steps=STEPS, max_lag=max_lag), per_call)
    check_streaming(graph, events, k, max_lag, STEPS)
    groups = sorted({g for _, occ in graph.nodes(data="occupies") for g in occ})
    sim = simulate(timed_graph(graph, seconds, groups), STEPS)
    predicted = {(e["node"], e["step"] * k + e.get("mini_batch", 0)
                  if "mini_batch" in e else e["step"]): e for e in sim.events(STEPS)}
    for e in events:  # before the last steps, where the runtime skips unused syncs
        version = e["step"] if e["node"] == "param_update" else e["step"] // k
        if version < STEPS - max_lag - 3:
            assert e["start"] == pytest.approx(predicted[(e["node"], e["step"])]["start"],
                                               abs=1e-9), e


def test_one_mini_batch_is_the_unstreamed_pipeline() -> None:
    graph = build_graph(streamed(1, 1))
    seconds = dict.fromkeys(graph, 0.5)
    events = drive_unstreamed(Pipeline(graph, steps=STEPS, max_lag=1), seconds)
    check_unstreamed(graph, events, 1, STEPS)


@pytest.mark.parametrize("stop_after", [3, 4])  # mid-version and at a version's end (k 2)
def test_stop_and_resume_at_mini_batch_granularity(stop_after: int) -> None:
    k, max_lag = 2, 1
    graph = build_graph(streamed(k, max_lag))
    seconds = {"generate": 1.0, "reward": 0.01, "logp": 0.2, "ref_logp": 0.2, "train": 0.6,
               "param_update": 0.05}
    stopped = Pipeline(graph, steps=STEPS, max_lag=max_lag)
    first = drive(stopped, seconds, stop_after_train=stop_after)
    done = stopped.trained_steps()
    buffer = stopped.rollout_buffer()
    assert done == 4, "a stop finishes the version train is in (k 2: calls 0..3)"
    assert all(m >= done for _, m in buffer)
    resumed = Pipeline(graph, steps=STEPS, max_lag=max_lag, start_step=done, preloaded=buffer)
    assert resumed.machines["param_update"].step == done // k  # armed: its next sync
    second = drive(resumed, seconds)
    for node in ("train", "generate"):
        calls = sorted(e["step"] for e in first + second if e["node"] == node)
        assert calls == list(range(STEPS * k)), node
    syncs = sorted(e["step"] for e in first + second if e["node"] == "param_update")
    assert syncs == sorted(set(syncs)) and syncs[-1] == STEPS - max_lag - 2
    assert all(e["version"] >= e["step"] // k - max_lag for e in second
               if e["node"] == "generate")


# ---------------------------------------------------------------- continuous refill

TOK = CharTokenizer()


def cache_of(k: int, max_lag: int, mix: bool) -> RolloutCache:
    return RolloutCache(prompts_per_step=2, samples_per_prompt=2, oversample=k, max_lag=max_lag,
                        stale="drop", max_new_tokens=12, stride=k, mix_versions=mix,
                        prompt_of=lambda p: TOK.encode_prompt(f"{p % 10}+{p % 7}="))


@pytest.mark.parametrize(("max_lag", "mix"), [(0, False), (1, False), (1, True)])
def test_refill_keeps_the_batch_in_flight_and_every_token_within_the_bound(max_lag, mix):
    torch.manual_seed(0)
    spec = streamed(2, max_lag, "model.warm_start.steps=0")
    model = build_model(spec.model, TOK, seed=0).eval()
    k, cache = 3, cache_of(3, max_lag, mix)
    emitted: list[int] = []
    for m in range(4 * k):
        version = max(0, m // k - (m % 2) * max_lag)  # as fresh as allowed, or the oldest
        with torch.no_grad():
            groups, metrics = generate_round(cache, m, model, version, lambda: None,
                                             eos_id=TOK.eos_id, pad_id=TOK.pad_id,
                                             temperature=1.0,
                                             generator=torch.Generator().manual_seed(m))
        assert len(groups) == 2 and all(g.complete for g in groups)
        for g in groups:
            for s in g.samples:
                assert all(0 <= m // k - v <= max_lag for v in s.versions), (m, s.versions)
                if not mix:
                    assert len(set(s.versions)) <= 1
        if m % k == 0 and metrics["rollout/cached"] == 0:  # refilled to the whole batch
            assert cache.totals["admitted"] >= (m // k + 1) * 2 * 2 * k
        emitted += [g.position for g in groups]
    assert len(set(emitted)) == len(emitted), "a prompt was emitted twice"
    t = cache.totals
    assert t["admitted"] == t["emitted"] + t["dropped"] + cache.samples()
    if max_lag == 0:  # a version admits exactly the groups it trains: nothing wasted
        assert t["dropped"] == t["restarted"] == 0 and cache.samples() == 0
        assert sorted(emitted) == list(range(len(emitted)))


# ---------------------------------------------------------------- the serial runtime


def test_serial_streaming_run_keeps_every_token_within_the_bound() -> None:
    spec = load_spec(LONGTAIL, ["schedule.stream.mini_batches=4", "schedule.max_lag=1",
                                "model.warm_start.steps=0", "data.prompts_per_step=4"])
    plan = compile_plan(spec)
    run = run_serial(plan, steps=3)
    rows = [m["metrics"] for m in run.metrics]
    assert [m["step"] for m in run.metrics] == list(range(12))
    assert [m["policy_version"] for m in run.metrics] == [(s + 1) // 4 for s in range(12)]
    assert all(r["lag/max"] <= plan.lag.max_policy_lag for r in rows)
    assert max(r["lag/max"] for r in rows) == 1, "generate ran a version ahead"
    assert all(r["samples"] == 4 for r in rows)  # one prompt group of 4 per mini-batch


def test_colocated_streaming_samples_each_version_from_its_snapshot(monkeypatch) -> None:
    """Generate and train in one group (one process): at a version's first mini-batch the
    engine's weights are the trainer's, inside the version the trainer has moved on and the
    engine still holds the version's weights; every token within the bound, and every token
    tagged v was sampled by version v's weights (its behaviour log-prob is their forward)."""
    from rlgraph.engines.cpu_decode import token_logp
    from rlgraph.nodes.generate import GenerateWorker
    from rlgraph.runtime import serial

    k, versions = 2, 2
    spec = load_spec(LONGTAIL, [f"schedule.stream.mini_batches={k}", "schedule.max_lag=1",
                                "schedule.partial_rollout=true", "model.warm_start.steps=0",
                                "data.prompts_per_step=2", "nodes.train.lr=1e-2",
                                "data.response_len={mean: 6, max: 24, dist: lognormal}",
                                "groups={all: {share: 1, tasks: [generate, logp, train]}}"])
    plan = compile_plan(spec)
    boundary: dict[int, dict[str, torch.Tensor]] = {}  # version -> the trainer's weights
    calls: list[tuple[int, int, bool, bool]] = []
    batches: dict[int, dict] = {}
    run = GenerateWorker.run

    def spy(self, step, inputs=None):
        policy = {n: t.clone() for n, t in self.ws.policy.state_dict().items()}
        if step % k == 0:
            boundary[step // k] = policy
        snap = self.snapshot.state_dict()
        same = all(torch.equal(snap[n], t) for n, t in policy.items())
        held = all(torch.equal(snap[n], t) for n, t in boundary[step // k].items())
        calls.append((step, self.snapshot_version, same, held))
        batches[step] = out = run(self, step, inputs)
        return out

    monkeypatch.setattr(GenerateWorker, "run", spy)
    result = serial.run_serial(plan, steps=versions)
    assert [(m, v) for m, v, _, _ in calls] == [(m, m // k) for m in range(versions * k)]
    assert all(held for *_, held in calls), "the snapshot moved inside a version"
    assert [same for _, _, same, _ in calls] == [m % k == 0 for m in range(versions * k)]
    rows = [r["metrics"] for r in result.metrics]
    assert all(r["lag/max"] <= plan.lag.max_policy_lag for r in rows)
    model = serial.build_workspaces(plan)["train"].policy  # version 0, then each boundary's
    for m, batch in batches.items():
        tagged = batch["token_version"]
        for v in tagged[batch["response_mask"].bool()].unique().tolist():
            model.load_state_dict(boundary[v])
            with torch.no_grad():
                logp = token_logp(model, batch["sequences"], batch["attention_mask"],
                                  batch["prompt_len"], batch["temperature"])
            mine = (tagged == v) & batch["response_mask"].bool()
            assert torch.allclose(logp[mine], batch["behavior_logp"][mine], atol=1e-4), (m, v)


# ---------------------------------------------------------------- rlgraph tune


def test_tune_searches_the_mini_batches_per_version() -> None:
    from rlgraph.tune.search import tune
    from rlgraph.tune.space import SearchSpace

    spec = load_spec(LONGTAIL, ["schedule.stream.mini_batches=4", "schedule.max_lag=1"])
    assert SearchSpace(spec).stream_choices == (1, 2, 4, 8)
    result = tune(spec, top=8)
    assert result.input is not None and result.input.mini_batches == 4
    split = [p for p in result.top if len(p.groups) == 2 and p.mini_batches is not None]
    assert split, "a layout with generate on its own streams"
    assert all(p.mini_batches is None for p in result.top if len(p.groups) == 1), \
        "a colocated plan cannot stream"
    mine = next(p for p in split if {tuple(g["tasks"]) for g in p.groups}
                == {tuple(g["tasks"]) for g in result.input.groups})
    assert mine.period_s <= result.input.period_s * (1 + 1e-9)  # its best K, at worst the 4
    assert compile_plan(result.best.spec).schedule.period_s == pytest.approx(
        result.best.period_s, rel=1e-6)



def test_later_mini_batches_anchor_the_clip_to_the_versions_policy() -> None:
    """Mini-batch j > 0 of a version trains on tokens of that version: its proximal policy
    is the version's (the rollout's log-probs), so the IS weight is exactly 1, as the
    step-start proximal gives an unstreamed step's later mini-batches."""
    from rl_support import make_spec

    from rlgraph.config.schema import StreamSpec
    from rlgraph.process.workspace import Workspace

    spec = make_spec(data={"prompts_per_step": 2, "samples_per_prompt": 2},
                     algorithm={"kl_coef": 0.0}, train={"lr": 1e-2}, max_lag=0)
    spec.schedule.stream = StreamSpec(mini_batches=2)
    gen = Workspace(spec, ["generate"], seed=0).worker("generate")
    ws = Workspace(spec, ["train"], seed=0)
    figures = []
    for m in range(2):
        batch = gen.run(m, {})
        batch["rewards"] = torch.tensor([1.0, 0.0])
        out = ws.worker("train").run(m, {"generate": batch})
        figures.append(out["metrics"])
        assert out["policy_version"] == (m + 1) // 2
    assert figures[1]["actor/is_weight_mean"] == pytest.approx(1.0)
    assert figures[1]["lag/max"] == 0
