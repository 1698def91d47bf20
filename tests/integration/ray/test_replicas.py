"""Data parallelism inside a group (rlgraph.process.replicas): a step's rows are shared out at GRPO
groups and joined back unchanged; two replicas train the step one process would, and stay
bit-identical; replicated generate samples every prompt of a step once; whole runs with
replicated groups (colocated, split over the object store, split over gloo with partial
rollout and a resume) keep every group's replicas in step."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
import torch
from rl_support import make_spec

from rlgraph.engines.cpu_decode import pack
from rlgraph.errors import SpecError
from rlgraph.process.workspace import Workspace
from rlgraph.rl.batch import concat_rows, group_rows, shard_bounds, take_rows

ray = pytest.importorskip("ray")

from rlgraph.compiler import compile_plan  # noqa: E402
from rlgraph.config.load import load_spec  # noqa: E402
from rlgraph.runtime.actors import start_replicas  # noqa: E402
from rlgraph.runtime.runner import Runner, RunOptions  # noqa: E402

pytestmark = pytest.mark.runtime

COLOCATED = """
name: replicas
cluster: {local: true, cpus: 2}
model: {hf_config: {model_type: llama, vocab_size: 64, hidden_size: 32, num_hidden_layers: 2,
                    num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 64,
                    max_position_embeddings: 64, tie_word_embeddings: true}}
data: {task: arithmetic, prompts_per_step: 4, samples_per_prompt: 4, prompt_len: 16,
       response_len: {mean: 3, max: 5}}
groups:
  all: {share: 1.0, tasks: [generate, logp, train], replicas: 2}
nodes:
  generate: {kind: generate}
  logp: {kind: logp}
  reward: {kind: reward}
  train: {kind: train, lr: 1.0e-3}
  param_update: {kind: param_update, src: train, dst: generate}
schedule: {max_lag: 0, steps: 3}
"""
SPLIT = ["cluster.cpus=3", "groups={trainer: {share: 0.34, tasks: [logp, train]}, "
         "rollout: {share: 0.66, tasks: [generate], replicas: 2}}", "schedule.max_lag=1"]


def _batch(prompts: list[list[int]], responses: list[list[int]], samples: int) -> dict:
    rollout = pack([p for p in prompts for _ in range(samples)], responses,
                   [[-0.5] * len(r) for r in responses], [[0] * len(r) for r in responses], 0)
    rows = len(responses)
    return {"step": 0, "prompt_len": rollout.prompt_len, "sequences": rollout.sequences,
            "attention_mask": rollout.attention_mask, "response_mask": rollout.response_mask,
            "behavior_logp": rollout.behavior_logp, "token_version": rollout.token_version,
            "group": torch.arange(len(prompts)).repeat_interleave(samples),
            "prompt_uid": [f"p{i // samples}" for i in range(rows)]}


def _real(batch: dict, row: int) -> tuple[list[int], list[int], list[int]]:
    """Row's prompt tokens, response tokens and their versions, padding stripped."""
    p = batch["prompt_len"]
    seq, mask = batch["sequences"][row], batch["attention_mask"][row]
    prompt = seq[:p][mask[:p].bool()].tolist()
    keep = batch["response_mask"][row].bool()
    return prompt, seq[p:][keep].tolist(), batch["token_version"][row][keep].tolist()


def test_shares_cover_every_row_once_at_group_bounds_and_join_back():
    """For 1..4 replicas the shares are contiguous, whole groups, cover the batch; joined,
    they are the batch again."""
    prompts = [[1, 2], [3], [4, 5, 6]]
    batch = _batch(prompts, [[7, 8], [9], [10, 11, 12], [13], [14], [15, 16]], 2)
    for world in range(1, 4):
        shares = [group_rows(batch, rank, world) for rank in range(world)]
        assert shares[0].start == 0 and shares[-1].stop == 6
        assert all(a.stop == b.start for a, b in pairwise(shares))
        assert all(s.start % 2 == 0 for s in shares)  # two samples per prompt stay together
        joined = concat_rows([take_rows(batch, s) for s in shares])
        for key, value in batch.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(joined[key], value), key
            else:
                assert joined[key] == value, key
    assert [shard_bounds(5, r, 3) for r in range(3)] == [(0, 2), (2, 4), (4, 5)]


