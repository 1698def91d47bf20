"""`rlgraph tune` output: the ranked plans as a rich table, the best plan as graph.yaml.

The tuned graph.yaml is the user's file (with the command line's `key=value` overrides
applied) with only what the search decides replaced: `groups` (shares = GPUs / cluster
GPUs, so placement gives exactly the GPUs searched), `schedule.max_lag`,
`schedule.partial_rollout` and generate's `tp`. Every other key and value is kept; comments
are not. rich is imported only when the table is printed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from rlgraph.compiler.calibrate import load_calibration
from rlgraph.config.load import apply_overrides, load_spec
from rlgraph.config.safe_yaml import read_graph
from rlgraph.errors import RLGraphError, SpecError
from rlgraph.nodes import KINDS
from rlgraph.tune.ranking import RankedPlan, TuneResult
from rlgraph.tune.search import tune


def tuned_graph_data(path: str | Path, overrides: Sequence[str], result: TuneResult
                     ) -> dict[str, Any]:
    """The user's graph.yaml data with the best plan's groups, lag, partial rollout, tp and
    env workers."""
    data, source = read_graph(path)
    apply_overrides(data, overrides, source)
    best = result.best
    for name, workers in env_workers_of(best).items():  # a multi-turn generate's env workers
        raw = data["nodes"].get(name)
        if isinstance(raw, dict) and isinstance(raw.get("env"), dict):
            raw["env"]["workers"] = workers
    if best.origin == "input":
        return data
    slots = best.spec.cluster.slots()
    data["groups"] = {g["name"]: {"share": g["gpus"] / slots, "tasks": list(g["tasks"])}
                      for g in best.groups}
    schedule = data.get("schedule")
    if not isinstance(schedule, dict):
        schedule = data["schedule"] = {}
    schedule["max_lag"] = best.max_lag
    if "partial_rollout" in schedule or best.partial_rollout:
        schedule["partial_rollout"] = best.partial_rollout
    if "stream" in schedule:  # a layout that cannot stream (generate beside train) drops it
        if best.mini_batches is None:
            del schedule["stream"]
        else:
            schedule["stream"] = {**(schedule["stream"] or {}), "mini_batches": best.mini_batches}
    for name, node in best.spec.nodes.items():
        if not KINDS[node.kind].samples:
            continue
        raw = data["nodes"].get(name)
        if best.tp is not None:
            raw = data["nodes"][name] = raw if isinstance(raw, dict) else {}
            raw["tp"] = best.tp
        if isinstance(raw, dict) and "inflight" in raw:  # tried only where the user set it
            raw["inflight"] = bool(getattr(node, "inflight", False))
    return data


def env_workers_of(plan: RankedPlan) -> dict[str, int]:
    """The env workers of each multi-turn generate of `plan` (`tune.space.env_workers`: the
    fewest whose threads step every trajectory in flight at once), the user's plan too."""
    from rlgraph.tune.space import env_workers

    return {name: env_workers(node, plan.spec, plan.partial_rollout).env.workers
            for name, node in plan.spec.nodes.items() if getattr(node, "env", None) is not None}


def tuned_yaml(path: str | Path, overrides: Sequence[str], result: TuneResult) -> str:
    """The tuned graph.yaml text, with a header saying where it came from."""
    best, mine = result.best, result.input
    yours = f"yours {mine.period_s:.4g} s" if mine else "yours is refused by placement"
    header = (f"# tuned by `rlgraph tune {path}` (seed {result.seed}, {result.method}): "
              f"period {best.period_s:.4g} s/step ({yours}, colocated sync "
              f"{result.sync_period_s:.4g} s)\n")
    data = tuned_graph_data(path, overrides, result)
    anchor_paths(data, Path(path).parent)
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100,
                          allow_unicode=True)
    return header + body


def anchor_paths(data: dict[str, Any], graph_dir: Path) -> None:
    """Make the graph's relative file references absolute, in place, so the tuned graph works
    from any folder: data files, model.path, and `file.py:name` functions of nodes and their
    environments. A path resolves as the runtime resolves it (the working directory, else the
    graph's folder); one found in neither place is left as written."""

    def anchored(name: Any) -> Any:
        if not isinstance(name, str) or not name or Path(name).expanduser().is_absolute():
            return name
        for base in (Path.cwd(), graph_dir):
            if (base / name).exists():
                return str((base / name).resolve())
        return name

    def anchored_ref(ref: Any) -> Any:
        if isinstance(ref, str) and ".py:" in ref:
            file, _, attr = ref.rpartition(":")
            return f"{anchored(file)}:{attr}"
        return ref

    section = data.get("data")
    if isinstance(section, dict):
        for key in ("train_files", "val_files"):
            if isinstance(section.get(key), list):
                section[key] = [anchored(f) for f in section[key]]
    model = data.get("model")
    if isinstance(model, dict) and "path" in model:
        model["path"] = anchored(model["path"])
    for node in (data.get("nodes") or {}).values():
        if isinstance(node, dict):
            if "fn" in node:
                node["fn"] = anchored_ref(node["fn"])
            if isinstance(node.get("env"), dict) and "fn" in node["env"]:
                node["env"]["fn"] = anchored_ref(node["env"]["fn"])


