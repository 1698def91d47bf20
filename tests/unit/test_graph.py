"""The graph stage on tiny hand-built specs: edges and their step distance, the step's order,
and the graphs it refuses (deadlock, dead end)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rl_support import make_spec

from rlgraph.config.load import validate_spec
from rlgraph.errors import SourceMap, SpecError
from rlgraph.graph import build_graph, data_edges, max_lag, step_order


@given(lag=st.integers(min_value=0, max_value=8))
def test_weight_edge_carries_max_lag_plus_one(lag: int) -> None:
    graph = build_graph(make_spec(max_lag=lag))
    assert graph.edges["param_update", "generate"]["distance"] == lag + 1
    assert max_lag(graph) == lag and "max_lag" not in graph.graph  # kept once: the edge
    assert all(d == 0 for u, v, d in graph.edges(data="distance") if u != "param_update")
    assert ("param_update", "generate") not in data_edges(graph)


def test_step_order_is_topological_and_stable() -> None:
    spec = make_spec()
    order = step_order(build_graph(spec))
    assert order == step_order(build_graph(spec))
    position = {name: i for i, name in enumerate(order)}
    for u, v in data_edges(build_graph(spec)):
        assert position[u] < position[v]
    assert order[0] == "generate" and order.index("train") < order.index("param_update")


def _raw(edges: list[str]) -> dict:
    return {"cluster": {"local": True, "cpus": 2},
            "groups": {"all": {"share": 1, "tasks": ["generate", "train"]}},
            "nodes": {"generate": {}, "reward": {}, "train": {}, "extra": {"kind": "reward"}},
            "edges": edges}


def test_cycle_without_step_distance_is_a_deadlock() -> None:
    spec = validate_spec(_raw(["generate -> reward", "reward -> extra", "extra -> reward",
                               "reward -> train"]), SourceMap())
    with pytest.raises(SpecError, match="deadlock"):
        build_graph(spec)


def test_node_that_cannot_reach_train_is_refused() -> None:
    spec = validate_spec(_raw(["generate -> reward", "reward -> train", "generate -> extra"]),
                         SourceMap())
    with pytest.raises(SpecError, match="'extra' cannot reach train"):
        build_graph(spec)
