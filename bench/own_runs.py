"""Does the uncalibrated compiler price our own runs? For every committed GPU run
(`bench/results/gpu-*.json`, `gpu4-*.json`: graph, overrides, measured median step) and every
CPU mode of `bench/results/async_vs_sync*.json` (the long-tail graph, and the quickstart's
`--graph graphs/quickstart.yaml` run), compiles the graph as it ran, without calibration, and
sets the predicted period beside the measured step. Target: within +-25%, and the
verdict (split vs colocated) of each CPU graph as measured. Runs of an older runtime, and a
streamed run that stopped while its pipeline filled (no steady state), are listed but not
counted.

    python bench/own_runs.py

Writes bench/results/own_runs.json and prints a markdown table for the README.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, machine, write_result

from rlgraph import lengths
from rlgraph.compiler import compile_plan
from rlgraph.compiler.calibrate import carried_scale, carry
from rlgraph.config.load import load_spec
from rlgraph.nodes import logp as logp_kind

TARGET = 0.25
CROSS_TARGET = 0.10  # cross-plan calibrated: within +-10%
# Runs made by an older runtime than the one the model prices: what differed, per file.
SUPERSEDED = {
    "gpu-e2e.json": "runtime of 2026-11-21: HF dynamic-cache decode, weights through the object "
                    "store serialized with generate, one GPU driven per group",
    "gpu4-nccl.json": "runtime before data parallelism: one GPU driven per group, HF "
                      "dynamic-cache decode",
    "gpu4-object_store.json": "runtime before data parallelism: one GPU driven per group, HF "
                              "dynamic-cache decode",
    "gpu4-megatron-tp2.json": "runtime before GroupActor.gather_with_peers: every weight sync "
                              "returned the tp peer's gathered 1 GB copy through Ray, holding "
                              "the trainer ~3 s a step (the run's notes; fixed after it, not "
                              "measured again)",
}
PARTIAL = "+partial"


def overrides_of(command: str | None) -> list[str]:
    """key=value words of the run's recorded command (the last bench call's)."""
    if not command:
        return []
    words = shlex.split(re.sub(r"[`()]", " ", command))
    return [w for w in words if re.match(r"^[a-z_]+(\.[a-z_0-9]+)+=", w)]


def gpu_rows() -> list[dict[str, Any]]:
    """One row per committed GPU run."""
    rows = []
    files = sorted(RESULTS.glob("gpu-*.json")) + sorted(RESULTS.glob("gpu4-*.json"))
    for file in files:
        result = json.loads(file.read_text())
        runs = result.get("runs")
        if not isinstance(runs, dict):
            continue
        for name, run in runs.items():
            if not isinstance(run, dict) or "graph" not in run or "step_s_median" not in run:
                continue
            overrides = overrides_of(result.get("command"))
            if run.get("partial_rollout") or name.endswith(PARTIAL):
                overrides.append("schedule.partial_rollout=true")
            if run.get("transport") in ("nccl", "object_store") and file.name.startswith("gpu4"):
                overrides.append(f"nodes.param_update.transport={run['transport']}")
            overrides += one_gpu_driven(run)
            ran_logp = float(run.get("node_s_median", {}).get("logp", 0.0)) > 0
            rows.append(price(f"{file.name}: {name}", ROOT / run["graph"], overrides,
                              float(run["step_s_median"]), SUPERSEDED.get(file.name),
                              logp_ran=ran_logp, length=(run.get("rollout_metrics_median")
                                                         or {}).get("response/length_mean"),
                              nodes=run.get("node_s_median"), machine=file.name))
    return rows


def one_gpu_driven(run: dict[str, Any]) -> list[str]:
    """The override that prices a one-group run as it ran where its runtime drove one GPU of
    the group (runs before data parallelism record groups without `replicas`: one actor on
    the group's first GPU, e.g. gpu-e2e-static.json's colocated-sync), else none."""
    groups = run.get("groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        return []
    (group,) = groups.values()
    if "replicas" in group or int(group.get("gpus", 1)) <= 1:
        return []
    return ["cluster.gpus_per_node=1"]


# gpu-longtail-1gpu.json's throughput sections on the current runtime (the earlier ones ran
# the sdpa decode attention, before round 4's varlen kernel; their `table` keeps them)
LONGTAIL = {"throughput_sigma_1.5_varlen": None, "throughput_sigma_1.5_rolloutlogp": None,
            "throughput_sigma_1.5_lag6_rolloutlogp": None}
STREAM_SECTIONS = {"throughput": None}  # gpu-stream-1gpu.json (a version per step)


def longtail_rows() -> list[dict[str, Any]]:
    """One row per mode of the one-GPU long-tail runs (`bench/gpu_longtail.py`: the sync and
    partial-rollout steps, and the streamed plan's versions), measured as the benchmark's
    throughput basis (`step_s_steady_mean`: a partial rollout's short and long rounds
    alternate, so a median of steps misstates the period)."""
    rows = []
    for name, sections in (("gpu-longtail-1gpu.json", LONGTAIL),
                           ("gpu-stream-1gpu.json", STREAM_SECTIONS),
                           ("gpu-stream-1gpu-long.json", STREAM_SECTIONS)):
        file = RESULTS / name
        if not file.is_file():
            continue
        result = json.loads(file.read_text())
        for section, superseded in sections.items():
            for mode, run in (result.get(section) or {}).items():
                if not isinstance(run, dict) or "graph" not in run:
                    continue
                if name == "gpu-stream-1gpu.json" and mode == "sync":
                    continue  # the same sync as gpu-longtail-1gpu's, one call earlier
                measured = steady_step(run)
                rows.append(price(f"{name}: {section}/{mode}", ROOT / run["graph"],
                                  list(run.get("overrides", [])), float(measured), superseded,
                                  length=steady_length(run), unsteady=only_filled(run),
                                  nodes=run.get("node_s_median"),
                                  machine=f"{name}: {section}"))
    return rows


def steady_step(run: dict[str, Any]) -> float:
    """Mean step after the warm-up step 0 (a streamed run: its version's, after the
    max_lag + 1 versions that fill its pipeline, where it recorded them); a partial rollout's
    short and long rounds alternate, so its steps count in whole pairs (an odd count ending on
    a short step would understate the period)."""
    if run.get("mini_batches", 1) > 1:  # streamed: step_s_all holds optimizer steps
        # after the versions that fill the pipeline, whole short/long pairs
        versions = (run.get("version_s") or [])[fill_versions(run):]
        versions = versions[:len(versions) // 2 * 2]
        if versions:
            return sum(versions) / len(versions)
        return float(run["step_s_steady_mean"])
    after = (run.get("step_s_all") or [])[1:]
    if run.get("partial_rollout") and len(after) % 2:
        after = after[:-1]
    if not after:
        return float(run.get("step_s_steady_mean") or run["step_s_median"])
    return sum(after) / len(after)


def fill_versions(run: dict[str, Any]) -> int:
    """Versions a streamed run's pipeline takes to fill: max_lag + 1 (the lag climbs
    0..max_lag, and the last of them finishes every group started at version 0)."""
    return int(run.get("max_lag", 0)) + 1


def only_filled(run: dict[str, Any]) -> bool:
    """Whether a streamed run stopped within the max_lag + 1 versions that fill its pipeline:
    no version of it ran in the steady state the plan's period describes, so its mean step
    (the fill's) is no figure to price against."""
    if run.get("mini_batches", 1) <= 1:
        return False
    versions = len(run.get("version_s") or []) or (
        len(run.get("step_s_all") or []) // int(run["mini_batches"]))
    return versions <= fill_versions(run)


def steady_length(run: dict[str, Any]) -> float | None:
    """Mean trained response length over the steps `steady_step` counts (a streamed run's
    per_step figures are optimizer steps: those after the versions that fill it), or None
    where the run did not record it."""
    means = (run.get("per_step") or {}).get("response/length_mean") or []
    skip = 1
    if run.get("mini_batches", 1) > 1:
        skip = fill_versions(run) * int(run["mini_batches"])
    means = means[skip:]
    return sum(means) / len(means) if means else None


@contextlib.contextmanager
def logp_forward_priced(ran: bool) -> Iterator[None]:
    """Price the old-log-prob forward even where the compiler proves it redundant, for a run
    whose logp node measured time (runs before the skip of commit 28c288e, 2026-11-24, ran
    it on every batch): the prediction prices the runtime the run had."""
    if not ran:
        yield
        return
    skip = logp_kind.skip_reason
    logp_kind.skip_reason = lambda spec: None
    try:
        yield
    finally:
        logp_kind.skip_reason = skip


def cpu_rows() -> list[dict[str, Any]]:
    """One row per CPU mode of every bench/results/async_vs_sync*.json."""
    rows = []
    for file in sorted(RESULTS.glob("async_vs_sync*.json")):
        result = json.loads(file.read_text())
        graph = ROOT / result["graph"]
        for name, mode in result["modes"].items():
            rows.append(price(f"{file.name}: {name}", graph,
                              [*mode["overrides"], *result.get("extra_overrides", [])],
                              float(mode["measured"]["step_s"]), None,
                              length=mode["measured"].get("length_mean")))
    return rows


def price(name: str, graph: Path, overrides: list[str], measured: float,
          superseded: str | None, logp_ran: bool = False, length: float | None = None,
          unsteady: bool = False, nodes: dict[str, float] | None = None,
          machine: str | None = None) -> dict[str, Any]:
    """The uncalibrated prediction of one run against its measured step (`logp_ran`: the
    run's logp node ran its forward, priced even where today's runtime skips it), and where
    the run recorded its mean trained response `length`, the prediction again at that mean
    (the graph's other length terms kept): the cost model's error with the workload the
    policy actually produced, a diagnostic beside the figure, not the figure."""
    spec = load_spec(graph, overrides)
    with logp_forward_priced(logp_ran):
        plan = compile_plan(spec)
        at_length = None
        stated = spec.data.response_len
        if length and stated.mean < stated.max:  # a fixed length has no distribution to move
            mean = stated_mean(stated, float(length))
            at_length = compile_plan(load_spec(graph, [*overrides,
                                                       f"data.response_len.mean={mean:.4g}"]))
    predicted = plan["schedule"]["period_s"]
    measured_length = {}
    if at_length is not None:
        again = at_length["schedule"]["period_s"]
        measured_length = {"measured_length_mean": round(float(length), 2),
                           "graph_length_mean": stated.mean,
                           "predicted_at_measured_length_s": round(again, 4),
                           "ratio_at_measured_length": round(again / measured, 3)}
    return {"run": name, "graph": str(graph.relative_to(ROOT)), "overrides": overrides,
            "measured_step_s": round(measured, 4), "predicted_step_s": round(predicted, 4),
            "ratio": round(predicted / measured, 3),
            "within_target": within(predicted / measured),
            "pricing": plan["pricing"]["runtime"], "superseded_runtime": superseded,
            "no_steady_state": unsteady,
            "logp_forward_priced": logp_ran and logp_kind.skip_reason(spec) is not None,
            "bottleneck": plan["schedule"]["bottleneck"], **measured_length,
            "measured_nodes_s": nodes or {}, "machine_key": machine, "logp_ran": logp_ran,
            "gpus": sum(g["gpus"] for g in plan["placement"]["groups"]),
            "colocated_sync": is_colocated_sync(spec)}


def is_colocated_sync(spec: Any) -> bool:
    """Whether the run is the colocated synchronous plan: one group on every GPU, max_lag 0,
    no partial rollout, no streaming (the plan cross-plan calibration measures on)."""
    groups = list(spec.groups.values())
    return (len(groups) == 1 and groups[0].share >= 1 - 1e-9 and spec.schedule.max_lag == 0
            and not spec.schedule.partial_rollout and spec.schedule.stream is None)


def cross_plan(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Calibrate on the colocated synchronous run of each machine (a result file, or one
    section of it), its node medians over the model's costs under its own plan
    (`carried_scale`), and predict every other plan of that machine with the ratios carried
    to its own modelled costs (`carry`), as `rlgraph compile --calibrate RUN` does."""
    out = []
    current = [r for r in rows if not r["superseded_runtime"] and not r["no_steady_state"]
               and r["machine_key"] and r["measured_nodes_s"]]
    for key in dict.fromkeys(r["machine_key"] for r in current):
        same = [r for r in current if r["machine_key"] == key]
        anchor = next((r for r in same if r["colocated_sync"]), None)
        if anchor is None or len(same) < 2:
            continue
        with logp_forward_priced(anchor["logp_ran"]):
            scale = carried_scale(anchor["measured_nodes_s"],
                                  load_spec(ROOT / anchor["graph"], anchor["overrides"]))
        for r in same:
            if r is anchor:
                continue
            spec = load_spec(ROOT / r["graph"], r["overrides"])
            with logp_forward_priced(r["logp_ran"]):
                plan = compile_plan(spec, calibration=carry(scale, spec))
            period = plan["schedule"]["period_s"]
            out.append({"machine": key, "gpus": r["gpus"], "calibrated_on": anchor["run"],
                        "run": r["run"], "measured_step_s": r["measured_step_s"],
                        "uncalibrated_ratio": r["ratio"],
                        "calibrated_step_s": round(period, 4),
                        "ratio": round(period / r["measured_step_s"], 3),
                        "within_target": abs(period / r["measured_step_s"] - 1)
                        <= CROSS_TARGET,
                        "scale": {n: round(v, 3) for n, v in scale.items()}})
    return out


def within(ratio: float) -> bool:
    """Whether a predicted / measured ratio meets the target."""
    return abs(ratio - 1) <= TARGET


def stated_mean(response_len: Any, measured: float) -> float:
    """The `response_len.mean` (the distribution's mean before the clip at max) whose clipped
    mean is the `measured` mean of the trained responses, the graph's dist / sigma / max kept
    (bisection: the clipped mean grows with it; at most just below max, where the clipped
    distribution's own mean tops out)."""
    model = lengths.of(response_len)
    top = model.max * (1 - 1e-6)  # at max itself the length is fixed
    low, high = 1e-3, min(max(measured, 1.0), top)
    while high < top and lengths.moments(dataclasses.replace(model, mean=high))[0] < measured:
        high = min(2 * high, top)
    for _ in range(50):
        mid = (low + high) / 2
        if lengths.moments(dataclasses.replace(model, mean=mid))[0] < measured:
            low = mid
        else:
            high = mid
    return high


def verdicts(cpu: list[dict[str, Any]]) -> dict[str, Any]:
    """Split vs colocated on each CPU graph: measured and predicted step ratios (above 1:
    the split is faster)."""
    out = {}
    for file in dict.fromkeys(r["run"].split(": ")[0] for r in cpu):
        by = {r["run"].split(": ")[1]: r for r in cpu if r["run"].startswith(file + ":")}
        if "sync" not in by or "one_step_off" not in by:
            continue
        sync, split = by["sync"], by["one_step_off"]
        measured = sync["measured_step_s"] / split["measured_step_s"]
        predicted = sync["predicted_step_s"] / split["predicted_step_s"]
        out[sync["graph"]] = {"measured_split_over_sync": round(measured, 3),
                              "predicted_split_over_sync": round(predicted, 3),
                              "verdict_matches": (measured > 1) == (predicted > 1)}
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README table of our runs."""
    out = ["| run | measured s/step | predicted s/step | predicted / measured | within ±25% | "
           "at the run's mean length (graph's) |", "|---|---:|---:|---:|:---:|---:|"]
    for r in rows:
        mark = "yes" if r["within_target"] else "**no**"
        if r["superseded_runtime"]:
            mark += " (older runtime)"
        if r["no_steady_state"]:
            mark += " (no steady state)"
        again = (f"{r['ratio_at_measured_length']:.2f} at {r['measured_length_mean']:.3g} "
                 f"({r['graph_length_mean']:g})" if "ratio_at_measured_length" in r else "–")
        out.append(f"| {r['run']} | {r['measured_step_s']:.3g} | {r['predicted_step_s']:.3g} | "
                   f"{r['ratio']:.2f} | {mark} | {again} |")
    return "\n".join(out)


def cross_markdown(rows: list[dict[str, Any]]) -> str:
    """The cross-plan table: calibrated on the colocated sync run, each other plan."""
    out = ["| GPUs | machine (calibrated on its colocated sync run) | plan | measured s/step | "
           "calibrated s/step | calibrated / measured | within ±10% | uncalibrated / "
           "measured |", "|---:|---|---|---:|---:|---:|:---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["gpus"], r["machine"])):
        plan = r["run"].split(": ", 1)[1]
        out.append(f"| {r['gpus']} | {r['machine']} | {plan} | {r['measured_step_s']:.3g} | "
                   f"{r['calibrated_step_s']:.3g} | {r['ratio']:.2f} | "
                   f"{'yes' if r['within_target'] else '**no**'} | "
                   f"{r['uncalibrated_ratio']:.2f} |")
    return "\n".join(out)


def main() -> int:
    """Price every run, write the JSON, print the table."""
    gpu, cpu = gpu_rows() + longtail_rows(), cpu_rows()
    rows = gpu + cpu
    crossed = cross_plan(gpu)
    current = [r for r in rows if not r["superseded_runtime"] and not r["no_steady_state"]]
    timed = [r for r in current if "ratio_at_measured_length" in r]
    result = {"benchmark": "own_runs", "machine": machine(), "target": TARGET,
              "summary": {"runs": len(rows), "current_runtime": len(current),
                          "no_steady_state": sum(r["no_steady_state"] for r in rows),
                          "within_target": sum(r["within_target"] for r in current),
                          "with_measured_length": len(timed),
                          "within_target_at_measured_length": sum(
                              within(r["ratio_at_measured_length"]) for r in timed)},
              "split_vs_colocated_cpu": verdicts(cpu), "runs": rows,
              "cross_plan": {"target": CROSS_TARGET, "within_target": sum(
                  r["within_target"] for r in crossed), "plans": len(crossed),
                  "rows": crossed}}
    write_result("own_runs.json", result)
    print(markdown(rows))
    print("\nCross-plan calibration (calibrated on each machine's colocated sync run):\n")
    print(cross_markdown(crossed))
    print(f"\n{result['summary']['within_target']}/{len(current)} runs of the current runtime "
          "that reached their steady state "
          f"within ±25% ({result['summary']['within_target_at_measured_length']}/{len(timed)} "
          "of those that recorded their mean length, priced at it); split vs colocated on CPU "
          f"{result['split_vs_colocated_cpu']}; cross-plan calibrated "
          f"{result['cross_plan']['within_target']}/{len(crossed)} within ±10%; wrote "
          "bench/results/own_runs.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
