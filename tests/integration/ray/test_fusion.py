"""Fused actor calls (runtime.executor): a colocated group's chained tasks run in one call.

A seeded colocated run trains exactly as the unfused one (same losses, step by step), every
task still has its own span, and the fused run did fuse (generate, reward and train of a
step in one call); in a split plan nothing whose output another group waits for is fused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from rlgraph.compiler import compile_plan  # noqa: E402
from rlgraph.config.load import load_spec  # noqa: E402
from rlgraph.runtime.metrics import read_rows  # noqa: E402
from rlgraph.runtime.runner import Runner, RunOptions  # noqa: E402

pytestmark = pytest.mark.runtime

QUICKSTART = Path(__file__).resolve().parents[3] / "graphs" / "quickstart.yaml"
STEPS = 4
SMALL = ["data.prompts_per_step=4", "data.samples_per_prompt=4",
         "data.response_len={mean: 8, max: 12}", "model.warm_start.steps=0"]
COLOCATED = "groups={all: {share: 1.0, tasks: [generate, reward, logp, ref_logp, train]}}"


def run(out: Path, overrides: list[str], fuse: bool):
    plan = compile_plan(load_spec(QUICKSTART, [*SMALL, *overrides]))
    result = Runner(plan, RunOptions(out_dir=out, steps=STEPS, tensorboard=False,
                                     checkpoint_every_s=0, fuse=fuse)).run()
    return plan, result


def test_fused_run_trains_as_the_unfused_one_with_a_span_per_task(cluster, tmp_path):
    overrides = [COLOCATED, "schedule.max_lag=0"]
    _, fused = run(tmp_path / "fused", overrides, fuse=True)
    _, plain = run(tmp_path / "plain", overrides, fuse=False)
    losses = [[(row["loss/policy"], row["reward/mean"])
               for row in read_rows(r.out_dir / "metrics.jsonl")] for r in (fused, plain)]
    assert len(losses[0]) == STEPS and losses[0] == losses[1]
    for result in (fused, plain):
        spans = [(e["node"], e["step"]) for e in result.events]
        assert len(spans) == len(set(spans)), "one span per task"
        assert {(n, t) for n in ("generate", "reward", "logp", "ref_logp", "train")
                for t in range(STEPS)} <= set(spans)
    chained = {(e["node"], e["step"]) for e in fused.events if e.get("fused")}
    assert {("generate", t) for t in range(STEPS)} <= chained, "generate never fused"
    assert {("train", t) for t in range(STEPS)} <= chained, "train never fused"
    assert not any(e.get("fused") for e in plain.events)
    for t in range(STEPS):  # in order within the call: each span after the one it follows
        by = {e["node"]: e for e in fused.events if e["step"] == t}
        assert by["generate"]["end"] <= by["train"]["start"]


def test_a_split_plan_fuses_nothing_another_group_waits_for(cluster, tmp_path):
    plan, result = run(tmp_path / "split", ["schedule.max_lag=1"], fuse=True)
    groups = dict(plan.graph.nodes(data="occupies"))
    assert any(e.get("fused") for e in result.events), "logp and ref_logp share the trainer"
    for event in result.events:
        if event.get("fused"):
            node = event["node"]
            assert all(groups[dst] == groups[node] for dst in plan.graph.successors(node)), (
                f"{node} fused though another group waits for it")
