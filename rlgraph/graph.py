"""Spec -> networkx DiGraph: the dataflow of one step plus the weight back edge.

Node attributes: `kind`, `spec` (the node's pydantic spec), `group` (its group or None),
`occupies` (the groups whose GPUs it holds while it runs: param_update its sender's only),
`uses_gpu`. Edge attribute
`distance`: 0 for data within a step, `max_lag + 1` on edges leaving a weight-carrying node
(param_update -> generate): generate of step t waits for param_update of t - max_lag - 1.
That distance is where the graph keeps `max_lag`, once; `max_lag(graph)` reads it back.
Graph attributes: `name`, `mini_batches` (optimizer steps per policy version).
Passes add their own attributes (`duration`, ...) to copies, never to this graph.
"""

from __future__ import annotations

import networkx as nx

from rlgraph.config.schema import Spec
from rlgraph.errors import SpecError, did_you_mean
from rlgraph.nodes import KINDS


def parse_edge(text: str, index: int) -> tuple[str, str]:
    """`"a -> b"` -> ("a", "b")."""
    parts = [p.strip() for p in text.split("->")]
    if len(parts) != 2 or not all(parts):
        raise SpecError(f"edge '{text}' is not of the form 'a -> b'", ("edges", index),
                        hint='write e.g. "generate -> reward"')
    return parts[0], parts[1]


def _edges(spec: Spec) -> list[tuple[str, str, tuple]]:
    """(src, dst, key of the YAML that declared it) for every data and back edge."""
    if spec.edges is not None:
        out = []
        for i, text in enumerate(spec.edges):
            src, dst = parse_edge(text, i)
            for end in (src, dst):
                if end not in spec.nodes:
                    raise SpecError(f"edge '{text}' names unknown node '{end}'", ("edges", i),
                                    hint=did_you_mean(end, spec.nodes) or
                                    f"nodes: {', '.join(spec.nodes)}")
            out.append((src, dst, ("edges", i)))
        return out
    out = []
    for name, node in spec.nodes.items():
        for src, dst in KINDS[node.kind].default_edges(name, node, spec.nodes):
            for end, field in ((src, "src"), (dst, "dst")):
                if end not in spec.nodes:
                    raise SpecError(f"node '{name}' refers to unknown node '{end}'",
                                    ("nodes", name, field),
                                    hint=did_you_mean(end, spec.nodes) or
                                    f"nodes: {', '.join(spec.nodes)}")
            out.append((src, dst, ("nodes", name)))
    return out


def _check_groups(spec: Spec) -> dict[str, str]:
    """task -> group; refuses unknown tasks, a task in two groups, a GPU task in none."""
    owner: dict[str, str] = {}
    for group, gspec in spec.groups.items():
        for i, task in enumerate(gspec.tasks):
            key = ("groups", group, "tasks", i)
            if task not in spec.nodes:
                raise SpecError(f"group '{group}' lists unknown task '{task}'", key,
                                hint=did_you_mean(task, spec.nodes) or
                                f"nodes: {', '.join(spec.nodes)}")
            if task in owner:
                raise SpecError(f"task '{task}' is in two groups: '{owner[task]}' and '{group}'",
                                key, hint="a task runs in exactly one group")
            if KINDS[spec.nodes[task].kind].carries_weights:
                raise SpecError(f"'{task}' (param_update) cannot be a group's task", key,
                                hint="it occupies the group of its src by itself")
            owner[task] = group
    for name, node in spec.nodes.items():
        if KINDS[node.kind].uses_gpu and name not in owner:
            raise SpecError(f"GPU task '{name}' is in no group", ("nodes", name),
                            hint=f"add it to a group's tasks (groups: {', '.join(spec.groups)})"
                            if spec.groups else "add groups: {name: {share: 1, tasks: [...]}}")
    return owner


def _occupies(spec: Spec, name: str, owner: dict[str, str]) -> tuple[str, ...]:
    """The groups a node holds while it runs. A weight sync holds its sender's group only:
    the receiver stages the version beside generation (dual buffer) and generation pays only
    the switch, which the cost pass puts on generate."""
    node = spec.nodes[name]
    if KINDS[node.kind].carries_weights:
        group = owner.get(node.src) or owner.get(node.dst)
        return (group,) if group else ()
    return (owner[name],) if name in owner else ()


