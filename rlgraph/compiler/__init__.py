"""The compiler: graph.yaml -> placement, costs, proven lag bound and overlapped schedule.

`compile_plan(spec, calibration=None)` runs the passes, each a pure function of the spec
and what the passes before it returned:

0. `references.check_references`  reward functions and data files exist (parsed, not run);
1. `graph.build_graph`       dataflow of one step + the param_update back edge;
2. `placement.place`         shares -> GPUs -> devices, every divisibility rule, and
                             `memory_check.check_memory`: bytes per GPU of every group;
3. `cost.node_costs`         seconds per step per node (model, override or calibrated);
4. `lag.prove_lag`           the off-policy bound, per pair and per edge;
5. `bound.schedule_bound`    max(cycle ratio, group load), exact;
6. `schedule.steady_state`   discrete-event simulation -> period, events; the same for
                             max_lag 0..max_lag (smallest lag reaching the best period) and
                             for the colocated synchronous baseline (speedup_vs_sync).

It imports neither torch nor ray, so `rlgraph compile` runs anywhere in well under a second.
"""

from __future__ import annotations

from typing import Any

import networkx as nx

from rlgraph.compiler.baseline import (
    disagreeing_baselines,
    is_sync,
    sync_baseline,
    sync_graph,
    sync_spec,
    system_messages,
    verdict,
)
from rlgraph.compiler.calibrate import as_calibration, load_calibration
from rlgraph.compiler.costs import NodeCost, calibration_scale, node_costs
from rlgraph.compiler.first_steps import window_costs
from rlgraph.compiler.lag import (
    BEST_PERIOD_TOLERANCE,
    channel_capacities,
    check_inflight,
    check_stream,
    lag_messages,
    prove_lag,
    schedule_lags,
    smallest_lag_for_best_period,
    version_gate,
)
from rlgraph.compiler.period_bound import Bound, schedule_bound
from rlgraph.compiler.placement import Placement, place
from rlgraph.compiler.plan import (
    LagPlan,
    MemoryPlan,
    Plan,
    PricingPlan,
    SchedulePlan,
    check_buckets,
    weight_routes,
)
from rlgraph.compiler.references import check_references
from rlgraph.compiler.schedule import (
    LowestStepFirst,
    SteadyState,
    TaskState,
    simulate,
    steady_state,
    utilization,
)
from rlgraph.compiler.timed_graph import TimedGraph, timed_graph
from rlgraph.compiler.trust import trust
from rlgraph.config.schema import Spec
from rlgraph.errors import SpecError
from rlgraph.graph import build_graph
from rlgraph.nodes import KINDS
from rlgraph.pricing.system import (
    SYSTEMS,
    refit_path,
    system_of,
    unknown_system_hint,
)

EVENT_STEPS = 12  # steps of the predicted timeline kept in the plan
MAX_SIMULATED_LAG = 64  # the largest max_lag simulated (see effective_lag)
LAG_FREE = 10**9  # a max_lag that no back edge or channel of a step-sized graph feels

__all__ = [
    "LowestStepFirst",
    "Plan",
    "TaskState",
    "compile_plan",
    "describe_bottleneck",
    "disagreeing_baselines",
    "first_steps_period",
    "load_calibration",
    "simulate",
    "steady_state",
    "sync_graph",
    "sync_spec",
    "verdict",
]


def _without_partial_rollout(spec: Spec, graph: nx.DiGraph, placement: Placement,
                             costs: dict[str, NodeCost]) -> TimedGraph:
    """The plan at max_lag 0 with partial rollout on: the rollout cache must drop every
    unfinished sample, so generate decodes like a synchronous batch."""
    schedule = spec.schedule.model_copy(update={"partial_rollout": False})
    plain = spec.model_copy(update={"schedule": schedule})
    plain_costs, _ = node_costs(plain, graph, placement, scale=calibration_scale(costs))
    seconds = {n: (costs[n] if costs[n].source == "override" else plain_costs[n]).seconds
               for n in costs}
    return timed_graph(graph, seconds, list(placement.groups)).with_lag(0)


