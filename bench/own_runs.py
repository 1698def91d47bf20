"""Does the uncalibrated compiler price our own runs? For every committed GPU run (every
mapping, at any depth of `bench/results/gpu*.json`, with a graph, its overrides and a
measured step: `find_runs`) and every CPU mode of `bench/results/async_vs_sync*.json` (the
long-tail graph, and the quickstart's `--graph graphs/quickstart.yaml` run), compiles the
graph as it ran, without calibration, and sets the predicted period beside the measured one
(`measured_step`: over the steps after the warm-up whose window holds one generate each).
Target: within +-25%, and the verdict (split vs colocated) of each CPU graph as measured.
Runs of an older runtime, and a streamed run that stopped while its pipeline filled (no
steady state), are listed but not counted. Then, per machine, calibrated on its colocated
synchronous run, every other plan of it (target +-10%).

    python bench/own_runs.py

Writes bench/results/own_runs.json and prints the markdown tables of docs/results/own_runs.md.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import re
import shlex
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, machine, write_result

from rlgraph import lengths
from rlgraph.compiler import compile_plan, first_steps_period
from rlgraph.compiler.calibrate import carried_scale, carry
from rlgraph.config.load import apply_overrides, load_spec, validate_spec
from rlgraph.errors import SourceMap, SpecError
from rlgraph.nodes import KINDS
from rlgraph.nodes import logp as logp_kind
from rlgraph.pricing.engine_revisions import ENGINE_REVISIONS
from rlgraph.pricing.rollout_rounds import WARMUP

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


CONTAINERS = {"runs", "modes", "plans"}  # keys that only hold runs: left out of a run's name
# Sections of a result file measured on another engine revision than the file's dates say
# (file, section) -> (revision, why): the long-tail file's first rounds ran before the varlen
# decode attention (calls 1-8, 2026-11-24 18:49-20:59 UTC; its table keeps them)
ENGINE_OF_SECTIONS = {
    ("gpu-longtail-1gpu.json", "throughput"): ("sdpa", "2026-11-24 calls 4-5, before varlen"),
    ("gpu-longtail-1gpu.json", "throughput_sigma_1.5"): ("sdpa", "2026-11-24 calls 1-3 and "
                                                                 "6-8, before varlen"),
}
SUPERSEDED_SECTIONS: dict[tuple[str, str], str] = {}
# Runs a result file keeps that are no measurement of their own: (file, name) -> why.
SKIPPED = {
    ("gpu-stream-1gpu.json", "throughput/sync"): "the same sync as gpu-longtail-1gpu's, one "
                                                 "call earlier",
}
STEP_KEYS = ("step_s_steady_mean", "step_s", "step_s_mean", "step_s_median")
# Result files measured on a static engine revision they do not record and whose dates do
# not say it (a date without its time): file -> revision, with when it ran. A file that
# records neither the revision nor a dated time predates both: per_slot.
ENGINE_OF = {
    "gpu-agentic.json": ("one_copy", "run at e342a45, 2026-11-27 11:18 UTC"),
    "gpu-scale-2gpu.json": ("per_slot", "dated 11:03 UTC when written, after its two calls "
                                        "(445 s and 420 s limits) began on the tree before "
                                        "the one-copy read reached main at 11:02"),
}
OLDEST_ENGINE = "per_slot"
DATED = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2})")


@dataclasses.dataclass
class Found:
    """One measured run found in a result file: its name there, the run's dict, the graph it
    ran (a path or an inline mapping) and the nearest command above it."""

    file: str
    path: tuple[str, ...]
    run: dict[str, Any]
    graph: Any
    command: str | None
    result: dict[str, Any]

    @property
    def name(self) -> str:
        """The run's name within its file: its keys, the containers (runs, modes) left out."""
        return "/".join(k for k in self.path if k not in CONTAINERS)

    @property
    def section(self) -> str:
        """The run's section of its file (its name less the last part), '' at the top."""
        return self.name.rpartition("/")[0]


