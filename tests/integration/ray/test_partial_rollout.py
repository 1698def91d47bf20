"""Partial rollout: the rollout cache, the resumable decode round, the IS correction on
multi-version samples, checkpoints of the cache, and one multi-turn `rlgraph run` with it on
Ray, resumed (the single-turn round runs on Ray in test_replicas.py, replicated and resumed).

The policy is the micro Llama of rl_support with its eos logit raised (`EosBias`), so
response lengths vary and some samples outlive a round. Weight versions are real weight
sets switched into the live model, the way `Workspace.swap_if_staged` does.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rl_support import MICRO, make_spec

from rlgraph.config.schema import Spec
from rlgraph.engines.cpu_decode import pack, token_logp
from rlgraph.engines.partial_rollout import RolloutCache, generate_round
from rlgraph.model.build import build_model
from rlgraph.model.tokenizer import CharTokenizer
from rlgraph.process.workspace import Workspace
from rlgraph.rl.loss import policy_loss
from rlgraph.runtime.checkpoint import load_checkpoint, save_checkpoint

TOK = CharTokenizer()
TEMPERATURE = 1.0
MAX_NEW = 10


class EosBias(torch.nn.Module):
    """A real causal LM whose eos logit is raised by `bias` (varied response lengths)."""

    def __init__(self, inner: torch.nn.Module, bias: float) -> None:
        super().__init__()
        self.inner, self.bias = inner, bias

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        logits = out.logits.clone()
        logits[..., TOK.eos_id] += self.bias
        return SimpleNamespace(logits=logits, past_key_values=out.past_key_values)


def weight_versions(count: int) -> list[dict[str, torch.Tensor]]:
    """Weights of versions 0..count-1: version v is version 0 moved by v seeded steps."""
    spec = make_spec(model={"hf_config": dict(MICRO)})
    base = build_model(spec.model, TOK, seed=3).state_dict()
    out = []
    for v in range(count):
        gen = torch.Generator().manual_seed(100 + v)
        out.append({k: t + 0.3 * v * torch.randn(t.shape, generator=gen) if t.is_floating_point()
                    else t for k, t in base.items()})
    return out


WEIGHTS = weight_versions(12)


def policy_at(version: int, bias: float = 2.5) -> EosBias:
    """A fresh model holding `version`'s weights."""
    spec = make_spec(model={"hf_config": dict(MICRO)})
    model = build_model(spec.model, TOK, seed=3)
    model.load_state_dict(WEIGHTS[version])
    return EosBias(model.eval(), bias)


def prompt_of(position: int) -> list[int]:
    return TOK.encode_prompt(f"{position % 10}+{position % 7}=")


def new_cache(max_lag: int, stale: str = "drop", oversample: float = 2.0,
              prompts: int = 2, samples: int = 3) -> RolloutCache:
    return RolloutCache(prompts_per_step=prompts, samples_per_prompt=samples,
                        oversample=oversample, max_lag=max_lag, stale=stale,
                        max_new_tokens=MAX_NEW, prompt_of=prompt_of)


class Versions:
    """The live model and a `switch` that adopts the next version after `after` calls."""

    def __init__(self, version: int) -> None:
        self.model = policy_at(version)
        self.version = version
        self.pending: tuple[int, int] | None = None  # (calls left, version)

    def set(self, version: int) -> None:
        self.model.inner.load_state_dict(WEIGHTS[version])
        self.version, self.pending = version, None

    def stage(self, version: int, after: int) -> None:
        self.pending = (after, version)

    def switch(self) -> int | None:
        if self.pending is None:
            return None
        left, version = self.pending
        if left > 0:
            self.pending = (left - 1, version)
            return None
        self.pending = None
        self.set(version)
        return version


def run_round(cache: RolloutCache, step: int, live: Versions):
    """generate(step) with the live weights; returns the emitted groups and metrics."""
    with torch.no_grad():
        return generate_round(cache, step, live.model, live.version, live.switch,
                              eos_id=TOK.eos_id, pad_id=TOK.pad_id, temperature=TEMPERATURE,
                              generator=torch.Generator().manual_seed(step))


def as_rollout(groups):
    samples = [s for g in groups for s in g.samples]
    return pack([g.prompt for g in groups for _ in g.samples], [s.tokens for s in samples],
                [s.logps for s in samples], [s.versions for s in samples], TOK.pad_id)


