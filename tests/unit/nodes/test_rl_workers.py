"""Node workers on a Workspace (no Ray): the Batch contract between generate ... train."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rl_support import make_spec

from rlgraph.errors import SourceMap, SpecError
from rlgraph.nodes import KINDS
from rlgraph.process.workspace import Workspace
from rlgraph.rl.rewards import RewardFnError

EXTRA = {"logp": {}, "ref_logp": {}}


@pytest.fixture(scope="module")
def ws() -> Workspace:
    spec = make_spec(extra_nodes=EXTRA, train={"lr": 1e-2, "micro_batch": 6},
                     algorithm={"kl_coef": 0.1})
    return Workspace(spec, ["generate", "logp", "ref_logp", "reward", "train"], seed=0)


def test_every_kind_has_its_worker_in_its_own_file() -> None:
    import importlib

    for name, kind in KINDS.items():
        module, _, attr = kind.worker.partition(":")
        assert module == f"rlgraph.nodes.{name}", name
        assert isinstance(getattr(importlib.import_module(module), attr), type)


def test_workspace_builds_only_what_its_tasks_need() -> None:
    spec = make_spec(extra_nodes=EXTRA)
    rollout = Workspace(spec, ["generate"])
    assert rollout.policy is not None and rollout.reference is None and rollout.optimizer is None
    ref = Workspace(spec, ["ref_logp"])
    assert ref.policy is None and ref.reference is not None
    scorer = Workspace(spec, ["reward"])
    assert scorer.policy is None and scorer.reference is None


def test_one_step_through_every_worker(ws: Workspace) -> None:
    gen = ws.worker("generate").run(0, {})
    data = ws.spec.data
    rows = data.prompts_per_step * data.samples_per_prompt
    assert len(gen["response_text"]) == rows and gen["sequences"].shape[0] == rows
    assert gen["group"].tolist() == [i // data.samples_per_prompt for i in range(rows)]
    assert gen["policy_version"] == ws.policy_version == 0
    mask = gen["response_mask"].bool()
    assert (gen["token_version"][mask] == 0).all()
    assert gen["prompt_uid"][0] == "arithmetic:train:0"
    # same (seed, step) -> same samples, so a resumed run regenerates the same batch
    again = ws.worker("generate").run(0, {})
    assert torch.equal(again["sequences"], gen["sequences"])

    scored = ws.worker("reward").run(0, {"generate": gen})
    logp = ws.worker("logp").run(0, {"generate": gen})
    assert "old_logp" not in logp  # on-policy, one update: train's own forward serves
    old_logp = ws.worker("logp").forward(gen)
    ref = ws.worker("ref_logp").run(0, {"generate": gen})
    torch.testing.assert_close(old_logp[mask], gen["behavior_logp"][mask],
                               atol=1e-4, rtol=1e-4)  # same weights: proximal == behaviour
    torch.testing.assert_close(ref["ref_logp"], old_logp)  # version 0 == reference
    assert scored["rewards"].shape == (rows,)
    # a random model rarely scores; give every group a spread so the step must move the policy
    scored["rewards"] = (torch.arange(rows) % 2).to(scored["rewards"].dtype)

    out = ws.worker("train").run(0, {"reward": scored, "logp": logp, "ref_logp": ref})
    assert out["policy_version"] == ws.policy_version == 1
    metrics = out["metrics"]
    assert metrics["lag/max"] == 0 and metrics["policy/version"] == 1
    assert metrics["reward/mean"] == pytest.approx(float(scored["rewards"].mean()))
    assert out["trained_uids"] == [f"arithmetic:train:{i}" for i in range(data.prompts_per_step)]

    # a batch sampled at version 1 and trained at step 2 has lag 1; the reference is frozen
    stale = ws.worker("generate").run(2, {})
    assert (stale["token_version"][stale["response_mask"].bool()] == 1).all()
    ref2 = ws.worker("ref_logp").run(2, {"generate": stale})
    logp2 = ws.worker("logp").run(2, {"generate": stale})
    assert not torch.allclose(ref2["ref_logp"], logp2["old_logp"])
    out2 = ws.worker("train").run(2, {"reward": ws.worker("reward").run(2, {"g": stale}),
                                      "logp": logp2, "ref_logp": ref2})
    assert out2["metrics"]["lag/max"] == 1 and out2["metrics"]["lag/mean"] == 1
    assert out2["metrics"]["loss/kl"] > 0


def test_train_without_logp_node_recomputes_the_proximal_policy() -> None:
    ws = Workspace(make_spec(train={"lr": 1e-3}), ["generate", "reward", "train"])
    gen = ws.worker("generate").run(0, {})
    out = ws.worker("train").run(0, {"reward": ws.worker("reward").run(0, {"g": gen})})
    assert out["metrics"]["actor/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError, match="wire a reward node"):
        ws.worker("train").run(1, {"generate": ws.worker("generate").run(1, {})})


def test_worker_refuses_the_batch_of_another_step(ws: Workspace) -> None:
    gen = ws.worker("generate").run(3, {})
    with pytest.raises(ValueError, match="batch of step 3 at step 4"):
        ws.worker("reward").run(4, {"generate": gen})


def test_long_prompt_is_a_spec_error() -> None:
    spec = make_spec(data={"prompt_len": 3})
    spec._source = SourceMap(path="my-graph.yaml", positions={("data", "prompt_len"): (7, 3)})
    ws = Workspace(spec, ["generate"])
    with pytest.raises(SpecError, match="more than prompt_len 3") as err:
        ws.worker("generate").run(0, {})
    assert err.value.key == ("data", "prompt_len")
    assert err.value.render().startswith("my-graph.yaml:7:3: data.prompt_len: prompt ")


def test_reward_worker_refuses_a_reward_that_is_not_finite(tmp_path: Path) -> None:
    (tmp_path / "r.py").write_text("def f(data_source, solution_str, ground_truth, "
                                   "extra_info=None):\n    return 1e308\n")
    ws = Workspace(make_spec(reward={"fn": f"{tmp_path}/r.py:f"}), ["generate", "reward"])
    gen = ws.worker("generate").run(2, {})
    with pytest.raises(RewardFnError, match=r"r.py:f at step 2 on sample 0 \(prompt "
                       r"arithmetic:train:\d+.*returned 1e\+308, not a finite reward"):
        ws.worker("reward").run(2, {"generate": gen})


def test_reward_worker_reports_a_failing_fn(tmp_path: Path) -> None:
    (tmp_path / "r.py").write_text("def f(data_source, solution_str, ground_truth, "
                                   "extra_info=None):\n    return None\n")
    spec = make_spec(reward={"fn": f"{tmp_path}/r.py:f"})
    ws = Workspace(spec, ["generate", "reward"])
    with pytest.raises(RewardFnError,
                       match=r"r.py:f at step 0 on sample 0 \(prompt arithmetic:train:0"):
        ws.worker("reward").run(0, {"generate": ws.worker("generate").run(0, {})})