def find_runs(file: str, data: Any) -> list[Found]:
    """Every measured run of a result file: a mapping with a measured step (one of
    STEP_KEYS) and a graph (its own `graph`, else its nearest ancestor's), at any depth."""
    out: list[Found] = []

    def walk(node: Any, path: tuple[str, ...], graph: Any, command: str | None) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                key = str(item.get("name", i)) if isinstance(item, dict) else str(i)
                walk(item, (*path, key), graph, command)
            return
        if not isinstance(node, dict):
            return
        graph = node.get("graph", graph)
        command = node["command"] if isinstance(node.get("command"), str) else command
        if any(k in node for k in STEP_KEYS) and graph is not None and path:
            out.append(Found(file, path, node, graph, command, data))
            return
        for key, value in node.items():
            if key != "graph":
                walk(value, (*path, str(key)), graph, command)

    walk(data, (), None, None)
    return out


def graph_of(found: Found) -> tuple[Path | dict[str, Any], list[str]] | None:
    """The graph a run ran and its overrides as recorded, or None where the file does not
    say (a summary row whose run is recorded elsewhere in the file, or none)."""
    run, graph = found.run, found.graph
    if isinstance(graph, str):
        graph = ROOT / graph.split(" ")[0]
        if not graph.is_file():
            return None
    if "overrides" in run:
        return graph, list(run["overrides"] or [])
    if "schedule" in run and isinstance(run["schedule"], dict):  # a plan of an inline graph
        return graph, [f"schedule.{k}={json.dumps(v)}" for k, v in run["schedule"].items()]
    if "graph" not in run:  # a summary row (gpu_scale.py's `plans`): its script's overrides
        return scale_plan(found)
    overrides = overrides_of(found.command)
    if run.get("partial_rollout") or found.name.endswith(PARTIAL):
        overrides.append("schedule.partial_rollout=true")
    if run.get("transport") in ("nccl", "object_store") and found.file.startswith("gpu4"):
        overrides.append(f"nodes.param_update.transport={run['transport']}")
    return graph, overrides


def scale_plan(found: Found) -> tuple[Path, list[str]] | None:
    """A plan of bench/gpu_scale.py recorded only as its summary row (the file's first
    form, before it kept each run's graph and overrides): the overrides the script gave that
    plan, from its `--shape` and `--gpus` as the recorded command states them."""
    command = found.command or ""
    if "gpu_scale.py" not in command:
        return None
    runs = found.result.get("runs") or {}
    if (runs.get(found.path[-1]) or {}).get("graph"):
        return None  # the run itself is recorded: that row is priced, not this one
    import gpu_scale

    shape = re.search(r"--shape\s+(\S+)", command)
    gpus = re.search(r"--gpus\s+(\d+)", command)
    name = str(found.result.get("device", {}).get("name", ""))
    base = [*gpu_scale.SHAPES[shape.group(1) if shape else "3b"],
            f"cluster.gpus_per_node={gpus.group(1) if gpus else 4}",
            f"cluster.gpu={'H200' if 'H200' in name else 'H100'}"]
    overrides = gpu_scale.plans(False, base).get(found.path[-1])
    return (gpu_scale.GRAPH, overrides) if overrides is not None else None


