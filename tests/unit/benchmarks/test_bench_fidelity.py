"""bench/fidelity.py's physical floor: a published pass faster than every FLOP at the GPUs'
dense peak is flagged, and the floor follows the graph's GPUs and tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from bench_support import bench_module

fidelity = bench_module("fidelity")
pytestmark = pytest.mark.usefixtures("memory_unchecked")  # the floor, not memory

GRAPH = {
    "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "H20"},
    "model": {"preset": "qwen2.5-0.5b"},
    "data": {"prompts_per_step": 64, "samples_per_prompt": 8, "prompt_len": 256,
             "response_len": {"mean": 1000, "max": 65536}},
    "algorithm": {"name": "grpo", "kl_coef": 0.0},
    "nodes": {"generate": {"kind": "generate", "engine": "sglang"}, "reward": {"kind": "reward"},
              "train": {"kind": "train"},
              "param_update": {"kind": "param_update", "src": "train", "dst": "generate"}},
}


def _case(tmp_path: Path, published: dict[str, dict[str, float]]) -> dict:
    sync = dict(GRAPH, name="sync", groups={"all": {"share": 1.0, "tasks": [
        "generate", "train"]}}, schedule={"max_lag": 0})
    split = dict(GRAPH, name="split", groups={"trainer": {"share": 0.5, "tasks": ["train"]},
                                              "rollout": {"share": 0.5, "tasks": ["generate"]}},
                 schedule={"max_lag": 1})
    for name, graph in (("sync.yaml", sync), ("split.yaml", split)):
        (tmp_path / name).write_text(yaml.safe_dump(graph))
    return {"name": "case", "sync": "sync.yaml", "async": "split.yaml", "phases": published}


def test_a_pass_faster_than_the_gpus_peak_is_flagged(tmp_path: Path) -> None:
    case = _case(tmp_path, {"sync": {"update_actor": 1.0}, "async": {"update_actor": 1.0}})
    rows = {r["mode"]: r for r in fidelity.peak_floor(case, tmp_path, "")}
    assert rows["sync"]["gpus"] == 16 and rows["async"]["gpus"] == 8
    # the same tokens on half the GPUs: twice the floor, half the published / floor
    assert abs(rows["async"]["floor_s"] / rows["sync"]["floor_s"] - 2) < 0.02
    floor = rows["sync"]["floor_s"]
    fast = _case(tmp_path, {"sync": {"update_actor": 0.5 * floor}})
    slow = _case(tmp_path, {"sync": {"update_actor": 2.0 * floor}})
    assert fidelity.peak_floor(fast, tmp_path, "")[0]["over_floor"] < 1  # impossible
    assert fidelity.peak_floor(slow, tmp_path, "")[0]["over_floor"] > 1


def test_the_floor_counts_every_token_of_the_stated_workload(tmp_path: Path) -> None:
    case = _case(tmp_path, {"sync": {"update_actor": 1.0}})
    short = fidelity.peak_floor(case, tmp_path, "")[0]["floor_s"]
    GRAPH["data"]["response_len"]["mean"] = 3000
    try:
        long = fidelity.peak_floor(_case(tmp_path, {"sync": {"update_actor": 1.0}}),
                                   tmp_path, "")[0]["floor_s"]
    finally:
        GRAPH["data"]["response_len"]["mean"] = 1000
    # 3000 + 256 against 1000 + 256 tokens a sample, plus attention's square: more than 2.6x
    assert long / short > (3000 + 256) / (1000 + 256)


def test_an_async_trainers_work_is_its_step_less_its_wait_with_the_recompute_floor(
        tmp_path: Path) -> None:
    case = _case(tmp_path, {"sync": {"update_actor": 100.0},
                            "async": {"step": 150.0, "trainer_wait": 30.0}})
    rows = {(r["mode"], r["phase"]): r for r in fidelity.peak_floor(case, tmp_path, "")}
    work = rows[("async", "trainer_work")]
    assert work["published_s"] == 120.0
    # no stated system: rlgraph's runtime does not recompute, so no recompute floor
    assert "recompute_floor_s" not in work
    # the same rate per GPU: 120 s on 8 GPUs against 100 s on 16 is 0.6x the tokens
    assert work["token_share"] == 0.6 and work["colocated_gpus"] == 16
    GRAPH["pricing"] = {"system": "verl"}  # verl recomputes: one more forward, 4/3 the floor
    try:
        again = {(r["mode"], r["phase"]): r for r in fidelity.peak_floor(
            _case(tmp_path, case["phases"]), tmp_path, "")}[("async", "trainer_work")]
    finally:
        GRAPH.pop("pricing")
    assert abs(again["recompute_floor_s"] / again["floor_s"] - 4 / 3) < 1e-3


def test_step_windows_divide_the_published_total_times_by_100_steps() -> None:
    windows = fidelity.step_windows("verl fully_async 7B 32xH20")
    assert [w["steps"] for w in windows] == ["1-100", "101-200", "201-300", "301-400"]
    # 13h 44m over the first 100 colocated steps, 7h 58m over the async ones
    assert windows[0]["sync_s"] == 494.4 and windows[0]["async_s"] == 286.8
    assert fidelity.duration("1d 3h 43m") == 86400 + 3 * 3600 + 43 * 60
    assert fidelity.step_windows("a case without totals") == []


def test_the_trainer_work_leaves_out_the_wait_and_a_ref_forward_beside_train() -> None:
    row = {"step": 282.75, "trainer_wait": 22.06, "ref": 50.05, "update_actor": 206.63}
    assert fidelity.published_work(row, has_logp=False)["trainer_work"] == 260.69
    assert fidelity.published_work(row, False, ref_with_train=True)["trainer_work"] == 210.64
    # a trainer that also computes old log-probs is not a train-only trainer
    assert "trainer_work" not in fidelity.published_work(row, has_logp=True)
    assert "trainer_work" not in fidelity.published_work(dict(row, old_log_prob=9.0), False)


def test_cases_are_counted_by_the_system_their_run_used() -> None:
    rows = [{"pricing": "verl hybrid engine", "within_target": True},
            {"pricing": "AReaL", "within_target": False},
            {"pricing": "verl hybrid engine", "within_target": False}]
    assert fidelity.by_system(rows) == {"verl hybrid engine": [1, 2], "AReaL": [0, 1]}
