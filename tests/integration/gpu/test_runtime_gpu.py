"""The GPU path of `rlgraph run`: what can be checked without a GPU runs everywhere (GPU
bundles and actor options from a GPU plan, batches leaving a GPU actor as CPU tensors, the
GPU count a local Ray cluster is started with); the run itself needs 2 CUDA GPUs and is
skipped on CI."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from rlgraph.compiler import compile_plan
from rlgraph.config.load import load_spec
from rlgraph.runtime import cluster
from rlgraph.runtime.actors import to_host

GRAPHS = Path(__file__).resolve().parents[3] / "bench" / "graphs_gpu"
SPLIT = GRAPHS / "split-one-step-off.yaml"
COLOCATED = GRAPHS / "colocated-sync.yaml"


def test_gpu_plans_reserve_gpu_bundles_per_group():
    """Each group's placement group asks for its GPUs, one bundle (and one replica) per GPU
    (Ray then sets CUDA_VISIBLE_DEVICES)."""
    split = compile_plan(load_spec(SPLIT))
    assert not split["placement"]["local"]
    bundles = {g["name"]: cluster.group_bundles(g, local=False)
               for g in split["placement"]["groups"]}
    assert bundles == {"trainer": [{"GPU": 1.0, "CPU": 1.0}],
                       "rollout": [{"GPU": 1.0, "CPU": 1.0}]}
    colocated = compile_plan(load_spec(COLOCATED))
    (group,) = colocated["placement"]["groups"]
    assert group["replicas"] == 2
    assert cluster.group_bundles(group, local=False) == [{"GPU": 1.0, "CPU": 1.0}] * 2


def test_actor_options_carry_the_bundle_gpus():
    """The actor of a GPU group asks Ray for the bundle's GPUs, inside its placement group."""
    pytest.importorskip("ray")
    res = cluster.Reservations()
    res.groups["trainer"] = cluster.GroupReservation("trainer", object(),
                                                     {"GPU": 1.0, "CPU": 1.0}, 1)
    try:
        options = res.actor_options("trainer")
    except (TypeError, ValueError):  # Ray validates the placement group's type
        pytest.skip("this Ray checks the placement group object")
    assert options["num_gpus"] == 1.0 and options["num_cpus"] == 1.0


def test_to_host_moves_nested_tensors_and_keeps_the_rest():
    """What a GPU actor returns has only CPU tensors, at any depth; other values unchanged."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch = {"step": 3, "prompt": ["1+1="], "sequences": torch.arange(4, device=device),
             "metrics": {"loss": 0.5},
             "state": {0: {"exp_avg": torch.ones(2, device=device)}}}
    out = to_host(batch)
    assert out["step"] == 3 and out["prompt"] == ["1+1="] and out["metrics"] == {"loss": 0.5}
    assert out["sequences"].device.type == "cpu"
    assert out["sequences"].tolist() == [0, 1, 2, 3]
    assert out["state"][0]["exp_avg"].device.type == "cpu"


def test_visible_gpus_matches_torch():
    """A local cluster for a GPU plan gets the GPUs torch sees (None without any: Ray looks)."""
    count = torch.cuda.device_count()
    assert cluster.visible_gpus() == (count or None)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
@pytest.mark.parametrize("graph", [SPLIT, COLOCATED], ids=["split", "colocated"])
def test_plans_run_on_two_gpus(tmp_path, graph):
    """Split: train on GPU 0, generate on GPU 1, one step off. Colocated: every task on two
    replicas, one per GPU (NCCL sums the gradients). Short real runs within the bound; the
    colocated group's replicas end with identical weights."""
    ray = pytest.importorskip("ray")
    from rlgraph.runtime.runner import Runner, RunOptions

    spec = load_spec(graph, ["data.prompts_per_step=4", "data.samples_per_prompt=2",
                             "data.response_len={mean: 4, max: 4}"])
    plan = compile_plan(spec)
    digests: dict[str, list[str]] = {}
    runner: Runner | None = None

    def on_step(row):
        if row["step"] == 2:
            for group in runner.groups:
                digests[group] = ray.get(runner.group_actors[group].replica_digests.remote())

    started = not ray.is_initialized()
    if started:
        ray.init(num_gpus=2, include_dashboard=False, logging_level=logging.WARNING,
                 log_to_driver=False)
    try:
        runner = Runner(spec, plan, RunOptions(out_dir=tmp_path / "run", steps=3,
                                               tensorboard=False, on_step=on_step))
        result = runner.run()
    finally:
        if started:
            ray.shutdown()
    assert result.next_step == 3 and result.lag_violations == 0
    assert [r["policy/version"] for r in result.rows] == [1.0, 2.0, 3.0]
    replicas = {g["name"]: g["replicas"] for g in plan["placement"]["groups"]}
    assert {g: len(d) for g, d in digests.items()} == replicas
    assert all(len(set(d)) == 1 for d in digests.values())
