"""Lag pass: the off-policy bound proven from the graph (the README, "Versions and lag").

Train step t produces version t + 1. A weight-carrying node P (param_update) fed within the
step by train node T runs P(s) after T(s), so it carries version s + 1; its back edge to a
generate G has distance D, so G(t) starts only after P(t - D) and holds a version >= t - D + 1.
A token sampled by G(t) and trained on by T(t) therefore has lag t - version <= D - 1. With
several routes T -> P -> G the newest wins (the smallest D); a train node fed by a generate
that receives no weights from it has no bound, and the graph is refused. With DESIGN's
distance D = max_lag + 1 the proven bound is max_lag.

With partial rollout a sample's tokens may come from several versions: an unfinished sample
is kept in the rollout cache and resumed by a later generate step with newer weights, and
the cache drops any sample whose oldest token would exceed max_lag when trained on, so every
token of a sample is within the same bound and `token_version_span` (newest minus oldest
version within one sample) is at most max_policy_lag; without partial rollout it is 0. The
same holds with generate's in-flight updates (`engines.inflight`: rows keep decoding across
calls and versions, and train checks every token against the bound again).

Streaming (`schedule.stream.mini_batches` K): version t spans K optimizer steps t*K + j, one
per mini-batch; generate's call for mini-batch j of step t waits for the same version as the
whole step did (>= t - max_lag), so the bound holds per mini-batch: a token sampled by
version v is trained at an optimizer step of version <= v + max_lag. A sample carried from
one call to the next (continuous refill) is evicted before a call whose version window it
has left (`engines.partial_rollout`), so carrying never stretches the bound. A generate in
the group that trains streams too: the group time-slices its tasks and the engine samples
from a snapshot of the weights refreshed by the group's param_update once per version, so
"sampled by version v" stays true while train updates the policy at every mini-batch.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from rlgraph.errors import SpecError
from rlgraph.graph import data_edges, step_order
from rlgraph.graph import max_lag as graph_max_lag
from rlgraph.nodes import KINDS

BEST_PERIOD_TOLERANCE = 0.005  # a lag "reaches the best period" within 0.5%


@dataclass
class LagProof:
    """The proven bound, per train/generate pair and per edge, with the route that proves it."""

    max_policy_lag: int
    pairs: dict[tuple[str, str], tuple[int, str, int]]  # (train, generate) -> (lag, via, D)
    per_edge: dict[str, int]
    token_version_span: int
    note: str
    messages: list[str] = field(default_factory=list)
    mini_batches: int = 1  # optimizer steps per version (schedule.stream)
    per_mini_batch: str = ""  # the bound per mini-batch, in words (streaming only)


def _reach(order: list[str], links: dict[str, list[str]], keep: set[str]) -> dict[str, set[str]]:
    """For each node, the nodes of `keep` among itself and everything `links` lead back to,
    filled in `order` (each node's links come earlier in it)."""
    out: dict[str, set[str]] = {}
    for node in order:
        found = {node} & keep
        for other in links[node]:
            found |= out[other]
        out[node] = found
    return out


def prove_lag(graph: nx.DiGraph, partial_rollout: bool = False) -> LagProof:
    """The largest lag of any token at any train node, proven from the graph's edges."""
    kinds = dict(graph.nodes(data="kind"))
    order = step_order(graph)
    preds: dict[str, list[str]] = {n: [] for n in order}
    succs: dict[str, list[str]] = {n: [] for n in order}
    for u, v in data_edges(graph):
        preds[v].append(u)
        succs[u].append(v)
    trains = {n for n, k in kinds.items() if KINDS[k].advances_policy}
    gens = {n for n, k in kinds.items() if KINDS[k].samples}
    gens_up = _reach(order, preds, gens)  # generates whose data reaches a node within a step
    trains_up = _reach(order, preds, trains)  # trains whose output reaches a node
    trains_down = _reach(order[::-1], succs, trains)  # trains a node's output reaches
    back_into: dict[str, list[tuple[str, int]]] = {}
    for u, v, d in graph.edges(data="distance"):
        if d:
            back_into.setdefault(v, []).append((u, d))
    position = {n: i for i, n in enumerate(order)}
    pairs: dict[tuple[str, str], tuple[int, str, int]] = {}
    for train in sorted(trains, key=position.get):
        for gen in sorted(gens_up[train], key=position.get):
            routes = [(d - 1, u, d) for u, d in back_into.get(gen, []) if train in trains_up[u]]
            if not routes:
                raise SpecError(
                    f"'{gen}' never receives weights from '{train}', so the lag of the tokens "
                    f"'{train}' trains on grows without bound", ("nodes", gen),
                    hint=f"add a param_update node with src: {train}, dst: {gen}")
            pairs[(train, gen)] = min(routes)
    max_lag = max((lag for lag, _, _ in pairs.values()), default=0)
    per_edge: dict[str, int] = {}
    for u, v, d in graph.edges(data="distance"):
        if d:
            per_edge[f"{u}->{v}"] = d - 1
            continue
        lags = [pairs[(t, g)][0] for t in trains_down[v] for g in gens_up[u] if (t, g) in pairs]
        per_edge[f"{u}->{v}"] = max(lags, default=0)
    messages = []
    if partial_rollout and max_lag == 0:
        messages.append("partial_rollout with max_lag 0 must drop every unfinished sample at "
                        "each step (no version may differ); use max_lag >= 1")
    k = int(graph.graph.get("mini_batches", 1))
    colocated = [g for g in samplers(graph) if k > 1 and colocated_trainer(graph, g)]
    return LagProof(max_lag, pairs, per_edge, max_lag if partial_rollout else 0,
                    _note(pairs, max_lag), messages, k,
                    _mini_batch_note(k, max_lag, colocated))


def _mini_batch_note(k: int, max_lag: int, colocated: list[str] = ()) -> str:
    """The streaming bound per mini-batch, in words ('' without streaming)."""
    if k <= 1:
        return ""
    note = (f"streaming {k} mini-batches per version: optimizer step s = t*{k} + j (mini-batch "
            f"j of step t) trains tokens sampled by version >= t - {max_lag}, so a token "
            f"sampled by version v is trained at optimizer steps of version <= v + {max_lag} "
            f"(steps v*{k} .. (v + {max_lag})*{k} + {k - 1}); each mini-batch's generate call "
            f"waits for version t - {max_lag} and evicts carried samples older than that")
    if colocated:
        verb = "shares" if len(colocated) == 1 else "share"
        note += (f"; {', '.join(colocated)} {verb} the group that trains, so the group "
                 f"time-slices generate and train and the engine decodes from a snapshot of "
                 f"the weights its param_update refreshes once per version (the in-place "
                 f"updates of a version's mini-batches never reach the sampler: a token "
                 f"tagged v was sampled by version v's weights)")
    return note


def check_stream(spec: Any, graph: nx.DiGraph) -> None:
    """Refuse a `schedule.stream` the runtime cannot honour: the mini-batches must split the
    batch's prompt groups evenly, and every generate that feeds a train must receive its
    weights through a param_update. A generate in the group that trains (colocated) streams
    by time-slicing the group, decoding from a snapshot of the weights that its param_update
    refreshes once per version, which only the native engine can hold."""
    stream = spec.schedule.stream
    if stream is None:
        return
    key = ("schedule", "stream", "mini_batches")
    k, prompts = stream.mini_batches, spec.data.prompts_per_step
    if prompts % k:
        fits = [d for d in range(1, prompts + 1) if prompts % d == 0 and d <= k]
        raise SpecError(f"mini_batches {k} does not divide data.prompts_per_step {prompts} "
                        f"(each mini-batch is a whole number of prompt groups)", key,
                        hint=f"use mini_batches: {fits[-1]}, or a prompts_per_step that "
                        f"{k} divides")
    for gen in samplers(graph):
        fed = any(d for _, _, d in graph.in_edges(gen, data="distance"))
        if not fed:
            raise SpecError(f"schedule.stream needs '{gen}' to receive weights from a "
                            "param_update (once per version); it has none", key,
                            hint=f"add a param_update node (src: train, dst: {gen}), or "
                            "remove schedule.stream")
        engine = getattr(spec.nodes[gen], "engine", "native")
        if colocated_trainer(graph, gen) is not None and engine != "native":
            raise SpecError(f"schedule.stream with '{gen}' in the group that trains decodes "
                            f"from a snapshot of the weights, which engine {engine} cannot "
                            "hold", key, hint=f"use engine: native, or put {gen} in a group "
                            "of its own")


def check_inflight(spec: Any, graph: nx.DiGraph) -> None:
    """Refuse `generate.inflight` where it cannot hold: its rows live in the rollout cache
    (schedule.partial_rollout or schedule.stream), span versions (max_lag >= 1: a row is
    trained with tokens of versions older than the newest) and decode on the native engine's
    static decoder."""
    schedule = spec.schedule
    for gen in samplers(graph):
        node = spec.nodes[gen]
        if not getattr(node, "inflight", False):
            continue
        key = ("nodes", gen, "inflight")
        if not schedule.partial_rollout and schedule.stream is None:
            raise SpecError(f"'{gen}': inflight keeps unfinished rows decoding from one call "
                            "to the next, which needs the rollout cache", key,
                            hint="set schedule.partial_rollout: true (or schedule.stream)")
        if schedule.max_lag < 1:
            raise SpecError(f"'{gen}': inflight rows carry tokens of an older version into a "
                            "later batch, which max_lag 0 forbids", key,
                            hint="use schedule.max_lag: 1 or more, or inflight: false")
        if getattr(node, "engine", "native") != "native":
            raise SpecError(f"'{gen}': inflight runs on engine native's decode loop, not "
                            f"{node.engine}", key, hint="use engine: native, or inflight: false")


def samplers(graph: nx.DiGraph) -> list[str]:
    """The graph's nodes that sample tokens (generate)."""
    return [n for n, kind in graph.nodes(data="kind") if KINDS[kind].samples]


def colocated_trainer(graph: nx.DiGraph, gen: str) -> str | None:
    """The train node sharing `gen`'s group, if any (the group time-slices them)."""
    group = graph.nodes[gen]["group"]
    return next((n for n, kind in graph.nodes(data="kind") if KINDS[kind].advances_policy
                 and group is not None and graph.nodes[n]["group"] == group), None)


def schedule_lags(graph: nx.DiGraph, sim: Any, cyclicity: int) -> dict[str, tuple[int, ...]]:
    """Each generate node that shares its group with a train node (`colocated_trainer`): the
    versions its weights lag its step over the simulated schedule's steady cycle (`sim`, a
    `schedule.Simulation`, repeating every `cyclicity` steps), round t taking lag
    `[t % cyclicity]`. The engine samples from the trainer's live weights, so a call holds
    the version of the train steps ended before it starts (step s makes version s + 1). A
    group whose train waits on a batch from outside it (a reward in its own actor) while the
    next generate may run (the bound allows it) runs that generate first, as the runtime's
    policy does: lags (0, 1); a group that takes logp first keeps (0,). Empty for a streamed
    plan (its calls are mini-batches of a version) and where the schedule did not repeat."""
    if int(graph.graph.get("mini_batches", 1)) > 1 or cyclicity < 1:
        return {}
    tg, n = sim.tg, sim.tg.n
    index = {name: i for i, name in enumerate(tg.names)}
    out: dict[str, tuple[int, ...]] = {}
    for gen in samplers(graph):
        trainer = colocated_trainer(graph, gen)
        if trainer is None or gen not in index or trainer not in index:
            continue
        ends = sorted(sim.end[s * n + index[trainer]] for s in range(sim.steps))
        lags = [t - bisect_right(ends, sim.start[t * n + index[gen]] + 1e-9)
                for t in range(sim.steps)]
        first = len(lags) // 2
        first += (-first) % cyclicity  # a whole number of cycles from step 0
        if first + cyclicity <= len(lags):
            out[gen] = tuple(max(0, lag) for lag in lags[first:first + cyclicity])
    return out


def version_gate(graph: nx.DiGraph) -> int:
    """The runtime's version gate: generate (or any weight receiver) of step t waits for a
    version >= t - gate: graph.yaml's max_lag, as the graph keeps it (`graph.max_lag`)."""
    return graph_max_lag(graph)


def channel_capacities(graph: nx.DiGraph) -> dict[str, int]:
    """Steps each data edge's channel holds: gate + 1, so a producer runs at most as far
    ahead of its consumer as the back edge lets generate run ahead of train. Streaming
    counts in the consumer's calls: (gate + 1) x mini_batches between nodes that run once
    per mini-batch, gate + 1 into a weight carrier (once per version)."""
    room = version_gate(graph) + 1
    k = int(graph.graph.get("mini_batches", 1))
    kinds = dict(graph.nodes(data="kind"))
    return {f"{u}->{v}": room if KINDS[kinds[v]].carries_weights else room * k
            for u, v in data_edges(graph)}


def _note(pairs: Mapping[tuple[str, str], tuple[int, str, int]], max_lag: int) -> str:
    if not pairs:
        return "no train node reads sampled tokens"
    (train, gen), (lag, via, dist) = max(pairs.items(), key=lambda kv: kv[1][0])
    version = "t" if dist == 1 else f"t-{dist - 1}"
    return (f"lag <= {max_lag}: {gen}(t) waits for {via}(t-{dist}), which carries version "
            f"{version} from {train}(t-{dist}); so {train}(t) trains on tokens at most {lag} "
            f"version(s) old")


def smallest_lag_for_best_period(periods: Mapping[int, float],
                                 tolerance: float = BEST_PERIOD_TOLERANCE) -> int:
    """The smallest max_lag whose period is within `tolerance` of the best one evaluated."""
    best = min(periods.values())
    return min(lag for lag, p in periods.items() if p <= best * (1 + tolerance) + 1e-12)


def lag_messages(user_lag: int, smallest: int, periods: Mapping[int, float]) -> list[str]:
    """Advice when the user's max_lag is larger than the period needs."""
    if smallest >= user_lag:
        return []
    return [f"max_lag {user_lag} buys nothing over {smallest}: the period is "
            f"{periods[smallest]:.4g} s with max_lag {smallest} and {periods[user_lag]:.4g} s "
            f"with {user_lag}; the smaller lag keeps training closer to on-policy"]
