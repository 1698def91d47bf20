"""A run's first steps: the node costs of a window of steps of a run started from scratch,
before its rollout rounds settle.

The plan's period prices the rollout cache's steady rounds: the round simulation leaves out
its first rounds (`pricing.rollout_rounds.WARMUP`, an empty cache filling up). A run of a
few steps measures those first rounds instead, and they differ in two ways:

- the cache starts empty, so the first rounds admit a full cache of new groups and the
  groups begun then come due together, `max_lag` rounds later;
- the runtime skips the old-log-prob forward of an on-policy batch (`nodes.logp`), and batch
  0 is always one (every token is version 0's). Where train then waits on a batch from
  outside its group (a reward in its own actor), the group runs the next generate first, so
  generate 1 samples with version 0's weights and the groups it begins come due a round early.

`window_costs` prices such a window: the plan's schedule simulated from step 0 with step 0's
old-log-prob forward free gives each early round's weight lag (`startup_lags`, read as
`lag.schedule_lags` reads the steady ones), and each generate's rounds are simulated from an
empty cache at those lags and averaged over the window's rounds (the run's own lengths where
the graph forces them, benchmark mode; else the mean over seeded draws). The plan's printed
period keeps the steady rounds.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

from rlgraph.compiler.costs import NodeCost, node_costs
from rlgraph.compiler.lag import colocated_trainer, samplers
from rlgraph.compiler.placement import Placement
from rlgraph.compiler.schedule import simulate
from rlgraph.compiler.timed_graph import timed_graph
from rlgraph.nodes import KINDS
from rlgraph.pricing.system import system_of


def skipped_at_start(spec: Any, graph: Any) -> set[str]:
    """Nodes whose step 0 costs nothing on rlgraph's runtime: the old-log-prob forward of
    the on-policy batch 0, where the runtime may skip it (`nodes.logp`: one update per
    batch)."""
    from rlgraph.nodes.logp import trained_once

    if not system_of(spec).runs_here or not trained_once(spec):
        return set()
    return {n for n, kind in graph.nodes(data="kind") if KINDS[kind].proximal_logp}


def startup_lags(spec: Any, graph: Any, costs: dict[str, NodeCost], placement: Placement,
                 rounds: int) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """Each generate sharing a group with train (`lag.colocated_trainer`): the versions its
    weights lag rounds 0..rounds - 1 of a run from scratch, read off the plan's schedule
    simulated from step 0 with `skipped_at_start`'s nodes free at step 0 (a call holds the
    version of the train steps ended before it starts), and, where step 0 had such a node,
    generate 1's lag: that of any round after an on-policy batch, whose forward the runtime
    skips as it skips batch 0's (None where none is skipped). Empty for a streamed plan."""
    if int(graph.graph.get("mini_batches", 1)) > 1 or rounds < 1:
        return {}
    tg = timed_graph(graph, {n: c.seconds for n, c in costs.items()}, list(placement.groups))
    index = {name: i for i, name in enumerate(tg.names)}
    free = {index[n]: 0.0 for n in skipped_at_start(spec, graph) if n in index}
    sim = simulate(tg, rounds, first_step=free)
    out: dict[str, tuple[tuple[int, ...], int | None]] = {}
    for gen in samplers(graph):
        trainer = colocated_trainer(graph, gen)
        if trainer is None or gen not in index or trainer not in index:
            continue
        ends = sorted(sim.end[s * tg.n + index[trainer]] for s in range(rounds))
        lags = tuple(max(0, t - bisect_right(ends, sim.start[t * tg.n + index[gen]] + 1e-9))
                     for t in range(rounds))
        out[gen] = (lags, lags[1] if free and rounds > 1 else None)
    return out


def window_costs(spec: Any, graph: Any, placement: Placement, window: tuple[int, int],
                 measured: dict[str, float] | None = None,
                 scale: dict[str, float] | None = None) -> dict[str, NodeCost]:
    """Node costs of steps window[0] <= t < window[1] of a run from scratch: every generate
    whose rounds are simulated (partial rollout, streaming, in-flight) prices those rounds
    (`pricing.generate.partial_rounds`), at the start-up's lags (`startup_lags`); the other
    costs are the plan's. `measured` / `scale` as `node_costs` takes them."""
    first, last = window
    if not 0 <= first < last:
        raise ValueError(f"a window of steps first..last - 1 needs 0 <= first < last, got "
                         f"{window}")
    costs, _ = node_costs(spec, graph, placement, measured, scale)
    lags = startup_lags(spec, graph, costs, placement, last)
    rounds = {gen: (first, last, *lags.get(gen, ((), None))) for gen in samplers(graph)}
    return node_costs(spec, graph, placement, measured, scale, rounds_window=rounds)[0]
