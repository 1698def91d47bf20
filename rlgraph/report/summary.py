"""The plan as a terminal summary: groups and GPUs, node costs, lag, period, speedup, advice.

`rlgraph compile` and `rlgraph run` print it before anything runs; rich is imported here
only, so `rlgraph compile --json` never pays for it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

from rlgraph.report.timeline import fmt_seconds


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


def cluster_line(plan: Mapping[str, Any]) -> str:
    """'4 nodes × 8 H200 (32 GPUs) · model red-moe-16b' (or the local CPU slots)."""
    spec, placement = plan.get("spec", {}), plan.get("placement", {})
    cluster = spec.get("cluster", {})
    if placement.get("local") or cluster.get("local"):
        where = f"local, {placement.get('slots', cluster.get('cpus', '?'))} CPU slots"
    else:
        nodes, per = cluster.get("nodes", 1), cluster.get("gpus_per_node", "?")
        where = f"{nodes} node{'s' if nodes != 1 else ''} × {per} {cluster.get('gpu', '')}"
        where += f" ({placement.get('slots', '?')} GPUs)"
    model = spec.get("model", {})
    name = model.get("preset") or model.get("path") or "hf_config"
    return f"{where} · model {name}"


def summary_renderables(plan: Mapping[str, Any]) -> list[Any]:
    """rich renderables: a groups table, a nodes table and the figures."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    sched, lag = plan.get("schedule", {}), plan.get("lag", {})
    util, idle = sched.get("utilization", {}), sched.get("idle", {})
    local = plan.get("placement", {}).get("local")
    title = Text.assemble((str(plan.get("name", "")), "bold"), f" · {cluster_line(plan)}")
    groups = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column, justify in (("group", "left"), ("slots" if local else "GPUs", "right"),
                            ("devices", "left"), ("replicas", "right"), ("share", "right"),
                            ("tasks", "left"), ("busy", "right"), ("idle", "right")):
        groups.add_column(column, justify=justify)  # type: ignore[arg-type]
    for g in plan.get("placement", {}).get("groups", []):
        groups.add_row(g["name"], str(g.get("gpus", "")), device_ranges(g.get("devices", [])),
                       str(g.get("replicas", 1)), f"{g.get('share', 0):g}",
                       ", ".join(g.get("tasks", [])), _pct(util.get(g["name"])),
                       _pct(idle.get(g["name"])))

    nodes = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column, justify in (("node", "left"), ("runs on", "left"), ("time/step", "right")):
        nodes.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    nodes.add_column("cost", ratio=1)
    spec_nodes = plan.get("spec", {}).get("nodes", {})
    occupied = _occupied_by_node(plan)
    for name, cost in plan.get("costs", {}).items():
        kind = spec_nodes.get(name, {}).get("kind", name)
        source = cost.get("source", "model")
        detail = str(cost.get("detail", "")).removeprefix(f"{source}: ")
        nodes.add_row(name if kind == name else f"{name} ({kind})", occupied.get(name, "cpu"),
                      fmt_seconds(cost.get("seconds")),
                      detail if source == "model" else f"[{source}] {detail}")

    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    speedup = sched.get("speedup_vs_sync")
    facts.add_row("period", Text(f"{fmt_seconds(sched.get('period_s'))}/step", style="bold"))
    facts.add_row("bound", f"{fmt_seconds(sched.get('bound_s'))}/step "
                  "(max of cycle ratio and group load)")
    facts.add_row("colocated sync", f"{fmt_seconds(sched.get('sync_period_s'))}/step "
                  "(all tasks on all GPUs, max_lag 0)")
    facts.add_row("speedup", Text(f"{speedup:.2f}×" if isinstance(speedup, int | float)
                                  else "–", style="bold green"))
    facts.add_row("max policy lag", _lag_text(lag))
    if sched.get("bottleneck"):
        facts.add_row("bottleneck", str(sched["bottleneck"]))
    pricing, trust = plan.get("pricing", {}), plan.get("trust", {})
    if pricing:
        facts.add_row("prices", f"{pricing.get('runtime')}: {pricing.get('why')}")
    if trust:
        how = ("calibrated: " + ", ".join(trust.get("calibrated_nodes", []))
               if trust.get("calibrated") else "uncalibrated (analytic costs; calibrate with "
               "`rlgraph compile --calibrate RUN/trace.json`)")
        facts.add_row("trust", how)
        for line in trust.get("assumptions", []):
            facts.add_row("", f"• {line}")
    for i, message in enumerate(plan.get("messages", [])):
        facts.add_row("advice" if i == 0 else "", f"• {message}")
    return [title, groups, nodes, facts]


def _lag_text(lag: Mapping[str, Any]) -> str:
    text = str(lag.get("max_policy_lag", "–"))
    extra = []
    if "token_version_span" in lag:
        extra.append(f"token version span {lag['token_version_span']}")
    if "smallest_max_lag_for_best_period" in lag:
        best = lag["smallest_max_lag_for_best_period"]
        extra.append(f"smallest max_lag for the best period {best}")
    return f"{text} ({'; '.join(extra)})" if extra else text


def _occupied_by_node(plan: Mapping[str, Any]) -> dict[str, str]:
    """node -> the groups it occupies, from the plan's events (or its group's tasks)."""
    out: dict[str, str] = {}
    for g in plan.get("placement", {}).get("groups", []):
        for task in g.get("tasks", []):
            out[task] = g["name"]
    for event in plan.get("schedule", {}).get("events", []):
        occupies = event.get("occupies") or []
        if (occupies and event["node"] not in out) or len(occupies) > 1:
            out[event["node"]] = "+".join(occupies)
    return out


def print_summary(plan: Mapping[str, Any], file: IO[str] | None = None,
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
