"""The overlapped weight sync: the receive lands beside a running generate (Ray `receive`
concurrency group), into the second buffer, in consume-sized pieces, and the new version
goes live only at `Workspace.swap_if_staged`; the object-store and gloo transports move
the weights bit for bit (a whole run with `transport: nccl`, gloo on CPU, and its sync
metrics: test_runtime_ray.py's max_lag 1 run).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from sim_drive import drive  # noqa: E402

from rlgraph.config.load import load_spec  # noqa: E402
from rlgraph.graph import build_graph  # noqa: E402
from rlgraph.process.workspace import Workspace  # noqa: E402
from rlgraph.runtime import weight_sync  # noqa: E402
from rlgraph.runtime.actors import start_actor  # noqa: E402
from rlgraph.runtime.pipeline import Pipeline  # noqa: E402
from rlgraph.weights import BucketMiB  # noqa: E402
from rlgraph.weights.buckets import WeightSyncError  # noqa: E402

pytestmark = pytest.mark.runtime

QUICKSTART = Path(__file__).resolve().parents[3] / "graphs" / "quickstart.yaml"
SMALL = ["data.prompts_per_step=4", "data.samples_per_prompt=4",
         "data.response_len={mean: 16, max: 24}", "model.warm_start.steps=0"]
LONG = ["data.prompts_per_step=8", "data.samples_per_prompt=8",
        "data.response_len={mean: 300, max: 400}", "model.warm_start.steps=0"]
PRODUCE_MB, CONSUME_MB = 0.25, 1 / 32  # 256 KiB buckets loaded 32 KiB at a time
BUCKET_MB = BucketMiB(PRODUCE_MB, CONSUME_MB)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # probes run in the actors



@pytest.fixture(scope="module")
def actors(cluster):
    """A trainer and a rollout actor of the tiny model, long responses (a slow generate)."""
    spec = load_spec(QUICKSTART, LONG)
    opts = {"seed": 0, "threads": 1, "device": "cpu", "options": {"num_cpus": 0}}
    trainer = start_actor(spec, ["train"], **opts)
    rollout = start_actor(spec, ["generate"], **opts)
    ray.get([trainer.ready.remote(), rollout.ready.remote()])
    yield trainer, rollout
    ray.kill(trainer)
    ray.kill(rollout)


def _new_version(trainer, version: int, seed: int) -> str:
    """Give the trainer different weights as `version`; returns their digest."""
    state = ray.get(trainer.state_for_checkpoint.remote())
    gen = torch.Generator().manual_seed(seed)
    state["weights"] = {k: v + 0.01 * torch.randn(v.shape, generator=gen)
                        for k, v in state["weights"].items()}
    state["policy_version"] = version
    ray.get(trainer.load_checkpoint.remote(state))
    return ray.get(trainer.weights_digest.remote())


def _probe(actor, fn):
    """Run `fn(actor)` in the actor's `sync` group: beside a task of its default group."""
    return ray.get(actor.__ray_call__.options(concurrency_group=weight_sync.RECEIVE).remote(fn))


def _generating(actor) -> bool:
    """Whether a task of the default group holds the workspace lock (generate runs)."""
    lock = actor.workspace.lock
    if lock.acquire(blocking=False):
        lock.release()
        return False
    return True


def _live(actor) -> tuple[int, int | None, str]:
    """(version in use, version staged, digest of the live weights) without switching."""
    ws = actor.workspace
    staged = ws.staged[0] if ws.staged else None
    return ws.policy_version, staged, ws.weights_digest()


def _sync_under_generation(trainer, rollout, start_sync) -> tuple[dict, dict, dict]:
    """Start a generate on the rollout actor, land a sync while it runs; returns
    (generate's output, generate's info, the sync's info)."""
    version0, _, digest0 = _live_probe(rollout)
    gen_out, gen_info = rollout.run.options(num_returns=2).remote("generate", 0, [])
    deadline = time.time() + 60
    while not _probe(rollout, _generating):
        assert time.time() < deadline, "generate never started"
        time.sleep(0.01)
    info = ray.get(start_sync())
    assert _probe(rollout, _generating), "generate ended before the sync was staged: the " \
        "test needs a longer generate"
    out, ginfo = ray.get([gen_out, gen_info])
    assert ginfo["end"] > info["end"], "the sync was staged while generate ran"
    # generate used one version throughout: the one it started with
    assert out["policy_version"] == version0
    assert set(out["token_version"].unique().tolist()) <= {version0, -1}
    assert _live_probe(rollout) == (version0, info["version"], digest0), "switched too early"
    return out, ginfo, info


def _live_probe(actor) -> tuple:
    return _probe(actor, _live)


def _switch(actor) -> int | None:
    return actor.workspace.swap_if_staged()