def gpu_rows() -> list[dict[str, Any]]:
    """One row per measured run of every committed GPU result file (`gpu*.json`)."""
    rows = []
    for file in sorted(RESULTS.glob("gpu*.json")):
        for found in find_runs(file.name, json.loads(file.read_text())):
            if "invalid" in found.name or (file.name, found.name) in SKIPPED:
                continue
            ran = graph_of(found)
            if ran is None:
                continue
            graph, overrides = ran
            run = found.run
            cluster = spec_of(graph, overrides).cluster
            engine = engine_revision_of(found)
            overrides = overrides + one_gpu_driven(run) + [f"pricing.engine_revision={engine}"]
            nodes = run.get("node_s_median") or per_step_nodes(run)
            superseded = SUPERSEDED.get(file.name) or SUPERSEDED_SECTIONS.get(
                (file.name, found.section))
            rows.append(price(f"{file.name}: {found.name}", graph, overrides,
                              measured_step(run), superseded, rounds=measured_rounds(run),
                              logp_ran=float((nodes or {}).get("logp", 0.0)) > 0,
                              length=measured_length(run), unsteady=only_filled(run),
                              nodes=nodes, machine=f"{file.name}: {found.section}"
                              if found.section else file.name)
                        | {"cluster_gpus": cluster.nodes * cluster.gpus_per_node})
    return rows


def engine_revision_of(found: Found) -> str:
    """The static engine revision a run was measured on: the one its run or file records
    (`engine_revision`, bench/common.py `machine`), else `ENGINE_OF`'s, else the newest
    revision that had reached main by the latest date and time the file records (its parts'
    included), else the oldest (`OLDEST_ENGINE`)."""
    node: Any = found.result
    recorded = None
    for key in (None, *found.path):  # from the file down to the run: the innermost wins
        if isinstance(node, list):
            node = next((x for i, x in enumerate(node)
                         if str(x.get("name", i) if isinstance(x, dict) else i) == key), None)
        elif key is not None:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            break
        for holder in (node, node.get("machine")):
            if isinstance(holder, dict) and isinstance(holder.get("engine_revision"), str):
                recorded = holder["engine_revision"]
    if recorded is not None:
        return recorded
    if (found.file, found.section) in ENGINE_OF_SECTIONS:
        return ENGINE_OF_SECTIONS[(found.file, found.section)][0]
    if found.file in ENGINE_OF:
        return ENGINE_OF[found.file][0]
    latest = max(dates(found.result), default="")
    landed = [r for r in ENGINE_REVISIONS.values() if r.landed <= latest]
    return max(landed, key=lambda r: r.landed).name if landed else OLDEST_ENGINE


def dates(node: Any) -> Iterator[str]:
    """Every 'YYYY-MM-DD HH:MM' a result records under a `date` key, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "date" and isinstance(value, str) and DATED.match(value):
                yield DATED.match(value).group(1)
            else:
                yield from dates(value)
    elif isinstance(node, list):
        for item in node:
            yield from dates(item)


def measured_step(run: dict[str, Any]) -> float:
    """The run's measured period: over the steps whose window holds one generate each where
    the run recorded its spans (`steady_window`), else the steady mean of its steps (see
    `steady_step`), else its recorded mean or median step."""
    window = steady_window(run)
    if window is not None:
        return window
    if "step_s_steady_mean" in run or "step_s" in run:
        return steady_step(run)
    return float(run.get("step_s_mean") or run["step_s_median"])


def steady_window(run: dict[str, Any]) -> float | None:
    """Mean step over the run's window of spans (`window_of`), or None."""
    found = window_of(run)
    return None if found is None else found[0]


def window_of(run: dict[str, Any]) -> tuple[float, tuple[int, int]] | None:
    """Mean step over the last steps whose window (from one train's end to the last's) holds
    as many generate calls as steps, where the run recorded its node spans (`events`) and
    the steps after the first train's end hold fewer: within the lag, step 1's generate may
    run before train 0 (the pipeline fills), and the steps after train 0 then hold one
    generate less than their count, a window no steady state has. Whole pairs of steps
    where partial rollout alternates short and long rounds and a pair fits; None where the
    first window already holds a generate a step (steady_step's figure is then the same).
    With the steps (first, last + 1) of the generate calls the window holds."""
    events = run.get("events")
    if not isinstance(events, list) or run.get("mini_batches", 1) > 1:
        return None
    trains = sorted(e["end"] for e in events if e.get("node") == "train")
    gens = [e["end"] for e in events if e.get("node") == "generate"]
    last = len(trains) - 1

    def holds(first: int) -> bool:  # (more: the generator ran ahead, in-flight calls that
        # found their batch complete and returned at once, gpu-inflight.json)
        return sum(trains[first] < g <= trains[last] for g in gens) >= last - first

    if last < 1 or holds(0):
        return None
    fits = [a for a in range(1, last) if holds(a)]
    if run.get("partial_rollout"):
        fits = [a for a in fits if (last - a) % 2 == 0] or fits
    if not fits:
        return None
    held = [e["step"] for e in events if e.get("node") == "generate"
            and trains[fits[0]] < e["end"] <= trains[last]]
    return ((trains[last] - trains[fits[0]]) / (last - fits[0]),
            (min(held), max(held) + 1))


