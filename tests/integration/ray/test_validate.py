"""The validate node: wiring, cost, refusals and its worker (its metrics in a real run:
test_runtime_ray.py, whose max_lag 0 run holds a validate node)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rl_support import make_spec

from rlgraph.compiler import compile_plan
from rlgraph.config.load import load_spec
from rlgraph.errors import SpecError
from rlgraph.graph import build_graph
from rlgraph.process.workspace import Workspace
from rlgraph.rl.data import write_task_file

QUICKSTART = Path(__file__).resolve().parents[3] / "graphs" / "quickstart.yaml"
WITH_VALIDATE = ["nodes.validate={kind: validate, every: 2, prompts: 8}",
                 "groups.rollout.tasks=[generate, validate]"]


def test_validate_runs_after_generate_and_before_train_on_the_engine() -> None:
    spec = load_spec(QUICKSTART, WITH_VALIDATE)
    graph = build_graph(spec)
    assert graph.has_edge("generate", "validate") and graph.has_edge("validate", "train")
    assert graph.edges["generate", "validate"]["distance"] == 0
    assert graph.nodes["validate"]["occupies"] == ("rollout",)
    plan = compile_plan(spec)
    every = load_spec(QUICKSTART, [*WITH_VALIDATE, "nodes.validate.every=4"])
    # the validation decode is amortized over `every` steps
    assert compile_plan(every)["costs"]["validate"]["seconds"] == pytest.approx(
        plan["costs"]["validate"]["seconds"] / 2)
    assert "every 2 steps" in plan["costs"]["validate"]["detail"]
    assert plan["lag"]["max_policy_lag"] == 1


def test_validate_outside_generates_group_is_refused_clearly() -> None:
    wrong = ["nodes.validate={kind: validate}", "groups.trainer.tasks=[logp, ref_logp, train,"
             " validate]"]
    with pytest.raises(SpecError) as info:
        compile_plan(load_spec(QUICKSTART, wrong))
    assert info.value.key == ("groups", "trainer", "tasks", 3)
    assert "holds no generate node" in info.value.message
    assert "group 'rollout'" in info.value.hint
    with pytest.raises(SpecError, match="in no group"):
        compile_plan(load_spec(QUICKSTART, ["nodes.validate={kind: validate}"]))
    with pytest.raises(SpecError) as info:
        load_spec(QUICKSTART, [*WITH_VALIDATE, "nodes.validate.task=adition"])
    assert info.value.key == ("nodes", "validate", "task")


def val_workspace(**node) -> Workspace:
    spec = make_spec(extra_nodes={"validate": {"kind": "validate", "every": 3, "prompts": 6,
                                               **node}})
    return Workspace(spec, ["generate", "validate"])


def test_worker_scores_held_out_prompts_every_few_steps() -> None:
    ws = val_workspace()
    worker = ws.worker("validate")
    assert [ex.uid for ex in worker.examples] == [f"arithmetic:val:{i}" for i in range(6)]
    out = worker.run(0, {})
    metrics = out["metrics"]
    assert out["step"] == 0 and metrics["val/policy_version"] == 0
    assert 0.0 <= metrics["val/reward/mean"] <= 1.0 and metrics["val/samples"] == 6
    assert 0.0 <= metrics["val/accuracy"] <= 1.0
    ws.policy_version = 2
    final = worker.validate(2)["metrics"]  # the run's last validation: any step
    assert final["val/accuracy"] == metrics["val/accuracy"]
    assert final["val/policy_version"] == 2
    ws.policy_version = 0
    assert worker.run(1, {}) == {"step": 1}  # not a validation step: no metrics
    ws.policy_version = 5
    again = worker.run(3, {})["metrics"]  # greedy: same weights, same score
    assert again["val/reward/mean"] == metrics["val/reward/mean"]
    assert again["val/policy_version"] == 5


def test_worker_reads_its_own_files_and_task(tmp_path: Path) -> None:
    val = write_task_file(tmp_path / "val.jsonl", "copy", 4, split="val")
    worker = val_workspace(files=[str(val)]).worker("validate")
    assert [ex.data_source for ex in worker.examples] == ["copy"] * 4
    assert worker.run(0, {})["metrics"]["val/samples"] == 4
    worker = val_workspace(task="reverse", greedy=False, temperature=0.5).worker("validate")
    assert {ex.data_source for ex in worker.examples} == {"reverse"}
