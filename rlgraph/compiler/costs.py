"""Cost pass: seconds per step of every node, dispatched to its kind's cost model.

Order of precedence: a measured calibration (source "calibrated"), then the node's `cost:
{seconds: S}` or `cost: {gpu_seconds: W}` (W / GPUs of its group; source "override"), then
the kind's analytic model (`rlgraph/pricing/<kind>.py`, constants in
`rlgraph/pricing/constants.py`; source "model"). Where the plan prices a system with a
colocation switch (`pricing.system: verl`, `rlgraph.pricing.system.SYSTEMS`), a group that
holds both a train and a generate node pays the switch on its generate node every step:
train states and rollout weights go to host memory and come back over PCIe, and the weights
are refit into the engine at the measured rate of the stated path. rlgraph's own runtime
decodes with the training weights and pays no switch; local CPU clusters pay none either. A
generate node that receives weights from another group pays the dual-buffer switch instead
(`pricing.param_update.switch_cost`): param_update stages the new version beside generation
and holds only the sender's group, so the copy into the live weights is all generate waits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import networkx as nx

from rlgraph.compiler.memory import engine_slots
from rlgraph.compiler.placement import Placement
from rlgraph.compiler.shapes import shape_of
from rlgraph.config.schema import Spec
from rlgraph.errors import SpecError
from rlgraph.nodes import KINDS
from rlgraph.presets.models import ModelShape
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.param_update import switch_cost
from rlgraph.pricing.system import refit_path, system_of
from rlgraph.pricing.system import switch_terms as switch_terms_of


@dataclass
class NodeCost:
    """Seconds one step of a node takes, where the figure comes from, and how it was made."""

    seconds: float
    source: str  # "model" | "override" | "calibrated"
    detail: str
    modelled: float  # what the analytic model (or the override) says, before calibration

    def to_dict(self) -> dict[str, Any]:
        """The plan's `costs[node]` entry."""
        return {"seconds": self.seconds, "source": self.source, "detail": self.detail}


def switch_seconds(spec: Spec, placement: Placement, group: str, shape: ModelShape) -> float:
    """Per-step switch of a colocated group between training and rollout, as the priced
    system pays it (`pricing.system.switch_terms`; 0 for rlgraph's runtime, or on a local
    CPU cluster)."""
    return sum(switch_terms(spec, placement, group, shape).values())


def switch_terms(spec: Spec, placement: Placement, group: str, shape: ModelShape
                 ) -> dict[str, float]:
    """The switch's terms in seconds: offload/reload, sleep/wake, refit."""
    if placement.local:
        return {}
    tasks = [spec.nodes[t] for t in placement.groups[group].tasks]
    tp = max((getattr(n, "tp", 1) for n in tasks if KINDS[n.kind].samples), default=1)
    return switch_terms_of(system_of(spec), refit_path(spec), shape.params,
                           placement.gpus_of(group), tp, placement.preset.host_bytes_per_s,
                           placement.preset.nvlink_bytes_per_s)


def _colocated_switch_groups(spec: Spec, placement: Placement) -> dict[str, str]:
    """Sampling node -> its group, for groups that also hold a node that advances the policy
    (one per group: the first of each)."""
    out = {}
    for name, group in placement.groups.items():
        roles = [KINDS[spec.nodes[t].kind] for t in group.tasks]
        samplers = [t for t, kind in zip(group.tasks, roles, strict=True) if kind.samples]
        if samplers and any(kind.advances_policy for kind in roles):
            out[samplers[0]] = name
    return out


def _fed_by_other_group(graph: nx.DiGraph) -> set[str]:
    """Nodes that receive weights from a weight sync whose sender is in another group."""
    out = set()
    for src, dst in graph.edges():
        if KINDS[graph.nodes[src]["kind"]].carries_weights:
            sender = graph.nodes[src]["spec"].src
            if sender in graph and graph.nodes[sender]["group"] != graph.nodes[dst]["group"]:
                out.add(dst)
    return out


def _context(spec: Spec, graph: nx.DiGraph, placement: Placement, name: str,
             shape: ModelShape, kinds: dict[str, frozenset[str]], host_processes: int,
             fitting: frozenset[str]) -> CostContext:
    """The cost model's view of `name`; `host_processes` and `fitting` (the groups whose
    memory fits) are the placement's, the same for every node."""
    attrs = graph.nodes[name]
    occupies = attrs["occupies"]
    home = attrs["group"] or (occupies[0] if occupies else None)
    colocated = kinds.get(home, frozenset())
    ends = occupies
    if KINDS[attrs["kind"]].carries_weights:  # the link spans sender and receiver groups
        node = attrs["spec"]
        ends = tuple(dict.fromkeys(graph.nodes[n]["group"] for n in (node.src, node.dst)
                                   if n in graph and graph.nodes[n]["group"]))
    hosts = set().union(*(placement.groups[g].nodes() for g in ends)) if ends else set()
    replicas = placement.groups[home].replicas if home in placement.groups else 1
    extra = {"local": placement.local, "cross_node": len(hosts) > 1, "occupies": occupies,
             "replicas": replicas, "host_processes": host_processes,
             "host_slots": placement.slots}
    memory = placement.memory.get(home) if home else None
    if memory is not None and home in fitting and name in memory.tasks:  # (a baseline that
        # does not fit keeps the paged estimate: a one-slot engine would inflate speedups)
        slots = engine_slots(memory.tasks[name], spec, shape)
        if slots:
            extra["engine_slots"] = slots  # the native engine's KV slots (memory pass)
    return CostContext(spec=spec, name=name, shape=shape, gpu=placement.preset,
                       gpus=placement.gpus_of(home), colocated=colocated, extra=extra)