def measured_rounds(run: dict[str, Any]) -> tuple[int, int] | None:
    """The steps (a streamed run: versions) first..last - 1 whose generate calls the measured
    period holds (`measured_step`'s window), or None where the run does not say."""
    found = window_of(run)
    if found is not None:
        return found[1]
    if run.get("mini_batches", 1) > 1:
        versions = (run.get("version_s") or [])[fill_versions(run):]
        count = len(versions) // 2 * 2
        return (fill_versions(run), fill_versions(run) + count) if count else None
    if "step_s_steady_mean" not in run and "step_s" not in run:
        return None
    after = (run.get("step_s_all") or run.get("step_s") or [])[1:]
    partial = run.get("partial_rollout") or (run.get("schedule") or {}).get("partial_rollout")
    count = len(after) - (len(after) % 2 if partial else 0)
    return (1, 1 + count) if count else None


def settles_after(spec: Any, rounds: tuple[int, int] | None) -> bool:
    """Whether a run's window holds rollout rounds before the model's steady ones: its
    generate's rounds are simulated (partial rollout, streaming, in-flight updates; not a
    multi-turn env's), the window begins within the simulation's warm-up
    (`rollout_rounds.WARMUP` rounds from an empty cache), which the plan's period leaves
    out, and generate shares train's group, where the schedule from step 0 gives the first
    rounds' lags (`first_steps.startup_lags`; a generator of its own runs ahead of train by
    as much as its calls' lengths let it, which no start-up state the compiler holds
    says). Such a window is priced as its own rounds (`first_steps_period`)."""
    if rounds is None or rounds[0] >= WARMUP:
        return False
    trains = {spec.group_of(n) for n, node in spec.nodes.items()
              if KINDS[node.kind].advances_policy}
    return any(KINDS[node.kind].samples and getattr(node, "env", None) is None
               and spec.group_of(name) in trains - {None}
               and (spec.schedule.partial_rollout or spec.schedule.stream is not None
                    or getattr(node, "inflight", False)) for name, node in spec.nodes.items())


def per_step_nodes(run: dict[str, Any]) -> dict[str, float]:
    """Median seconds per step of each node from `<node>_s_per_step` lists (the first step,
    warm-up, left out where there are three or more), where a run recorded those."""
    out = {}
    for key, values in run.items():
        if key.endswith("_s_per_step") and isinstance(values, list) and values:
            kept = values[1:] if len(values) >= 3 else values
            out[key.removesuffix("_s_per_step")] = statistics.median(kept)
    return out


def measured_length(run: dict[str, Any]) -> float | None:
    """Mean trained response length of the steps the period counts, where recorded."""
    steady = steady_length(run)
    if steady is not None:
        return steady
    for key in ("trained_response_length_mean_per_step", "response_tokens_mean"):
        means = run.get(key) or []
        if len(means) > 1:
            return sum(means[1:]) / len(means[1:])
    return (run.get("rollout_metrics_median") or {}).get("response/length_mean")


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
    after = (run.get("step_s_all") or run.get("step_s") or [])[1:]
    partial = run.get("partial_rollout") or (run.get("schedule") or {}).get("partial_rollout")
    if partial and len(after) % 2:
        after = after[:-1]
    if not after:
        return float(run.get("step_s_steady_mean") or run["step_s_median"])
    return sum(after) / len(after)


