"""Lag: the proven bound per pair and edge, token version span, and the smallest useful lag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlgraph.compiler import compile_plan
from rlgraph.compiler.lag import prove_lag, smallest_lag_for_best_period
from rlgraph.config.load import validate_spec
from rlgraph.errors import SourceMap, SpecError
from rlgraph.graph import build_graph


def spec_of(max_lag: int, partial: bool = False, nodes: dict[str, Any] | None = None,
            edges: list[str] | None = None, groups: dict[str, Any] | None = None) -> Any:
    data: dict[str, Any] = {
        "cluster": {"local": True, "cpus": 2},
        "groups": groups or {"trainer": {"share": 0.5, "tasks": ["logp", "train"]},
                             "rollout": {"share": 0.5, "tasks": ["generate"]}},
        "nodes": nodes or {"generate": {}, "reward": {}, "logp": {}, "train": {},
                           "param_update": {}},
        "schedule": {"max_lag": max_lag, "partial_rollout": partial},
    }
    if edges is not None:
        data["edges"] = edges
    return validate_spec(data, SourceMap())


@pytest.mark.parametrize("max_lag", [0, 1, 2])
def test_default_graph_proves_max_lag(max_lag: int) -> None:
    proof = prove_lag(build_graph(spec_of(max_lag)))
    assert proof.max_policy_lag == max_lag
    assert proof.pairs[("train", "generate")] == (max_lag, "param_update", max_lag + 1)
    assert proof.per_edge["generate->reward"] == max_lag
    assert proof.per_edge["logp->train"] == max_lag
    assert proof.per_edge["train->param_update"] == 0  # fresh weights, no sampled tokens
    assert proof.per_edge["param_update->generate"] == max_lag
    assert proof.token_version_span == 0
    assert f"at most {max_lag} version" in proof.note


def test_partial_rollout_spans_versions_within_the_bound() -> None:
    assert prove_lag(build_graph(spec_of(2)), partial_rollout=True).token_version_span == 2
    zero = prove_lag(build_graph(spec_of(0)), partial_rollout=True)
    assert zero.token_version_span == 0
    assert any("drop every unfinished sample" in m for m in zero.messages)


FANOUT = {"gen_a": {"kind": "generate"}, "gen_b": {"kind": "generate"}, "train": {},
          "sync_a": {"kind": "param_update", "dst": "gen_a"},
          "sync_b": {"kind": "param_update", "dst": "gen_b"}}


def test_each_generate_needs_weights_from_the_train_it_feeds() -> None:
    groups = {"trainer": {"share": 0.5, "tasks": ["train"]},
              "rollout": {"share": 0.5, "tasks": ["gen_a", "gen_b"]}}
    proof = prove_lag(build_graph(spec_of(1, nodes=FANOUT, groups=groups)))
    assert proof.max_policy_lag == 1
    assert proof.pairs[("train", "gen_b")] == (1, "sync_b", 2)
    nodes = {k: v for k, v in FANOUT.items() if k != "sync_b"}
    with pytest.raises(SpecError) as info:
        prove_lag(build_graph(spec_of(1, nodes=nodes, groups=groups)))
    assert info.value.key == ("nodes", "gen_b")
    assert "never receives weights from 'train'" in info.value.message
    assert "src: train, dst: gen_b" in (info.value.hint or "")


def test_the_newest_weight_route_decides() -> None:
    nodes = {"generate": {}, "train": {}, "fast": {"kind": "param_update"},
             "slow": {"kind": "param_update"}}
    edges = ["generate -> train", "train -> fast", "fast -> generate", "train -> slow",
             "slow -> generate"]
    groups = {"trainer": {"share": 0.5, "tasks": ["train"]},
              "rollout": {"share": 0.5, "tasks": ["generate"]}}
    proof = prove_lag(build_graph(spec_of(1, nodes=nodes, edges=edges, groups=groups)))
    assert proof.max_policy_lag == 1 and proof.pairs[("train", "generate")][1] == "fast"


def test_smallest_lag_for_best_period() -> None:
    assert smallest_lag_for_best_period({0: 10.0, 1: 6.0, 2: 6.0}) == 1
    assert smallest_lag_for_best_period({0: 10.0, 1: 6.02, 2: 6.0}) == 1  # within 0.5%
    assert smallest_lag_for_best_period({0: 10.0, 1: 6.1, 2: 6.0}) == 2
    assert smallest_lag_for_best_period({0: 3.0}) == 0


FIXED = {"generate": {"cost": {"seconds": 4}}, "reward": {"cost": {"seconds": 4}},
         "train": {"cost": {"seconds": 4}}, "param_update": {"cost": {"seconds": 0}}}
FIXED_GROUPS = {"trainer": {"share": 0.5, "tasks": ["train"]},
                "rollout": {"share": 0.5, "tasks": ["generate"]}}


def test_plan_reports_when_a_larger_lag_buys_nothing() -> None:
    # generate 4 s, reward 4 s on CPU, train 4 s: the cycle through the back edge needs
    # (4 + 4 + 4) / (max_lag + 1) <= 4, i.e. max_lag 2; 3 buys nothing over 2.
    plan = compile_plan(spec_of(3, nodes=FIXED, groups=FIXED_GROUPS))
    lag = plan["lag"]
    assert lag["max_policy_lag"] == 3
    assert lag["smallest_max_lag_for_best_period"] == 2
    assert lag["periods_by_max_lag"]["2"] == pytest.approx(4.0)
    assert lag["periods_by_max_lag"]["0"] is None  # ruled out by its bound (12 s)
    assert any(m.startswith("max_lag 3 buys nothing over 2: the period is 4 s") for m in
               plan["messages"])
    assert plan["channels"] == {"generate->reward": 4, "reward->train": 4,
                                "train->param_update": 4}
    tight = compile_plan(spec_of(1, nodes=FIXED, groups=FIXED_GROUPS))
    assert tight["schedule"]["period_s"] == pytest.approx(6.0)  # (4 + 4 + 4) / 2
    assert "max_lag 2 would allow a period down to 4 s (its bound, -33%)" in tight["messages"]


def test_partial_rollout_that_cannot_carry_is_reported() -> None:
    """A trainer-bound plan holds generate at the lag bound: the cache can never carry."""
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import load_spec

    root = Path(__file__).resolve().parents[3]
    bound = compile_plan(load_spec(root / "graphs" / "quickstart.yaml",
                                   ["schedule.partial_rollout=true"]))
    assert any("carries nothing" in m for m in bound["messages"])
    # generate-bound, generate(t) starts with version t - 1: at max_lag 2 a sample may carry
    gen_bound = compile_plan(load_spec(root / "graphs" / "quickstart.yaml", [
        "schedule.partial_rollout=true", "schedule.max_lag=2", "nodes.generate.cost={seconds: 5}"]))
    assert not any("carries nothing" in m for m in gen_bound["messages"])


GRAPHS = sorted((Path(__file__).resolve().parents[3] / "graphs").glob("*.yaml"))


@pytest.mark.parametrize("graph", GRAPHS, ids=[g.stem for g in GRAPHS])
def test_large_max_lag_is_simulated_only_as_far_as_it_matters(graph: Path) -> None:
    """A max_lag of 256 compiles like 12 (the period is already at its lag-free bound), with
    the proof and channels still at 256, and simulates no more steps than max_lag 12."""
    from rlgraph.config.load import load_spec

    small = compile_plan(load_spec(graph, ["schedule.max_lag=12"]))
    large = compile_plan(load_spec(graph, ["schedule.max_lag=256"]))
    assert large["schedule"]["period_s"] == pytest.approx(small["schedule"]["period_s"])
    assert large["schedule"]["steps_simulated"] == small["schedule"]["steps_simulated"]
    assert large["lag"]["max_policy_lag"] == 256
    assert set(large["channels"].values()) == {257}
    assert any("max_lag 256 is simulated as 12" in m for m in large["messages"])

