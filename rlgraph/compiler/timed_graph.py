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

Streaming (`schedule.stream.mini_batches` K > 1) refines the step to mini-batch granularity:
every node that runs on batches becomes K pieces `name[j]`, each 1/K of the node's seconds,
chained in order (piece j after piece j - 1 of the same step, piece 0 after the last piece
of the step before: a node's calls run one at a time, in order); a data edge joins piece j to
piece j, an edge into a weight carrier leaves the last piece (param_update syncs once per
version), and a back edge enters piece 0 (a version's first mini-batch waits for its
weights). So train's mini-batch j starts once generate's mini-batch j is done, while
generate goes on with mini-batch j + 1: the overlap streaming buys. Steps stay versions.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import networkx as nx

from rlgraph.graph import max_lag as graph_max_lag
from rlgraph.graph import step_order
from rlgraph.nodes import KINDS


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
    wraps: tuple[tuple[int, int], ...] = ()  # streaming: last piece(t - 1) -> first piece(t)
    base: tuple[str, ...] = ()  # streaming: the graph node each piece belongs to
    piece: tuple[int | None, ...] = ()  # streaming: the piece's mini-batch (None: unsplit)

    def node_of(self, i: int) -> str:
        """The graph node of timed node `i` (its own name unless streaming split it)."""
        return self.base[i] if self.base else self.names[i]

    def mini_batch_of(self, i: int) -> int | None:
        """The mini-batch of timed node `i` (None: a whole node)."""
        return self.piece[i] if self.piece else None

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
        edges += [(u, v, d[u], 1) for u, v in self.wraps]
        if self.capacity is not None:
            edges += [(v, u, 0.0, self.capacity) for u, v in self.data_edges]
        return edges


def per_mini_batch(graph: nx.DiGraph) -> set[str]:
    """Nodes that run once per mini-batch when streaming: all but the weight carriers."""
    return {n for n, k in graph.nodes(data="kind") if not KINDS[k].carries_weights}


def piece_name(node: str, mini_batch: int) -> str:
    """The timed node of `node`'s mini-batch `mini_batch` when streaming."""
    return f"{node}[{mini_batch}]"


def streamed_order(graph: nx.DiGraph) -> list[str]:
    """The step order of the graph at mini-batch granularity (its own order unstreamed)."""
    k = int(graph.graph.get("mini_batches", 1))
    if k == 1:
        return step_order(graph)
    streamed, _, _ = _streamed(graph, dict.fromkeys(graph, 0.0), k)
    return step_order(streamed)


def _streamed(graph: nx.DiGraph, seconds: Mapping[str, float], k: int
              ) -> tuple[nx.DiGraph, dict[str, float], dict[str, tuple[str, int | None]]]:
    """The graph at mini-batch granularity (see the module docstring): pieces, their
    seconds, and each piece's (node, mini-batch)."""
    split = per_mini_batch(graph)
    order = step_order(graph)
    out = nx.DiGraph(**graph.graph)
    secs: dict[str, float] = {}
    origin: dict[str, tuple[str, int | None]] = {}
    pieces = {name: [piece_name(name, j) for j in range(k)] if name in split else [name]
              for name in order}
    for j in range(k):  # mini-batch major: the step order runs mini-batch j before j + 1
        for name in order:
            if name in split or j == k - 1:
                piece = pieces[name][j if name in split else 0]
                out.add_node(piece, **graph.nodes[name])
                secs[piece] = float(seconds[name]) / len(pieces[name])
                origin[piece] = (name, j if name in split else None)
    for names in pieces.values():
        for a, b in itertools.pairwise(names):
            out.add_edge(a, b, distance=0)
    for u, v, dist in graph.edges(data="distance"):
        if dist:
            out.add_edge(pieces[u][-1], pieces[v][0], distance=dist)
        elif len(pieces[u]) == len(pieces[v]):
            for a, b in zip(pieces[u], pieces[v]):
                out.add_edge(a, b, distance=0)
        else:
            out.add_edge(pieces[u][-1], pieces[v][0], distance=0)
    return out, secs, origin


def timed_graph(graph: nx.DiGraph, seconds: Mapping[str, float], groups: Sequence[str],
                capacity: bool = True) -> TimedGraph:
    """The TimedGraph of a built graph with per-node seconds and the plan's group names
    (at mini-batch granularity when the graph streams)."""
    k = int(graph.graph.get("mini_batches", 1))
    origin: dict[str, tuple[str, int | None]] = {}
    wraps: list[tuple[str, str]] = []
    if k > 1:
        wraps = [(piece_name(n, k - 1), piece_name(n, 0)) for n in per_mini_batch(graph)]
        graph, seconds, origin = _streamed(graph, seconds, k)
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
    max_lag = graph_max_lag(graph)
    return TimedGraph(names, tuple(float(seconds[n]) for n in names), tuple(groups), occupies,
                      tuple(sorted(data)), tuple(sorted(back)), max_lag + 1 if capacity else None,
                      max_lag,
                      tuple(sorted((index[a], index[b]) for a, b in wraps)),
                      tuple(origin[n][0] for n in names) if origin else (),
                      tuple(origin[n][1] for n in names) if origin else ())
