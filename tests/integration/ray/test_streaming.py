"""Streaming on Ray end to end (tiny model, CPU): train takes one optimizer step per
mini-batch as generate emits it, weights are synced once per version, every trained token's
lag is within the proven bound, and a run stopped mid-version finishes that version,
checkpoints, and resumes to train exactly the prompts an uninterrupted run trains.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from rlgraph.compiler import compile_plan  # noqa: E402
from rlgraph.config.load import load_spec  # noqa: E402
from rlgraph.report.chrome_trace import events_from_trace  # noqa: E402
from rlgraph.runtime.checkpoint import load_checkpoint, read_ledger  # noqa: E402
from rlgraph.runtime.metrics import read_rows  # noqa: E402
from rlgraph.runtime.runner import Runner, RunOptions  # noqa: E402

pytestmark = pytest.mark.runtime

GRAPH = """\
name: stream-tiny
cluster: {local: true, cpus: 2}
model: {preset: tiny, warm_start: {steps: 0}}
data: {task: longtail, prompts_per_step: 4, samples_per_prompt: 2, prompt_len: 8,
       response_len: {mean: 6, max: 24}, seed: 0}
algorithm: {name: grpo, kl_coef: 0.0}
groups:
  trainer: {share: 0.5, tasks: [train]}
  rollout: {share: 0.5, tasks: [generate]}
nodes:
  generate: {kind: generate}
  reward: {kind: reward}
  train: {kind: train, lr: 1.0e-3}
  param_update: {kind: param_update, src: train, dst: generate}
schedule: {max_lag: 0, steps: 3, stream: {mini_batches: 2}}
"""
K, VERSIONS = 2, 3


def run(folder: Path, graph: Path, resume: bool = False, stop_after: int | None = None):
    plan = compile_plan(load_spec(graph))
    runner: Runner | None = None

    def on_step(row):
        if stop_after is not None and row["step"] + 1 == stop_after:
            runner.request_stop()

    runner = Runner(plan, RunOptions(out_dir=folder, steps=VERSIONS, resume=resume,
                                     on_step=on_step, checkpoint_every=0))
    return plan, runner.run()


COLOCATED = ("  trainer: {share: 0.5, tasks: [train]}\n"
             "  rollout: {share: 0.5, tasks: [generate]}\n",
             "  all: {share: 1.0, tasks: [generate, train]}\n")


@pytest.mark.parametrize("colocated", [False, True], ids=["split", "colocated"])
def test_streaming_run_lag_syncs_and_exact_resume(cluster, tmp_path: Path, colocated) -> None:
    """Split, or generate beside train in one group (one actor): there the engine samples
    from a snapshot its param_update refreshes every version, so staleness 0 holds. The stop
    and resume run on the colocated plan, the one where resuming must also refresh that
    snapshot (the checkpoint and resume path is the same for both plans)."""
    graph = tmp_path / "stream.yaml"
    graph.write_text(GRAPH.replace(*COLOCATED) if colocated else GRAPH)
    base = tmp_path / "base"
    plan, result = run(base, graph)
    rows = read_rows(base / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(VERSIONS * K))
    assert [r["policy/version"] for r in rows] == [(m + 1) // K for m in range(VERSIONS * K)]
    assert all(r["lag/max"] <= plan.lag.max_policy_lag == 0 for r in rows)
    assert result.lag_violations == 0 and all(r["samples"] == 4 for r in rows)
    events = events_from_trace(json.loads((base / "trace.json").read_text()))
    syncs = sorted(e["step"] for e in events if e["node"] == "param_update")
    assert syncs == list(range(VERSIONS - 1)), "one weight sync per version"
    by = {(e["node"], e["step"]): e for e in events}
    for m in range(K, VERSIONS * K):  # on-policy: a version's mini-batches wait for its sync
        assert by[("generate", m)]["start"] >= by[("param_update", m // K - 1)]["end"] - 1e-6

    if not colocated:
        return
    stopped_dir = tmp_path / "stopped"
    _, stopped = run(stopped_dir, graph, stop_after=3)  # mid-version 1 (calls 2, 3)
    assert stopped.stopped and stopped.next_step == 4, "the version is finished first"
    ckpt = load_checkpoint(stopped_dir)
    assert ckpt.step == 4 and ckpt.meta["policy_version"] == 2
    _, resumed = run(stopped_dir, graph, resume=True)
    assert resumed.first_step == 4 and resumed.next_step == VERSIONS * K
    ledger, reference = read_ledger(stopped_dir / "ledger.jsonl"), read_ledger(
        base / "ledger.jsonl")
    assert [r["step"] for r in ledger] == list(range(VERSIONS * K))
    assert [r["prompt_uids"] for r in ledger] == [r["prompt_uids"] for r in reference]
    assert [r["policy_version"] for r in ledger] == [r["policy_version"] for r in reference]
    again = read_rows(stopped_dir / "metrics.jsonl")
    assert [r["reward/mean"] for r in again] == pytest.approx([r["reward/mean"] for r in rows])