def test_join_repads_prompts_on_the_left_and_responses_on_the_right():
    """Replicas' batches of different widths join with every row's tokens intact and
    version -1 on the new padding."""
    a = _batch([[1, 2, 3]], [[7], [8, 9]], 2)
    b = _batch([[4]], [[10, 11, 12], [13]], 2)
    b["token_version"][0, :3] = 5
    joined = concat_rows([a, b])
    assert joined["prompt_len"] == 3 and joined["response_mask"].shape[1] == 3
    assert joined["group"].tolist() == [0, 0, 1, 1]
    assert [_real(joined, i) for i in range(4)] == [
        _real(a, 0), _real(a, 1), _real(b, 0), _real(b, 1)]
    assert joined["token_version"][0].tolist() == [0, -1, -1]


def test_replicas_are_refused_where_they_cannot_run():
    """More replicas than CPU slots, or than prompts per step, is a compile-time error."""
    from rlgraph.compiler.placement import place

    with pytest.raises(SpecError, match="replicas need a CPU slot each"):
        place(make_spec_with_replicas(3))
    with pytest.raises(SpecError, match="some would get none"):
        place(make_spec_with_replicas(2, prompts=1))


def make_spec_with_replicas(replicas: int, prompts: int = 4):
    spec = make_spec(data={"prompts_per_step": prompts})
    spec.cluster.cpus = 4  # two slots per group
    spec.groups["rollout"].replicas = replicas
    return spec


def _leader(spec, tasks: list[str], world: int = 2) -> list:
    """`world` replica actors of `tasks`, built, rank 0 leading."""
    actors, builds = start_replicas(spec, tasks, seed=0, threads=1, device="cpu", world=world,
                                    options_of=lambda rank: {"num_cpus": 0})
    ray.get(builds + [a.ready.remote() for a in actors])
    ray.get(actors[0].lead.remote(actors[1:]))
    return actors


def test_two_replicas_train_the_step_one_process_would(cluster4):
    """Same batch, two mini-batches, no logp node: the replicas' weights after the step match
    a lone process's within float summation error (the step itself moves them by lr), their
    loss and gradient norm too, and they equal each other bit for bit."""
    spec = make_spec(train={"lr": 1e-2, "mini_batches": 2})
    lone = Workspace(spec, ["generate", "train"], seed=0)
    batch = lone.worker("generate").run(0, {})
    batch["rewards"] = torch.rand(len(batch["group"]), generator=torch.Generator().manual_seed(0))
    actors = _leader(spec, ["train"])
    try:
        out, info = ray.get(actors[0].run.remote("train", 0, ["reward"], batch))
        before = {n: t.clone() for n, t in lone.policy.state_dict().items()}
        expected = lone.worker("train").run(0, {"reward": batch})
        state = ray.get(actors[0].state_for_checkpoint.remote())
        for name, tensor in lone.policy.state_dict().items():
            # Adam turns summation-order noise of near-zero gradients into tiny steps
            diff = (state["weights"][name] - tensor).abs()
            assert diff.max() < 1e-4 and (diff > 1e-6).float().mean() < 0.01, name
        assert not all(torch.equal(state["weights"][n], t) for n, t in before.items())
        digests = ray.get(actors[0].replica_digests.remote())
        assert len(digests) == 2 and digests[0] == digests[1]
        for key in ("loss/policy", "actor/grad_norm", "reward/mean", "samples"):
            assert out["metrics"][key] == pytest.approx(expected["metrics"][key], rel=1e-4)
        assert out["policy_version"] == 1 and info["summary"]["policy_version"] == 1
    finally:
        for a in actors:
            ray.kill(a)