def _groups_text(plan: RankedPlan) -> str:
    """One line per group: `name ×GPUs`, with the tasks when the name does not list them."""
    lines = []
    for g in plan.groups:
        tasks = "" if g["name"] == "-".join(g["tasks"]) else f" ({', '.join(g['tasks'])})"
        lines.append(f"{g['name']}{tasks} ×{g['gpus']}")
    return "\n".join(lines)


def _times(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


def tune_table(result: TuneResult) -> Any:
    """The top plans (and the user's, if not among them) as a rich Table."""
    from rich import box
    from rich.table import Table

    from rlgraph.report.timeline import fmt_seconds

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_lines=True)
    for column, justify in (("#", "right"), ("groups (tasks ×GPUs)", "left"), ("GPUs", "right"),
                            ("lag", "right"), ("period", "right"), ("vs yours", "right"),
                            ("vs sync", "right"), ("bottleneck", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    rows = list(enumerate(result.top, 1))
    if result.input and all(p.origin != "input" for p in result.top):
        rows.append((0, result.input))
    for rank, plan in rows:
        label = "yours" if plan.origin == "input" else str(rank)
        if plan.origin == "input" and rank:
            label = f"{rank} (yours)"
        lag = f"{plan.max_lag}" + (" +partial" if plan.partial_rollout else "")
        if plan.tp is not None:
            lag += f" (tp {plan.tp})"
        if plan.mini_batches is not None:
            lag += f" stream {plan.mini_batches}"
        if plan.inflight:
            lag += " +inflight"
        style = "bold green" if plan is result.best else None
        table.add_row(label, _groups_text(plan), str(sum(g["gpus"] for g in plan.groups)), lag,
                      fmt_seconds(plan.period_s), _times(result.speedup_vs_input(plan)),
                      _times(result.speedup_vs_sync(plan)), plan.bottleneck, style=style)
    return table


def print_tune(result: TuneResult, footer: str, file: IO[str] | None = None) -> None:
    """Print the search summary, the table and the footer."""
    import os

    from rich.console import Console

    stream = file or sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", 0) or 140)
    console = Console(file=stream, highlight=False, soft_wrap=False, width=width)
    stats = result.stats
    how = "exact" if result.exact else "best found"
    console.print(f"[bold]{result.best.spec.name}[/bold] · {result.method} ({how}) in "
                  f"{result.seconds:.2f} s: {stats.get('lower_bounded', 0)} layouts "
                  f"lower-bounded, {stats.get('bounded', 0)} plans bounded exactly, "
                  f"{stats.get('simulated', 0)} simulated, {stats.get('refused', 0)} refused "
                  f"by placement")
    if result.input_error:
        console.print(f"your plan is refused: {result.input_error}")
    console.print(tune_table(result))
    beyond = result.beyond_bound
    if beyond:
        console.print(f"beyond your bound: partial rollout at max_lag {beyond['max_lag']} "
                      f"would take {beyond['period_s']:.3g} s a step "
                      f"({beyond['speedup_vs_best']:.2f}x plan 1); allow it with "
                      f"schedule.partial_rollout=true schedule.max_lag={beyond['max_lag']}")
    for name, workers in env_workers_of(result.best).items():
        env = result.best.spec.nodes[name].env
        console.print(f"env workers: {name} {workers} (the graph's {env.workers}): the fewest "
                      f"whose {env.threads} threads each step every trajectory plan 1 holds in "
                      f"flight at once; more never shorten its step")
    console.print(footer)


def _tp_choices(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        choices = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"--tp {text}: give comma-separated integers, e.g. --tp 1,2,4") from None
    if not choices or min(choices) < 1:
        raise SpecError(f"--tp {text}: every tp must be at least 1")
    return choices


def run_tune(args: argparse.Namespace) -> int:
    """`rlgraph tune graph.yaml [key=value ...] [-o tuned.yaml] [--json] [--top K] [--seed S]
    [--calibrate RUN_DIR] [--tp 1,2,4]`: search, print the leaderboard, write the tuned graph."""
    spec = load_spec(args.graph, args.overrides)
    calibration = load_calibration(args.calibrate) if getattr(args, "calibrate", None) else None
    try:
        result = tune(spec, top=max(1, int(getattr(args, "top", 5) or 5)),
                      seed=int(getattr(args, "seed", 0) or 0), calibration=calibration,
                      tp_choices=_tp_choices(getattr(args, "tp", None)))
        text = tuned_yaml(args.graph, args.overrides, result)
    except SpecError as err:
        err.source = err.source or spec.source
        raise
    out = getattr(args, "out", None)
    if args.json:
        if out:
            _write(Path(out), text)
        sys.stdout.write(result.plan.to_json())
        return 0
    from rlgraph.cli.main import out_dir_for

    path = Path(out) if out else out_dir_for(spec.name) / "tuned.yaml"
    _write(path, text)
    print_tune(result, f"wrote {path}: rlgraph compile {path}")
    return 0


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise RLGraphError(f"{path}: cannot write the tuned graph: {exc.strerror}") from None