def fresh_behaviour_logp(rollout) -> torch.Tensor:
    """Each token's log-prob recomputed from scratch under the weights of its own version."""
    out = torch.zeros_like(rollout.behavior_logp)
    for v in rollout.token_version.unique().tolist():
        if v < 0:
            continue
        with torch.no_grad():
            lp = token_logp(policy_at(v), rollout.sequences, rollout.attention_mask,
                            rollout.prompt_len, TEMPERATURE)
        out = torch.where(rollout.token_version == v, lp, out)
    return out


def test_interrupted_samples_resume_under_new_weights_and_carry_both_versions() -> None:
    cache, live = new_cache(max_lag=3), Versions(0)
    batches, carried = [], 0.0
    for step in range(5):
        if step:
            live.set(step)  # weights of version `step` arrive before generate(step)
        if step == 2:
            live.stage(step + 1, after=1)  # and one switch mid-round
        groups, metrics = run_round(cache, step, live)
        carried += metrics["rollout/carried"]
        batches.append((as_rollout(groups), metrics))
    assert carried > 0
    mixed = 0
    for rollout, metrics in batches:
        mask = rollout.response_mask.bool()
        versions = [set(r[m].tolist()) for r, m in zip(rollout.token_version, mask)]
        mixed += sum(len(v) > 1 for v in versions)
        assert metrics["rollout/version_span"] == max(max(v) - min(v) for v in versions)
        # every token's behaviour log-prob is that of the weights that sampled it, although
        # its prefix was sampled by older weights and re-encoded under the new ones
        torch.testing.assert_close(rollout.behavior_logp[mask],
                                   fresh_behaviour_logp(rollout)[mask], atol=2e-4, rtol=2e-4)
        assert (rollout.token_version[~mask] == -1).all()
    assert mixed > 0
    assert batches[2][1]["rollout/switches"] == 1