def fill_versions(run: dict[str, Any]) -> int:
    """Versions a streamed run's pipeline takes to fill: max_lag + 1 (the lag climbs
    0..max_lag, and the last of them finishes every group started at version 0)."""
    return int(run.get("max_lag", 0)) + 1


def only_filled(run: dict[str, Any]) -> bool:
    """Whether a run stopped while its pipeline was filling, so its mean step (the fill's)
    is no figure to price against: a streamed run within the max_lag + 1 versions that fill
    it; a lagged run of no more than max_lag steps, which never reached step max_lag, the
    first whose batch must take the groups begun in step 0 (`RolloutRules.must_finish`):
    none of the bound's stalls, which the plan's period holds, could happen in it."""
    if run.get("mini_batches", 1) <= 1:
        steps = len(run.get("step_s_all") or run.get("step_s") or [])
        return 0 < steps <= int(run.get("max_lag", 0))
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


@contextlib.contextmanager
def memory_measured_only() -> Iterator[None]:
    """Compile with the memory check measuring but not refusing: a run that ran fit its
    GPUs, whatever the check says (where it refuses one, the row says so)."""
    from rlgraph.compiler import placement

    check = placement.check_memory
    placement.check_memory = lambda *args, refuse=True, **kw: check(*args, refuse=False, **kw)
    try:
        yield
    finally:
        placement.check_memory = check


def memory_refusal(spec: Any) -> str | None:
    """The memory check's refusal of a plan that ran, or None where it accepts it."""
    try:
        compile_plan(spec)
    except SpecError as err:
        return str(err).split(": ", 1)[-1] if "per GPU" in str(err) else None
    return None


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
          machine: str | None = None, rounds: tuple[int, int] | None = None
          ) -> dict[str, Any]:
    """The uncalibrated prediction of one run against its measured step (`logp_ran`: the
    run's logp node ran its forward, priced even where today's runtime skips it), and where
    the run recorded its mean trained response `length`, the prediction again at that mean
    (the graph's other length terms kept). That is the run's figure where its policy chose
    its lengths (`policy_lengths`: no generate forces them), so the workload priced is the
    one the run trained; a run of forced lengths decoded the graph's distribution, and its
    trained mean (biased by which samples a window trains) is a diagnostic beside it.
    A window of `rounds` (steps first..last - 1) within the rounds the model's steady price
    leaves out (`settles_after`) is priced as a run from scratch decodes them
    (`first_steps_period`); the steady prediction is kept beside it."""
    spec = spec_of(graph, overrides)
    with logp_forward_priced(logp_ran):
        refused = memory_refusal(spec)
    with logp_forward_priced(logp_ran), memory_measured_only():
        plan = compile_plan(spec)
        at_length = None
        stated = spec.data.response_len
        at_mean: list[str] = []
        if length and stated.mean < stated.max:  # a fixed length has no distribution to move
            at_mean = [f"data.response_len.mean={stated_mean(stated, float(length)):.4g}"]
            at_length = compile_plan(spec_of(graph, [*overrides, *at_mean]))
    predicted = at_graph = plan["schedule"]["period_s"]
    measured_length = {}
    chosen = policy_lengths(spec)
    if at_length is not None:
        again = at_length["schedule"]["period_s"]
        measured_length = {"measured_length_mean": round(float(length), 2),
                           "graph_length_mean": stated.mean,
                           "predicted_at_measured_length_s": round(again, 4),
                           "ratio_at_measured_length": round(again / measured, 3),
                           "predicted_at_graph_length_s": round(at_graph, 4),
                           "ratio_at_graph_length": round(at_graph / measured, 3)}
        if chosen:
            predicted, overrides = again, [*overrides, *at_mean]
    steady = predicted
    windowed = settles_after(spec, rounds)
    if windowed:
        with logp_forward_priced(logp_ran), memory_measured_only():
            predicted = first_steps_period(spec_of(graph, overrides), rounds)
    return {"run": name, "graph": graph_name(graph), "graph_data": graph_data(graph),
            "overrides": overrides,
            "measured_step_s": round(measured, 4), "predicted_step_s": round(predicted, 4),
            "ratio": round(predicted / measured, 3),
            "within_target": within(predicted / measured),
            "window_rounds": list(rounds) if windowed else None,
            "steady_predicted_step_s": round(steady, 4),
            "steady_ratio": round(steady / measured, 3),
            "pricing": plan["pricing"]["runtime"], "superseded_runtime": superseded,
            "priced_at_trained_length": chosen and at_length is not None,
            "no_steady_state": unsteady,
            "logp_forward_priced": logp_ran and logp_kind.skip_reason(spec) is not None,
            "bottleneck": plan["schedule"]["bottleneck"], **measured_length,
            "measured_nodes_s": nodes or {}, "machine_key": machine, "logp_ran": logp_ran,
            "memory_check_refused": refused,
            "gpus": sum(g["gpus"] for g in plan["placement"]["groups"]),
            "colocated_sync": is_colocated_sync(spec)}


