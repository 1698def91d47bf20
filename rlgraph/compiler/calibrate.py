"""Calibration: node seconds per step measured by a run, to replace the modelled costs.

`rlgraph run` writes `trace.json` (Chrome trace: spans `{"ph": "X", "dur": us, "args":
{node, step, group, occupies}}`). A node that occupies several groups appears once per group
lane; it is counted once per step. Per node the figure is the median over its
steps, without the first step (warm-up: compilation, caches, allocator) when there are at
least three.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rlgraph.errors import RLGraphError
from rlgraph.readback import MAX_SECONDS, finite_number, read_json, trace_spans

WARMUP_MIN_STEPS = 3  # drop the first step only when at least this many were measured


class CalibrationError(RLGraphError):
    """A trace that cannot calibrate a plan: missing, unreadable or without spans."""


def calibration_from_events(events: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Median seconds per step of each node from event dicts `{node, step, start, end}`."""
    per_node: dict[str, dict[int, float]] = {}
    for event in events:
        node, step = event.get("node"), event.get("step")
        if node is None or step is None:
            continue
        seconds = float(event["end"]) - float(event["start"])
        if not 0 <= seconds <= MAX_SECONDS:  # NaN too: it would never converge
            raise CalibrationError(f"node {node} step {step}: a measured duration of "
                                   f"{seconds:g} s (not finite, negative or over "
                                   f"{MAX_SECONDS:g} s); calibrate with the trace.json of a "
                                   f"real run")
        per_node.setdefault(str(node), {})[int(step)] = seconds
    out = {}
    for node, steps in per_node.items():
        ordered = [steps[s] for s in sorted(steps)]
        if len(ordered) >= WARMUP_MIN_STEPS:
            ordered = ordered[1:]
        out[node] = statistics.median(ordered)
    return out


def events_of_trace(trace: Mapping[str, Any], where: str = "trace.json"
                    ) -> list[dict[str, Any]]:
    """Event dicts (seconds) of a Chrome trace's complete ("X") spans (checked: finite,
    non-negative times; a bad span is a CalibrationError naming `where`)."""
    events = []
    for span in trace_spans(trace, where, CalibrationError):
        args = span.get("args") or {}
        start = float(span.get("ts", 0)) / 1e6
        events.append({"node": args.get("node", span.get("name")), "step": args.get("step"),
                       "start": start, "end": start + float(span.get("dur", 0)) / 1e6})
    return events


def load_calibration(path: str | Path) -> dict[str, float]:
    """Median measured seconds per step of each node, from a trace.json or a run directory."""
    file = Path(path)
    if file.is_dir():
        file = file / "trace.json"
    trace = read_json(file, "give a run dir or its trace.json", CalibrationError)
    if not isinstance(trace, dict | list):
        raise CalibrationError(f"{file}: not a Chrome trace (a mapping with traceEvents)")
    try:
        calibration = calibration_from_events(events_of_trace(
            trace if isinstance(trace, dict) else {"traceEvents": trace}, str(file)))
    except CalibrationError as err:
        text = str(err)
        raise CalibrationError(text if text.startswith(str(file)) else f"{file}: {text}"
                               ) from None
    if not calibration:
        raise CalibrationError(f"{file}: the trace has no node spans (args.node, args.step) "
                               f"to calibrate with")
    return calibration


def as_calibration(value: Mapping[str, float] | Iterable[Mapping[str, Any]] | str | Path | None
                   ) -> dict[str, float] | None:
    """Accept seconds per node, event dicts (as `report.chrome_trace.events_from_trace` gives),
    or a path; return seconds per node."""
    if value is None:
        return None
    if isinstance(value, str | Path):
        return load_calibration(value)
    if isinstance(value, Mapping):
        return {str(k): finite_number(v, f"calibration of {k}", upper=MAX_SECONDS,
                                      error=CalibrationError) for k, v in value.items()}
    return calibration_from_events(value)


def carried_scale(measured: Mapping[str, float], measured_spec: Any) -> dict[str, float]:
    """measured / modelled seconds of each node of the run that measured them, its costs
    modelled under its own plan (`measured_spec`: its groups, GPUs and lag): what a
    calibration carries to another plan of the same machine and workload."""
    from rlgraph.compiler import modelled_costs
    from rlgraph.compiler.placement import place
    from rlgraph.graph import build_graph

    costs = modelled_costs(measured_spec, build_graph(measured_spec),
                           place(measured_spec, strict=False))
    return {n: float(measured[n]) / c.modelled for n, c in costs.items()
            if n in measured and c.modelled > 0}


