"""Lower bound of the steady-state period: max(maximum cycle ratio, maximum group load).

Every constraint `b(t + distance) >= a(t) + weight` (see `timed.py`) is an edge; a cycle C
forces period >= sum(weight on C) / sum(distance on C), and a group runs its tasks one at a
time, so period >= the seconds of work it holds per step. The maximum cycle ratio is
computed exactly by Howard's policy iteration (Cochet-Terrasson et al. 1998; Dasdan 2004
found it the fastest in practice): each node follows one out-edge, the policy graph's
cycles give a ratio per node, and the policy improves until no edge raises a node's ratio or
potential. The value returned is the exact ratio of a cycle of the final policy;
`enumerated_cycle_ratio` (all simple cycles, for small graphs) checks it in the tests.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import networkx as nx

from rlgraph.compiler.timed_graph import TimedGraph

Edge = tuple[int, int, float, int]  # (a, b, weight, distance)


@dataclass(frozen=True)
class Bound:
    """The period's lower bound and what binds it."""

    seconds: float
    cycle_ratio: float
    cycle: tuple[int, ...]  # critical cycle as node indices, first node repeated at the end
    cycle_distance: int
    group_load: float
    group: int | None  # the most loaded group

    @property
    def binding(self) -> str:
        """"group" when a group's work sets the bound (ties go to the group), else "cycle"."""
        return "group" if self.group is not None and self.group_load >= self.cycle_ratio \
            else "cycle"


def _evaluate(n: int, edges: list[Edge], policy: list[int]
              ) -> tuple[list[float], list[float], list[list[int]]]:
    """Ratio and potential of every node under a policy, and the policy graph's cycles."""
    succ = [edges[policy[u]][1] for u in range(n)]
    eta = [0.0] * n
    x = [0.0] * n
    state = [0] * n  # 0 unseen, 1 on the current walk, 2 evaluated
    cycles: list[list[int]] = []
    for root in range(n):
        if state[root]:
            continue
        walk = []
        u = root
        while state[u] == 0:
            state[u] = 1
            walk.append(u)
            u = succ[u]
        if state[u] == 1:  # a new cycle, starting at u
            cycle = walk[walk.index(u):]
            weight = sum(edges[policy[c]][2] for c in cycle)
            dist = sum(edges[policy[c]][3] for c in cycle)
            ratio = weight / dist
            x[cycle[0]] = 0.0
            for c in reversed(cycle[1:]):
                _, b, w, d = edges[policy[c]]
                x[c] = w - ratio * d + x[b]
            for c in cycle:
                eta[c] = ratio
                state[c] = 2
            cycles.append(cycle)
            walk = walk[: walk.index(u)]
        for c in reversed(walk):  # tree nodes hang off an evaluated node
            _, b, w, d = edges[policy[c]]
            eta[c] = eta[b]
            x[c] = w - eta[c] * d + x[b]
            state[c] = 2
    return eta, x, cycles


def max_cycle_ratio(n: int, edges: list[Edge]) -> tuple[float, tuple[int, ...], int]:
    """Howard's policy iteration: (ratio, critical cycle, its distance). Every node needs an
    out-edge and every cycle a positive distance."""
    out: list[list[int]] = [[] for _ in range(n)]
    for k, (a, _, _, _) in enumerate(edges):
        out[a].append(k)
    policy = [max(out[u], key=lambda k: edges[k][2]) for u in range(n)]
    scale = max([1e-30, *(abs(e[2]) for e in edges)])
    eps = 1e-12 * scale * max(1, n)
    for _ in range(10 * n + 100):
        eta, x, cycles = _evaluate(n, edges, policy)
        changed = False
        for u in range(n):
            best, best_eta = policy[u], eta[u]
            for k in out[u]:
                if eta[edges[k][1]] > best_eta + eps:
                    best, best_eta = k, eta[edges[k][1]]
            if best == policy[u]:
                best_val = x[u]
                for k in out[u]:
                    _, b, w, d = edges[k]
                    if abs(eta[b] - eta[u]) <= eps:
                        val = w - eta[u] * d + x[b]
                        if val > best_val + eps:
                            best, best_val = k, val
            if best != policy[u]:
                policy[u] = best
                changed = True
        if not changed:
            break
    best_cycle, best_ratio, best_dist = (), float("-inf"), 1
    for cycle in cycles:
        weight = sum(edges[policy[c]][2] for c in cycle)
        dist = sum(edges[policy[c]][3] for c in cycle)
        if weight / dist > best_ratio:
            best_cycle, best_ratio, best_dist = (*cycle, cycle[0]), weight / dist, dist
    return best_ratio, best_cycle, best_dist


def enumerated_cycle_ratio(n: int, edges: list[Edge]) -> float:
    """The maximum cycle ratio by enumerating simple cycles (exponential: small graphs only)."""
    by_pair: dict[tuple[int, int], list[Edge]] = {}
    for e in edges:
        by_pair.setdefault((e[0], e[1]), []).append(e)
    graph = nx.DiGraph(list(by_pair))
    best = float("-inf")
    for cycle in nx.simple_cycles(graph):
        pairs = [(cycle[i], cycle[(i + 1) % len(cycle)]) for i in range(len(cycle))]
        for choice in itertools.product(*(by_pair[p] for p in pairs)):
            dist = sum(e[3] for e in choice)
            if dist > 0:
                best = max(best, sum(e[2] for e in choice) / dist)
    return best


def schedule_bound(tg: TimedGraph) -> Bound:
    """max(maximum cycle ratio, maximum group load) of a timed graph."""
    ratio, cycle, dist = max_cycle_ratio(tg.n, tg.constraint_edges())
    loads = tg.group_loads()
    group = max(range(len(loads)), key=lambda g: loads[g]) if loads else None
    load = loads[group] if group is not None else 0.0
    return Bound(max(ratio, load), ratio, cycle, dist, load, group)