def policy_lengths(spec: Any) -> bool:
    """Whether the run's policy chose its response lengths: no generate node forces them
    (`forced_lengths`, benchmark mode, draws them from the graph's distribution)."""
    return not any(getattr(node, "forced_lengths", False) for node in spec.nodes.values())


def spec_of(graph: Path | dict[str, Any], overrides: list[str]) -> Any:
    """The validated spec of a graph file or an inline graph (a result file's `graph`
    mapping), with `overrides`."""
    if isinstance(graph, Path):
        return load_spec(graph, overrides)
    data, source = copy.deepcopy(graph), SourceMap()
    apply_overrides(data, overrides, source)
    return validate_spec(data, source)


def graph_name(graph: Path | dict[str, Any]) -> str:
    """A graph file relative to the repository, or an inline graph's name."""
    return str(graph.relative_to(ROOT)) if isinstance(graph, Path) else (
        f"inline graph {graph.get('name', '')}".strip())


def graph_data(graph: Path | dict[str, Any]) -> dict[str, Any] | None:
    """An inline graph's mapping (None for a file), so the row can be priced again."""
    return None if isinstance(graph, Path) else graph


def row_graph(row: dict[str, Any]) -> Path | dict[str, Any]:
    """The graph a priced row ran: its inline mapping or its file."""
    return row["graph_data"] if row.get("graph_data") is not None else ROOT / row["graph"]


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
    to its own modelled costs (`carry`), as `rlgraph compile --calibrate RUN` does. A plan
    that stopped while its pipeline filled (`only_filled`) is listed, not counted. A plan
    whose window holds rounds before the steady ones (`settles_after`) is predicted over
    those rounds (`first_steps_period`), as uncalibrated."""
    out = []
    current = [r for r in rows if not r["superseded_runtime"] and r["machine_key"]
               and r["measured_nodes_s"]]
    for key, size in dict.fromkeys((r["machine_key"], r["cluster_gpus"]) for r in current):
        same = [r for r in current if (r["machine_key"], r["cluster_gpus"]) == (key, size)]
        anchor = next((r for r in same if r["colocated_sync"] and not r["no_steady_state"]),
                      None)
        if anchor is None or len(same) < 2:
            continue
        anchor_spec = spec_of(row_graph(anchor), anchor["overrides"])
        with logp_forward_priced(anchor["logp_ran"]):
            scale = carried_scale(anchor["measured_nodes_s"], anchor_spec)
        for r in same:
            if r is anchor:
                continue
            spec = spec_of(row_graph(r), r["overrides"])
            window = tuple(r["window_rounds"]) if r.get("window_rounds") else None
            with logp_forward_priced(r["logp_ran"]), memory_measured_only():
                steady = compile_plan(spec, calibration=carry(scale, spec, anchor_spec))[
                    "schedule"]["period_s"]
                period = (first_steps_period(spec, window, carry(scale, spec, anchor_spec,
                                                                 window=window))
                          if window else steady)
            out.append({"machine": key, "gpus": r["gpus"], "calibrated_on": anchor["run"],
                        "run": r["run"], "measured_step_s": r["measured_step_s"],
                        "uncalibrated_ratio": r["ratio"],
                        "calibrated_step_s": round(period, 4),
                        "ratio": round(period / r["measured_step_s"], 3),
                        "window_rounds": list(window) if window else None,
                        "steady_ratio": round(steady / r["measured_step_s"], 3),
                        "within_target": abs(period / r["measured_step_s"] - 1)
                        <= CROSS_TARGET,
                        "no_steady_state": r["no_steady_state"],
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
           "at the run's mean length (graph's) | at the graph's lengths |",
           "|---|---:|---:|---:|:---:|---:|---:|"]
    for r in rows:
        mark = "yes" if r["within_target"] else "**no**"
        if r["superseded_runtime"]:
            mark += " (older runtime)"
        if r["no_steady_state"]:
            mark += " (no steady state)"
        if r.get("priced_at_trained_length"):
            mark += " (at its trained length)"
        mark += first_rounds_mark(r)
        again = (f"{r['ratio_at_measured_length']:.2f} at {r['measured_length_mean']:.3g} "
                 f"({r['graph_length_mean']:g})" if "ratio_at_measured_length" in r else "–")
        graph = (f"{r['ratio_at_graph_length']:.2f}" if "ratio_at_graph_length" in r
                 else f"{r['ratio']:.2f}")
        out.append(f"| {r['run']} | {r['measured_step_s']:.3g} | {r['predicted_step_s']:.3g} | "
                   f"{r['ratio']:.2f} | {mark} | {again} | {graph} |")
    return "\n".join(out)


def first_rounds_mark(row: dict[str, Any]) -> str:
    """' (steps a-b from scratch; steady s)' for a row priced over its window's rounds."""
    if not row.get("window_rounds"):
        return ""
    first, last = row["window_rounds"]
    return f" (steps {first}-{last - 1} from scratch; steady {row['steady_ratio']:.2f})"


