"""The plan as a terminal summary: groups and GPUs, node costs, lag, period, speedup, advice.

`rlgraph compile` and `rlgraph run` print it before anything runs; rich is imported here
only, so `rlgraph compile --json` never pays for it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import IO, Any

from rlgraph.compiler.plan import LagPlan, Plan
from rlgraph.pricing.system import SYSTEMS
from rlgraph.report.timeline import fmt_seconds


def baseline_verdicts(plan: Plan) -> dict[str, float]:
    """The other systems' synchronous periods under which the verdict (faster or slower than
    the baseline, by more than 1%) is the opposite of the chosen baseline's; empty when they
    all agree."""
    from rlgraph.compiler import disagreeing_baselines

    sched, baselines = plan.schedule, plan.pricing.baselines
    if sched.period_s <= 0 or len(baselines) < 2:
        return {}
    return disagreeing_baselines(sched.period_s, baselines, plan.pricing.baseline)


def device_ranges(devices: Sequence[Sequence[int]]) -> str:
    """[[node, gpu], ...] -> 'n0:0-3', 'n0-1:0-7' (same GPUs on each node), 'n0:0-1 n1:4,6'."""
    by_node: dict[int, list[int]] = {}
    for node, gpu in devices:
        by_node.setdefault(int(node), []).append(int(gpu))
    runs = {node: _ranges(sorted(gpus)) for node, gpus in sorted(by_node.items())}
    nodes = list(runs)
    if len(nodes) > 1 and len(set(runs.values())) == 1 and nodes == list(
        range(nodes[0], nodes[-1] + 1)
    ):
        return f"n{nodes[0]}-{nodes[-1]}:{runs[nodes[0]]}"
    return " ".join(f"n{node}:{gpus}" for node, gpus in runs.items())


def _ranges(values: list[int]) -> str:
    out, start = [], None
    for i, value in enumerate(values):
        if start is None:
            start = value
        if i + 1 == len(values) or values[i + 1] != value + 1:
            out.append(str(start) if start == value else f"{start}-{value}")
            start = None
    return ",".join(out)


def _pct(value: Any) -> str:
    return f"{100 * value:.0f}%" if isinstance(value, int | float) else "–"


def cluster_line(plan: Plan) -> str:
    """'4 nodes × 8 H200 (32 GPUs) · model red-moe-16b' (or the local CPU slots)."""
    cluster, placement = plan.spec.cluster, plan.placement
    if placement.local or cluster.local:
        where = f"local, {placement.slots or cluster.cpus or '?'} CPU slots"
    else:
        nodes = cluster.nodes
        where = f"{nodes} node{'s' if nodes != 1 else ''} × {cluster.gpus_per_node} {cluster.gpu}"
        where += f" ({placement.slots} GPUs)"
    model = plan.spec.model
    name = model.preset or model.path or "hf_config"
    return f"{where} · model {name}"


def summary_renderables(plan: Plan) -> list[Any]:
    """rich renderables: a groups table, a nodes table and the figures."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    sched, lag = plan.schedule, plan.lag
    util, idle = sched.utilization, sched.idle
    local = plan.placement.local
    title = Text.assemble((plan.name, "bold"), f" · {cluster_line(plan)}")
    groups = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column, justify in (("group", "left"), ("slots" if local else "GPUs", "right"),
                            ("devices", "left"), ("replicas", "right"), ("share", "right"),
                            ("tasks", "left"), ("busy", "right"), ("idle", "right")):
        groups.add_column(column, justify=justify)  # type: ignore[arg-type]
    for g in plan.placement.groups:
        groups.add_row(g.name, str(g.gpus), device_ranges([list(d) for d in g.devices]),
                       str(g.replicas), f"{g.share:g}", ", ".join(g.tasks),
                       _pct(util.get(g.name)), _pct(idle.get(g.name)))

    nodes = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column, justify in (("node", "left"), ("runs on", "left"), ("time/step", "right")):
        nodes.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    nodes.add_column("cost", ratio=1)
    kinds = plan.kinds
    occupied = _occupied_by_node(plan)
    for name, cost in plan.costs.items():
        kind = kinds.get(name, name)
        detail = cost.detail.removeprefix(f"{cost.source}: ")
        nodes.add_row(name if kind == name else f"{name} ({kind})", occupied.get(name, "cpu"),
                      fmt_seconds(cost.seconds),
                      detail if cost.source == "model" else f"[{cost.source}] {detail}")

    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row("period", Text(f"{fmt_seconds(sched.period_s)}/step", style="bold"))
    facts.add_row("bound", f"{fmt_seconds(sched.bound_s)}/step "
                  "(max of cycle ratio and group load)")
    base = plan.pricing.baseline
    if base in SYSTEMS and SYSTEMS[base].syncs_apart:
        facts.add_row("sync", f"{fmt_seconds(sched.sync_period_s)}/step (the plan's groups, "
                      f"max_lag 0, on {base}: its synchronous runs keep rollout and training "
                      f"apart)")
    else:
        facts.add_row("colocated sync", f"{fmt_seconds(sched.sync_period_s)}/step "
                      f"(all tasks on all GPUs, max_lag 0, on {base})")
    facts.add_row("speedup", Text(f"{sched.speedup_vs_sync:.2f}×", style="bold green"))
    for name, sync in baseline_verdicts(plan).items():
        facts.add_row(f"  vs {name}", f"{sync / sched.period_s:.2f}× "
                      f"(sync on {name}: {fmt_seconds(sync)}/step)")
    facts.add_row("max policy lag", _lag_text(lag))
    if sched.bottleneck:
        facts.add_row("bottleneck", sched.bottleneck)
    pricing, trust = plan.pricing, plan.trust
    if pricing.runtime:
        facts.add_row("prices", f"{pricing.runtime}: {pricing.why}")
    how = ("calibrated: " + ", ".join(trust.calibrated_nodes) if trust.calibrated
           else "uncalibrated (analytic costs; calibrate with "
           "`rlgraph compile --calibrate RUN/trace.json`)")
    facts.add_row("trust", how)
    for line in trust.assumptions:
        facts.add_row("", f"• {line}")
    for i, message in enumerate(plan.messages):
        facts.add_row("advice" if i == 0 else "", f"• {message}")
    return [title, groups, nodes, facts]


def _lag_text(lag: LagPlan) -> str:
    extra = [f"token version span {lag.token_version_span}"]
    if lag.smallest_max_lag_for_best_period is not None:
        extra.append(f"smallest max_lag for the best period "
                     f"{lag.smallest_max_lag_for_best_period}")
    return f"{lag.max_policy_lag} ({'; '.join(extra)})"


def _occupied_by_node(plan: Plan) -> dict[str, str]:
    """node -> the groups it occupies, from the plan's events (or its group's tasks)."""
    out: dict[str, str] = {}
    for g in plan.placement.groups:
        for task in g.tasks:
            out[task] = g.name
    for event in plan.schedule.events:
        occupies = event.get("occupies") or []
        if (occupies and event["node"] not in out) or len(occupies) > 1:
            out[event["node"]] = "+".join(occupies)
    return out


def print_summary(plan: Plan, file: IO[str] | None = None,
                  footer: str | None = None) -> None:
    """Print the summary with rich (to stdout unless `file` is given)."""
    import os

    from rich.console import Console

    stream = file or sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", 0) or 120)
    console = Console(file=stream, highlight=False, soft_wrap=False, width=width)
    for renderable in summary_renderables(plan):
        console.print(renderable)
    if footer:
        console.print(footer, highlight=False)
