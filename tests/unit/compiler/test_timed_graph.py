"""The timed constraint system on a hand-built two-node plan: the constraint edges each rule
adds, group loads, and how a new max_lag moves back edges and channel capacity together."""

from __future__ import annotations

from rlgraph.compiler.timed_graph import TimedGraph


def two_nodes(capacity: int | None = 2, max_lag: int = 1) -> TimedGraph:
    """gen (0) -> train (1) within a step; train -> gen one step plus max_lag later."""
    return TimedGraph(names=("gen", "train"), duration=(3.0, 2.0), groups=("a", "b"),
                      occupies=((0,), (1,)), data_edges=((0, 1),),
                      back_edges=((1, 0, max_lag + 1),), capacity=capacity, max_lag=max_lag)


def test_constraint_edges_name_every_rule() -> None:
    edges = set(two_nodes().constraint_edges())
    assert (0, 1, 3.0, 0) in edges  # data: train(t) after gen(t)
    assert (1, 0, 2.0, 2) in edges  # back edge: gen(t + 2) after train(t)
    assert {(0, 0, 3.0, 1), (1, 1, 2.0, 1)} <= edges  # a node runs one step at a time
    assert (1, 0, 0.0, 2) in edges  # channel: gen(t + 2) starts after train(t) started
    assert len(two_nodes(capacity=None).constraint_edges()) == len(edges) - 1


def test_with_lag_moves_back_edges_and_channels_together() -> None:
    tg = two_nodes().with_lag(4)
    assert tg.back_edges == ((1, 0, 5),) and tg.capacity == 5 and tg.max_lag == 4
    assert two_nodes(capacity=None).with_lag(4).capacity is None
    assert tg.max_distance() == 5


def test_group_loads_count_a_shared_task_in_both_groups() -> None:
    tg = TimedGraph(names=("x", "y"), duration=(1.0, 4.0), groups=("a", "b"),
                    occupies=((0, 1), (1,)), data_edges=((0, 1),), back_edges=(),
                    capacity=None, max_lag=0)
    assert tg.group_loads() == [1.0, 5.0]