def effective_lag(tg: TimedGraph) -> tuple[int, str | None]:
    """The max_lag the simulator needs for a plan of `tg.max_lag`, and why it is smaller.

    Every period is at least the lag-free bound (the bound with no back edge or channel
    limit). Once a lag's simulated period reaches it, no larger lag can shorten the period,
    so the simulation stops there (at EVENT_STEPS at least: a back edge or channel of more
    than EVENT_STEPS steps never binds within the timeline's steps), and at
    MAX_SIMULATED_LAG in any case: compile time stays bounded whatever max_lag says."""
    if tg.max_lag <= EVENT_STEPS:
        return tg.max_lag, None
    free = schedule_bound(tg.with_lag(LAG_FREE)).seconds
    reached = None
    for lag in range(min(tg.max_lag, MAX_SIMULATED_LAG) + 1):
        variant = tg.with_lag(lag)
        if schedule_bound(variant).seconds > free * (1 + 1e-9) + 1e-12:
            continue  # the back edge still bounds the period: no need to simulate
        if steady_state(variant).period <= free * (1 + 1e-9) + 1e-12:
            reached = lag
            break
    if reached is not None:
        lag = max(reached, EVENT_STEPS)
        return lag, (f"max_lag {tg.max_lag} is simulated as {lag}: from max_lag {reached} on "
                     f"the period is at its lag-free bound ({free:.4g} s), which no larger lag "
                     f"can shorten; the lag bound and channels keep {tg.max_lag}")
    return MAX_SIMULATED_LAG, (f"max_lag {tg.max_lag} is simulated as {MAX_SIMULATED_LAG}, the "
                               f"largest the compiler simulates; the lag bound and channels "
                               f"keep {tg.max_lag}")


def _lag_sweep(tg: TimedGraph, period: float, at_zero: TimedGraph | None = None
               ) -> dict[int, float | None]:
    """Period for max_lag 0..tg.max_lag; None where the bound alone rules a lag out."""
    periods: dict[int, float | None] = {tg.max_lag: period}
    for lag in range(tg.max_lag):
        variant = at_zero if lag == 0 and at_zero is not None else tg.with_lag(lag)
        if schedule_bound(variant).seconds > period * (1 + BEST_PERIOD_TOLERANCE) + 1e-12:
            periods[lag] = None
        else:
            periods[lag] = steady_state(variant).period
    return dict(sorted(periods.items()))


def describe_bottleneck(tg: TimedGraph, bound: Bound, period: float,
                        util: dict[str, float]) -> str:
    """What bounds the period, in words, and which group idles most."""
    if period <= 0:
        return "every node costs 0 s: nothing bounds the period"
    names, dur = tg.names, tg.duration
    binding_group = None
    if bound.binding == "group":
        binding_group = tg.groups[bound.group]
        tasks = sorted((i for i in range(tg.n) if bound.group in tg.occupies[i]),
                       key=lambda i: -dur[i])
        if dur[tasks[0]] >= 0.5 * bound.group_load:
            text = f"{names[tasks[0]]} on {binding_group} bounds the period"
        else:
            busy = [names[i] for i in tasks if dur[i] > 0]
            more = f" + {len(busy) - 3} more" if len(busy) > 4 else ""
            text = f"{' + '.join(busy[:3] if more else busy)}{more} on {binding_group} " \
                   f"bound the period"
    elif len(bound.cycle) == 2:
        i = bound.cycle[0]
        where = f"on {tg.groups[tg.occupies[i][0]]}" if tg.occupies[i] else "in no group"
        text = f"{names[i]} ({where}, one step at a time) bounds the period"
    else:
        path = " -> ".join(names[i] for i in bound.cycle)
        text = (f"the cycle {path} ({bound.cycle_distance} step(s) of distance) bounds the "
                f"period")
    idle = sorted(((1 - u, g) for g, u in util.items() if g != binding_group), reverse=True)
    if idle and idle[0][0] >= 0.005:
        text += f"; {idle[0][1]} idles {idle[0][0]:.0%}"
    if bound.seconds > 0 and period > bound.seconds * 1.01:
        text += (f"; the schedule runs {period / bound.seconds - 1:.0%} above the bound "
                 f"(tasks wait for busy groups)")
    return text


