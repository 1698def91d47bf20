"""The memory pass: bytes per GPU of every group, its refusals, and the placement by
data-parallel rank and by sample."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlgraph.compiler import compile_plan
from rlgraph.compiler.costs import node_costs
from rlgraph.compiler.memory import PREFILL_TOKENS, group_memory, native_engine_slots
from rlgraph.compiler.placement import place
from rlgraph.compiler.shapes import shape_of
from rlgraph.config.load import validate_spec
from rlgraph.config.safe_yaml import SourceMap
from rlgraph.errors import SpecError
from rlgraph.graph import build_graph
from rlgraph.presets.gpus import GPU_PRESETS
from rlgraph.pricing import sharding
from rlgraph.pricing.context import CostContext
from rlgraph.tune.search import tune

MODELS = ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen3-8b", "qwen2.5-32b"]


def spec_of(model: str = "qwen2.5-7b", gpus: int = 8, trainer: float = 0.5,
            train: dict[str, Any] | None = None, nodes_per: int = 8, gpu: str = "H100",
            prompts: int = 64, samples: int = 8, response: int = 4096,
            engine: str = "native") -> Any:
    """A split plan: trainer (logp, train) and rollout (generate)."""
    node = {"micro_tokens": 16384, **(train or {})}
    return validate_spec({
        "cluster": {"nodes": max(1, gpus // nodes_per), "gpus_per_node": min(gpus, nodes_per),
                    "gpu": gpu},
        "model": {"preset": model},
        "data": {"prompts_per_step": prompts, "samples_per_prompt": samples, "prompt_len": 512,
                 "response_len": {"mean": response / 4, "max": response}},
        "groups": {"trainer": {"share": trainer, "tasks": ["logp", "train"]},
                   "rollout": {"share": 1 - trainer, "tasks": ["generate"]}},
        "nodes": {"generate": {"engine": engine}, "reward": {},
                  "logp": {"micro_tokens": node["micro_tokens"],
                           "sharding": node.get("sharding", "none")}, "train": node,
                  "param_update": {}},
        "schedule": {"max_lag": 1},
    }, SourceMap())


def need(spec: Any, group: str, gpus: int) -> float:
    tasks = list(spec.groups[group].tasks)
    return group_memory(spec, group, tasks, gpus, GPU_PRESETS[spec.cluster.gpu]).need


def test_a_14b_trainer_needs_fsdp_on_four_h100s_and_the_error_says_so() -> None:
    spec = spec_of("qwen3-14b", gpus=8, trainer=0.5, response=8192,
                   train={"activation_checkpointing": True})
    with pytest.raises(SpecError) as info:
        place(spec)
    err = info.value
    assert err.key == ("nodes", "train", "sharding")
    assert "group 'trainer' needs" in err.message and "GB per GPU" in err.message
    assert "AdamW states 52.9" in err.message  # 13.2e9 params x 4 bytes (bf16 m and v)
    assert "sharding: fsdp" in (err.hint or "")
    fixed = spec_of("qwen3-14b", gpus=8, trainer=0.5, response=8192,
                    train={"activation_checkpointing": True, "sharding": "fsdp"})
    placement = place(fixed)
    trainer = placement.memory["trainer"]
    assert trainer.fits and trainer.need < trainer.capacity
    assert "fsdp weights + gradients + AdamW states" in trainer.resident


def test_plan_json_reports_memory_per_gpu_of_every_group() -> None:
    plan = compile_plan(spec_of(gpus=8, trainer=0.5, train={"sharding": "fsdp",
                                                          "activation_checkpointing": True}))
    memory = plan["memory"]
    assert memory["checked"] and set(memory["groups"]) == {"trainer", "rollout"}
    trainer = memory["groups"]["trainer"]
    assert trainer["fits"] and 0 < trainer["need_gb"] <= trainer["capacity_gb"]
    assert trainer["worst_task"] == "train" and trainer["capacity_gb"] == pytest.approx(72.0)
    rollout = memory["groups"]["rollout"]
    assert "KV cache + decode outputs" in rollout["resident_gb"]


def test_the_128_gpu_example_compiles_by_data_parallel_rank_and_sample() -> None:
    """16 prompts x 32 samples on 128 trainer GPUs at tp 4, pp 8: 4 data-parallel ranks of
    128 samples each (rows are sharded by sample, not by prompt)."""
    model = {"backend": "megatron", "tp": 4, "pp": 8, "micro_tokens": 16384}
    spec = validate_spec({
        "cluster": {"nodes": 32, "gpus_per_node": 8, "gpu": "H100"},
        "model": {"preset": "qwen2.5-32b"},
        "data": {"prompts_per_step": 16, "samples_per_prompt": 32, "prompt_len": 1024,
                 "response_len": {"mean": 2048, "max": 8192}},
        "groups": {"trainer": {"share": 0.5, "tasks": ["logp", "train"]},
                   "rollout": {"share": 0.5, "tasks": ["generate"]}},
        "nodes": {"generate": {"engine": "sglang", "tp": 8}, "reward": {},
                  "logp": dict(model),
                  "train": {**model, "activation_checkpointing": True},
                  "param_update": {}},
    }, SourceMap())
    plan = compile_plan(spec)
    trainer = plan.placement.group("trainer")
    assert trainer.gpus == 128 and trainer.replicas == 128
    assert trainer.data_parallel == {"logp": 4, "train": 4}
    assert plan.placement.group("rollout").data_parallel == {"generate": 16}
    assert plan["memory"]["groups"]["trainer"]["fits"]


def test_a_rank_without_a_sample_is_refused_and_one_without_a_prompt_too() -> None:
    base = spec_of("qwen2.5-0.5b", gpus=16, trainer=0.5, prompts=2, samples=2)
    with pytest.raises(SpecError, match="some ranks would get none") as info:
        place(base)  # 8 train ranks, 4 samples
    assert info.value.key == ("data", "prompts_per_step")
    spec = spec_of("qwen2.5-0.5b", gpus=16, trainer=0.5, prompts=4, samples=2)
    with pytest.raises(SpecError, match="a replica samples whole prompts"):
        place(spec)  # 8 samples for 8 train ranks, but 8 engines for 4 prompts


def test_the_native_engine_holds_what_fits_and_queues_the_rest() -> None:
    spec = spec_of("qwen2.5-7b", gpus=8, trainer=0.5, prompts=512, samples=8, response=16384,
                   train={"sharding": "fsdp", "activation_checkpointing": True})
    slots = native_engine_slots(spec, "generate", 4)
    assert 1 <= slots < 512 * 8 // 4
    mem = place(spec).memory["rollout"]
    assert mem.fits and "decoded in waves" in mem.tasks["generate"].note


def test_prefill_chunk_matches_the_static_decoder() -> None:
    pytest.importorskip("torch")
    from rlgraph.engines import static_decode

    assert static_decode.PREFILL_TOKENS == PREFILL_TOKENS


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(MODELS), gpus=st.sampled_from([1, 2, 4, 8, 16]),
       fsdp=st.booleans(), checkpointing=st.booleans(),
       response=st.sampled_from([1024, 4096, 16384]), engine=st.sampled_from(["native",
                                                                              "sglang"]))
def test_more_gpus_never_need_more_memory_per_gpu(model: str, gpus: int, fsdp: bool,
                                                  checkpointing: bool, response: int,
                                                  engine: str) -> None:
    train = {"sharding": "fsdp" if fsdp else "none",
             "activation_checkpointing": checkpointing}
    spec = spec_of(model, gpus=64, train=train, response=response, engine=engine)
    for group in ("trainer", "rollout"):
        assert need(spec, group, 2 * gpus) <= need(spec, group, gpus) * (1 + 1e-12)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(model=st.sampled_from(MODELS), gpus=st.sampled_from([4, 8, 16, 32]),
       response=st.sampled_from([1024, 8192]))
def test_fsdp_over_four_ranks_or_more_never_needs_more_than_replicas(model: str, gpus: int,
                                                                     response: int) -> None:
    """FSDP keeps 16 bytes a parameter (fp32 master, gradients, AdamW) over the ranks, the
    replicated bf16 model 8 on each: from 4 data-parallel ranks on, sharding never costs
    memory (on 1 or 2 ranks it does, and the check says so)."""
    plain = spec_of(model, gpus=64, response=response)
    sharded = spec_of(model, gpus=64, response=response, train={"sharding": "fsdp"})
    assert need(sharded, "trainer", gpus) <= need(plain, "trainer", gpus)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(model=st.sampled_from(MODELS), gpus=st.sampled_from([8, 16, 32]),
       trainer=st.sampled_from([0.25, 0.5]), fsdp=st.booleans(),
       gpu=st.sampled_from(["H100", "H200", "A100"]), response=st.sampled_from([2048, 8192]))
def test_a_plan_is_refused_exactly_when_a_group_needs_more_than_a_gpu_holds(
        model: str, gpus: int, trainer: float, fsdp: bool, gpu: str, response: int) -> None:
    spec = spec_of(model, gpus=gpus, trainer=trainer, gpu=gpu, response=response,
                   train={"sharding": "fsdp" if fsdp else "none"})
    sizes = {"trainer": round(trainer * gpus), "rollout": gpus - round(trainer * gpus)}
    over = [g for g, n in sizes.items() if need(spec, g, n) > GPU_PRESETS[gpu].memory_bytes
            * 0.9]
    try:
        placement = place(spec)
    except SpecError as err:
        assert over and f"group '{over[0]}' needs" in err.message
        return
    assert not over
    assert all(m.need <= m.capacity for m in placement.memory.values())


def test_sharding_follows_the_runtimes_limits() -> None:
    mixed = spec_of("qwen2.5-0.5b", gpus=8, train={"sharding": "fsdp"})
    mixed.nodes["logp"].sharding = "none"
    with pytest.raises(SpecError, match="shares the policy") as info:
        place(mixed)
    assert info.value.key == ("nodes", "logp", "sharding")
    colocated = validate_spec({
        "cluster": {"nodes": 1, "gpus_per_node": 4, "gpu": "H100"},
        "model": {"preset": "qwen2.5-0.5b"},
        "groups": {"all": {"share": 1.0, "tasks": ["generate", "train"]}},
        "nodes": {"generate": {}, "reward": {}, "train": {"sharding": "fsdp"},
                  "param_update": {}}}, SourceMap())
    with pytest.raises(SpecError, match="cannot share group 'all' with 'generate'"):
        place(colocated)


def test_fsdp_prices_its_gathers_and_reduce_scatters_on_the_link() -> None:
    """A sharded train moves 2 + 2 + 4 bytes a parameter a pass through each GPU's link
    ((W - 1) / W of them), overlapped with compute; the replicated one sums bf16 gradients
    after the backward instead."""
    train = {"sharding": "fsdp", "activation_checkpointing": True}
    spec = spec_of("qwen2.5-7b", gpus=8, trainer=0.5, response=8192, train=train)
    placement = place(spec)
    costs, _ = node_costs(spec, build_graph(spec), placement)
    assert "FSDP all-gathers and reduce-scatters" in costs["train"].detail
    assert "FSDP all-gathers" in costs["logp"].detail
    assert "activation checkpointing's recomputed forward" in costs["train"].detail
    h100 = GPU_PRESETS["H100"]

    ctx = CostContext(spec=spec, name="train", shape=shape_of(spec), gpu=h100, gpus=4)
    moved = sharding.fsdp_collective_bytes(spec.nodes["train"], ctx, backward=True)
    assert moved == pytest.approx(8 * ctx.shape.params * 3 / 4)
    assert sharding.fsdp_collective_bytes(spec.nodes["logp"], ctx, backward=False) == \
        pytest.approx(2 * ctx.shape.params * 3 / 4)
    across = CostContext(spec=spec, name="train", shape=ctx.shape, gpu=h100, gpus=16)
    assert sharding.link_bytes_per_s(ctx) == h100.nvlink_bytes_per_s
    assert sharding.link_bytes_per_s(across) == h100.network_bytes_per_s


def test_tune_proposes_fsdp_where_only_a_sharded_trainer_fits() -> None:
    spec = spec_of("qwen3-14b", gpus=8, trainer=0.5, response=8192,
                   train={"activation_checkpointing": True})
    result = tune(spec)
    best = result.best.spec
    assert best.nodes["train"].sharding == "fsdp" and best.nodes["logp"].sharding == "fsdp"
    trainer = next(g for g in best.groups.values() if "train" in g.tasks)
    assert "generate" not in trainer.tasks  # a sharded group holds no engine
    assert all(m["fits"] for m in compile_plan(best)["memory"]["groups"].values())