def build_graph(spec: Spec) -> nx.DiGraph:
    """The step's dataflow with groups and distances; refuses graphs that cannot run."""
    owner = _check_groups(spec)
    graph = nx.DiGraph(name=spec.name, mini_batches=spec.schedule.mini_batches)
    for name, node in spec.nodes.items():
        graph.add_node(name, kind=node.kind, spec=node, group=owner.get(name),
                       occupies=_occupies(spec, name, owner), uses_gpu=KINDS[node.kind].uses_gpu)
    for src, dst, key in _edges(spec):
        if src == dst:
            raise SpecError(f"edge {src} -> {dst} is a self-loop", key,
                            hint="a node already waits for its own previous step")
        back = KINDS[spec.nodes[src].kind].carries_weights
        graph.add_edge(src, dst, distance=spec.schedule.max_lag + 1 if back else 0, key=key)
    _refuse_deadlock(graph)
    _refuse_dead_ends(spec, graph)
    _refuse_stale_policy(graph)
    _check_algorithm(spec)
    return graph


# What an advantage estimator needs from another node: the batch key and what to add.
ADVANTAGE_NEEDS = {"gae": ("advantages", "add a critic node (nodes: {critic: {}}) in a group, "
                           "or write algorithm.advantage: batch for PPO without a critic")}


def _check_algorithm(spec: Spec) -> None:
    """The algorithm's needs are met by the graph: GAE needs a node that provides advantages
    (the critic); a KL in the reward, or a `kl_coef` the user wrote, needs a ref_logp node
    (a family's default `kl_coef` applies only where there is one); dynamic sampling and
    ReMax's greedy baseline draw whole synchronous batches, which partial rollout and
    streaming do not."""
    algo = spec.algorithm
    need = ADVANTAGE_NEEDS.get(algo.advantage)
    if need is not None and not any(need[0] in KINDS[n.kind].provides
                                    for n in spec.nodes.values()):
        raise SpecError(f"algorithm {algo.name} takes its advantages from a critic, and the "
                        f"graph has none", ("algorithm", "name"), hint=need[1])
    has_ref = any("ref_logp" in KINDS[n.kind].provides for n in spec.nodes.values())
    if algo.kl_coef > 0 and not has_ref and spec.source.written(("algorithm", "kl_coef")):
        raise SpecError("a KL in the loss needs the reference model's log-probs, and the "
                        "graph has no ref_logp node", ("algorithm", "kl_coef"),
                        hint="add a ref_logp node (nodes: {ref_logp: {kind: ref_logp}}) in a "
                        "group, or write kl_coef: 0")
    if algo.reward_kl_coef > 0:
        if algo.advantage == "gae":
            raise SpecError("a KL in the reward is charged where train computes the "
                            "advantages; the critic's GAE does not take it",
                            ("algorithm", "reward_kl_coef"),
                            hint="write reward_kl_coef: 0 and kl_coef (the KL in the loss)")
        if not has_ref:
            raise SpecError("a KL in the reward needs the reference model's log-probs, and "
                            "the graph has no ref_logp node", ("algorithm", "reward_kl_coef"),
                            hint="add a ref_logp node (nodes: {ref_logp: {kind: ref_logp}}) "
                            "in a group, or write reward_kl_coef: 0")
    if algo.advantage == "greedy_baseline":
        for name, node in spec.nodes.items():
            if getattr(node, "engine", "native") != "native":
                raise SpecError("ReMax's greedy baseline decodes with the native engine",
                                ("nodes", name, "engine"), hint="write engine: native, or "
                                "use grpo / rloo")
    if algo.dynamic_sampling.enable or algo.advantage == "greedy_baseline":
        for name, node in spec.nodes.items():
            if getattr(node, "env", None) is not None:
                what = "dynamic sampling" if algo.dynamic_sampling.enable else "ReMax"
                raise SpecError(f"{what} draws single-turn batches; '{name}' rolls out "
                                f"multi-turn episodes (env)", ("nodes", name, "env"),
                                hint="use grpo, rloo or reinforce_pp with env")
    if algo.dynamic_sampling.enable and spec.data.samples_per_prompt < 2:
        raise SpecError("dynamic sampling keeps groups whose rewards differ: a group of one "
                        "sample never does", ("data", "samples_per_prompt"),
                        hint="use at least 2 samples per prompt")
    sched = spec.schedule
    if sched.partial_rollout or sched.stream is not None:
        how = "partial_rollout" if sched.partial_rollout else "stream"
        if algo.dynamic_sampling.enable:
            raise SpecError(f"dynamic sampling draws whole batches of prompts and cannot run "
                            f"with schedule.{how}", ("algorithm", "dynamic_sampling", "enable"),
                            hint=f"write enable: false, or drop schedule.{how}")
        if algo.advantage == "greedy_baseline":
            raise SpecError(f"ReMax decodes a greedy baseline beside each synchronous batch and "
                            f"cannot run with schedule.{how}", ("algorithm", "name"),
                            hint=f"drop schedule.{how}, or use grpo / rloo")


