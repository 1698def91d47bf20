"""Placement: shares -> whole GPUs -> devices, and every refusal names its graph.yaml key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlgraph.compiler.placement import largest_remainder, place
from rlgraph.config.load import load_spec, validate_spec
from rlgraph.errors import SourceMap, SpecError

GRAPHS = Path(__file__).parent / "graphs_compiler"


def make_spec(groups: dict[str, Any], cluster: dict[str, Any] | None = None,
              nodes: dict[str, Any] | None = None, **top: Any) -> Any:
    """A spec with generate/reward/train/param_update and the given groups."""
    data = {
        "cluster": cluster or {"nodes": 1, "gpus_per_node": 8, "gpu": "H100"},
        "model": {"preset": "qwen2.5-0.5b"},
        "data": {"prompts_per_step": 64, "samples_per_prompt": 8},
        "groups": groups,
        "nodes": nodes or {"generate": {}, "reward": {}, "train": {}, "param_update": {}},
        **top,
    }
    return validate_spec(data, SourceMap())


def two_groups(train: float = 0.5, rollout: float = 0.5, **kw: Any) -> Any:
    return make_spec({"trainer": {"share": train, "tasks": ["train"]},
                      "rollout": {"share": rollout, "tasks": ["generate"]}}, **kw)


def refusal(spec: Any) -> SpecError:
    with pytest.raises(SpecError) as info:
        place(spec)
    return info.value


def all_devices(placement: Any) -> list[tuple[int, int]]:
    return [tuple(d) for g in placement.groups.values() for d in g.devices]


def test_largest_remainder_gives_every_gpu_once() -> None:
    third = 1 / 3
    assert largest_remainder({"a": third, "b": third, "c": third}, 8) == {"a": 3, "b": 3, "c": 2}
    assert largest_remainder({"a": 0.5, "b": 0.25}, 8) == {"a": 4, "b": 2}  # 2 GPUs stay free
    assert sum(largest_remainder({"a": 0.7, "b": 0.3}, 10).values()) == 10


@pytest.mark.usefixtures("memory_unchecked")  # packing, not memory
def test_small_groups_pack_inside_nodes() -> None:
    spec = make_spec({f"g{i}": {"share": 0.25, "tasks": [t]} for i, t in
                      enumerate(["generate", "train", "reward"])},
                     cluster={"nodes": 2, "gpus_per_node": 8, "gpu": "H100"})
    placement = place(spec)
    for group in placement.groups.values():
        assert group.gpus == 4
        assert len(group.nodes()) == 1, group.devices
    devices = all_devices(placement)
    assert len(devices) == len(set(devices)) == 12


def test_group_larger_than_a_node_takes_whole_nodes() -> None:
    spec = two_groups(0.75, 0.25, cluster={"nodes": 4, "gpus_per_node": 8, "gpu": "H200"},
                      data={"prompts_per_step": 96, "samples_per_prompt": 8})
    placement = place(spec)
    trainer, rollout = placement.groups["trainer"], placement.groups["rollout"]
    assert trainer.gpus == 24 and rollout.gpus == 8
    assert sorted(trainer.nodes()) == [0, 1, 2] and rollout.nodes() == {3}
    assert len(set(all_devices(placement))) == 32
    as_dict = placement.to_dict()
    assert as_dict["groups"][0]["devices"][0] == [0, 0]
    assert {g["name"] for g in as_dict["groups"]} == {"trainer", "rollout"}


def test_shares_over_one_name_the_share() -> None:
    spec = load_spec(GRAPHS / "over_share.yaml")
    err = refusal(spec)
    assert err.key == ("groups", "rollout", "share")
    assert "sum to 1.25" in err.message
    assert "over_share.yaml:5:" in err.render(spec.source)  # the line of rollout's share
    assert "0.25" in (err.hint or "")


def test_float_shares_summing_to_one_are_accepted() -> None:
    third = 1 / 3
    spec = make_spec({"a": {"share": third, "tasks": ["generate"]},
                      "b": {"share": third, "tasks": ["train"]},
                      "c": {"share": third, "tasks": ["reward"]}},
                     cluster={"nodes": 1, "gpus_per_node": 6, "gpu": "H100"},
                     data={"prompts_per_step": 6, "samples_per_prompt": 1})
    assert [g.gpus for g in place(spec).groups.values()] == [2, 2, 2]


def test_share_rounding_to_zero_gpus() -> None:
    err = refusal(two_groups(0.95, 0.05))
    assert err.key == ("groups", "rollout", "share")
    assert "rounds to 0 GPUs" in err.message and "0.125" in (err.hint or "")


@pytest.mark.parametrize("node, field, value", [
    ("generate", "tp", 3), ("train", "tp", 3), ("train", "pp", 3), ("train", "ep", 3)])
def test_parallel_sizes_must_divide_the_group(node: str, field: str, value: int) -> None:
    nodes: dict[str, Any] = {"generate": {}, "reward": {}, "train": {}, "param_update": {}}
    nodes[node] = {field: value}
    err = refusal(two_groups(nodes=nodes))
    assert err.key == ("nodes", node, field)
    assert f"{field} {value} does not divide the 4 GPUs" in err.message
    assert "1, 2, 4" in (err.hint or "")


def test_batch_must_split_over_data_parallel_replicas() -> None:
    spec = two_groups(0.75, 0.25, cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "H100"},
                      data={"prompts_per_step": 10, "samples_per_prompt": 1})
    err = refusal(spec)  # trainer: 6 GPUs, 10 samples per step
    assert err.key == ("data", "prompts_per_step")
    assert "6 data-parallel replicas of 'train'" in err.message
    assert "multiple of 6 prompts" in (err.hint or "")


def test_a_sampling_group_takes_shares_a_prompt_apart() -> None:
    """generate on 6 replicas samples 8 prompts as shares of 2 and 1 (AReaL spreads 512
    prompts over 96 SGLang GPUs), priced at the larger share (its rows set the decode step's
    time; the call lasts until the longest sample of the whole batch); train's 2 replicas
    still split the batch evenly."""
    from rlgraph.compiler import compile_plan

    def generate_s(prompts: int) -> float:  # lengths fixed: every batch's longest is max
        spec = two_groups(0.25, 0.75, data={"prompts_per_step": prompts,
                                            "samples_per_prompt": 4,
                                            "response_len": {"mean": 256, "max": 256}})
        return compile_plan(spec)["costs"]["generate"]["seconds"]

    spec = two_groups(0.25, 0.75, data={"prompts_per_step": 8, "samples_per_prompt": 4})
    assert {n: g.gpus for n, g in place(spec).groups.items()} == {"trainer": 2, "rollout": 6}
    assert generate_s(8) == pytest.approx(generate_s(12), rel=1e-3)  # 2 prompts either way
    assert generate_s(6) < generate_s(8) * (1 - 1e-3)  # 1 prompt each


def test_train_that_cannot_fit_is_refused() -> None:
    spec = two_groups(model={"preset": "qwen2.5-32b"},
                      cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "H100"})
    # rlgraph's runtime builds it with the character vocabulary (no model.path): bf16 weights,
    # gradients and AdamW states, 8 B/param x 31.2e9 on every GPU = 250 GB > 72 GB usable
    err = refusal(spec)
    assert err.key == ("groups", "trainer", "share")
    assert "AdamW states 124.8" in err.message and "GB per GPU" in err.message
    assert "sharding: fsdp" in (err.hint or "") and "at least" in (err.hint or "")


def test_generate_that_cannot_fit_is_refused() -> None:
    from rlgraph.compiler.memory import group_memory
    from rlgraph.compiler.memory_check import refusal as memory_refusal
    from rlgraph.compiler.shapes import shape_of
    from rlgraph.presets.gpus import GPU_PRESETS

    h100 = GPU_PRESETS["H100"]
    data = {"prompts_per_step": 64, "samples_per_prompt": 1, "prompt_len": 4096,
            "response_len": {"mean": 8192, "max": 32768}}

    def rollout(generate: dict[str, Any]) -> tuple[Any, Any]:
        nodes = {"generate": generate, "reward": {}, "train": {}, "param_update": {}}
        spec = two_groups(0.5, 0.5, model={"preset": "qwen2.5-32b"}, nodes=nodes, data=data,
                          cluster={"nodes": 2, "gpus_per_node": 8, "gpu": "H100"})
        return spec, group_memory(spec, "rollout", ["generate"], 8, h100)

    spec, mem = rollout({"engine": "sglang"})  # weights 65.5 GB + one 36864-token KV 9.7 GB
    assert not mem.fits and "KV cache 9.7" in mem.breakdown()
    err = memory_refusal(spec, mem, 16, shape_of(spec), h100)
    assert err.key == ("nodes", "generate", "tp") and "raise tp" in (err.hint or "")
    assert rollout({"engine": "sglang", "tp": 2})[1].fits  # tp 2 halves the weights
    spec, mem = rollout({"engine": "native", "tp": 2})  # the native engine: the whole model
    assert not mem.fits
    assert "no setting" in (memory_refusal(spec, mem, 16, shape_of(spec), h100).hint or "")


def test_local_cluster_gives_every_group_a_slot_and_skips_memory() -> None:
    spec = two_groups(cluster={"local": True, "cpus": 1}, model={"preset": "qwen2.5-32b"})
    placement = place(spec)
    assert placement.local and placement.gpu == "cpu" and placement.slots == 1
    assert [g.gpus for g in placement.groups.values()] == [1, 1]
    assert placement.shared_slots
    assert any("share slots" in m for m in placement.messages)
    spec = two_groups(cluster={"local": True, "cpus": 2})
    placement = place(spec)
    assert not placement.shared_slots and sorted(all_devices(placement)) == [(0, 0), (0, 1)]


def test_strict_false_skips_refusals_for_the_sync_baseline() -> None:
    spec = two_groups(0.95, 0.05)
    assert place(spec, strict=False).groups["rollout"].gpus == 0
