"""Fused actor calls (runtime.executor): a colocated group's chained tasks run in one call.

A seeded colocated run trains exactly as the unfused one (same losses, step by step), every
task still has its own span, and the fused run did fuse (generate, reward and train of a
step in one call); a split plan's fused calls are checked in test_runtime_ray.py.
A train step that raises inside a fused call leaves the emergency checkpoint the unfused run
leaves (its step's finished rollout buffered), and the fused run resumes to the
training of the uninterrupted one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from actor_hooks import hooked_actor

ray = pytest.importorskip("ray")

from rlgraph.compiler import compile_plan  # noqa: E402
from rlgraph.config.load import load_spec  # noqa: E402
from rlgraph.errors import RLGraphError  # noqa: E402
from rlgraph.report.chrome_trace import events_from_trace  # noqa: E402
from rlgraph.runtime import actors  # noqa: E402
from rlgraph.runtime.checkpoint import load_checkpoint, read_ledger  # noqa: E402
from rlgraph.runtime.metrics import read_rows  # noqa: E402
from rlgraph.runtime.runner import Runner, RunOptions  # noqa: E402

pytestmark = pytest.mark.runtime

QUICKSTART = Path(__file__).resolve().parents[3] / "graphs" / "quickstart.yaml"
STEPS = 4
SMALL = ["data.prompts_per_step=4", "data.samples_per_prompt=4",
         "data.response_len={mean: 8, max: 12}",
         "model.warm_start.steps=30"]  # a warm start, so rewards and losses are not all zero
COLOCATED = "groups={all: {share: 1.0, tasks: [generate, reward, logp, ref_logp, train]}}"


def run(out: Path, overrides: list[str], fuse: bool, resume: bool = False):
    plan = compile_plan(load_spec(QUICKSTART, [*SMALL, *overrides]))
    result = Runner(plan, RunOptions(out_dir=out, steps=STEPS, tensorboard=False, resume=resume,
                                     checkpoint_every_s=0, fuse=fuse)).run()
    return plan, result


def same(a, b) -> bool:
    """Batches (nested dicts of tensors and values) equal: tokens and values exactly, float
    tensors to rounding (each run picks its torch thread count at start-up, which moves a
    log-prob's last bits: 5e-7 seen)."""
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype):
            return False
        return torch.allclose(a, b, rtol=0, atol=1e-5) if a.is_floating_point() else (
            torch.equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def complete(cluster, tmp_path_factory):
    """The colocated on-policy run fused and unfused, to the end (shared by two tests)."""
    folder = tmp_path_factory.mktemp("complete")
    overrides = [COLOCATED, "schedule.max_lag=0"]
    return {fuse: run(folder / str(fuse), overrides, fuse=fuse)[1] for fuse in (True, False)}


def test_fused_run_trains_as_the_unfused_one_with_a_span_per_task(complete):
    fused, plain = complete[True], complete[False]
    losses = [[(row["loss/policy"], row["reward/mean"])
               for row in read_rows(r.out_dir / "metrics.jsonl")] for r in (fused, plain)]
    assert len(losses[0]) == STEPS and losses[0] == losses[1]
    assert any(loss != 0 for loss, _ in losses[0]), "all-zero losses compare equal trivially"
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


def test_a_train_step_failing_in_a_fused_call_keeps_what_the_unfused_run_keeps(
        complete, tmp_path, monkeypatch):
    k, overrides = 2, [COLOCATED, "schedule.max_lag=0"]
    kept, message, folders = {}, {}, {}
    for fuse in (True, False):
        folders[fuse] = tmp_path / ("fused" if fuse else "plain")
        with monkeypatch.context() as patch:
            patch.setattr(actors, "GroupActor", hooked_actor(fail={("train", k)}))
            with pytest.raises(RLGraphError) as err:
                run(folders[fuse], overrides, fuse)
        message[fuse], kept[fuse] = str(err.value), load_checkpoint(folders[fuse])
        assert "\n" not in message[fuse]
        assert f"train failed at step {k}: RuntimeError: injected failure" in message[fuse]
        assert f"progress kept: checkpoint at step {k}" in message[fuse], message[fuse]
        assert "injected failure of train" in (folders[fuse] / "error.log").read_text()
    events = events_from_trace(json.loads((folders[True] / "trace.json").read_text()))
    assert any(e["node"] == "generate" and e["step"] == k and e.get("fused")
               for e in events), "generate of the failing step did not run in a fused call"
    fused, plain = kept[True], kept[False]
    assert fused.step == plain.step == k and fused.meta["policy_version"] == k
    assert sorted(fused.rollout) == sorted(plain.rollout) == [("generate", k)], (
        "the failing step's finished rollout is lost")
    assert same(fused.rollout[("generate", k)], plain.rollout[("generate", k)])
    assert fused.meta["data_position"] == plain.meta["data_position"] == k + 1
    # the fused run resumes (its step k's rollout preloaded ahead of a fused chain) and
    # trains as the uninterrupted unfused run did (the unfused resume is test_faults.py's)
    run(folders[True], overrides, True, resume=True)
    resumed, whole = folders[True], complete[False].out_dir
    ledgers = [read_ledger(f / "ledger.jsonl") for f in (resumed, whole)]
    assert [r["step"] for r in ledgers[0]] == list(range(STEPS))
    assert [r["prompt_uids"] for r in ledgers[0]] == [r["prompt_uids"] for r in ledgers[1]]
    losses = [[row["loss/policy"] for row in read_rows(f / "metrics.jsonl")]
              for f in (resumed, whole)]
    assert len(losses[0]) == STEPS and losses[0] == losses[1]
