"""The timed constraint system of one plan: what the bound and the simulator both read.

Nodes are numbered in the step's topological order; each has a duration and the groups it
occupies. Constraints between node instances `(node, step)`:

- data edge u -> v:           v(t) starts after u(t) ends;
- back edge u -> v, dist D:   v(t) starts after u(t - D) ends (param_update -> generate);
- order:                      u(t) starts after u(t - 1) ends;
- channel u -> v, capacity C: u(t) starts after v(t - C) started (a bounded channel has room);
- groups:                     tasks sharing a group never overlap.

With the plan's channel capacity (max_lag + 1) the channel constraint is implied by the lag in
graphs whose data all flows back to generate through param_update; it bounds run-ahead in
graphs where it is not, exactly as the runtime's bounded channels do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import networkx as nx

from rlgraph.graph import step_order


@dataclass(frozen=True)
class TimedGraph:
    """Durations, occupancy and step-distance constraints of one plan, nodes by index."""

    names: tuple[str, ...]
    duration: tuple[float, ...]
    groups: tuple[str, ...]
    occupies: tuple[tuple[int, ...], ...]
    data_edges: tuple[tuple[int, int], ...]
    back_edges: tuple[tuple[int, int, int], ...]  # (u, v, distance)
    capacity: int | None  # channel capacity of every data edge; None = unbounded
    max_lag: int

    @property
    def n(self) -> int:
        """Number of nodes."""
        return len(self.names)

    def max_distance(self) -> int:
        """The largest step distance of any constraint (>= 1)."""
        return max([1, self.capacity or 1, *(d for _, _, d in self.back_edges)])

    def with_lag(self, max_lag: int) -> TimedGraph:
        """The same plan under another max_lag: back edges and channels become max_lag + 1."""
        back = tuple((u, v, max_lag + 1) for u, v, _ in self.back_edges)
        capacity = None if self.capacity is None else max_lag + 1
        return replace(self, back_edges=back, capacity=capacity, max_lag=max_lag)

    def group_loads(self) -> list[float]:
        """Seconds of work per step on each group (a two-group task counts in both)."""
        loads = [0.0] * len(self.groups)
        for i, occ in enumerate(self.occupies):
            for g in occ:
                loads[g] += self.duration[i]
        return loads

    def constraint_edges(self) -> list[tuple[int, int, float, int]]:
        """Every constraint as `(a, b, weight, distance)`: b(t + distance) >= a(t) + weight."""
        d = self.duration
        edges = [(u, v, d[u], 0) for u, v in self.data_edges]
        edges += [(u, v, d[u], dist) for u, v, dist in self.back_edges]
        edges += [(i, i, d[i], 1) for i in range(self.n)]
        if self.capacity is not None:
            edges += [(v, u, 0.0, self.capacity) for u, v in self.data_edges]
        return edges


def timed_graph(graph: nx.DiGraph, seconds: Mapping[str, float], groups: Sequence[str],
                capacity: bool = True) -> TimedGraph:
    """The TimedGraph of a built graph with per-node seconds and the plan's group names."""
    names = tuple(step_order(graph))
    index = {name: i for i, name in enumerate(names)}
    group_index = {g: i for i, g in enumerate(groups)}
    occupies = tuple(tuple(group_index[g] for g in graph.nodes[n]["occupies"]) for n in names)
    data, back = [], []
    for u, v, dist in graph.edges(data="distance"):
        if dist:
            back.append((index[u], index[v], int(dist)))
        else:
            data.append((index[u], index[v]))
    max_lag = int(graph.graph.get("max_lag", 0))
    return TimedGraph(names, tuple(float(seconds[n]) for n in names), tuple(groups), occupies,
                      tuple(sorted(data)), tuple(sorted(back)), max_lag + 1 if capacity else None,
                      max_lag)
