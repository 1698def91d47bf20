"""The evaluation of one candidate plan of `rlgraph tune`'s space (`rlgraph.tune.space`).

`Evaluator.lower_bound` is a cheap valid lower bound of a candidate's period from per-group
cost tables (each group's node costs depend on that group's tasks and GPUs only):
max(group loads, any single node, the longest generate -> ... -> param_update path over
max_lag + 1). `Evaluator.evaluate` is exact and is what the compiler would say: it builds the
candidate's Spec, runs `place` (strict), `node_costs`, `schedule_bound` and, only when the
bound can still beat `cutoff`, the steady-state simulation. Results are cached by candidate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import networkx as nx

from rlgraph.compiler.costs import node_costs
from rlgraph.compiler.period_bound import schedule_bound
from rlgraph.compiler.placement import GroupPlacement, Placement, place
from rlgraph.compiler.schedule import steady_state, utilization
from rlgraph.compiler.timed_graph import TimedGraph, timed_graph
from rlgraph.config.schema import GroupSpec
from rlgraph.errors import SpecError
from rlgraph.graph import build_graph, data_edges
from rlgraph.nodes import KINDS
from rlgraph.tune.space import PRUNE_TOLERANCE, Block, Candidate, Evaluation, SearchSpace


class Evaluator:
    """Cost tables, lower bounds and exact (cached) evaluations of candidates of one space."""

    def __init__(self, space: SearchSpace, scale: Mapping[str, float] | None = None):
        self.space = space
        self.scale = dict(scale or {})
        spec = space.spec
        self.weight_nodes = [n for n, node in spec.nodes.items()
                             if KINDS[node.kind].carries_weights]
        self.free_nodes = [n for n, node in spec.nodes.items()
                           if n not in space.tasks and n not in self.weight_nodes]
        graph = build_graph(spec)
        self.dag = nx.DiGraph(data_edges(graph))
        self.dag.add_nodes_from(graph)
        self.topo = list(nx.topological_sort(self.dag))
        self.back = [(u, v) for u, v, d in graph.edges(data="distance") if d]
        self._tables: dict[tuple, dict[str, float]] = {}
        self._loads: dict[tuple, float] = {}
        self._graphs: dict[tuple[Block, ...], Any] = {}
        self._layouts: dict[tuple, Any] = {}
        self.cache: dict[Candidate, Evaluation] = {}
        self.stats = {"lower_bounded": 0, "placed": 0, "bounded": 0, "simulated": 0,
                      "refused": 0}

    # ------------------------------------------------------------ per-group tables

    def valid_sizes(self, block: Block, tp: int | None) -> list[int]:
        """Sizes the placement pass accepts for this block as a group on its own."""
        return [size for size in self.space.sizes
                if self.space.sharding(block, size, tp) is not None]

    def _graph(self, blocks: tuple[Block, ...]) -> Any:
        if blocks not in self._graphs:
            names = self.space.names(blocks)
            groups = {n: GroupSpec(share=1.0 / len(blocks), tasks=list(b))
                      for n, b in zip(names, blocks)}
            graph = build_graph(self.space.variant(groups, 0, False, None))
            self._graphs[blocks] = (graph, names)
        return self._graphs[blocks]

    def table(self, block: Block, size: int, partial: bool, tp: int | None) -> dict[str, float]:
        """Seconds of the block's tasks on `size` GPUs, of the weight nodes homed in it (the
        smaller of within / across machines) and of nodes in no group: at max_lag 0 (logp
        may be skipped), with partial rollout the least over the lags searched (a round's
        decode depends on the lag: `rollout_rounds`)."""
        key = (block, size, partial, tp)
        if key not in self._tables:
            lags = self.space.lags_for(True) if partial else (0,)
            tables = [self._table_at(block, size, partial, tp, lag) for lag in lags or (1,)]
            self._tables[key] = {n: min(t[n] for t in tables) for n in tables[0]}
        return self._tables[key]

    def _table_at(self, block: Block, size: int, partial: bool, tp: int | None, lag: int
                  ) -> dict[str, float]:
        """`table` at one max_lag."""
        space = self.space
        rest = tuple(t for t in space.tasks if t not in block)
        blocks = (block, rest) if rest else (block,)
        graph, names = self._graph(blocks)
        spec = space.variant({n: GroupSpec(share=0.5, tasks=list(b))
                              for n, b in zip(names, blocks)}, lag, partial, tp,
                             sharded=space.sharding(block, size, tp) or ())
        span = max(1, math.ceil(size / space.per_node))
        out: dict[str, float] = {}
        for across in (False, True) if space.machines > 1 else (False,):
            groups = {names[0]: GroupPlacement(names[0], list(block), 0.5, size,
                                               [(m, 0) for m in range(span)])}
            if rest:
                machine = span if across and space.machines > span else 0
                groups[names[1]] = GroupPlacement(names[1], list(rest), 0.5, 1,
                                                  [(machine, space.per_node - 1)])
            placement = Placement(spec.cluster.local, space.slots,
                                  "cpu" if spec.cluster.local else spec.cluster.gpu, groups)
            costs, _ = node_costs(spec, graph, placement, scale=self.scale)
            for name, cost in costs.items():
                home = graph.nodes[name]["occupies"]
                if name in block or name in self.free_nodes:
                    out[name] = cost.seconds
                elif name in self.weight_nodes and home and home[0] == names[0]:
                    out[name] = min(out.get(name, math.inf), cost.seconds)
        return out

    def block_load(self, block: Block, size: int, partial: bool, tp: int | None) -> float:
        """Seconds of the block's own tasks per step on `size` GPUs (a lower bound of its
        group's load: weight transfers come on top)."""
        key = (block, size, partial, tp)
        if key not in self._loads:
            table = self.table(block, size, partial, tp)
            self._loads[key] = sum(table[t] for t in block)
        return self._loads[key]

    def lower_bound(self, blocks: tuple[Block, ...], sizes: tuple[int, ...], partial: bool,
                    tp: int | None) -> tuple[float, float]:
        """(load part, path part): the period of any lag is >= max(load, path / (lag + 1))."""
        self.stats["lower_bounded"] += 1
        seconds: dict[str, float] = {}
        owner: dict[str, int] = {}
        for i, (block, size) in enumerate(zip(blocks, sizes)):
            seconds.update(self.table(block, size, partial, tp))
            owner.update(dict.fromkeys(block, i))
        loads = [0.0] * len(blocks)
        for name in seconds:
            if name in owner:
                loads[owner[name]] += seconds[name]
        for name in self.weight_nodes:  # a weight sync holds its sender's group only
            node = self.space.spec.nodes[name]
            sender = node.src if node.src in owner else node.dst
            if sender in owner:
                loads[owner[sender]] += seconds.get(name, 0.0)
        load = max([*loads, *seconds.values()])
        path = 0.0
        if self.space.stream_choices:  # a streaming cycle holds 1/K of a split node at least
            k = max(self.space.stream_choices)
            seconds = {n: s if n in self.weight_nodes else s / k for n, s in seconds.items()}
        for u, v in self.back:  # the data path v -> ... -> u plus the back edge u -> v
            path = max(path, self._path(v, u, seconds))
        return load, path

    def _path(self, src: str, dst: str, seconds: Mapping[str, float]) -> float:
        best: dict[str, float] = {src: seconds.get(src, 0.0)}
        for name in self.topo:
            if name not in best:
                continue
            for succ in self.dag.successors(name):
                value = best[name] + seconds.get(succ, 0.0)
                if value > best.get(succ, -math.inf):
                    best[succ] = value
        return best.get(dst, 0.0)

    # ------------------------------------------------------------ exact evaluation

    def _layout(self, cand: Candidate) -> Any:
        """(spec, placement, TimedGraph) of the candidate's layout, or an error. Costs do
        not depend on the lag except that max_lag 0 may prove the logp forward redundant
        (rlgraph.nodes.logp), so a layout is priced once at lag 0 and once at lag 1."""
        key = (cand.layout, min(cand.max_lag, 1))
        if key not in self._layouts:
            self.stats["placed"] += 1
            spec = self.space.spec_for(replace(cand, max_lag=min(cand.max_lag, 1)))
            try:
                placement = place(spec)
            except SpecError as err:
                self._layouts[key] = str(err.message)
                return self._layouts[key]
            if not self.space.aligned(placement):
                self._layouts[key] = "a group smaller than a machine is split across machines"
                return self._layouts[key]
            graph, _ = self._graph(cand.blocks)
            costs, _ = node_costs(spec, graph, placement, scale=self.scale)
            if graph.graph.get("mini_batches", 1) != spec.schedule.mini_batches:
                graph = graph.copy()  # the candidate's streaming mini-batches
                graph.graph["mini_batches"] = spec.schedule.mini_batches
            tg = timed_graph(graph, {n: c.seconds for n, c in costs.items()},
                             list(placement.groups))
            self._layouts[key] = (spec, placement, tg)
        return self._layouts[key]

    def evaluate(self, cand: Candidate, cutoff: float = math.inf) -> Evaluation:
        """The candidate's bound, and its simulated period unless the bound exceeds `cutoff`
        (a cached pruned evaluation is simulated later if asked with a higher cutoff)."""
        done = self.cache.get(cand)
        if done is not None and (done.period_s is not None or done.error is not None
                                 or done.bound_s > cutoff * (1 + PRUNE_TOLERANCE)):
            return done
        layout = self._layout(cand)
        if isinstance(layout, str):
            self.stats["refused"] += 1
            done = Evaluation(cand, None, math.inf, error=layout)
            self.cache[cand] = done
            return done
        spec, placement, tg0 = layout
        tg = tg0.with_lag(cand.max_lag)
        if done is None:
            self.stats["bounded"] += 1
            bound = schedule_bound(tg)
            done = Evaluation(cand, spec.model_copy(update={"schedule": spec.schedule.model_copy(
                update={"max_lag": cand.max_lag})}), bound.seconds, tg=tg, bound=bound)
            self.cache[cand] = done
        if done.bound_s <= cutoff * (1 + PRUNE_TOLERANCE):
            self.stats["simulated"] += 1
            done.period_s = steady_state(tg).period
            done.idle_gpus = idle_gpus(tg, done.period_s, placement, self.space.slots)
        return done


def idle_gpus(tg: TimedGraph, period: float, placement: Placement, slots: int) -> float:
    """GPUs idle on average in steady state: unassigned ones plus each group's idle share."""
    util = utilization(tg, period)
    busy = sum(placement.groups[g].gpus * u for g, u in util.items())
    return max(0.0, slots - busy)