def cross_markdown(rows: list[dict[str, Any]]) -> str:
    """The cross-plan table: calibrated on the colocated sync run, each other plan."""
    out = ["| GPUs | machine (calibrated on its colocated sync run) | plan | measured s/step | "
           "calibrated s/step | calibrated / measured | within ±10% | uncalibrated / "
           "measured |", "|---:|---|---|---:|---:|---:|:---:|---:|"]
    for r in sorted(rows, key=lambda r: (r["gpus"], r["machine"])):
        plan = r["run"].split(": ", 1)[1]
        out.append(f"| {r['gpus']} | {r['machine']} | {plan} | {r['measured_step_s']:.3g} | "
                   f"{r['calibrated_step_s']:.3g} | {r['ratio']:.2f} | "
                   f"{'yes' if r['within_target'] else '**no**'}"
                   f"{' (no steady state)' if r.get('no_steady_state') else ''}"
                   f"{first_rounds_mark(r)} | "
                   f"{r['uncalibrated_ratio']:.2f} |")
    return "\n".join(out)


def main() -> int:
    """Price every run, write the JSON, print the table."""
    gpu, cpu = gpu_rows(), cpu_rows()
    rows = gpu + cpu
    crossed = cross_plan(gpu)
    counted = [r for r in crossed if not r["no_steady_state"]]
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
                  r["within_target"] for r in counted), "plans": len(counted),
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
          f"{result['cross_plan']['within_target']}/{len(counted)} within ±10%; wrote "
          "bench/results/own_runs.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
