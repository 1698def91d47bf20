"""Hypothesis over random graphs, costs, groups, shares and lags.

Invariants of every simulated schedule: no data edge, back edge, step order, channel
capacity or group exclusivity is broken; no token is trained on more than max_lag versions
after the policy that sampled it; period_s >= bound_s, and within 0.5% of the average over
a 240-step run (the steady-state error); the fast simulator agrees with a
naive one that asks `LowestStepFirst.pick` at every decision (the runtime's entry point);
Howard's cycle ratio equals the enumerated one; placement never gives a GPU twice.

Classes where the bound is tight (period == bound within 1%), found by these tests:
- one group holds every node, CPU nodes included: the group never idles, so the period is
  its total work, which is the bound;
- every group holds exactly one task and every param_update costs 0 s (any lag, any other
  costs, CPU nodes outside groups): the only contention is the instantaneous weight sync,
  which the reservation of the oldest blocked task lets through at once.
Other classes can exceed the bound (a greedy list schedule is not optimal, and a
param_update must wait until both of its groups are free at the same time).
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlgraph.compiler import compile_plan
from rlgraph.compiler.costs import node_costs
from rlgraph.compiler.period_bound import enumerated_cycle_ratio, max_cycle_ratio
from rlgraph.compiler.placement import place
from rlgraph.compiler.schedule import LowestStepFirst, simulate, steady_state
from rlgraph.compiler.timed_graph import TimedGraph, timed_graph
from rlgraph.config.load import validate_spec
from rlgraph.errors import SourceMap, SpecError
from rlgraph.graph import build_graph

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
COSTS = st.one_of(st.just(0.0), st.floats(0.1, 10.0).map(lambda x: round(x, 2)))
EPS = 1e-9


@st.composite
def random_graphs(draw: Any, layout: str = "any") -> Any:
    """A spec: 1-2 generate (each with its param_update, maybe a CPU reward), maybe logp and
    ref_logp, one train; GPU tasks in random groups; fixed random costs; max_lag 0-3."""
    n_gen = draw(st.integers(1, 2))
    zero_sync = layout == "one_task_per_group_zero_sync"
    nodes: dict[str, Any] = {"train": {"kind": "train", "cost": {"seconds": draw(COSTS)}}}
    edges: list[str] = []
    extras = [name for name, kind in (("logp", "logp"), ("ref", "ref_logp"))
              if draw(st.booleans()) and nodes.setdefault(
                  name, {"kind": kind, "cost": {"seconds": draw(COSTS)}})]
    rewards = []
    for i in range(n_gen):
        sync = 0.0 if zero_sync else draw(COSTS)
        nodes[f"gen{i}"] = {"kind": "generate", "cost": {"seconds": draw(COSTS)}}
        nodes[f"pu{i}"] = {"kind": "param_update", "src": "train", "dst": f"gen{i}",
                           "cost": {"seconds": sync}}
        edges += [f"train -> pu{i}", f"pu{i} -> gen{i}"]
        if draw(st.booleans()):
            nodes[f"reward{i}"] = {"kind": "reward", "cost": {"seconds": draw(COSTS)}}
            rewards.append(f"reward{i}")
            edges += [f"gen{i} -> reward{i}", f"reward{i} -> train"]
        else:
            edges.append(f"gen{i} -> train")
        edges += [f"gen{i} -> {e}" for e in extras]
    edges += [f"{e} -> train" for e in extras]
    gpu_tasks = [n for n, v in nodes.items() if v["kind"] not in ("reward", "param_update")]
    if layout == "one_group":
        assign = {t: 0 for t in gpu_tasks + rewards}
    elif zero_sync:
        assign = {t: i for i, t in enumerate(gpu_tasks)}
    else:
        k = draw(st.integers(1, min(4, len(gpu_tasks))))
        assign = {t: draw(st.integers(0, k - 1)) for t in gpu_tasks}
        assign.update({r: draw(st.integers(0, k - 1)) for r in rewards if draw(st.booleans())})
    if "logp" in assign and not any(assign.get(t) == assign["logp"] for t in nodes
                                    if t == "train" or t.startswith("gen")):
        nodes["pu_logp"] = {"kind": "param_update", "src": "train", "dst": "logp",
                            "cost": {"seconds": 0.0 if zero_sync else draw(COSTS)}}
        edges += ["train -> pu_logp", "pu_logp -> logp"]  # logp needs the policy's weights
    groups: dict[str, Any] = {}
    for task, g in assign.items():
        groups.setdefault(f"g{g}", {"share": 0.0, "tasks": []})["tasks"].append(task)
    for group in groups.values():
        group["share"] = 1 / len(groups)
    data = {"name": "random", "cluster": {"local": True, "cpus": 8},
            "data": {"prompts_per_step": 840, "samples_per_prompt": 1},
            "groups": groups, "nodes": nodes, "edges": edges,
            "schedule": {"max_lag": draw(st.integers(0, 3)), "steps": 12}}
    return validate_spec(data, SourceMap())


def timed(spec: Any) -> TimedGraph:
    graph = build_graph(spec)
    placement = place(spec)
    costs, _ = node_costs(spec, graph, placement)
    return timed_graph(graph, {n: c.seconds for n, c in costs.items()}, list(placement.groups))


def reference_simulation(tg: TimedGraph, steps: int, policy: LowestStepFirst) -> list[float]:
    """Start times from a naive event loop that asks `policy.pick` at every decision; a task
    counts as done for its dependents once its end time has been processed."""
    n, names = tg.n, tg.names
    occupies = {names[i]: [tg.groups[g] for g in tg.occupies[i]] for i in range(n)}
    start = [math.nan] * (steps * n)
    finished = [False] * (steps * n)

    def deps(i: int, t: int) -> list[tuple[int, int, bool]]:  # (node, step, needs its end)
        out = [(u, t, True) for u, v in tg.data_edges if v == i]
        out += [(u, t - d, True) for u, v, d in tg.back_edges if v == i and t >= d]
        out += [(u, t - 1, True) for u, v in tg.wraps if v == i and t >= 1]  # streaming
        out += [(i, t - 1, True)] if t else []
        if tg.capacity is not None and t >= tg.capacity:
            out += [(v, t - tg.capacity, False) for u, v in tg.data_edges if u == i]
        return out

    now, running, done = 0.0, [], 0
    while done < steps * n:
        busy = {g for _, task in running for g in occupies[names[task % n]]}
        ready = [(names[i], t) for t in range(steps) for i in range(n)
                 if math.isnan(start[t * n + i]) and all(
                     finished[s * n + u] if need_end else not math.isnan(start[s * n + u])
                     for u, s, need_end in deps(i, t))]
        task = policy.pick(ready, occupies, busy)
        if task is not None:
            i, t = names.index(task[0]), task[1]
            start[t * n + i] = now
            heapq.heappush(running, (now + tg.duration[i], t * n + i))
            continue
        now = running[0][0]
        while running and running[0][0] <= now:
            finished[heapq.heappop(running)[1]] = True
            done += 1
    return start


def check_invariants(spec: Any, tg: TimedGraph, steps: int) -> None:
    sim = simulate(tg, steps)
    n, s, e = tg.n, sim.start, sim.end

    def at(t: int, i: int) -> int:
        return t * n + i

    for t in range(steps):
        for u, v in tg.data_edges:
            assert s[at(t, v)] >= e[at(t, u)] - EPS
        for u, v, d in tg.back_edges:
            if t >= d:
                assert s[at(t, v)] >= e[at(t - d, u)] - EPS
        for i in range(n):
            assert e[at(t, i)] == s[at(t, i)] + tg.duration[i]
            if t:
                assert s[at(t, i)] >= e[at(t - 1, i)] - EPS
        if tg.capacity is not None and t >= tg.capacity:
            for u, v in tg.data_edges:
                assert s[at(t, u)] >= s[at(t - tg.capacity, v)] - EPS
    for g in range(len(tg.groups)):
        spans = sorted((s[at(t, i)], e[at(t, i)]) for t in range(steps) for i in range(n)
                       if g in tg.occupies[i])
        for (_, end_a), (start_b, _) in itertools.pairwise(spans):
            assert start_b >= end_a - EPS
    index = {name: i for i, name in enumerate(tg.names)}
    syncs = {index[v]: [u for u, w, _ in tg.back_edges if w == index[v]]
             for v in spec.nodes if spec.nodes[v].kind == "generate"}
    train = index["train"]
    for t in range(steps):
        for gen, pus in syncs.items():
            held = [step + 1 for step in range(steps) for pu in pus
                    if e[at(step, pu)] <= s[at(t, gen)] + EPS]
            version = max(held, default=0)  # weights of the newest sync it waited for
            assert t - version <= spec.schedule.max_lag, (t, version)
        assert s[at(t, train)] >= 0
    assert reference_simulation(tg, steps, LowestStepFirst.of(tg.names)) == s


@SETTINGS
@given(random_graphs())
def test_simulated_schedule_keeps_every_constraint(spec: Any) -> None:
    tg = timed(spec)
    check_invariants(spec, tg, steps=10)
    plan = compile_plan(spec)
    schedule = plan["schedule"]
    assert schedule["period_s"] >= schedule["bound_s"] * (1 - 1e-9) - 1e-12
    long = simulate(tg, 240)  # the long-run average agrees with the detected regime
    average = (long.row(200)[0] - long.row(80)[0]) / 120
    assert math.isclose(steady_state(tg).period, average, rel_tol=0.005, abs_tol=1e-9)
    assert schedule["sync_period_s"] >= 0 and schedule["speedup_vs_sync"] > 0
    assert plan["lag"]["max_policy_lag"] == spec.schedule.max_lag


@SETTINGS
@given(random_graphs())
def test_howard_equals_enumerated_cycle_ratio(spec: Any) -> None:
    tg = timed(spec)
    edges = tg.constraint_edges()
    ratio, cycle, dist = max_cycle_ratio(tg.n, edges)
    assert math.isclose(ratio, enumerated_cycle_ratio(tg.n, edges), rel_tol=1e-9,
                        abs_tol=1e-12)
    assert cycle[0] == cycle[-1] and dist >= 1


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.one_of(random_graphs("one_group"), random_graphs("one_task_per_group_zero_sync")))
def test_bound_is_tight_where_it_should_be(spec: Any) -> None:
    schedule = compile_plan(spec)["schedule"]
    assert schedule["period_s"] <= schedule["bound_s"] * 1.01 + 1e-12, schedule["bottleneck"]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(nodes=st.integers(1, 4), per_node=st.sampled_from([1, 2, 4, 8]),
       weights=st.lists(st.floats(0.05, 1.0), min_size=1, max_size=5),
       total=st.floats(0.3, 1.0))
def test_placement_never_gives_a_gpu_twice(nodes: int, per_node: int, weights: list[float],
                                           total: float) -> None:
    shares = [w / sum(weights) * total for w in weights]
    tasks = ["generate", "train", "logp", "ref_logp", "reward"]
    data = {"cluster": {"nodes": nodes, "gpus_per_node": per_node, "gpu": "H100"},
            "model": {"preset": "tiny"}, "data": {"prompts_per_step": 840,
                                                  "samples_per_prompt": 1},
            "groups": {f"g{i}": {"share": s, "tasks": [tasks[i]]} for i, s in enumerate(shares)},
            "nodes": {t: {} for t in [*tasks, "param_update"]}}
    spec = validate_spec(data, SourceMap())
    try:
        placement = place(spec)
    except SpecError as err:
        assert err.key[0] in ("groups", "nodes", "data")
        return
    devices = [d for g in placement.groups.values() for d in g.devices]
    assert len(devices) == len(set(devices)) <= nodes * per_node
    assert all(0 <= node < nodes and 0 <= gpu < per_node for node, gpu in devices)
    for group in placement.groups.values():
        assert group.gpus == len(group.devices) >= 1
        assert abs(group.gpus - group.share * nodes * per_node) < len(shares) + 1
