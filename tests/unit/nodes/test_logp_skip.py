"""The old-log-prob forward is skipped exactly when it is redundant (rlgraph/nodes/logp.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_support import make_spec

from rlgraph.compiler import compile_plan
from rlgraph.config.load import load_spec
from rlgraph.process.workspace import Workspace

ROOT = Path(__file__).resolve().parents[3]

TASKS = ["generate", "logp", "reward", "train"]


def _spec(max_lag: int = 0, **train):
    return make_spec(extra_nodes={"logp": {}}, train={"lr": 1e-2, **train}, max_lag=max_lag)


def _scored(ws: Workspace, step: int = 0) -> dict:
    gen = ws.worker("generate").run(step, {})
    scored = ws.worker("reward").run(step, {"generate": gen})
    rows = len(scored["rewards"])
    # a spread in every group, so the step moves the policy
    scored["rewards"] = (torch.arange(rows) % 2).to(scored["rewards"].dtype)
    return scored


def test_skipped_forward_gives_the_same_step_as_the_forward() -> None:
    torch.manual_seed(0)
    skip, full = (Workspace(_spec(), TASKS, seed=0) for _ in range(2))
    batch = _scored(skip)
    logp = skip.worker("logp").run(0, {"generate": batch})
    assert "old_logp" not in logp  # on-policy and one update: no forward
    with_old = {**batch, "old_logp": full.worker("logp").forward(batch)}
    out_skip = skip.worker("train").run(0, {"reward": batch, "logp": logp})
    out_full = full.worker("train").run(0, {"reward": with_old})
    assert out_skip["metrics"]["logp/skipped"] == 1.0
    assert out_full["metrics"]["logp/skipped"] == 0.0
    for key in ("loss/policy", "actor/grad_norm", "actor/is_weight_mean"):
        assert abs(out_skip["metrics"][key] - out_full["metrics"][key]) < 1e-6, key
    for (name, a), b in zip(skip.policy.named_parameters(), full.policy.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)
    start = Workspace(_spec(), TASKS, seed=0).policy
    assert any(not torch.equal(a, b) for a, b in zip(start.parameters(),
                                                     skip.policy.parameters()))


def test_an_off_policy_batch_still_runs_the_forward() -> None:
    ws = Workspace(_spec(), TASKS, seed=0)
    batch = _scored(ws)
    valid = batch["response_mask"].bool()
    stale = {**batch, "token_version": torch.where(valid, 5, -1)}  # sampled by another version
    logp = ws.worker("logp").run(0, {"generate": stale})
    assert logp["old_logp"].shape == batch["behavior_logp"].shape
    out = ws.worker("train").run(0, {"reward": stale})  # no logp node: train's own forward
    assert out["metrics"]["logp/skipped"] == 0.0


def test_more_than_one_update_keeps_the_forward() -> None:
    ws = Workspace(_spec(mini_batches=2), TASKS, seed=0)
    batch = _scored(ws)
    assert "old_logp" in ws.worker("logp").run(0, {"generate": batch})


@settings(max_examples=12, deadline=None, derandomize=True)
@given(max_lag=st.integers(0, 2), mini_batches=st.integers(1, 2), epochs=st.integers(1, 2),
       partial=st.booleans())
def test_the_compiler_prices_logp_zero_exactly_when_it_is_provably_redundant(
        max_lag: int, mini_batches: int, epochs: int, partial: bool) -> None:
    spec = make_spec(extra_nodes={"logp": {}, "ref_logp": {}},
                     train={"mini_batches": mini_batches, "epochs": epochs}, max_lag=max_lag)
    spec = spec.model_copy(update={"schedule": spec.schedule.model_copy(
        update={"partial_rollout": partial and max_lag > 0})})
    plan = compile_plan(spec)
    redundant = max_lag == 0 and mini_batches == 1 and epochs == 1
    cost = plan["costs"]["logp"]
    assert (cost["seconds"] == 0.0) == redundant
    assert cost["detail"].startswith("skipped") == redundant
    assert any(m.startswith("logp: skipped") for m in plan["messages"]) == redundant
    assert plan["costs"]["ref_logp"]["seconds"] > 0  # the reference forward is never skipped


def test_a_plan_priced_as_verls_hybrid_engine_keeps_old_log_prob() -> None:
    """verl computes old_log_prob on every batch: pricing.system verl prices it, and its
    synchronous graph keeps the forward even where rlgraph's runtime would skip it."""
    graph = ROOT / "graphs" / "verl-hybrid-engine.yaml"
    ours = compile_plan(load_spec(graph))
    verl = compile_plan(load_spec(graph, ["pricing.system=verl"]))
    assert ours["costs"]["logp"]["seconds"] == 0.0
    assert verl["costs"]["logp"]["seconds"] > 0.0


def test_a_streamed_batch_of_its_version_skips_the_forward() -> None:
    """Streaming (K optimizer steps a version): logp's step t*K + j is version t's."""
    from rlgraph.config.schema import StreamSpec

    spec = _spec()
    spec = spec.model_copy(update={"schedule": spec.schedule.model_copy(
        update={"stream": StreamSpec(mini_batches=2)})})
    ws = Workspace(spec, TASKS, seed=0)
    batch = _scored(ws, step=3)
    valid = batch["response_mask"].bool()
    mine = {**batch, "token_version": torch.where(valid, 1, -1)}  # version 1 = steps 2 and 3
    assert "old_logp" not in ws.worker("logp").run(3, {"generate": mine})
    other = {**batch, "token_version": torch.where(valid, 3, -1)}  # the step, not the version
    assert "old_logp" in ws.worker("logp").run(3, {"generate": other})


def test_old_logp_from_the_rollout_takes_the_behaviour_log_probs_without_a_forward() -> None:
    """train.old_logp: rollout (verl fully_async): an off-policy batch trains with the
    sampler's log-probs as the proximal ones, the same step as a logp node that gave them."""
    torch.manual_seed(0)
    rollout, given_ = (Workspace(_spec(max_lag=2, old_logp=o), TASKS, seed=0)
                       for o in ("rollout", "proximal"))  # a bound that lets lag 2 train
    batch = _scored(rollout)
    valid = batch["response_mask"].bool()
    stale = {**batch, "step": 2, "token_version": torch.where(valid, 0, -1),  # other weights
             "behavior_logp": batch["behavior_logp"] - 0.3 * valid}
    rollout.policy_version = given_.policy_version = 2  # sampled two versions ago
    out = rollout.worker("train").run(2, {"reward": stale})
    ref = given_.worker("train").run(2, {"reward": {**stale,
                                                    "old_logp": stale["behavior_logp"]}})
    assert out["metrics"]["logp/from_rollout"] == 1.0 and out["metrics"]["lag/max"] == 2.0
    assert out["metrics"]["lag/stale_tokens"] == 0.0
    assert ref["metrics"]["logp/from_rollout"] == 0.0
    for key in ("loss/policy", "actor/grad_norm", "actor/is_weight_mean"):
        assert abs(out["metrics"][key] - ref["metrics"][key]) < 1e-6, key
    for a, b in zip(rollout.policy.parameters(), given_.policy.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