def _host_processes(spec: Spec, placement: Placement) -> int:
    """On a local CPU cluster, how many processes compute on the host every step: each group
    holding a model node (once per replica), and each node outside the groups that is not a
    weight carrier (a reward scored in an actor of its own, which takes the batch in and out
    of the object store: the vs-TRL `tuned` plan's generate and train ran 1.8x slower beside
    such a reward actor than with the reward in their group, 2026-11-25)."""
    grouped = {t for group in placement.groups.values() for t in group.tasks}
    models = sum(group.replicas for group in placement.groups.values()
                 if any(KINDS[spec.nodes[t].kind].uses_gpu for t in group.tasks))
    alone = sum(1 for name, node in spec.nodes.items()
                if name not in grouped and not KINDS[node.kind].carries_weights)
    return models + alone


def node_costs(spec: Spec, graph: nx.DiGraph, placement: Placement,
               calibration: dict[str, float] | None = None,
               scale: dict[str, float] | None = None,
               generate_lags: dict[str, tuple[int, ...]] | None = None,
               rounds_window: dict[str, tuple[int, int, tuple[int, ...], int | None]]
               | None = None
               ) -> tuple[dict[str, NodeCost], list[str]]:
    """Seconds per step of every node and advice; `scale` multiplies modelled costs (used to
    carry a calibration over to the synchronous baseline); `generate_lags`: a generate node's
    cycle of weight lags as the plan's own schedule runs it (`schedule_lags`), else the
    plan's structure gives it (`pricing.generate.generate_lag`); `rounds_window`: a generate
    node's rounds priced as a run's rounds first..last - 1 from its start, the first ones at
    the given lags, and a round after an on-policy batch at the last (`compiler.first_steps`),
    instead of the steady rounds."""
    shape = shape_of(spec)
    switches = _colocated_switch_groups(spec, placement)
    fed = _fed_by_other_group(graph)
    kinds = {g: frozenset(spec.nodes[t].kind for t in group.tasks)
             for g, group in placement.groups.items()}
    host_processes = _host_processes(spec, placement)
    fitting = frozenset(g for g, memory in placement.memory.items() if memory.fits)
    costs: dict[str, NodeCost] = {}
    messages: list[str] = []
    for name in graph:
        node = spec.nodes[name]
        ctx = _context(spec, graph, placement, name, shape, kinds, host_processes, fitting)
        if generate_lags and name in generate_lags:
            ctx.extra["generate_lag"] = generate_lags[name]
        if rounds_window and name in rounds_window:
            ctx.extra["rounds_window"] = rounds_window[name]
        if node.cost is not None and node.cost.seconds is not None:
            seconds, source = node.cost.seconds, "override"
            detail = f"cost.seconds {seconds:g}"
        elif node.cost is not None:
            seconds, source = node.cost.gpu_seconds / ctx.gpus, "override"
            detail = f"cost.gpu_seconds {node.cost.gpu_seconds:g} / {ctx.gpus} GPUs"
        else:
            seconds, source = float(KINDS[node.kind].cost(node, ctx)), "model"
            detail = str(ctx.extra.get("detail") or KINDS[node.kind].doc)
            if ctx.extra.get("note"):
                messages.append(str(ctx.extra["note"]))
            if name in switches and switch_terms(spec, placement, switches[name], shape):
                terms = switch_terms(spec, placement, switches[name], shape)
                switch = sum(terms.values())
                seconds += switch
                detail += (f" + colocation switch {switch:.3g} s ({system_of(spec).label}: "
                           + ", ".join(f"{k} {v:.3g} s" for k, v in terms.items()) + ")")
            elif name in fed:
                switch = switch_cost(node, shape, placement.preset, placement.local)
                seconds += switch
                detail += f" + dual-buffer switch {switch:.3g} s"
        if not math.isfinite(seconds) or seconds < 0:
            raise SpecError(f"the cost of '{name}' is not a finite time ({seconds})",
                            ("nodes", name), hint="give cost: {seconds: S}")
        modelled = seconds
        if calibration and name in calibration:
            seconds, source = float(calibration[name]), "calibrated"
            detail = f"measured median {seconds:.4g} s per step (model: {modelled:.4g} s)"
        elif scale and name in scale:
            seconds, source = seconds * scale[name], "calibrated"
            detail = f"model {modelled:.4g} s x measured/model ratio {scale[name]:.3g}"
        costs[name] = NodeCost(seconds, source, detail, modelled)
    if calibration:
        unknown = sorted(set(calibration) - set(graph))
        if unknown:
            messages.append(f"calibration: the trace has nodes this graph does not: "
                            f"{', '.join(unknown)} (ignored)")
    return costs, messages


def calibration_scale(costs: dict[str, NodeCost]) -> dict[str, float]:
    """measured / modelled per calibrated node, to carry a calibration to another plan."""
    return {n: c.seconds / c.modelled for n, c in costs.items()
            if c.source == "calibrated" and c.modelled > 0}
