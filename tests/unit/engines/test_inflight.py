"""In-flight weight updates (engines/inflight.py) on the CPU: a version swapped in between two
decode steps keeps the rows decoding (KV kept, or re-encoded), their tokens carry the version
and behaviour log-prob of the weights that sampled them, rows stay in the engine from one
call to the next, finished rows are refilled inside the call, the lag bound holds per token,
and a run resumed from a checkpoint goes on from the cache's state.

The policy is the micro Llama of rl_support; versions are real weight sets copied into the
live model in place (as the dual buffer's swap does); lengths are forced per sample (a
benchmark's budget, eos ignored) so rows outlive calls deterministically.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from rl_support import make_spec

from rlgraph.engines.cpu_decode import token_logp
from rlgraph.engines.inflight import InflightDecode
from rlgraph.engines.partial_rollout import RolloutCache, generate_round
from rlgraph.engines.static_rollout import StaticRollout
from rlgraph.errors import SpecError
from rlgraph.model.build import build_model, with_cache
from rlgraph.model.tokenizer import CharTokenizer
from rlgraph.process.workspace import Workspace
from rlgraph.runtime.checkpoint import load_checkpoint, save_checkpoint

TOK = CharTokenizer()


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The micro model's ops are tiny: one thread (not a team spinning on a loaded host)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
MAX_NEW = 24
PROMPT = 8


def weights(count: int) -> list[dict[str, torch.Tensor]]:
    """Version v: version 0 moved by v seeded steps."""
    base = build_model(make_spec().model, TOK, seed=3).state_dict()
    out = []
    for v in range(count):
        gen = torch.Generator().manual_seed(100 + v)
        out.append({k: t + 0.2 * v * torch.randn(t.shape, generator=gen)
                    if t.is_floating_point() else t for k, t in base.items()})
    return out


WEIGHTS = weights(8)


@functools.cache
def model_at(version: int) -> torch.nn.Module:
    """A model holding `version`'s weights (read-only: the live model is `Live`'s)."""
    model = build_model(make_spec().model, TOK, seed=3)
    model.load_state_dict(WEIGHTS[version])
    return model.eval().requires_grad_(False)


class Live:
    """The live model, and a swap that copies version `version` in after `after` checks."""

    def __init__(self) -> None:
        self.model = build_model(make_spec().model, TOK, seed=3).eval()
        self.version, self.pending = 0, None
        self.set(0)

    def set(self, version: int) -> None:
        with torch.no_grad():
            for name, t in self.model.state_dict().items():
                t.copy_(WEIGHTS[version][name])  # in place, as DualBuffer.swap
        self.version, self.pending = version, None

    def stage(self, version: int, after: int) -> None:
        self.pending = (after, version)

    def swap(self) -> int | None:
        if self.pending is None:
            return None
        left, version = self.pending
        if left:
            self.pending = (left - 1, version)
            return None
        self.set(version)
        return version


def length_of(position: int, sample: int) -> int:
    return random.Random(position * 31 + sample).randint(2, MAX_NEW)


def setup(kv: str, max_lag: int = 2, prompts: int = 2, samples: int = 2,
          stale: str = "drop", lengths: Any = length_of
          ) -> tuple[RolloutCache, InflightDecode, Live]:
    live = Live()
    cache = RolloutCache(prompts_per_step=prompts, samples_per_prompt=samples, oversample=2.0,
                         max_lag=max_lag, stale=stale, max_new_tokens=MAX_NEW,
                         prompt_of=lambda p: TOK.encode_prompt(f"{p % 10}+{p % 7}="),
                         length_of=lengths)
    engine = StaticRollout(live.model, slots=cache.in_flight * samples,
                           max_len=PROMPT + MAX_NEW, eos_id=TOK.eos_id, compile=False,
                           top_p=1.0, sync_every=2)
    return cache, InflightDecode(engine, kv), live


def run_round(cache: RolloutCache, inflight: InflightDecode, live: Live, step: int):
    with torch.no_grad():
        return generate_round(cache, step, live.model, live.version, live.swap,
                              inflight=inflight, eos_id=TOK.eos_id, pad_id=TOK.pad_id,
                              temperature=1.0, generator=torch.Generator().manual_seed(step))


def kept_kv_logp(prompt: list[int], tokens: list[int], versions: list[int]) -> list[float]:
    """Log-probs of `tokens` when each is sampled by its own version on a KV cache whose
    entries were computed by the weights current when they were written: the KV of token
    i is written by the step that samples token i + 1 (the prompt's by the prefill)."""
    seq = prompt + tokens
    out, cache = [], None
    for i, v in enumerate(versions):
        model = model_at(v)  # samples token i from the context up to it
        start = 0 if cache is None else cache.get_seq_length()
        ids = torch.tensor([seq[start:len(prompt) + i]])
        with torch.no_grad():
            res = model(input_ids=ids, position_ids=torch.arange(start, len(prompt) + i)[None],
                        **with_cache(model, cache), use_cache=True)
        cache = res.past_key_values
        logp = torch.log_softmax(res.logits[0, -1].float(), -1)[tokens[i]]
        out.append(float(logp))
    return out


@pytest.mark.parametrize("kv", ["keep", "recompute"])
def test_a_version_swap_mid_call_keeps_the_rows_and_tags_their_tokens(kv: str) -> None:
    cache, inflight, live = setup(kv)
    live.stage(1, after=2)  # version 1 arrives between two decode steps of call 0
    groups, metrics = run_round(cache, inflight, live, 0)
    assert metrics["rollout/switches"] == 1 and live.version == 1
    samples = [s for g in cache.groups + groups for s in g.samples if s.tokens]
    spanning = [s for s in samples if set(s.versions) == {0, 1}]
    assert spanning, "some row decoded through the swap"
    reencoded = metrics["rollout/reencoded_tokens"]
    assert (reencoded == 0) if kv == "keep" else (reencoded > 0)
    for s in samples:
        assert s.versions == sorted(s.versions)  # versions only grow along a row
        assert len(s.tokens) == len(s.logps) == len(s.versions)
    for g in groups + cache.groups:
        for s in g.samples:
            if set(s.versions) != {0, 1}:
                continue
            if kv == "keep":  # every token's log-prob: its own version on the KV it kept
                want = kept_kv_logp(g.prompt, s.tokens, s.versions)
            else:  # re-encoded: version 1's tokens are exactly version 1's log-probs
                seq = torch.tensor([g.prompt + s.tokens])
                full = token_logp(model_at(1), seq, torch.ones_like(seq), len(g.prompt))[0]
                v0 = token_logp(model_at(0), seq, torch.ones_like(seq), len(g.prompt))[0]
                want = [float(full[i] if v == 1 else v0[i]) for i, v in enumerate(s.versions)]
            torch.testing.assert_close(torch.tensor(s.logps), torch.tensor(want),
                                       atol=2e-4, rtol=2e-4)


def test_rows_stay_in_the_engine_across_calls_and_every_token_is_within_the_bound() -> None:
    max_lag = 2
    cache, inflight, live = setup("keep", max_lag=max_lag)
    trained: list[int] = []
    kept = refilled = 0.0
    for step in range(6):
        if step:
            live.set(step)  # generate runs one version behind the newest it may
        before = inflight.rollout.engine.stats["prefill_tokens"]
        groups, metrics = run_round(cache, inflight, live, step)
        kept += metrics["rollout/kept"]
        refilled += metrics["rollout/refilled"]
        assert metrics["rollout/reencoded_tokens"] == 0 and metrics["rollout/carried"] == 0
        # only prompts are encoded: a kept row's prefix never is
        assert metrics["generate/prefill_tokens"] == (
            inflight.rollout.engine.stats["prefill_tokens"] - before)
        assert len(groups) == cache.prompts_per_step and all(g.complete for g in groups)
        for g in groups:
            for s in g.samples:
                assert len(s.tokens) == length_of(g.position, g.samples.index(s))
                assert min(s.versions) >= step - max_lag
        trained += [g.position for g in groups]
    assert kept > 0 and refilled > 0
    assert len(trained) == len(set(trained))  # no prompt trained twice
    live_rows = {id(s) for _, s in inflight.live.values()}
    assert live_rows <= {id(s) for g in cache.groups for s in g.samples}


def test_refills_take_the_free_slots_and_no_group_is_dropped() -> None:
    """Finished rows' slots are refilled a whole group at a time: a complete group, or one
    with a single row left, holds no slot, so the call holds more groups than `in_flight`
    plus a batch, never past the engine's slots or the batches the version still reaches;
    with `stale: finish` no group is dropped and every token is within the bound."""
    max_lag, prompts = 4, 2
    cache, inflight, live = setup("keep", max_lag=max_lag, prompts=prompts, samples=2,
                                  stale="finish",  # one short row, one long every 3rd
                                  lengths=lambda p, k: 20 if k and p % 3 == 0 else 2)
    engine = inflight.rollout.engine
    held = []
    for step in range(8):
        live.set(max(0, step - 1))
        groups, metrics = run_round(cache, inflight, live, step)
        assert metrics["rollout/dropped"] == 0
        assert len(engine.queue) + sum(r is not None for r in engine.slots) <= len(engine.slots)
        held.append(len(cache.groups) + len(groups))
        assert held[-1] <= (live.version + max_lag + 1 - step) * prompts  # the window
        for g in groups:
            for s in g.samples:
                assert min(s.versions) >= step - max_lag
    assert max(held) > cache.in_flight + prompts and cache.totals["dropped"] == 0


def test_streamed_refills_by_free_slots_reach_later_mini_batches_within_the_bound() -> None:
    """Streaming (4 mini-batch calls a version): a refill inside a call by free slots admits
    groups while their version's mini-batches have room, and none is dropped."""
    prompts, k, lag, stride = 2, 2, 1, 4
    cache = RolloutCache(prompts_per_step=prompts, samples_per_prompt=k, oversample=4.0,
                         max_lag=lag, stale="finish", max_new_tokens=64, stride=stride,
                         prompt_of=lambda p: [1],
                         length_of=lambda p, s: random.Random(p * 7 + s).choice([2, 3, 30]))
    slots, refilled = cache.in_flight * k, 0
    for t in range(24):
        version = t // stride
        cache.evict(t, version)
        cache.refill(t, version)
        must, done = cache.must_finish(t, started=True), set()
        while not (len(done) >= prompts and must <= done):
            busy = sum(not s.finished for g in cache.groups for s in g.samples)
            if cache.refill(t, version, room=(slots - busy) // k):
                refilled += 1
                must = cache.must_finish(t, started=True)
            for s in (s for g in cache.groups for s in g.samples if not s.finished):
                s.tokens.append(0)
                s.versions.append(version)
                s.finished = len(s.tokens) >= s.budget
            done = {i for i, g in enumerate(cache.groups) if g.complete}
        for g in cache.take():
            assert min(v for s in g.samples for v in s.versions) >= t // stride - lag
    assert refilled > 0 and cache.totals["dropped"] == 0


def test_evicted_rows_leave_the_engine() -> None:
    cache, inflight, live = setup("keep", max_lag=1)
    run_round(cache, inflight, live, 0)
    assert inflight.live
    live.set(1)
    # step 2 under version 1: every row begun under version 0 is older than 2 - 1
    groups, metrics = run_round(cache, inflight, live, 2)
    assert metrics["rollout/dropped"] > 0
    for g in groups + cache.groups:
        for s in g.samples:
            assert not s.versions or min(s.versions) >= 1
    engine = inflight.rollout.engine
    running = {r.request_id for r in engine.slots if r is not None} | {
        r.request_id for r in engine.queue}
    assert running <= set(inflight.live)


def inflight_spec(max_lag: int = 2):
    spec = make_spec(data={"prompts_per_step": 2, "samples_per_prompt": 2, "prompt_len": 8,
                           "response_len": {"mean": 8, "max": 24}},
                     generate={"oversample": 2.0, "inflight": True, "forced_lengths": True,
                               "sync_every": 2}, max_lag=max_lag)
    spec.schedule.partial_rollout = True
    return spec


def test_resume_goes_on_from_the_checkpointed_rows(tmp_path: Path) -> None:
    spec = inflight_spec()
    ws = Workspace(spec, ["generate"], seed=0)
    worker = ws.worker("generate")
    seen = []
    for step in range(2):
        batch = worker.run(step, {})
        seen += batch["data_position"]
        ws.policy_version += 1
    assert batch["metrics"]["rollout/kept"] > 0
    state = worker.cache_state(1)
    prefixes = {(g["position"], k): s["tokens"] for g in state["groups"]
                for k, s in enumerate(g["samples"]) if s["tokens"] and not s["finished"]}
    assert prefixes, "rows were mid-decode at the checkpoint"
    save_checkpoint(tmp_path, {"step": 2, "policy_version": 2}, {"policy_version": 2}, {},
                    {"generate": state})
    resumed_ws = Workspace(spec, ["generate"], seed=0)
    resumed_ws.policy_version = ws.policy_version
    resumed = resumed_ws.worker("generate")
    resumed.load_cache_state(load_checkpoint(tmp_path).caches["generate"])
    out = resumed.run(2, {})
    assert out["metrics"]["rollout/carried"] == len(prefixes)  # re-encoded, not lost
    assert not set(out["data_position"]) & set(seen)
    mask = out["response_mask"].bool()
    assert (out["token_version"][mask] >= 2 - spec.schedule.max_lag).all()
    n = spec.data.samples_per_prompt
    for row, position in enumerate(out["data_position"][::n]):
        for k in range(n):
            prefix = prefixes.get((position, k))  # a lone replica: own = data positions
            if prefix:  # a checkpointed prefix is where its sample went on from
                got = out["sequences"][row * n + k, out["prompt_len"]:].tolist()
                assert got[:len(prefix)] == prefix


def test_inflight_needs_the_rollout_cache_and_a_lag() -> None:
    from rlgraph.compiler import compile_plan

    spec = inflight_spec()
    spec.schedule.partial_rollout = False
    with pytest.raises(SpecError, match="rollout cache"):
        compile_plan(spec)
    spec = inflight_spec(max_lag=0)
    with pytest.raises(SpecError, match="max_lag 0"):
        compile_plan(spec)


def test_train_leaves_out_tokens_older_than_the_bound() -> None:
    from rlgraph.rl.batch import merge  # noqa: F401  (the batch layout train reads)

    spec = make_spec(max_lag=1)
    ws = Workspace(spec, ["train"], seed=0)
    gen = Workspace(spec, ["generate"], seed=0).worker("generate")
    batch = gen.run(0, {})
    batch["rewards"] = torch.linspace(0, 1, len(batch["prompt_uid"]))
    mask = batch["response_mask"].bool()
    versions = batch["token_version"].clone()
    versions[0][mask[0]] = 0
    versions[1:][mask[1:]] = 2
    batch["token_version"], batch["step"] = versions, 3  # floor 3 - 1 = 2: row 0 is stale
    ws.policy_version = 3
    out = ws.worker("train").run(3, {"generate": batch})
    assert out["stale_tokens"] == int(mask[0].sum()) > 0
    assert out["metrics"]["lag/stale_tokens"] == out["stale_tokens"]
    assert out["metrics"]["lag/max"] <= 1


def test_compile_prices_inflight_and_tune_tries_it_off_and_on() -> None:
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import load_spec
    from rlgraph.tune.search import tune

    root = Path(__file__).resolve().parents[3]
    over = ["schedule.partial_rollout=true", "schedule.max_lag=2"]
    on = load_spec(root / "graphs" / "longtail.yaml", [*over, "nodes.generate.inflight=true"])
    plan = compile_plan(on)
    assert "in-flight updates" in plan.costs["generate"].detail
    assert "0 tokens re-encoded" in plan.costs["generate"].detail  # kv: keep
    off = compile_plan(load_spec(root / "graphs" / "longtail.yaml", over))
    assert "re-encoded" in off.costs["generate"].detail
    streamed = compile_plan(load_spec(root / "graphs" / "longtail.yaml", [
        "schedule.stream={mini_batches: 2}", "schedule.max_lag=1",
        "nodes.generate.inflight=true"]))
    assert streamed.lag.token_version_span == 1  # in-flight rows span versions
    result = tune(on, top=12)
    partial = [p for p in result.top if p.partial_rollout]
    assert {p.inflight for p in partial} == {False, True}
    assert not any(p.inflight for p in result.top if not p.partial_rollout)
    assert result.input is not None and result.input.inflight


def test_learning_with_inflight_updates_stays_within_the_synchronous_spread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the CPU learning check, small: the synchronous plan over two seeds and partial rollout
    # with in-flight updates (kv kept across versions), serially; the bench runs it longer
    from bench_support import bench_module

    monkeypatch.setenv("RLGRAPH_CACHE", str(tmp_path))  # the warm start, computed once here
    learning = bench_module("inflight_learning")
    runs = learning.learning_runs(16, [0, 1], ["sync"])
    runs.update(learning.learning_runs(16, [0], ["partial-lag2-inflight"]))
    verdict = learning.verdict(runs)
    assert verdict["no_lag_violation"], runs
    assert verdict["within_spread"], verdict
    inflight = runs["partial-lag2-inflight@0"]
    assert inflight["kept_rows"] > 0 and inflight["lag_max"] == 2  # rows kept across versions


def test_inflight_refills_never_outgrow_the_batches_their_version_reaches() -> None:
    """Generate two versions behind (a split plan whose rollout runs ahead): groups refilled
    inside a round under version t - 2 can only be trained by batch t + 1, so no more of them
    are admitted than batches t and t + 1 take; otherwise the surplus goes stale and is
    dropped, long answers first (a bias towards short ones)."""
    prompts, k, lag = 4, 2, 3
    cache = RolloutCache(prompts_per_step=prompts, samples_per_prompt=k, oversample=1.5,
                         max_lag=lag, stale="finish", max_new_tokens=64,
                         prompt_of=lambda p: [1],
                         length_of=lambda p, s: random.Random(p * 7 + s).choice([2, 3, 40]))
    for t in range(16):
        version = max(0, t - 2)
        cache.evict(t, version)
        cache.refill(t, version)
        must = cache.must_finish(t)
        done: set[int] = set()
        while not (len(done) >= prompts and must <= done):
            cache.refill(t, version, taken=min(len(done), prompts))
            for s in (s for g in cache.groups for s in g.samples if not s.finished):
                s.tokens.append(0)
                s.versions.append(version)
                s.finished = len(s.tokens) >= s.budget
            done = {i for i, g in enumerate(cache.groups) if g.complete}
        cache.take()
        window = (version + lag + 1 - t) * prompts
        assert len(cache.groups) <= max(window, cache.in_flight)
    assert cache.totals["dropped"] == 0 and cache.totals["admitted"] > 16 * prompts * k


def _colocated_stream(shares_device: bool) -> tuple[RolloutCache, int]:
    """A colocated streamed cache (4 mini-batches, max_lag 3) refilled in flight by free
    slots over a long tail, one version a batch as on one GPU: the cache and the decode
    steps spent after a mini-batch was complete, waiting only for must-finish groups."""
    prompts, k, stride, lag = 2, 4, 4, 3
    cache = RolloutCache(prompts_per_step=prompts, samples_per_prompt=k, oversample=stride * 1.5,
                         max_lag=lag, stale="finish", max_new_tokens=64, stride=stride,
                         prompt_of=lambda p: [1], shares_device=shares_device,
                         length_of=lambda p, s: random.Random(p * 7 + s).choice([2, 3, 4, 40]))
    slots, waited = cache.in_flight * k, 0
    for call in range(64):
        version = call // stride
        cache.evict(call, version)
        cache.refill(call, version)
        must = cache.must_finish(call, started=True)
        while True:
            done = {i for i, g in enumerate(cache.groups) if g.complete}
            if len(done) >= prompts and must <= done:
                break
            waited += len(done) >= prompts
            busy = sum(not s.finished for g in cache.groups for s in g.samples)
            if cache.refill(call, version, room=(slots - busy) // k):
                must = cache.must_finish(call, started=True)
                rules = cache.rules  # admitted only within the window less the reserve
                assert len(cache.groups) <= rules.window(call, version) - rules.reserve
            for s in (s for g in cache.groups for s in g.samples if not s.finished):
                s.tokens.append(0)
                s.versions.append(version)
                s.finished = len(s.tokens) >= s.budget
        for group in cache.take():  # the lag bound, token by token
            assert min(v for s in group.samples for v in s.versions) >= cache.rules.floor(call)
    return cache, waited


def test_colocated_streamed_refills_leave_slack_so_calls_wait_less_on_stragglers() -> None:
    """On one GPU a decode step a call spends waiting for a must-finish straggler at a few
    rows stalls train too. Filling the version's window to the brim made every call take
    exactly the oldest groups; keeping the oversample's slack (`shares_device`) lets calls
    take the groups that complete first: fewer waiting steps, nothing dropped, the bound
    held per token."""
    full, waited_full = _colocated_stream(shares_device=False)
    slack, waited_slack = _colocated_stream(shares_device=True)
    assert full.totals["dropped"] == slack.totals["dropped"] == 0
    assert waited_slack < waited_full, (waited_slack, waited_full)
