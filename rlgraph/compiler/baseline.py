"""The baseline a plan is compared with: the colocated synchronous plan of the same graph
(`sync_spec`, priced as the plan's system or another, `--baseline`), its period, and the
verdict under each system's baseline where they disagree."""

from __future__ import annotations

import networkx as nx

from rlgraph.compiler.costs import NodeCost, calibration_scale, node_costs
from rlgraph.compiler.placement import place
from rlgraph.compiler.schedule import steady_state
from rlgraph.compiler.timed_graph import timed_graph
from rlgraph.config.schema import GroupSpec, Spec
from rlgraph.graph import build_graph
from rlgraph.nodes import KINDS
from rlgraph.pricing.system import SYSTEMS, system_of, with_system

SYNC_GROUP = "colocated"
OLD_LOG_PROB = "old_log_prob"  # the logp node verl's baseline adds


def sync_spec(spec: Spec, system: str | None = None) -> Spec:
    """The colocated synchronous baseline: every grouped task in one group on all GPUs,
    max_lag 0, no partial rollout, priced as `system` (default: the plan's own). Where that
    system computes old_log_prob on every batch (verl) it is that system's baseline: the
    switch is paid (cost pass) and a plan without a logp node gets one (OLD_LOG_PROB). A
    system whose synchronous runs keep rollout and training on GPUs apart (AReaL, prime-rl,
    PipelineRL: `System.syncs_apart`) keeps the plan's groups: its synchronous step is the
    same split at max_lag 0."""
    if system is not None:
        spec = with_system(spec, system)
    tasks = [t for g in spec.groups.values() for t in g.tasks]
    nodes, edges = spec.nodes, spec.edges
    roles = [KINDS[n.kind] for n in nodes.values()]
    if (system_of(spec).old_logp_always and tasks and any(r.advances_policy for r in roles)
            and not any(r.proximal_logp for r in roles) and OLD_LOG_PROB not in nodes):
        logp = next(kind for kind in KINDS.values() if kind.proximal_logp)
        nodes = {**nodes, OLD_LOG_PROB: logp.spec()}
        tasks = [*tasks, OLD_LOG_PROB]
        if edges is not None:  # written edges: old_log_prob reads the samples, feeds train
            samplers = [n for n, s in spec.nodes.items() if KINDS[s.kind].samples]
            trainers = [n for n, s in spec.nodes.items() if KINDS[s.kind].advances_policy]
            edges = [*edges, *(f"{g} -> {OLD_LOG_PROB}" for g in samplers),
                     *(f"{OLD_LOG_PROB} -> {t}" for t in trainers)]
    groups = {SYNC_GROUP: GroupSpec(share=1.0, tasks=tasks)} if tasks else {}
    if system_of(spec).syncs_apart:  # its synchronous runs keep rollout and training apart
        added = [t for t in tasks if spec.group_of(t) is None]  # old_log_prob, where added
        groups = {}
        for name, group in spec.groups.items():
            trains = any(KINDS[spec.nodes[t].kind].advances_policy for t in group.tasks)
            groups[name] = group.model_copy(update={"tasks": [*group.tasks, *added]}) \
                if trains and added else group
            added = [] if trains else added
    schedule = spec.schedule.model_copy(update={"max_lag": 0, "partial_rollout": False,
                                                "stream": None})
    return spec.model_copy(update={"groups": groups, "schedule": schedule, "nodes": nodes,
                                   "edges": edges})


def is_sync(spec: Spec) -> bool:
    groups = list(spec.groups.values())
    return (spec.schedule.max_lag == 0 and not spec.schedule.partial_rollout
            and spec.schedule.stream is None and len(groups) == 1 and groups[0].share >= 1 - 1e-9)


def sync_graph(graph: nx.DiGraph) -> nx.DiGraph:
    """`build_graph(sync_spec(spec))` without re-validating: grouped nodes move to the one
    group, back edges get distance 1 (max_lag 0)."""
    sync = graph.copy()
    sync.graph["mini_batches"] = 1
    for _, attrs in sync.nodes(data=True):
        attrs["group"] = SYNC_GROUP if attrs["group"] else None
        attrs["occupies"] = (SYNC_GROUP,) if attrs["occupies"] else ()
    for _, _, attrs in sync.edges(data=True):
        attrs["distance"] = 1 if attrs["distance"] else 0
    return sync


def sync_baseline(spec: Spec, graph: nx.DiGraph, costs: dict[str, NodeCost],
                   system: str | None = None) -> tuple[float, dict[str, NodeCost]]:
    """The baseline's period and node costs, priced as `system` (default: the plan's own;
    a calibration carries over only to the plan's own system)."""
    base = sync_spec(spec, system)
    apart = system_of(base).syncs_apart
    graph = (sync_graph(graph) if len(base.nodes) == len(spec.nodes) and not apart
             else build_graph(base))
    placement = place(base, strict=False)
    own = system_of(base).name == system_of(spec).name
    sync_costs, _ = node_costs(base, graph, placement,
                               scale=calibration_scale(costs) if own else None)
    tg = timed_graph(graph, {n: c.seconds for n, c in sync_costs.items()}, list(placement.groups))
    return steady_state(tg).period, sync_costs


def system_messages(spec: Spec, period: float, baselines: dict[str, float], chosen: str
                     ) -> list[str]:
    """A one-line hint where engine sglang is read as it was before the system became a key,
    and the verdict under each baseline system where they disagree."""
    out = []
    engines = {getattr(n, "engine", None) for n in spec.nodes.values()}
    if ("sglang" in engines and "pricing" not in spec.model_fields_set
            and not spec.cluster.local):
        out.append("engine sglang prices SGLang's decode under rlgraph's runtime "
                   "(pricing.system: rlgraph); to price verl's hybrid engine, as engine "
                   "sglang once meant, set pricing.system: verl, or another framework's run: "
                   + ", ".join(name for name in SYSTEMS if not SYSTEMS[name].runs_here)
                   + " (docs/how-to/price-a-published-run.md)")
    if period > 0 and len(baselines) > 1:
        differing = disagreeing_baselines(period, baselines, chosen)
        if differing:
            own = baselines[chosen]
            word = {1: "faster", -1: "slower", 0: "as fast"}
            out.append(f"the verdict depends on the baseline: {own / period:.2f}x "
                       f"({word[verdict(own, period)]}) against sync on {chosen}, "
                       f"{word[verdict(next(iter(differing.values())), period)]} against "
                       f"sync on {', '.join(differing)} (the vs lines above)")
    return out


def verdict(sync: float, period: float) -> int:
    """1 where the plan runs faster than a baseline's step `sync`, -1 slower, 0 within 1%."""
    ratio = sync / period if period > 0 else 1.0
    return 1 if ratio > 1.01 else -1 if ratio < 0.99 else 0


def disagreeing_baselines(period: float, baselines: dict[str, float], chosen: str
                          ) -> dict[str, float]:
    """The other systems' synchronous steps under which the plan's verdict (faster or slower,
    by more than 1%) is the opposite of the one under the chosen baseline (none where that
    one is a tie: a synchronous plan against its own step)."""
    mine = verdict(baselines.get(chosen, period), period)
    return {name: sync for name, sync in baselines.items()
            if mine and verdict(sync, period) == -mine}