def max_lag(graph: nx.DiGraph) -> int:
    """The graph's `max_lag`: the weight edges' step distance less one (0 without any)."""
    distances = [d for _, _, d in graph.edges(data="distance") if d]
    return min(distances) - 1 if distances else 0


def _refuse_stale_policy(graph: nx.DiGraph) -> None:
    """A logp node scores with the policy: its group must hold the policy (train runs there,
    or a param_update delivers to one of its tasks), or it receives the weights itself;
    otherwise it would score every batch with the initial weights."""
    fed = {n for n in graph if any(d > 0 for _, _, d in graph.in_edges(n, data="distance"))}
    holding = {g for n, k, g in _kind_group(graph)
               if g and (KINDS[k].advances_policy or n in fed)}
    for name, kind, group in _kind_group(graph):
        if KINDS[kind].proximal_logp and name not in fed and group not in holding:
            raise SpecError(f"'{name}' (logp) never receives the policy's weights: its group "
                            "has no train and no param_update delivers to it",
                            ("nodes", name), hint=f"add param_update_{name}: {{kind: "
                            f"param_update, src: train, dst: {name}}}, or put it in train's group")


def _kind_group(graph: nx.DiGraph) -> list[tuple[str, str, str | None]]:
    return [(n, a["kind"], a["group"]) for n, a in graph.nodes(data=True)]


def _refuse_deadlock(graph: nx.DiGraph) -> None:
    """A cycle of data edges only (distance 0) can never start: name it."""
    within_step = nx.DiGraph([(u, v) for u, v, d in graph.edges(data="distance") if d == 0])
    if nx.is_directed_acyclic_graph(within_step):  # linear; find_cycle is slow on big graphs
        return
    try:
        cycle = nx.find_cycle(within_step)
    except nx.NetworkXNoCycle:
        return
    names = [u for u, _ in cycle] + [cycle[0][0]]
    raise SpecError(f"deadlock: the cycle {' -> '.join(names)} has no step distance",
                    graph.edges[cycle[-1]]["key"],
                    hint="every cycle needs a param_update back edge; remove one of its edges")


def _refuse_dead_ends(spec: Spec, graph: nx.DiGraph) -> None:
    """Every node must feed `train`, or its work is never used."""
    trains = [n for n, k in graph.nodes(data="kind") if KINDS[k].advances_policy]
    if not trains:
        raise SpecError("the graph has no train node", ("nodes",),
                        hint="add `train: {kind: train}`")
    reaches = set(trains)
    for t in trains:
        reaches |= nx.ancestors(graph, t)
    for name in graph:
        if name not in reaches:
                raise SpecError(f"node '{name}' cannot reach train: its output is never used",
                            ("nodes", name), hint="add an edge from it towards train, or remove it")


def data_edges(graph: nx.DiGraph) -> list[tuple[str, str]]:
    """Edges within a step (distance 0), in insertion order."""
    return [(u, v) for u, v, d in graph.edges(data="distance") if d == 0]


def step_order(graph: nx.DiGraph) -> list[str]:
    """A deterministic topological order of one step (back edges ignored)."""
    dag = nx.DiGraph()
    dag.add_nodes_from(graph)
    dag.add_edges_from(data_edges(graph))
    return list(nx.lexicographical_topological_sort(dag, key=list(graph).index))