def test_is_weight_uses_each_tokens_behaviour_logp() -> None:
    cache, live = new_cache(max_lag=3), Versions(0)
    for step in range(4):
        live.set(step)
        groups, _ = run_round(cache, step, live)
    rollout = as_rollout(groups)
    mask = rollout.response_mask.bool()
    assert len(rollout.token_version[mask].unique()) > 1  # a batch of several versions
    # proximal policy: the trainer at version 4; hand computation of w = min(pi_prox/pi_b, c)
    with torch.no_grad():
        prox = token_logp(policy_at(4), rollout.sequences, rollout.attention_mask,
                          rollout.prompt_len, TEMPERATURE)
    behaviour = fresh_behaviour_logp(rollout)
    cap = 1.5
    hand = torch.exp(prox - behaviour).clamp(max=cap)[mask]
    adv = torch.linspace(-1, 1, len(mask))
    terms = policy_loss(prox, prox, rollout.behavior_logp, adv, mask, clip=0.2,
                        is_truncation=cap)
    assert terms.is_weight_mean == pytest.approx(float(hand.mean()), rel=1e-4)
    per_token_adv = adv[:, None].expand_as(mask)[mask]
    assert float(terms.loss) == pytest.approx(float(-(hand * per_token_adv).mean()), rel=1e-4)
    truncated = (torch.exp(prox - behaviour) > cap)[mask].float().mean()
    assert terms.is_truncated_frac == pytest.approx(float(truncated))

    # the train worker reports the same weights for this batch (its proximal = version 4)
    spec = make_spec(algorithm={"is_truncation": cap, "kl_coef": 0.0}, max_lag=3)
    ws = Workspace(spec, ["train"], seed=3)
    ws.policy.load_state_dict(WEIGHTS[4])
    ws.policy = EosBias(ws.policy, 2.5)
    ws.policy_version = 4
    batch = {"step": 4, "temperature": TEMPERATURE, "prompt_len": rollout.prompt_len,
             "sequences": rollout.sequences, "attention_mask": rollout.attention_mask,
             "response_mask": rollout.response_mask, "behavior_logp": rollout.behavior_logp,
             "token_version": rollout.token_version, "rewards": adv,
             "group": torch.arange(len(adv)) // 3, "prompt_uid": ["u"] * len(adv)}
    out = ws.worker("train").run(4, {"generate": batch})
    assert out["metrics"]["actor/is_weight_mean"] == pytest.approx(float(hand.mean()), rel=1e-4)
    assert out["metrics"]["lag/max"] == 4 - int(rollout.token_version[mask].min())


def schedule(step: int, max_lag: int, version: int) -> tuple[int, int | None]:
    """Versions a run may give generate(step), never older than the last one: every
    max_lag + 1 steps it catches up (lag 0), in between it falls behind to the bound; it may
    switch mid-round to one more version if that version exists by then (<= step)."""
    start = max(version, step - step % (max_lag + 1))
    return start, (start + 1 if start + 1 <= step else None)


@pytest.mark.parametrize("stale", ["drop", "restart"])
@pytest.mark.parametrize("max_lag", [0, 1, 2])
def test_full_batches_lag_bound_and_counted_drops(max_lag: int, stale: str) -> None:
    cache, live = new_cache(max_lag, stale, oversample=2.5), Versions(0)
    n, emitted_positions = cache.samples_per_prompt, []
    totals = {"rollout/dropped": 0.0, "rollout/restarted": 0.0}
    for step in range(7):
        start, mid = schedule(step, max_lag, live.version)
        live.set(start)
        if mid is not None:
            live.stage(mid, after=step % 3)
        before = {g.position for g in cache.groups}
        groups, metrics = run_round(cache, step, live)
        for key in totals:
            totals[key] += metrics[key]
        # supplementation: always exactly prompts_per_step whole groups
        assert len(groups) == cache.prompts_per_step
        assert all(len(g.samples) == n and g.complete for g in groups)
        rollout = as_rollout(groups)
        mask = rollout.response_mask.bool()
        assert mask.any(1).all()
        lag = step - rollout.token_version[mask]
        assert int(lag.max()) <= max_lag and int(lag.min()) >= 0
        # samples that left the cache without being emitted are exactly the counted drops
        after = {g.position for g in cache.groups} | {g.position for g in groups}
        assert len(before - after) * n == metrics["rollout/dropped"]
        emitted_positions += [g.position for g in groups]
    # prompts are admitted in data order and none is trained twice
    assert len(set(emitted_positions)) == len(emitted_positions)
    assert cache.next_position == max([*emitted_positions, *(g.position for g in cache.groups)]) + 1
    t = cache.totals
    assert t["admitted"] == t["emitted"] + t["dropped"] + cache.samples()
    assert t["dropped"] == totals["rollout/dropped"] and t["restarted"] == totals[
        "rollout/restarted"]
    if stale == "restart":
        assert t["dropped"] == 0
    else:
        assert t["restarted"] == 0
    if max_lag == 0:  # nothing can be carried: no spares admitted, nothing dropped
        assert t["admitted"] == t["emitted"] and cache.samples() == 0
    else:
        assert t["dropped"] + t["restarted"] > 0  # some spares went stale and were counted


@pytest.mark.parametrize("stale", ["drop", "restart"])
def test_max_lag_zero_never_carries_a_token(stale: str) -> None:
    cache, live = new_cache(0, stale), Versions(0)
    for step in range(5):
        live.set(step)
        groups, metrics = run_round(cache, step, live)
        rollout = as_rollout(groups)
        assert metrics["rollout/carried"] == 0 and metrics["rollout/version_span"] == 0
        assert (rollout.token_version[rollout.response_mask.bool()] == step).all()


def test_no_spares_when_the_rounds_weights_are_as_old_as_the_bound() -> None:
    cache, live = new_cache(max_lag=1), Versions(0)
    run_round(cache, 0, live)  # version 0 at step 0: spares may be carried to step 1
    assert len(cache.groups) == cache.in_flight - cache.prompts_per_step
    run_round(cache, 1, live)  # version 0 at step 1: nothing started now outlives batch 1
    assert all(s.versions[0] == 0 for g in cache.groups for s in g.samples if s.versions)
    assert len(cache.groups) <= cache.in_flight - cache.prompts_per_step
    admitted = cache.next_position
    live.set(2)
    run_round(cache, 2, live)  # step 2, version 2: fresh again, spares admitted
    assert cache.next_position - admitted > cache.prompts_per_step


def test_oversample_one_decodes_the_batch_to_its_end() -> None:
    cache, live = new_cache(1, oversample=1.0), Versions(0)
    groups, metrics = run_round(cache, 0, live)
    assert len(groups) == 2 and cache.samples() == 0 and metrics["rollout/cached"] == 0


# ---------------------------------------------------------------- the worker and checkpoints


def partial_spec(max_lag: int = 1) -> Spec:
    spec = make_spec(data={"prompts_per_step": 2, "samples_per_prompt": 2,
                           "response_len": {"mean": 4, "max": 8}},
                     generate={"oversample": 2.0, "stale": "drop"}, max_lag=max_lag)
    spec.schedule.partial_rollout = True
    return spec


def test_worker_batch_layout_and_cache_survives_a_checkpoint(tmp_path: Path) -> None:
    spec = partial_spec()
    ws = Workspace(spec, ["generate"], seed=0)
    ws.policy = EosBias(ws.policy, 2.5)
    worker = ws.worker("generate")
    for step in range(2):
        batch = worker.run(step, {})
        ws.policy_version += 1
    rows = 4
    assert batch["sequences"].shape[0] == rows and batch["group"].tolist() == [0, 0, 1, 1]
    assert set(batch["metrics"]) >= {"rollout/dropped", "rollout/restarted", "rollout/carried",
                                     "rollout/version_span", "rollout/decode_steps"}
    assert batch["data_position"][::2] == sorted(batch["data_position"][::2])
    # checkpoint after step 1, resume in a fresh workspace: step 2 is the same batch
    save_checkpoint(tmp_path, {"step": 2, "policy_version": 2}, {"policy_version": 2}, {},
                    {"generate": worker.cache_state(1)})
    loaded = load_checkpoint(tmp_path)
    resumed_ws = Workspace(spec, ["generate"], seed=0)
    resumed_ws.policy = EosBias(resumed_ws.policy, 2.5)
    resumed_ws.policy_version = ws.policy_version
    resumed = resumed_ws.worker("generate")
    resumed.load_cache_state(loaded.caches["generate"])
    a, b = worker.run(2, {}), resumed.run(2, {})
    for key in ("sequences", "behavior_logp", "token_version"):
        assert torch.equal(a[key], b[key]), key
    assert a["data_position"] == b["data_position"] and a["metrics"] == b["metrics"]
    with pytest.raises(RuntimeError, match="no rollout cache state after step 7"):
        worker.cache_state(7)
    # a run resumed without a cache (none saved) reads on from the synchronous data position
    fresh = Workspace(spec, ["generate"], seed=0).worker("generate")
    assert fresh.run(5, {})["data_position"][0] == 5 * spec.data.prompts_per_step


def test_runner_reads_and_restores_the_cache_on_the_generate_actor() -> None:
    from rlgraph.runtime.actors import GroupActor

    spec = partial_spec()
    actor = GroupActor(spec, ["generate"], seed=0, threads=1, device="cpu")
    actor.run("generate", 0, [])
    state = actor.rollout_cache("generate", 0)
    assert state["next_position"] == 4 and actor.rollout_cache("generate", -1) is None
    other = GroupActor(spec, ["generate"], seed=0, threads=1, device="cpu")
    other.load_rollout_cache("generate", state)
    assert other.workers["generate"].cache.state_dict() == state


def test_worker_switches_to_staged_weights_at_the_start_of_a_call() -> None:
    spec = partial_spec()
    ws = Workspace(spec, ["generate"], seed=0)
    sender = copy.deepcopy(ws.policy)
    with torch.no_grad():
        for p in sender.parameters():
            p.add_(0.01)
    from rlgraph.weights.buckets import export_buckets

    for bucket in export_buckets(sender.state_dict(), 1, 0.01):
        ws.receive_bucket(bucket)
    ws.stage_weights(1)
    batch = ws.worker("generate").run(1, {})
    assert batch["policy_version"] == 1 and ws.policy_version == 1
    assert (batch["token_version"][batch["response_mask"].bool()] == 1).all()


# ---------------------------------------------------------------- rlgraph run on Ray

def forced(position: int, k: int) -> int:
    """A forced length per sample (1..MAX_NEW), long for every third prompt."""
    return MAX_NEW if position % 3 == 0 else 1 + (position + k) % 4


@pytest.mark.parametrize("max_lag", [1, 2])
def test_stale_finish_drops_nothing_and_keeps_the_long_answers(max_lag: int) -> None:
    # forced lengths (eos ignored): every admitted sample has a known length; with `finish` a
    # round waits for the groups that would go stale, so none is dropped, lag stays bounded
    # and every sample is trained at exactly its forced length
    cache = RolloutCache(prompts_per_step=2, samples_per_prompt=3, oversample=2.0,
                         max_lag=max_lag, stale="finish", max_new_tokens=MAX_NEW,
                         prompt_of=prompt_of, length_of=forced)
    live = Versions(0)
    for step in range(8):
        live.set(step)  # colocated: generate(t) holds version t
        must = {cache.groups[i].position for i in cache.must_finish(step)}
        groups, metrics = run_round(cache, step, live)
        assert must <= {g.position for g in groups}
        assert metrics["rollout/dropped"] == 0
        rollout = as_rollout(groups)
        mask = rollout.response_mask.bool()
        assert int((step - rollout.token_version[mask]).max()) <= max_lag
        for g in groups:
            assert [len(s.tokens) for s in g.samples] == [forced(g.position, k)
                                                          for k in range(3)]
    assert cache.totals["dropped"] == 0


AGENT_GRAPH = """\
name: agentic-tiny
cluster: {local: true, cpus: 2}
model: {preset: tiny, warm_start: {steps: 0}}
data: {task: calc, prompts_per_step: 4, samples_per_prompt: 2, prompt_len: 8,
       response_len: {mean: 8, max: 14}, seed: 0}
algorithm: {name: grpo}
groups:
  trainer: {share: 0.5, tasks: [train]}
  rollout: {share: 0.5, tasks: [generate]}
nodes:
  generate: {kind: generate, oversample: 2.0, stale: drop,
             env: {fn: guess_number, max_turns: 3, low: 1, high: 9}}
  reward: {kind: reward}
  train: {kind: train, lr: 1.0e-3}
  param_update: {kind: param_update, src: train, dst: generate}
schedule: {max_lag: 2, partial_rollout: true, steps: 2}
"""


@pytest.mark.runtime
def test_rlgraph_run_multi_turn_on_ray_and_resume(cluster, tmp_path: Path) -> None:
    # trajectories in a pool of Ray env actors, carried across steps by partial rollout;
    # the env lane in trace.json; a resume replays the trajectories in flight and trains
    # every prompt once
    from rlgraph.cli.main import main
    from rlgraph.runtime.metrics import read_rows

    graph = tmp_path / "agentic.yaml"
    graph.write_text(AGENT_GRAPH)
    out = tmp_path / "run"
    assert main(["run", str(graph), "--out", str(out), "--no-progress"]) == 0
    cache = load_checkpoint(out).caches["generate"]
    keys = [s["key"] for g in cache["groups"] for s in g["samples"]]
    assert all(k.startswith("calc:train:") and "#" in k for k in keys)  # trajectories, keyed
    assert main(["run", str(graph), "--resume", str(out), "--steps", "4",
                 "--no-progress"]) == 0
    rows = read_rows(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    bound = json.loads((out / "plan.json").read_text())["lag"]["max_policy_lag"]
    assert bound == 2 and all(r["lag/max"] <= bound and r["samples"] == 8 for r in rows)
    seen = set().union(*rows)
    assert {"env/turns_mean", "env/seconds", "env/ended_done", "env/tool_calls"} <= seen
    # generate's rollout/* figures reach the metrics rows (each in the row after it ends)
    assert {"rollout/dropped", "rollout/restarted", "rollout/carried", "rollout/version_span",
            "rollout/decode_steps", "rollout/dropped_total"} <= seen
    # the checkpoint keeps the cache; its totals are the last figures the rows saw
    cache = load_checkpoint(out).caches["generate"]
    last = [r for r in rows if "rollout/dropped_total" in r][-1]
    assert cache["totals"]["dropped"] == last["rollout/dropped_total"]
    t = cache["totals"]
    in_cache = sum(len(g["samples"]) for g in cache["groups"])
    assert t["admitted"] == t["emitted"] + t["dropped"] + in_cache and t["emitted"] == 4 * 8
    trace = json.loads((out / "trace.json").read_text())
    assert any(e.get("cat") == "env" for e in trace["traceEvents"])
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    uids = [u for row in ledger for u in row["prompt_uids"]]
    assert len(uids) == 16 and len(set(uids)) == 16  # none lost, none trained twice
