"""The Ray runtime end to end with the real workers (tiny model, CPU), one Ray cluster.

Each run is a few steps of the quickstart graph shrunk to a small batch. Checked: every
trained token's lag is within the plan's proven bound for max_lag 0, 1 and 2; with 1 and 2
the overlap is real (lag > 0 occurs and generate(t+1) overlaps train(t) in trace.json); a
validate node scores held-out prompts on its steps and the final weights at the end; a run
whose weights go over `transport: nccl` (gloo here) writes the sync metrics;
metrics.jsonl has the contract's keys; a run stopped after step k and resumed continues at
k with the same version and data position and trains exactly the prompts an uninterrupted
run trains; missing resources are clear errors that keep what the run dir already holds.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from unittest import mock

import pytest
from actor_hooks import hooked_actor

ray = pytest.importorskip("ray")

from rlgraph.compiler import compile_plan  # noqa: E402
from rlgraph.config.load import load_spec  # noqa: E402
from rlgraph.report.chrome_trace import events_from_trace  # noqa: E402
from rlgraph.runtime import actors  # noqa: E402
from rlgraph.runtime.checkpoint import load_checkpoint, read_ledger  # noqa: E402
from rlgraph.runtime.metrics import REQUIRED_KEYS, read_rows  # noqa: E402
from rlgraph.runtime.runner import Runner, RunOptions  # noqa: E402

pytestmark = pytest.mark.runtime

QUICKSTART = Path(__file__).resolve().parents[3] / "graphs" / "quickstart.yaml"
STEPS = 6
SMALL = ["data.prompts_per_step=4", "data.samples_per_prompt=4",
         "data.response_len={mean: 16, max: 24}", "model.warm_start.steps=0"]



# a validate node on the rollout group, every 2 steps (in the max_lag 0 run)
WITH_VALIDATE = ("nodes.validate={kind: validate, every: 2, prompts: 8}",
                 "groups.rollout.tasks=[generate, validate]")
# the weights over `transport: nccl` (gloo on CPU) in small buckets (in the max_lag 1 run;
# the max_lag 0 and 2 runs sync through the object store)
NCCL = ("nodes.param_update.transport=nccl",
        "nodes.param_update.bucket_mb={produce: 0.5, consume: 0.125}")


def run(out: Path, max_lag: int, steps: int = STEPS, resume: bool = False,
        stop_after: int | None = None, tensorboard: bool = False, checkpoint_every: int = 0,
        sleep: dict[tuple[str, int], float] | None = None, extra: tuple[str, ...] = ()):
    """One run; `sleep`: tasks that sleep that long first (`actor_hooks`)."""
    if sleep:
        with mock.patch.object(actors, "GroupActor", hooked_actor(sleep=sleep)):
            return run(out, max_lag, steps, resume, stop_after, tensorboard, checkpoint_every,
                       extra=extra)
    spec = load_spec(QUICKSTART, [*SMALL, f"schedule.max_lag={max_lag}", *extra])
    plan = compile_plan(spec)
    runner: Runner | None = None

    def on_step(row):
        if stop_after is not None and row["step"] + 1 == stop_after:
            runner.request_stop()  # what the Ctrl-C handler does

    runner = Runner(plan, RunOptions(out_dir=out, steps=steps, resume=resume,
                                     on_step=on_step, tensorboard=tensorboard,
                                     checkpoint_every=checkpoint_every,
                                     verify_weights=True))
    return plan, runner.run()


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """Uninterrupted runs at max_lag 0 (with a validate node), 1 (weights over gloo), 2
    (shared by several tests)."""
    out = {}
    for lag in (0, 1, 2):
        folder = tmp_path_factory.mktemp(f"lag{lag}")
        plan, result = run(folder, lag, tensorboard=lag == 1,
                           checkpoint_every=2 if lag == 2 else 0,
                           extra={0: WITH_VALIDATE, 1: NCCL}.get(lag, ()))
        out[lag] = (folder, plan, result)
    return out


@pytest.mark.parametrize("max_lag", [0, 1, 2])
def test_every_trained_token_is_within_the_proven_lag(runs, max_lag):
    folder, plan, result = runs[max_lag]
    bound = plan["lag"]["max_policy_lag"]
    assert bound == max_lag
    rows = read_rows(folder / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(r["lag/max"] <= bound for r in rows) and result.lag_violations == 0
    assert [r["policy/version"] for r in rows] == list(range(1, STEPS + 1))
    ckpt = load_checkpoint(folder)
    assert ckpt.step == STEPS and ckpt.meta["policy_version"] == STEPS and not ckpt.rollout
    events = events_from_trace(json.loads((folder / "trace.json").read_text()))
    by = {(e["node"], e["step"]): e for e in events}
    def overlap(gen, train):
        return gen["start"] < train["end"] and gen["end"] > train["start"]

    next_overlaps = [t for t in range(STEPS - 1)
                     if overlap(by[("generate", t + 1)], by[("train", t)])]
    ahead_overlaps = [t for t in range(STEPS - 1)
                      if any(overlap(by[("generate", s)], by[("train", t)])
                             for s in range(t + 1, min(STEPS, t + max_lag + 1)))]
    if max_lag == 0:
        assert all(r["lag/max"] == 0 for r in rows)
        assert not next_overlaps, "on-policy: generate(t+1) must wait for train(t)'s weights"
        for t in range(1, STEPS):
            assert by[("generate", t)]["start"] >= by[("param_update", t - 1)]["end"]
    else:
        assert max(r["lag/max"] for r in rows) > 0, "off-policy: some tokens are older"
        # generate of a later batch runs while train(t) runs: generate(t+1) with max_lag 1;
        # with max_lag 2 a fast generate may already be two batches ahead (t+2 overlaps)
        assert len(ahead_overlaps) >= 2, ahead_overlaps
        if max_lag == 1:
            assert next_overlaps, "generate(t+1) should overlap train(t)"


def test_a_run_writes_val_metrics_on_validation_steps(runs):
    folder, _, result = runs[0]
    rows = result.rows
    assert [("val/reward/mean" in r) for r in rows] == [True, False, True, False, True, True]
    # after the last step the final weights are validated on the trainer
    assert rows[-1]["val/policy_version"] == STEPS and 0.0 <= rows[-1]["val/accuracy"] <= 1.0
    assert [r["val/policy_version"] for r in rows[:5:2]] == [0, 2, 4]
    written = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert written[-1]["val/policy_version"] == STEPS
    assert 0.0 <= rows[-1]["reward/accuracy"] <= rows[-1]["reward/mean"] + 1e-9
    spans = {(e["node"], e["step"]): e for e in result.events}
    for t in (0, 2, 4):  # validation steps (the others are completed by the driver, no decode)
        assert spans["generate", t]["end"] <= spans["validate", t]["start"]
        assert spans["validate", t]["end"] <= spans["train", t]["start"]
    assert spans["validate", 1]["end"] == spans["validate", 1]["start"]


def test_a_run_over_the_nccl_transport_writes_sync_metrics(runs):
    folder, plan, _ = runs[1]
    assert plan.spec.nodes["param_update"].transport == "nccl"
    rows = read_rows(folder / "metrics.jsonl")
    synced = [r for r in rows if r.get("sync/bytes")]
    assert synced and all(r["sync/GBps"] > 0 and r["time/param_update_s"] > 0 for r in synced)
    # a generate that switched in a synced version reports the pause it cost
    assert any(r.get("generate/pause_s", 0) > 0 for r in rows)
    events = events_from_trace(json.loads((folder / "trace.json").read_text()))
    assert {tuple(e["occupies"]) for e in events if e["node"] == "param_update"} == \
        {("trainer",)}


def test_metrics_jsonl_and_tensorboard_have_the_contract_keys(runs):
    folder, plan, _ = runs[1]
    rows = read_rows(folder / "metrics.jsonl")
    nodes = list(plan["costs"])
    groups = [g["name"] for g in plan["placement"]["groups"]]
    for row in rows:
        for key in [*REQUIRED_KEYS, *(f"time/{n}_s" for n in nodes),
                    *(f"idle/{g}" for g in groups)]:
            assert key in row, key
        assert 0 <= row["reward/mean"] <= 1
        assert row["time/step_s"] > 0 and row["throughput/samples_per_s"] > 0
        assert all(0 <= row[f"idle/{g}"] <= 1 for g in groups)
    assert rows[-1]["time/param_update_s"] > 0
    assert list((folder / "tensorboard").glob("events.out.tfevents.*"))
    table = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines()]
    assert table and {r["step"] for r in table} == {0}  # samples_every 10: step 0's table
    assert all(0 <= r["lag"] <= plan["lag"]["max_policy_lag"] for r in table)
    for name in ("plan.json", "trace.json", "ledger.jsonl", "checkpoint/meta.json",
                 "checkpoint/model.safetensors", "checkpoint/config.json",
                 "checkpoint/manifest.json"):
        assert (folder / name).exists(), name


def test_a_split_plan_fuses_nothing_another_group_waits_for(runs):
    """Fused calls (runtime.executor) in the split plan: logp and ref_logp share the trainer
    with train, and nothing whose output another group waits for is chained."""
    _, plan, result = runs[1]
    groups = dict(plan.graph.nodes(data="occupies"))
    assert any(e.get("fused") for e in result.events), "logp and ref_logp share the trainer"
    for event in result.events:
        if event.get("fused"):
            node = event["node"]
            assert all(groups[dst] == groups[node] for dst in plan.graph.successors(node)), (
                f"{node} fused though another group waits for it")


def test_stopped_run_resumes_at_k_and_trains_the_same_prompts(runs, tmp_path):
    baseline_folder = runs[1][0]
    k = 3
    # train(k - 1) and logp(k) take a second longer: generate(k) and reward(k) are done by the
    # end of train(k - 1), so train(k) is queued in the trainer's actor behind logp(k) and
    # ref_logp(k) when the stop (asked as step k - 1's row is written) arrives; the stop
    # recalls it, and the run stops at k exactly (before recalls it stopped at k + 1)
    _, stopped = run(tmp_path, 1, stop_after=k, sleep={("train", k - 1): 1.0, ("logp", k): 1.0})
    assert stopped.stopped and stopped.next_step == k
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.step == k and ckpt.meta["policy_version"] == k
    buffered = sorted(s for _, s in ckpt.rollout)
    assert buffered and buffered[0] == k, "generate ran ahead: its batch is in the buffer"
    assert ckpt.meta["data_position"] == buffered[-1] + 1
    assert all(b["policy_version"] <= k for b in ckpt.rollout.values())

    _, resumed = run(tmp_path, 1, resume=True)
    assert not resumed.stopped and resumed.first_step == k and resumed.next_step == STEPS
    assert resumed.rows[0]["step"] == k and resumed.rows[0]["policy/version"] == k + 1
    events = events_from_trace(json.loads((tmp_path / "trace.json").read_text()))
    generated = sorted(e["step"] for e in events if e["node"] == "generate")
    assert generated == list(range(STEPS)), "a batch was sampled twice or never"
    rows = read_rows(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert all(r["lag/max"] <= 1 for r in rows)
    ledger, base = read_ledger(tmp_path / "ledger.jsonl"), read_ledger(
        baseline_folder / "ledger.jsonl")
    assert [r["step"] for r in ledger] == list(range(STEPS))
    assert [r["prompt_uids"] for r in ledger] == [r["prompt_uids"] for r in base]
    assert [r["policy_version"] for r in ledger] == [r["policy_version"] for r in base]
    uids = [u for r in ledger for u in r["prompt_uids"]]
    assert len(uids) == len(set(uids)), "a prompt was trained twice"


def test_ctrl_c_handler_requests_a_clean_stop():
    from rlgraph.cli.run import _install_sigint

    class Probe:
        stopped = False

        def request_stop(self):
            self.stopped = True

    probe = Probe()
    previous = _install_sigint(probe)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert probe.stopped
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_missing_gpus_and_unreachable_cluster_are_clear_errors(cluster, tmp_path, capsys):
    from rlgraph.cli.main import main

    out = tmp_path / "gpu-run"
    status = main(["run", str(QUICKSTART), "cluster={nodes: 1, gpus_per_node: 2, gpu: H100}",
                   "--out", str(out), "--steps", "2"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert "needs 2" in err and "GPU" in err and "has 0" in err
    assert (out / "plan.json").exists(), "what the run dir held before the error stays"

    status = main(["run", str(QUICKSTART), "--out", str(tmp_path / "x"), "--address",
                   "127.0.0.1:9"])
    err = capsys.readouterr().err
    assert status == 2 and "cannot reach the Ray cluster at 127.0.0.1:9" in err
    assert "Traceback" not in err