def test_replicated_generate_samples_every_prompt_of_the_step_once(cluster4):
    """Two replicas' generate is one batch: the step's prompts in order, groups 0.., each
    with all its samples, and a layout logp accepts; 3 prompts split 2 + 1 (the compiler
    lets a sampling node's shares differ by a prompt; the even split runs in every replicated
    run of test_runs_keep_every_groups_replicas_in_step)."""
    prompts = 3
    spec = make_spec(extra_nodes={"logp": {"kind": "logp"}},
                     data={"prompts_per_step": prompts})
    single = Workspace(spec, ["generate"], seed=0).worker("generate").run(2, {})
    actors = _leader(spec, ["generate", "logp"])
    try:
        batch, _ = ray.get(actors[0].run.remote("generate", 2, []))
        assert batch["prompt_uid"] == single["prompt_uid"]
        assert batch["data_position"] == single["data_position"]
        assert batch["group"].tolist() == [g for g in range(prompts) for _ in range(4)]
        scored, _ = ray.get(actors[0].run.remote("logp", 2, ["generate"], batch))
        assert scored["old_logp"].shape == batch["behavior_logp"].shape
        live = batch["response_mask"].bool()
        assert torch.allclose(scored["old_logp"][live], batch["behavior_logp"][live], atol=1e-4)
    finally:
        for a in actors:
            ray.kill(a)


def _run(spec, out: Path, steps: int, resume: bool = False) -> tuple[Runner, list, dict]:
    """A run; at its last step, every group's replica digests (read while the run is live)."""
    digests: dict[str, list[str]] = {}
    runner: Runner | None = None

    def on_step(row):
        if row["step"] == steps - 1:
            for group in runner.groups:
                digests[group] = ray.get(runner.group_actors[group].replica_digests.remote())

    runner = Runner(compile_plan(spec), RunOptions(out_dir=out, steps=steps, resume=resume,
                                                   on_step=on_step, tensorboard=False))
    result = runner.run()
    return runner, result.rows, digests


@pytest.mark.parametrize("layout", ["colocated", "split-object-store", "split-gloo-partial",
                                    "megatron-trainer"])
def test_runs_keep_every_groups_replicas_in_step(cluster4, tmp_path, layout):
    """Runs with replicated groups train within the lag bound and end with each group's
    replicas holding identical weights; the partial-rollout run resumes from its checkpoint
    (every replica's rollout cache restored) and goes on; a megatron trainer runs as two
    data-parallel replicas (megatron's groups inside the replicas' world)."""
    path = tmp_path / "graph.yaml"
    path.write_text(COLOCATED)
    overrides = [] if layout == "colocated" else list(SPLIT)
    if layout == "split-gloo-partial":
        overrides += ["nodes.param_update.transport=nccl", "schedule.partial_rollout=true"]
    if layout == "megatron-trainer":
        from rlgraph.backends.megatron import megatron_missing

        if megatron_missing():
            pytest.skip(megatron_missing())
        overrides = ["cluster.cpus=3", "groups={trainer: {share: 0.66, tasks: [logp, train], "
                     "replicas: 2}, rollout: {share: 0.34, tasks: [generate]}}",
                     "schedule.max_lag=1", "nodes.logp.backend=megatron",
                     "nodes.train.backend=megatron"]
    spec = load_spec(path, overrides)
    steps = 2 if layout == "split-gloo-partial" else 3
    runner, rows, digests = _run(spec, tmp_path / "run", steps)
    plan_replicas = {g.name: g.replicas for g in runner.plan.placement.groups}
    assert max(plan_replicas.values()) == 2
    assert [r["step"] for r in rows] == list(range(steps))
    assert all(r["lag/max"] <= spec.schedule.max_lag for r in rows)
    assert rows[-1]["samples"] == 16
    for group, values in digests.items():
        assert len(values) == plan_replicas[group] and len(set(values)) == 1, group
    if layout == "split-gloo-partial":
        _, more, digests = _run(spec, tmp_path / "run", 4, resume=True)
        assert [r["step"] for r in more] == [2, 3]
        assert all(r["lag/max"] <= spec.schedule.max_lag for r in more)
        assert len(set(digests["rollout"])) == 1