def test_object_store_sync_lands_beside_generate_and_switches_only_on_request(actors):
    trainer, rollout = actors
    target = _new_version(trainer, 7, seed=1)
    consume = int(CONSUME_MB * 2**20)
    _, _, info = _sync_under_generation(
        trainer, rollout,
        lambda: weight_sync.submit_param_update(trainer, rollout, "param_update", BUCKET_MB))
    assert info["version"] == 7 and info["buckets"] > 2
    # every byte went through consume-sized pieces (tensors cut, small ones batched)
    assert info["largest_piece"] == consume
    assert -(-info["bytes"] // consume) <= info["pieces"] <= info["bytes"] // consume + \
        info["buckets"]
    metrics = info["summary"]["metrics"]
    assert metrics["sync/bytes"] == info["bytes"] > 0 and metrics["sync/GBps"] > 0
    assert metrics["time/param_update_s"] == pytest.approx(info["end"] - info["start"])
    assert _probe(rollout, _switch) == 7 and _probe(rollout, _switch) is None
    assert _live_probe(rollout) == (7, None, target), "bit for bit after the switch"
    out, ginfo = ray.get(rollout.run.options(num_returns=2).remote("generate", 1, []))
    assert out["policy_version"] == 7
    assert ginfo["summary"]["metrics"]["generate/pause_s"] > 0  # the switch above


def test_gloo_transport_between_two_actors(actors):
    trainer, rollout = actors
    route = weight_sync.Route("param_update", trainer, rollout, BUCKET_MB, "nccl")
    weight_sync.connect_route(route, "gloo")
    for version, seed in ((9, 2), (10, 3)):  # a second sync reuses the group and buffers
        target = _new_version(trainer, version, seed)
        _, _, info = _sync_under_generation(
            trainer, rollout, lambda v=version: weight_sync.start_param_update(route, v)[0])
        assert info["version"] == version and info["bytes"] > 0
        assert info["pieces"] == -(-info["bytes"] // int(CONSUME_MB * 2**20))
        # the next task on the actor switches first: the generate of that step samples with it
        out, ginfo = ray.get(rollout.run.options(num_returns=2).remote("generate", 2, []))
        assert out["policy_version"] == version
        assert ginfo["summary"]["metrics"]["generate/pause_s"] > 0
        assert ray.get(rollout.weights_digest.remote()) == target


def test_param_update_holds_only_the_trainer_and_never_waits_for_generate() -> None:
    graph = build_graph(load_spec(QUICKSTART, SMALL))
    assert graph.nodes["param_update"]["occupies"] == ("trainer",)
    seconds = {"generate": 5.0, "reward": 0.1, "logp": 1.0, "ref_logp": 1.0, "train": 1.0,
               "param_update": 0.5}
    events = drive(Pipeline(graph, steps=6, max_lag=1), seconds)
    by = {(e["node"], e["step"]): e for e in events}
    syncs = [e for e in events if e["node"] == "param_update"]
    assert syncs and all(e["start"] == pytest.approx(by[("train", e["step"])]["end"])
                         for e in syncs), "a sync starts as soon as its train step ends"
    gens = [e for e in events if e["node"] == "generate"]
    assert any(g["start"] < s["end"] and s["start"] < g["end"] for s in syncs for g in gens)


def test_a_sync_to_logp_holds_its_sender_and_completes() -> None:
    spec = load_spec(QUICKSTART, [
        *SMALL, "cluster.cpus=4",
        "groups={g: {share: 0.25, tasks: [generate]}, l: {share: 0.25, tasks: [logp]},"
        " r: {share: 0.25, tasks: [ref_logp]}, t: {share: 0.25, tasks: [train]}}",
        "nodes.param_update_logp={kind: param_update, src: train, dst: logp}"])
    graph = build_graph(spec)
    assert graph.nodes["param_update_logp"]["occupies"] == ("t",)
    seconds = dict.fromkeys(graph, 1.0)
    events = drive(Pipeline(graph, steps=4, max_lag=1), seconds)
    assert {e["step"] for e in events if e["node"] == "param_update_logp"} == {0, 1}
    assert {e["step"] for e in events if e["node"] == "train"} == {0, 1, 2, 3}


def test_workspace_dual_buffer_rules() -> None:
    spec = load_spec(QUICKSTART, SMALL)
    sender, receiver = Workspace(spec, ["train"], seed=0), Workspace(spec, ["generate"], seed=0)
    before = receiver.weights_digest()
    assert receiver.swap_if_staged() is None
    for version in (1, 2):
        with torch.no_grad():
            for p in sender.policy.parameters():
                p.add_(0.01)
        sender.policy_version = version
        for bucket in sender.export_weights(bucket_mb=0.1):
            receiver.receive_bucket(bucket, BucketMiB(0.1, CONSUME_MB))
        receiver.stage_weights(version)
        if version == 1:
            assert receiver.weights_digest() == before and receiver.policy_version == 0
    # version 2's buckets overwrote staging: version 1 was switched in first, not lost
    assert receiver.policy_version == 1 and receiver.staged[0] == 2
    assert receiver.swap_if_staged() == 2
    assert receiver.weights_digest() == sender.weights_digest()
    assert receiver.take_pause_s() > 0 and receiver.take_pause_s() == 0
    with pytest.raises(WeightSyncError, match="staged"):
        receiver.stage_weights(3)  # nothing of version 3 arrived