def _carry_messages(graph: nx.DiGraph, events: list[dict[str, Any]], max_lag: int
                    ) -> list[str]:
    """Partial rollout carries an unfinished sample only if generate(t) holds a version newer
    than t - max_lag; at exactly the bound every carried token would be too old next step."""
    out = []
    for gen, kind in graph.nodes(data="kind"):
        feeders = [u for u, _, d in graph.in_edges(gen, data="distance") if d > 0]
        if not KINDS[kind].samples or not feeders:
            continue
        delivered = sorted(e["end"] for e in events if e["node"] in feeders)
        starts = [(e["step"], e["start"]) for e in events if e["node"] == gen]
        late = [(t, s) for t, s in starts[len(starts) // 2:] if t > max_lag]
        if late and all(sum(end <= s for end in delivered) <= t - max_lag for t, s in late):
            out.append(f"partial rollout on '{gen}' carries nothing: generate(t) waits for "
                       f"version t - {max_lag}, the oldest max_lag {max_lag} allows, so an "
                       f"unfinished sample would be too old next step and generate decodes "
                       f"whole batches; partial rollout pays only with max_lag >= 2 where "
                       f"generate is the bottleneck")
    return out


def compile_plan(spec: Spec, calibration: Any = None, baseline: str | None = None) -> Plan:
    """The Plan (`rlgraph.compiler.plan`): placement, costs, lag, schedule, channels, routes.

    `calibration`: seconds per node (`load_calibration`), measured event dicts, a trace path
    or None. `baseline`: the system (`rlgraph.pricing.system.SYSTEMS`) whose colocated
    synchronous step `speedup_vs_sync` compares with (default: the plan's own system); the
    baseline under every system is kept in `plan.pricing.baselines`. A SpecError raised by a
    pass carries the spec's source map (file:line:col)."""
    if baseline is not None and baseline not in SYSTEMS:
        raise SpecError(f"unknown baseline system '{baseline}'", ("pricing", "system"),
                        hint=unknown_system_hint(baseline))
    try:
        return _compile(spec, calibration, baseline)
    except SpecError as err:
        err.source = err.source or spec.source
        raise


def first_hour_advice(placement: Placement, period: float, sync: float) -> list[str]:
    """Advice a newcomer needs before a run: GPUs (slots) that no group holds, and a plan slower
    than the colocated synchronous baseline (`rlgraph tune` searches the alternatives)."""
    advice = []
    held = sum(g.gpus for g in placement.groups.values())
    if not placement.local and held < placement.slots:
        advice.append(f"the group shares leave {placement.slots - held} of {placement.slots} "
                      f"GPUs idle: raise a share (groups.<name>.share) or add a group")
    if period > 0 and sync > 0 and sync < period * 0.99:
        advice.append(f"colocated sync would run {period / sync:.2f}x faster than this plan: "
                      f"`rlgraph tune` on this graph searches groups, shares, lag and partial "
                      f"rollout for a faster one")
    return advice


def _scheduled(graph: Any, costs: dict[str, Any], placement: Placement
               ) -> tuple[TimedGraph, TimedGraph, str | None, SteadyState]:
    """The plan's timed graph (as the user's lag sets it, and as simulated), the lag note and
    its simulated steady state."""
    user_tg = timed_graph(graph, {n: c.seconds for n, c in costs.items()},
                          list(placement.groups))
    simulated_lag, lag_note = effective_lag(user_tg)
    tg = user_tg.with_lag(simulated_lag)
    return user_tg, tg, lag_note, steady_state(tg)


def _spans_versions(spec: Spec) -> bool:
    """Whether a sample's tokens may span versions: partial rollout or in-flight updates."""
    return bool(spec.schedule.partial_rollout or any(
        getattr(node, "inflight", False) for node in spec.nodes.values()))


def _priced(spec: Spec, graph: Any, placement: Placement,
            measured: dict[str, float] | None = None, scale: dict[str, float] | None = None
            ) -> tuple[dict[str, NodeCost], list[str],
                       tuple[TimedGraph, TimedGraph, str | None, SteadyState]]:
    """Node costs (`node_costs`, with `measured` seconds or `scale` ratios) and the plan they
    schedule (`_scheduled`). Where samples span versions on rlgraph's runtime (whose policy
    the simulated schedule is), a generate sharing train's group samples with the weight lags
    that schedule gives it (`lag.schedule_lags`); when they are not the plan's structural
    ones, its rounds are priced again with them and the plan scheduled again. Another
    system's loop keeps its own order (verl's trainer runs generate, reward and update in
    turn), so its plans keep the structural lags."""
    costs, messages = node_costs(spec, graph, placement, measured, scale)
    scheduled = _scheduled(graph, costs, placement)
    steady = scheduled[3]
    lags = (schedule_lags(graph, steady.sim, steady.cyclicity)
            if _spans_versions(spec) and system_of(spec).runs_here else {})
    if any(any(cycle) for cycle in lags.values()):
        costs, messages = node_costs(spec, graph, placement, measured, scale,
                                     generate_lags=lags)
        scheduled = _scheduled(graph, costs, placement)
    return costs, messages, scheduled


def modelled_costs(spec: Spec, graph: Any, placement: Placement,
                   scale: dict[str, float] | None = None,
                   window: tuple[int, int] | None = None) -> dict[str, NodeCost]:
    """The node costs `compile_plan` prices the plan with (`_priced`): what a calibration
    divides measured seconds by, and carries to another plan. `window`: those of steps
    window[0] .. window[1] - 1 of a run from scratch instead (`first_steps.window_costs`)."""
    if window is not None:
        return window_costs(spec, graph, placement, window, scale=scale)
    return _priced(spec, graph, placement, scale=scale)[0]


def first_steps_period(spec: Spec, window: tuple[int, int], calibration: Any = None) -> float:
    """The mean step a run from scratch measures over steps window[0] .. window[1] - 1:
    the plan scheduled with those steps' costs (`first_steps.window_costs`: the rollout
    rounds a run decodes first, at its start-up's lags), where the plan's period prices the
    steady rounds. `calibration` as `compile_plan` takes it."""
    graph = build_graph(spec)
    placement = place(spec)
    costs = window_costs(spec, graph, placement, window, as_calibration(calibration))
    _, tg, _, steady = _scheduled(graph, costs, placement)
    return max(steady.period, schedule_bound(tg).seconds)


def _compile(spec: Spec, calibration: Any, baseline: str | None = None) -> Plan:
    check_references(spec)
    graph = build_graph(spec)
    check_stream(spec, graph)
    check_inflight(spec, graph)
    placement: Placement = place(spec)
    check_buckets(spec, placement.local)
    measured = as_calibration(calibration)
    costs, messages, (user_tg, tg, lag_note, steady) = _priced(spec, graph, placement,
                                                                measured)
    # a sample's tokens span versions with partial rollout and with in-flight updates
    proof = prove_lag(graph, _spans_versions(spec))
    messages = placement.messages + messages
    bound = schedule_bound(tg)
    period = steady.period
    if period < bound.seconds <= period * (1 + 1e-9):
        period = bound.seconds  # float noise: the bound is a proven lower bound
    at_zero = (_without_partial_rollout(spec, graph, placement, costs)
               if spec.schedule.partial_rollout and spec.schedule.max_lag > 0 else None)
    periods = _lag_sweep(tg, period, at_zero)
    evaluated = {lag: p for lag, p in periods.items() if p is not None}
    smallest = smallest_lag_for_best_period(evaluated)
    messages += proof.messages + lag_messages(spec.schedule.max_lag, smallest,
                                              {**evaluated, spec.schedule.max_lag: period})
    if lag_note:
        messages.append(lag_note)
    more = schedule_bound(user_tg.with_lag(user_tg.max_lag + 1)).seconds
    if period > 0 and more < period * 0.95:
        messages.append(f"max_lag {user_tg.max_lag + 1} would allow a period down to "
                        f"{more:.4g} s (its bound, {more / period - 1:+.0%})")
    if spec.schedule.partial_rollout:
        messages += _carry_messages(graph, steady.sim.events(EVENT_STEPS), spec.schedule.max_lag)
    system = system_of(spec)
    chosen = system_of(spec, baseline)
    baselines: dict[str, float] = {}
    sync_costs = costs
    for other in dict.fromkeys([chosen.name, system.name, *SYSTEMS]):
        if placement.local and other != system.name:
            continue  # a local CPU cluster is priced as rlgraph's runtime only
        if other == system.name and is_sync(spec):
            seconds, own = period, costs
        elif other in (system.name, chosen.name):
            seconds, own = sync_baseline(spec, graph, costs, other)
        else:  # a comparison only: a graph another system cannot express has none
            try:
                seconds, own = sync_baseline(spec, graph, costs, other)
            except SpecError:
                continue
        baselines[other] = seconds
        if other == chosen.name:
            sync_costs = own
    sync = baselines[chosen.name]
    messages += system_messages(spec, period, baselines, chosen.name)
    messages += first_hour_advice(placement, period, sync)
    util = utilization(tg, period)
    if not steady.exact:
        messages.append(f"the schedule did not settle into a periodic regime within "
                        f"{steady.sim.steps} steps; period_s is estimated from its nearest "
                        f"repeat (never under bound_s)")
    if measured:
        used = sorted(set(measured) & set(costs))
        messages.append(f"calibrated {len(used)} node(s) from measured times: {', '.join(used)}")
    plan = Plan(
        name=spec.name,
        spec=spec,
        placement=placement.to_dict(),
        costs={n: c.to_dict() for n, c in costs.items()},
        lag=LagPlan(
            max_lag=version_gate(graph),
            max_policy_lag=proof.max_policy_lag,
            per_edge=proof.per_edge,
            token_version_span=proof.token_version_span,
            smallest_max_lag_for_best_period=smallest,
            periods_by_max_lag={str(k): v for k, v in periods.items()},
            note=proof.note,
            mini_batches=proof.mini_batches,
            per_mini_batch=proof.per_mini_batch,
        ),
        schedule=SchedulePlan(
            period_s=period,
            bound_s=bound.seconds,
            sync_period_s=sync,
            speedup_vs_sync=sync / period if period > 0 else 1.0,
            utilization={g: round(u, 6) for g, u in util.items()},
            idle={g: round(1 - u, 6) for g, u in util.items()},
            bottleneck=describe_bottleneck(tg, bound, period, util),
            policy=LowestStepFirst.name,
            steps_simulated=steady.sim.steps,
            cyclicity=steady.cyclicity,
            events=steady.sim.events(min(spec.schedule.steps, EVENT_STEPS)),
        ),
        channels=channel_capacities(graph),
        weight_sync=weight_routes(spec),
        memory=MemoryPlan(checked=bool(placement.memory),
                          groups={g: m.to_dict() for g, m in placement.memory.items()}),
        pricing=PricingPlan(runtime=system.label,
                            why=system.why(refit_path(spec), placement.preset.nvlink_bytes_per_s),
                            system=system.name, refit=system.refit_rate(refit_path(spec))[0],
                            baseline=chosen.name, baselines=baselines),
        trust=trust(spec, costs, sync_costs, sync),
        messages=messages,
    )
    return plan.with_graph(graph)

