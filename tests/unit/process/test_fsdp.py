"""`sharding: fsdp` on gloo: two FSDP2 ranks train the micro model as one replicated process
does (losses and weights after two steps), their log-prob forwards agree with uneven pass
counts, and the whole weights come out a bucket at a time."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from rank_support import run_ranks
from rl_support import make_spec

from rlgraph.errors import SpecError
from rlgraph.rl.batch import take_rows

PROMPTS, SAMPLES = 5, 3  # 15 rows: the ranks' shares (8, 7) need different pass counts
TRAIN = {"lr": 1e-2, "micro_tokens": 140}  # 7 rows of 20 tokens a pass: 2 passes vs 1
DATA = {"prompts_per_step": PROMPTS, "samples_per_prompt": SAMPLES}
BUCKET_BYTES = 4096


def _spec(sharding: str) -> Any:
    extra = {"logp": {"sharding": sharding, "micro_tokens": 40}}
    return make_spec(data=DATA, train={**TRAIN, "sharding": sharding}, extra_nodes=extra)


def _batches() -> tuple[list[dict], list[dict], dict[str, torch.Tensor], list[torch.Tensor]]:
    """Two steps of one replicated process: the scored batches, train's figures, the final
    weights and the log-probs of the first batch."""
    from rlgraph.process.workspace import Workspace

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the reference beside the ranks: no oversubscribed cores
    try:
        return _replicated(Workspace(_spec("none"), ["generate", "reward", "logp", "train"]))
    finally:
        torch.set_num_threads(threads)


def _replicated(ws: Any) -> tuple[list[dict], list[dict], dict[str, torch.Tensor],
                                   list[torch.Tensor]]:
    batches, figures, logps = [], [], []
    for step in range(2):
        gen = ws.worker("generate").run(step, {})
        scored = ws.worker("reward").run(step, {"generate": gen})
        scored["rewards"] = (torch.arange(len(scored["rewards"])) % 2).to(scored["rewards"].dtype)
        logps.append(ws.worker("logp").forward(scored))
        batches.append(scored)
        figures.append(ws.worker("train").run(step, {"reward": scored})["metrics"])
    return batches, figures, ws.host_weights(), logps


def _rank(rank: int, port: int, batches: list[dict], out: Any) -> None:
    from rlgraph.process.replicas import Replicas
    from rlgraph.process.workspace import Workspace

    torch.set_num_threads(1)
    replicas = Replicas(rank, 2)
    replicas.join("127.0.0.1", port, "gloo")
    ws = Workspace(_spec("fsdp"), ["logp", "train"], seed=0, replicas=replicas)
    rows = len(batches[0]["rewards"])
    cut = slice(0, 10) if rank == 0 else slice(10, rows)  # 5 passes against 3
    logp = ws.worker("logp").forward(take_rows(batches[0], cut))
    figures = [ws.worker("train").run(step, {"reward": b})["metrics"]
               for step, b in enumerate(batches)]
    buckets = [{n: t.clone() for n, t in b.items()} for b in ws.weight_buckets(BUCKET_BYTES)]
    weights = ws.host_weights()
    shard_bytes = sum(p.to_local().numel() for p in ws.policy.parameters())
    # a checkpoint: whole weights, one optimizer shard per rank; a fresh workspace takes them
    saved = ws.state_for_checkpoint()
    state = {**saved, "optimizer_shards": [None, None]}
    state["optimizer_shards"][rank] = state.pop("optimizer")
    again = Workspace(_spec("fsdp"), ["logp", "train"], seed=1, replicas=replicas)
    again.load_checkpoint(state)
    assert again.policy_version == 2
    restored = again.optimizer_state()["state"]
    for index, entry in state["optimizer_shards"][rank]["state"].items():
        for key, value in entry.items():
            assert torch.equal(restored[index][key], value), (index, key)
    for name, tensor in again.host_weights().items():
        assert torch.equal(tensor, weights[name]), name
    data = io.BytesIO()  # bytes, not shared tensors: this process exits before they are read
    torch.save((rank, logp, figures, buckets, weights, shard_bytes), data)
    out.put(data.getvalue())


def test_two_fsdp_ranks_train_as_one_process() -> None:
    batches, figures, weights, logps = _batches()
    results = run_ranks(_rank, 2, batches)
    rows = len(batches[0]["rewards"])
    logp = torch.cat([results[0][1], results[1][1]])
    torch.testing.assert_close(logp, logps[0], atol=1e-5, rtol=1e-5)
    for rank, _, got, buckets, whole, shard in results:
        for mine, ref in zip(got, figures):
            for key in ("loss/policy", "actor/grad_norm", "actor/clip_frac"):
                assert mine[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), (rank, key)
        assert set(whole) == set(weights)
        for name, tensor in weights.items():
            torch.testing.assert_close(whole[name], tensor, atol=1e-5, rtol=1e-4)
        # the export: every tensor once, whole, a bucket of at most BUCKET_BYTES (or alone)
        seen = [n for b in buckets for n in b]
        assert seen == list(weights)
        for bucket in buckets:
            size = sum(t.numel() * t.element_size() for t in bucket.values())
            assert size <= BUCKET_BYTES or len(bucket) == 1
            for name, tensor in bucket.items():
                torch.testing.assert_close(tensor, whole[name])
        full = sum(t.numel() for t in weights.values())
        assert shard < 0.75 * full  # each rank holds about half of the parameters
    assert rows == PROMPTS * SAMPLES


def test_sharding_needs_the_torch_backend_and_agreement() -> None:
    with pytest.raises(SpecError, match="sharding: fsdp runs on backend: torch"):
        make_spec(train={"sharding": "fsdp", "backend": "megatron"})
    from rlgraph.process.sharding import sharded_models

    spec = make_spec(train={"sharding": "fsdp"}, extra_nodes={"logp": {}})
    with pytest.raises(SpecError, match="shares the policy"):
        sharded_models(spec, ["logp", "train"])
    assert sharded_models(spec, ["train"]) == {"policy": True, "reference": False}


def test_sharded_policy_refuses_to_share_a_group_with_generate() -> None:
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import validate_spec
    from rlgraph.errors import SourceMap
    from rlgraph.process.workspace import Workspace

    spec = make_spec(train={"sharding": "fsdp"})
    with pytest.raises(SpecError, match="cannot share a group with 'generate'"):
        Workspace(spec, ["generate", "train"])
    data = spec.to_yaml_dict()
    data["groups"] = {"all": {"share": 1.0, "tasks": ["generate", "train"]}}
    with pytest.raises(SpecError, match="cannot share group 'all' with 'generate'") as err:
        compile_plan(validate_spec(data, SourceMap()))  # the compiler refuses it first
    assert err.value.key == ("nodes", "train", "sharding")


@pytest.mark.parametrize("key, message", [("pp", "runs pp 1 only here"),
                                          ("cp", "context parallelism")])
def test_megatron_model_parallelism_this_runtime_lacks_is_refused_before_ray_starts(
        tmp_path: Any, key: str, message: str) -> None:
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import validate_spec
    from rlgraph.errors import SourceMap
    from rlgraph.runtime.runner import Runner, RunOptions

    data = make_spec(train={"backend": "megatron", key: 2}).to_yaml_dict()
    data["cluster"] = {"local": True, "cpus": 4}
    plan = compile_plan(validate_spec(data, SourceMap()))  # the compiler prices it
    with pytest.raises(SpecError, match=message) as err:
        Runner(plan, RunOptions(out_dir=tmp_path, steps=1))
    assert err.value.key == ("nodes", "train", key)


def test_checkpointed_layers_recompute_with_the_forwards_attention_kernel() -> None:
    """train's forward picks attention kernels (`sdpa_kernel`) that the backward, where a
    checkpointed layer recomputes, runs outside of: the recompute must use the same ones, and
    the gradients equal those of the model without checkpointing."""
    from rl_support import MICRO
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlgraph.process.sharding import checkpoint_layers

    config = AutoConfig.for_model(**MICRO)
    config._attn_implementation = "sdpa"
    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        if checkpointed:
            checkpoint_layers(model)
        ids = torch.randint(0, MICRO["vocab_size"], (2, 16))
        with sdpa_kernel([SDPBackend.MATH]):
            loss = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.sum()
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for plain, recomputed in zip(*grads):
        torch.testing.assert_close(recomputed, plain)