def carry(scale: Mapping[str, float], spec: Any, measured_spec: Any = None,
          window: tuple[int, int] | None = None) -> dict[str, float]:
    """Seconds of each node of `spec` with `scale` (measured / modelled, `carried_scale`)
    applied to its modelled cost under its own plan, as `compile_plan` takes a calibration.
    A node of whole-sequence passes the run did not measure (logp skipped on its on-policy
    batches, say) takes the ratio of the run's train passes: the same model's forward and
    backward kernels over the same sequences (`pass_ratios`). A node that runs another
    program here than in the run that measured it (`measured_spec`) keeps its model
    (`same_program`). `window`: the costs of steps window[0] .. window[1] - 1 of a run
    from scratch (`compiler.first_steps_period`)."""
    from rlgraph.compiler import modelled_costs
    from rlgraph.compiler.placement import place
    from rlgraph.graph import build_graph

    kept = same_program(scale, spec, measured_spec)
    costs = modelled_costs(spec, build_graph(spec), place(spec, strict=False),
                           scale=pass_ratios(kept, spec), window=window)
    return {n: c.seconds for n, c in costs.items() if c.source == "calibrated"}


def measured_env_latency(path: str | Path) -> float | None:
    """Seconds of one env step measured by a run (a run dir's metrics.jsonl): per step,
    env/seconds over env/trajectories x env/turns_mean (a reset counts with its first
    step), the median over the steps after the first; None without multi-turn rows."""
    import json

    file = Path(path)
    file = (file if file.is_dir() else file.parent) / "metrics.jsonl"
    if not file.is_file():
        return None
    per_step = []
    for line in file.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        row = row.get("metrics", row) if isinstance(row, dict) else {}
        if not isinstance(row, dict):
            continue
        try:
            seconds, rows, turns = (float(row[k]) for k in
                                    ("env/seconds", "env/trajectories", "env/turns_mean"))
        except (KeyError, TypeError, ValueError):
            continue
        if rows > 0 and turns > 0 and 0 <= seconds <= MAX_SECONDS:
            per_step.append(seconds / (rows * turns))
    if len(per_step) >= WARMUP_MIN_STEPS:
        per_step = per_step[1:]
    return statistics.median(per_step) if per_step else None


def with_env_latency(spec: Any, path: str | Path | None) -> Any:
    """`spec` with the env latency a run measured (`measured_env_latency`) in every
    multi-turn generate whose env block leaves `latency_s` at 0 (the env block's figure
    wins); `spec` itself where there is nothing to set."""
    latency = None if path is None else measured_env_latency(path)
    names = [n for n, node in spec.nodes.items()
             if getattr(node, "env", None) is not None and node.env.latency_s == 0]
    if latency is None or not names:
        return spec
    spec = spec.model_copy(deep=True)
    for name in names:
        spec.nodes[name].env.latency_s = latency
    return spec


def same_program(scale: Mapping[str, float], spec: Any, measured_spec: Any
                 ) -> dict[str, float]:
    """`scale` without the ratios of nodes sharded otherwise in `spec` than in the run that
    measured them (`measured_spec`; None: all kept): an FSDP trainer (sharded parameters,
    gathered layer by layer, its own collectives) and whole data-parallel replicas (a
    gradient all-reduce, the leader's dispatch) are different programs, so one's measured
    error says nothing of the other's."""
    if measured_spec is None:
        return dict(scale)

    def sharding(s: Any, name: str) -> str | None:
        node = s.nodes.get(name)
        return None if node is None else getattr(node, "sharding", "none")

    return {n: r for n, r in scale.items()
            if sharding(measured_spec, n) is None or sharding(spec, n) is None
            or sharding(measured_spec, n) == sharding(spec, n)}


def pass_ratios(scale: Mapping[str, float], spec: Any) -> dict[str, float]:
    """`scale` with the train passes' measured ratio given to every node of `spec` whose
    kind runs whole-sequence passes (logp, ref_logp, critic) and that `scale` lacks."""
    from rlgraph.nodes import KINDS

    out = dict(scale)
    trained = [out[n] for n, node in spec.nodes.items()
               if n in out and KINDS[node.kind].sequence_passes
               and KINDS[node.kind].advances_policy]
    if trained:
        for name, node in spec.nodes.items():
            if name not in out and KINDS[node.kind].sequence_passes:
                out[name] = trained[0]
    return out


def carried_calibration(path: str | Path, spec: Any, window: tuple[int, int] | None = None
                        ) -> dict[str, float]:
    """The calibration `rlgraph compile --calibrate PATH` applies to `spec`: from a run
    directory holding plan.json, each node's measured / modelled ratio under the run's own
    plan, applied to this plan's modelled cost (so a run of one plan calibrates another of
    the same machine: cross-plan; a multi-turn generate prices both with the env latency the
    run measured, `with_env_latency`); from a bare trace.json, the measured times themselves.
    `window`: carried to the costs of those steps of a run from scratch (`carry`)."""
    from rlgraph.compiler.plan import Plan, PlanError

    measured = load_calibration(path)
    plan_file = Path(path) / "plan.json"
    if not plan_file.is_file():
        return measured
    try:
        run = Plan.from_json(plan_file.read_text(), str(plan_file))
    except (OSError, PlanError) as exc:
        raise CalibrationError(f"{plan_file}: cannot read the run's plan: {exc}") from None
    return carry(carried_scale(measured, with_env_latency(run.spec, path)),
                 with_env_latency(spec, path), run.spec, window=window)
