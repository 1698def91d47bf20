"""Runtime pieces that need no Ray: weight buckets in the object-store format, checkpoints,
the ledger, metrics rows, the critical path, and how `rlgraph run --resume` reads a run dir."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from rlgraph.cli.run import RunDirError, default_run_dir, prepare
from rlgraph.config.load import load_spec
from rlgraph.graph import build_graph
from rlgraph.runtime.checkpoint import (
    CheckpointError,
    Ledger,
    load_checkpoint,
    read_ledger,
    save_checkpoint,
)
from rlgraph.runtime.metrics import REQUIRED_KEYS, MetricsWriter, read_rows, step_row
from rlgraph.runtime.tracing import critical_path
from rlgraph.weights.buckets import digest, from_arrays, to_arrays

QUICKSTART = Path(__file__).resolve().parents[3] / "graphs" / "quickstart.yaml"


def test_buckets_survive_the_object_store_format_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    tensors = {"w": torch.randn(4, 3, generator=gen),
               "h": torch.randn(5, generator=gen).to(torch.bfloat16),
               "i": torch.arange(6, dtype=torch.int64).view(2, 3),
               "half": torch.randn(3, generator=gen).half()}
    bucket = {"version": 7, "index": 0, "total": 1, "tensors": tensors}
    stored = to_arrays(bucket)
    assert all(hasattr(a, "dtype") and not isinstance(a, torch.Tensor)
               for a in stored["arrays"].values()), "numpy arrays, not pickled tensors"
    back = from_arrays(stored)
    assert back["version"] == 7 and back["index"] == 0 and back["total"] == 1
    assert digest(back["tensors"]) == digest(tensors)
    assert back["tensors"]["h"].dtype == torch.bfloat16


def test_checkpoint_round_trip_keeps_weights_optimizer_and_rollout(tmp_path):
    model = torch.nn.Linear(3, 2)
    model.weight.data.fill_(0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = {"weights": dict(model.state_dict()), "optimizer": opt.state_dict(),
             "policy_version": 4, "seed": 0}
    rollout = {("generate", 4): {"step": 4, "sequences": torch.arange(6).view(2, 3),
                                 "policy_version": 3}}
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path)
    save_checkpoint(tmp_path, {"step": 4, "policy_version": 4}, state, rollout)
    save_checkpoint(tmp_path, {"step": 4, "policy_version": 4}, state, rollout)  # replaces
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.step == 4 and ckpt.state["policy_version"] == 4
    assert digest(ckpt.state["weights"]) == digest(state["weights"])
    assert ckpt.meta["rollout_steps"] == [4]
    assert torch.equal(ckpt.rollout[("generate", 4)]["sequences"], torch.arange(6).view(2, 3))
    fresh = torch.optim.AdamW(torch.nn.Linear(3, 2).parameters(), lr=0.1)
    fresh.load_state_dict(ckpt.state["optimizer"])
    assert fresh.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert not (tmp_path / "checkpoint.tmp").exists()


def test_ledger_and_metrics_are_cut_at_the_resumed_step(tmp_path):
    ledger = Ledger(tmp_path)
    for step in range(5):
        ledger.append(step, [f"p{step}"], step + 1)
    metrics = MetricsWriter(tmp_path, tensorboard=False)
    for step in range(5):
        metrics.write({"step": step})
    metrics.close()
    Ledger(tmp_path, first_step=3).append(3, ["p3"], 4)
    MetricsWriter(tmp_path, first_step=3, tensorboard=False).close()
    assert [r["step"] for r in read_ledger(tmp_path / "ledger.jsonl")] == [0, 1, 2, 3]
    assert [r["step"] for r in read_rows(tmp_path / "metrics.jsonl")] == [0, 1, 2]


def test_step_row_has_the_contract_keys_and_idle_fractions():
    events = [
        {"node": "generate", "step": 1, "start": 0.0, "end": 1.0, "occupies": ["rollout"]},
        {"node": "train", "step": 0, "start": 0.5, "end": 1.5, "occupies": ["trainer"]},
        {"node": "param_update", "step": 0, "start": 1.5, "end": 2.0,
         "occupies": ["trainer", "rollout"]},
    ]
    latest = {"generate": events[0], "train": events[1], "param_update": None}
    summary = {"metrics": {"reward/mean": 0.5, "lag/max": 1.0, "lag/mean": 0.5,
                           "samples": 32.0, "tokens": 640.0}, "policy_version": 1}
    row = step_row(0, summary, (0.0, 2.0), latest, events, ["trainer", "rollout"])
    assert set(REQUIRED_KEYS) <= set(row)
    assert row["time/step_s"] == 2.0 and row["throughput/samples_per_s"] == 16.0
    assert row["throughput/tokens_per_s"] == 320.0 and row["policy/version"] == 1
    assert row["idle/trainer"] == pytest.approx(0.25)  # busy 0.5-2.0 of 0-2
    assert row["idle/rollout"] == pytest.approx(0.25)  # busy 0-1 and 1.5-2
    assert row["time/generate_s"] == 1.0 and row["time/param_update_s"] == 0.0


def test_critical_path_counts_the_gaps_between_binding_spans():
    graph = build_graph(load_spec(QUICKSTART, ["schedule.max_lag=0"]))
    events, t = [], 0.0
    gap = 0.01
    for step in range(3):
        for node, dur in (("generate", 1.0), ("reward", 0.0), ("logp", 0.2),
                          ("ref_logp", 0.2), ("train", 0.5), ("param_update", 0.1)):
            occupies = {"generate": ["rollout"], "reward": [],
                        "param_update": ["trainer", "rollout"]}.get(node, ["trainer"])
            start = t + gap
            events.append({"node": node, "step": step, "start": start, "end": start + dur,
                           "occupies": occupies})
            t = start + dur
    path = critical_path(events, graph)
    # reward is not on the path (logp waits for generate, not for reward), train(2) ends it
    assert [e["node"] for e in path.spans][:3] == ["generate", "logp", "ref_logp"]
    assert len(path.spans) == 14 and path.spans[-1]["node"] == "train"
    assert path.busy_s == pytest.approx(2 * 2.0 + 1.9)
    assert path.overhead_s == pytest.approx(16 * gap)  # every gap from generate(0) on
    assert path.steps == 3 and path.overhead_fraction == pytest.approx(0.16 / 6.06)


def test_resume_without_a_checkpoint_and_bad_steps_are_clear_errors(tmp_path):
    args = argparse.Namespace(graph=str(QUICKSTART), overrides=[], steps=None, out=None,
                              resume=str(tmp_path), address=None)
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        prepare(args)
    with pytest.raises(RunDirError, match="not a directory"):
        prepare(argparse.Namespace(**{**vars(args), "resume": str(tmp_path / "missing")}))
    with pytest.raises(RunDirError, match="positive"):
        prepare(argparse.Namespace(**{**vars(args), "steps": 0}))


def test_default_run_dir_is_named_after_the_graph_and_time():
    path = default_run_dir("my graph/1", now=0)
    assert path.parent == Path("runs") and path.name.startswith("my-graph-1-")
    assert len(path.name.rsplit("-", 2)[-2]) == 8  # YYYYmmdd


@pytest.mark.parametrize(("overrides", "key"), [
    (["nodes.param_update.transport=nccl",
      "nodes.param_update.bucket_mb={produce: 100, consume: 64}"], "nodes.param_update.bucket_mb"),
    (["cluster.cpus=4", "nodes.train.backend=megatron", "nodes.train.tp=2"], "nodes.train.tp"),
])
def test_what_the_runtime_cannot_do_is_refused_before_ray_starts(tmp_path, overrides, key):
    from rlgraph.compiler import compile_plan
    from rlgraph.errors import SpecError
    from rlgraph.runtime.runner import Runner, RunOptions

    spec = load_spec(QUICKSTART, overrides)
    with pytest.raises(SpecError) as err:
        Runner(compile_plan(spec), RunOptions(out_dir=tmp_path, steps=1))
    assert f"{key}:" in err.value.render() and "<override" in err.value.render()
    assert not list(tmp_path.iterdir()), "nothing started, nothing written"


def test_a_gpu_out_of_memory_is_the_users_error_naming_the_key(monkeypatch):
    """A worker that runs out of GPU memory surfaces as a SpecError naming the node, the
    replica and the key to change (train: micro_batch), not a CUDA traceback."""
    import torch

    from rlgraph.errors import SpecError
    from rlgraph.runtime.actors import GroupActor

    spec = load_spec(QUICKSTART, ["model.warm_start.steps=0"])
    actor = GroupActor(spec, ["logp", "ref_logp", "train"], seed=0, threads=1, device="cpu")

    def exhausted(step, inputs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(actor.workers["train"], "run", exhausted)
    with pytest.raises(SpecError) as err:
        actor.run_replica("train", 3, {})
    text = err.value.render()
    assert "nodes.train.micro_batch:" in text and "'train' ran out of GPU memory at step 3" in text
    assert "Tried to allocate 2.00 GiB" in text and "quickstart.yaml" in text


def test_model_parallelism_the_runtime_does_not_run_is_said_before_the_run(tmp_path):
    """tp of a torch-backend node counts in the plan; `rlgraph run` says the node runs as
    whole-model replicas instead (and says nothing for a plan without such nodes)."""
    from rlgraph.compiler import compile_plan
    from rlgraph.runtime.runner import Runner, RunOptions

    spec = load_spec(QUICKSTART, ["cluster.cpus=4", "nodes.train.tp=2",
                                  "groups.trainer.replicas=2"])
    notes = Runner(compile_plan(spec), RunOptions(out_dir=tmp_path, steps=1)).notes
    assert len(notes) == 1 and notes[0].startswith("nodes.train: tp x pp = 2")
    assert "2 data-parallel replica(s)" in notes[0] and "backend: megatron" in notes[0]
    plain = load_spec(QUICKSTART)
    assert Runner(compile_plan(plain), RunOptions(out_dir=tmp_path, steps=1)).notes == []


def test_a_fused_call_returns_what_finished_and_a_recalled_task_never_starts(monkeypatch):
    """`GroupActor.run_chain` as separate calls would end: the tasks before a failure return
    their results, the failure its TaskFailure, the rest NotRun; a task a stop recalled
    (`recall`) does not start, alone or in a chain, and neither does what follows it."""
    from rlgraph.runtime.actors import GroupActor
    from rlgraph.runtime.tasks import NotRun, TaskFailure

    spec = load_spec(QUICKSTART, ["model.warm_start.steps=0"])
    actor = GroupActor(spec, ["logp", "ref_logp", "train"], seed=0, threads=1, device="cpu")
    ran = []

    def replica(node, step, inputs):
        ran.append((node, step))
        if node == "train" and step == 0:
            raise ValueError("bad batch")
        return {"node": node, "inputs": sorted(inputs)}

    monkeypatch.setattr(actor, "run_replica", replica)
    chain = [("logp", 0, ["generate"], [0], 0), ("ref_logp", 0, ["logp"], [-1], 0),
             ("train", 0, ["logp", "ref_logp"], [-1, -2], 0), ("logp", 1, ["generate"], [1], 0)]
    out = actor.run_chain(chain, {"rows": 0}, {"rows": 1})
    assert out[0] == {"node": "logp", "inputs": ["generate"]} and out[1]["fused"] == 4
    assert out[2]["node"] == "ref_logp" and isinstance(out[3], dict)
    failure = out[5]
    assert isinstance(failure, TaskFailure) and (failure.node, failure.step) == ("train", 0)
    assert isinstance(failure.error, ValueError) and "bad batch" in failure.trace
    assert out[6] is None and isinstance(out[7], NotRun)
    assert ran == [("logp", 0), ("ref_logp", 0), ("train", 0)]

    actor.recall([("logp", 2), ("train", 2)])
    output, info = actor.run("logp", 2, ["generate"], {"rows": 2})
    assert output is None and isinstance(info, NotRun)
    out = actor.run_chain([("ref_logp", 2, ["generate"], [0], 0),
                           ("logp", 2, ["generate"], [0], 0),
                           ("train", 2, ["logp", "ref_logp"], [-2, -1], 0)], {"rows": 2})
    assert isinstance(out[1], dict) and all(isinstance(i, NotRun) for i in out[3::2])
    assert ran[3:] == [("ref_logp", 2)]
