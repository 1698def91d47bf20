"""Asynchrony where it pays, on one GPU: synchronous colocated vs partial rollout colocated on
a long-tailed workload, side by side in one process.

  PYTHONUNBUFFERED=1 python bench/gpu_longtail.py
      [--parts throughput,decode,sweep,compiled,trainshapes,learning] [--repeats 1]
      [--modes sync,partial-lag1,partial-lag2,partial-lag3] [--steps 5] [--out DIR] [--name NAME]
      [--cpu] [key=value ...]
  python bench/gpu_longtail.py --plot bench/results/gpu-longtail-1gpu.json \\
      --png docs/gpu-longtail-1gpu.png

throughput: bench/graphs_gpu/longtail-1gpu.yaml (the qwen2.5-0.5b shape in bf16, 512 samples a
step, every task on one GPU) in BENCHMARK MODE: generate.forced_lengths draws each sample's
response length from data.response_len (lognormal, mean 512, sigma 1, clipped at 8192;
`data.response_len.sigma=1.5` for the heavier tail) and ignores eos until it. Each mode runs
`--steps` train steps (the first is warm-up: CUDA, graph capture), no periodic checkpoints;
`--repeats` alternates the modes that many rounds. Per mode: samples/s (steps after the first
over their summed time, and the median), step times, every step's node spans (the timeline),
train time per 1k tokens with new pass shapes and allocator counters, decode steps
per call, device ms per decode step, tokens carried / dropped / restarted, version span, lag,
the response lengths trained on against those started (mean, p90, p99: forced lengths are
known per data position, the run's ledger says which positions were trained), and the
compiler's uncalibrated prediction (`rlgraph compile`'s period_s) beside the measured period.
decode, sweep, compiled, trainshapes: the engine-level measurements of bench/longtail_engine.py
(slot compaction by live rows against the HBM roofline; one step per kernel, width and length;
varlen attention in a torch.compile'd step against the uncompiled one, with a greedy token
check; the cost of a new train pass shape with and without cuDNN's SDPA).
learning: the correctness check, bench/graphs_gpu/longtail-colocated.yaml (tiny preset after
its warm start, the countdown task, lengths chosen by the model) on one GPU, synchronous vs
partial rollout: reward, lag, lengths.

Writes OUT/NAME.json after every mode (a call cut short keeps what finished). `--cpu`
rehearses the same code on the CPU with a tiny model and tiny lengths. A multi-GPU run later
takes `cluster.gpus_per_node=N` and its groups as overrides.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import device_info, machine, mirrored, run_figures  # noqa: E402
from bench.longtail_engine import (  # noqa: E402
    decode_part,
    step_sweep_part,
    train_shapes_part,
)

GRAPHS = ROOT / "bench" / "graphs_gpu"
MODES = {  # name -> overrides of the throughput graph
    "sync": ["schedule.max_lag=0"],
    "partial-lag1": ["schedule.partial_rollout=true", "schedule.max_lag=1"],
    "partial-lag2": ["schedule.partial_rollout=true", "schedule.max_lag=2"],
    "partial-lag3": ["schedule.partial_rollout=true", "schedule.max_lag=3"],
    # no logp node (`without_logp`): train takes the old log-probs from the rollout (the
    # behaviour log-probs, verl fully_async), so no proximal forward at all
    **{f"partial-lag{lag}-rolloutlogp{tag}": [
        "schedule.partial_rollout=true", f"schedule.max_lag={lag}",
        "nodes.train.old_logp=rollout", *over] for lag in (3, 4, 6)
       for tag, over in (("", []), ("-os2", ["nodes.generate.oversample=2.0"]))},
    # two GPUs (give the groups as overrides): trainer | rollout, unstreamed and streamed
    "split": ["schedule.max_lag=0"],
    "split-stream4": ["schedule.max_lag=0", "schedule.stream={mini_batches: 4}"],
    "stream4-partial-lag1": ["schedule.partial_rollout=true", "schedule.max_lag=1",
                             "schedule.stream={mini_batches: 4}"],
    "stream4-colocated-lag3": ["schedule.partial_rollout=true", "schedule.max_lag=3",
                              "schedule.stream={mini_batches: 4}"],  # one GPU: time-sliced
}
NO_LOGP = {m for m, ov in MODES.items() if "nodes.train.old_logp=rollout" in ov}  # without_logp
CPU = ["model={preset: tiny}", "data.prompts_per_step=4", "data.samples_per_prompt=2",
       "data.response_len={mean: 12, max: 64, dist: lognormal, sigma: 1.0}",
       "nodes.train.micro_tokens=256", "nodes.logp.micro_tokens=256", "cluster.local=true"]


def without_logp(graph: Path, overrides: list[str]) -> list[str]:
    """`overrides` plus two that drop every logp node of `graph` (an override cannot delete a
    key): its nodes and groups, with `overrides` applied, less the logp nodes, as whole
    mappings."""
    from rlgraph.config.load import apply_overrides
    from rlgraph.config.safe_yaml import read_graph
    from rlgraph.nodes import KINDS

    data, source = read_graph(graph)
    apply_overrides(data, overrides, source)
    logp = {n for n, v in data["nodes"].items() if KINDS[v["kind"]].proximal_logp}
    nodes = {n: v for n, v in data["nodes"].items() if n not in logp}
    groups = {g: {**v, "tasks": [t for t in v["tasks"] if t not in logp]}
              for g, v in data["groups"].items()}
    return [*overrides, f"nodes={json.dumps(nodes)}", f"groups={json.dumps(groups)}"]


def old_logp_source(spec) -> str:
    """Where train's old (proximal) log-probs come from in this graph."""
    from rlgraph.nodes import KINDS

    if any(KINDS[n.kind].proximal_logp for n in spec.nodes.values()):
        return "logp node (a proximal forward; skipped on an on-policy batch)"
    if any(getattr(n, "old_logp", None) == "rollout" for n in spec.nodes.values()):
        return "the rollout (behaviour log-probs, no forward: verl fully_async)"
    return "train's own proximal forward (skipped on an on-policy batch)"


def length_stats(lengths: list[int]) -> dict[str, float]:
    """Mean, p50, p90, p99, max and count of response lengths."""
    if not lengths:
        return {"n": 0}
    xs = sorted(lengths)

    def q(p: float) -> float:
        return float(xs[min(len(xs) - 1, math.ceil(p * len(xs)) - 1)])

    return {"n": len(xs), "mean": round(statistics.fmean(xs), 1), "p50": q(0.5),
            "p90": q(0.9), "p99": q(0.99), "max": float(xs[-1])}


def forced_lengths(spec, run_dir: Path, rows: list[dict]) -> dict[str, Any]:
    """Lengths of the samples trained on (the ledger's positions) against those started (every
    admitted position; synchronous: the trained ones), with the forced length of each."""
    from rlgraph.bench_mode import forced_length
    from rlgraph.runtime.checkpoint import read_ledger

    data = spec.data
    n = data.samples_per_prompt

    def lengths(positions: list[int]) -> list[int]:
        return [forced_length(data.seed, p, k, data.response_len) for p in positions
                for k in range(n)]

    ledger = read_ledger(run_dir / "ledger.jsonl")
    trained = [int(uid.rsplit(":", 1)[1]) for r in ledger for uid in r["prompt_uids"]]
    # steps after the first: a cold start trains the short samples of round 0 first and ends
    # with the longest in flight; from step 1 on, what was carried in ~ what is left at the end
    steady = [int(uid.rsplit(":", 1)[1]) for r in ledger
              if r["step"] >= spec.schedule.mini_batches
              for uid in r["prompt_uids"]]
    # partial rollout fills its cache over max_lag + 1 versions: the steps after hold its
    # steady mix of carried and new rows
    fill = (spec.schedule.max_lag + 1 if spec.schedule.partial_rollout else 1) \
        * spec.schedule.mini_batches
    after_fill = [int(uid.rsplit(":", 1)[1]) for r in ledger if r["step"] >= fill
                  for uid in r["prompt_uids"]]
    last = rows[-1] if rows else {}
    admitted = int(last.get("rollout/admitted_total", len(trained) * n)) // n
    started = list(range(admitted)) if "rollout/admitted_total" in last else trained
    dropped = last.get("rollout/dropped_total", 0.0)
    restarted = last.get("rollout/restarted_total", 0.0)
    return {"trained": length_stats(lengths(trained)), "started": length_stats(lengths(started)),
            "trained_after_step_0": length_stats(lengths(steady)),
            "trained_after_fill": length_stats(lengths(after_fill)),
            "trained_by_step": [lengths([int(uid.rsplit(":", 1)[1]) for uid in r["prompt_uids"]])
                                for r in sorted(ledger, key=lambda r: r["step"])],
            "prefix_by_step": prefix_by_step(ledger),
            "fill_steps": fill, "trained_prompts_before_fill": len(trained) - len(after_fill),
            "started_not_trained_in_flight_at_end": len(set(started) - set(trained)) * n,
            "share_dropped": round(dropped / max(1, admitted * n), 4),
            "share_restarted": round(restarted / max(1, admitted * n), 4)}


def prefix_by_step(ledger: list[dict]) -> list[int]:
    """After each train step (ledger order), the count P of data positions 0..P-1 all
    trained: partial rollout trains positions out of order, the long ones late."""
    seen: set[int] = set()
    out, prefix = [], 0
    for r in sorted(ledger, key=lambda r: r["step"]):
        seen.update(int(uid.rsplit(":", 1)[1]) for uid in r["prompt_uids"])
        while prefix in seen:
            prefix += 1
        out.append(prefix)
    return out


def per_step(rows: list[dict], key: str) -> list[float]:
    """One metric of every step (None where a row lacks it)."""
    return [round(r[key], 4) if key in r else None for r in rows]


def run_mode(name: str, graph: Path, overrides: list[str], steps: int, runs: Path,
             forced: bool, progress: Path | None = None,
             stop_at: float | None = None, until_prefix: int | None = None
             ) -> dict[str, Any]:
    """One schedule of `graph` for `steps` train steps (see the module docstring); with
    `progress` (a folder), its metrics are mirrored there as `NAME.metrics.jsonl` while it
    runs (`common.mirrored`), so a call cut off mid-mode keeps its finished steps. With
    `stop_at` (a `time.time()`), the run stops there after its running tasks
    (`Runner.request_stop`) and its figures cover the steps it finished; with
    `until_prefix` P, it stops likewise after the train step that has trained every data
    position below P (`prefix_by_step`)."""
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import load_spec
    from rlgraph.runtime.runner import Runner, RunOptions

    spec = load_spec(graph, overrides)
    plan = compile_plan(spec)
    run_dir = runs / name
    began = time.time()
    timers: list[threading.Timer] = []
    runners: list[Runner] = []

    def stop_on_prefix(row: dict[str, Any]) -> None:
        if until_prefix is not None and runners:
            from rlgraph.runtime.checkpoint import read_ledger

            done = prefix_by_step(read_ledger(run_dir / "ledger.jsonl"))
            if done and done[-1] >= until_prefix:
                runners[0].request_stop()

    def stop_on_time(runner: Runner) -> None:
        runners.append(runner)
        if stop_at is not None:
            timers.append(threading.Timer(max(0.0, stop_at - time.time()), runner.request_stop))
            timers[-1].daemon = True
            timers[-1].start()

    options = RunOptions(out_dir=run_dir, steps=steps, tensorboard=False,
                         checkpoint_every_s=0, final_checkpoint=False,  # none at all
                         on_ready=stop_on_time, on_step=stop_on_prefix)
    try:
        if progress is None:
            result = Runner(plan, options).run()
        else:
            with mirrored(run_dir / "metrics.jsonl", progress / f"{name}.metrics.jsonl"):
                result = Runner(plan, options).run()
    finally:
        for timer in timers:
            timer.cancel()
    rows = result.rows
    k = spec.schedule.mini_batches  # rows per version: one per optimizer step when streaming
    after = rows[k:]  # the versions after the first (warm-up)
    steady = [r["time/step_s"] for r in after] or [r["time/step_s"] for r in rows]
    step_s = statistics.median(steady)
    calibrated = compile_plan(spec, calibration=run_dir)
    t0 = min((e["start"] for e in result.events), default=0.0)
    node_steps: dict[str, list[float]] = {}
    for e in sorted(result.events, key=lambda e: e["step"]):
        node_steps.setdefault(e["node"], []).append(round(e["end"] - e["start"], 4))
    steady_wall = sum(r["time/step_s"] for r in after)
    res = {
        "graph": str(graph.relative_to(ROOT)), "overrides": overrides,
        # steps after the first over their summed time: partial rollout's steps alternate
        # between short rounds and rounds that must finish the tail, so a median misleads
        "samples_per_s_steady": round(spec.data.samples_per_step() / k * len(after)
                                      / steady_wall, 3) if after else None,
        "step_s_steady_mean": round(steady_wall / len(after) * k, 3) if after else None,
        # partial rollout's long and short steps come in pairs: an odd count of them ends on
        # a short one and overstates the rate; this figure keeps an even number (1..2m)
        "samples_per_s_even_steps": round(spec.data.samples_per_step() / k * even
                                          / sum(r["time/step_s"] for r in after[:even]), 3)
        if (even := len(after) // 2 * 2) else None,
        "mini_batches": k,
        "partial_rollout": spec.schedule.partial_rollout,
        "forced_lengths": forced, "response_len": spec.data.response_len.model_dump(),
        "old_logp_from": old_logp_source(spec),
        "logp_from_rollout_steps": sum(r.get("logp/from_rollout", 0.0) for r in rows),
        "oversample": spec.nodes["generate"].oversample, "stale": spec.nodes["generate"].stale,
        "sync_every": spec.nodes["generate"].sync_every,
        **run_figures(spec, plan, result, step_s, calibrated),
        "step_s_spread": [round(min(steady), 4), round(max(steady), 4)],
        "predicted_over_measured": round(plan["schedule"]["period_s"] / step_s, 3),
        "node_s_per_step": node_steps,
        "per_step": {k: per_step(rows, k) for k in (
            "generate/decode_steps", "rollout/decode_steps", "generate/decode_ms_per_step",
            "generate/mean_width", "generate/live_share",
            "generate/engine_s", "rollout/carried", "rollout/dropped", "rollout/restarted",
            "rollout/version_span", "rollout/cached", "lag/max", "lag/mean", "reward/mean",
            "response/length_mean", "tokens", "train/new_pass_shapes", "train/alloc_retries",
            "train/device_mallocs", "train/device_frees",
            # in-flight updates (engines/inflight.py) and the per-token lag check
            "rollout/kept", "rollout/refilled", "rollout/reencoded_tokens", "rollout/switches",
            "generate/pause_s", "generate/prefill_tokens", "lag/stale_tokens",
            # where a call's wall time goes on the static engine (static_rollout.py)
            "generate/looks", "generate/prefill_s", "generate/move_s",
            "generate/device_idle_s")},
        "events": [{"node": e["node"], "step": e["step"], "start": round(e["start"] - t0, 4),
                    "end": round(e["end"] - t0, 4)} for e in result.events],
        "wall_s": round(time.time() - began, 2),
        "stopped_early": bool(result.stopped), "steps_asked": steps,
        "until_prefix": until_prefix,
    }
    train_s = node_steps.get("train", [])
    tokens = res["per_step"]["tokens"]
    res["train_s_per_step"] = train_s
    res["train_ms_per_1k_tokens"] = [round(t * 1e6 / n, 2) if n else None
                                     for t, n in zip(train_s, tokens)]
    late = train_s[2:]
    res["train_flat_from_step3_max_over_min"] = round(max(late) / min(late), 3) if late else None
    if forced:
        res["lengths"] = forced_lengths(spec, run_dir, rows)
    shutil.rmtree(run_dir, ignore_errors=True)  # checkpoints of GB size
    return res


def learning_part(steps: int, cpu: bool, runs: Path) -> dict[str, Any]:
    """The correctness check: the countdown task (tiny preset after its warm start) on one
    GPU, synchronous vs partial rollout."""
    graph = GRAPHS / "longtail-colocated.yaml"
    base = ["cluster={nodes: 1, gpus_per_node: 1, gpu: H200}"]
    if cpu:
        base += ["model.warm_start.steps=20", "data.prompts_per_step=8", "cluster.local=true"]
    partial = ["schedule.partial_rollout=true", "nodes.generate.stale=finish"]
    modes = {"sync": base,
             "partial-lag2": [*base, *partial, "schedule.max_lag=2"],
             "partial-lag3-rolloutlogp": without_logp(graph, [
                 *base, *partial, "schedule.max_lag=3", "nodes.train.old_logp=rollout"]),
             "partial-lag4-rolloutlogp-os2": without_logp(graph, [
                 *base, *partial, "schedule.max_lag=4", "nodes.train.old_logp=rollout",
                 "nodes.generate.oversample=2.0"])}
    out = {}
    for name, ov in modes.items():
        r = run_mode(f"learning-{name}", graph, ov, steps, runs, forced=False)
        tail = r["per_step"]["reward/mean"][-5:]
        out[name] = {k: r[k] for k in ("samples_per_s", "step_s_median", "lag_max",
                                        "lag_violations", "max_lag", "predicted_period_s",
                                        "old_logp_from", "logp_from_rollout_steps")}
        out[name].update(reward_last5_mean=round(statistics.fmean(tail), 4),
                         reward_last5=tail, reward=r["per_step"]["reward/mean"],
                         length_mean=r["per_step"]["response/length_mean"],
                         lag_max_per_step=r["per_step"]["lag/max"])
    return out


def summarize(runs: dict[str, dict]) -> dict[str, Any]:
    """Per mode over its repeats: samples/s and step-time medians with their spread, the
    step medians pooled, and samples/s over sync's (repeat by repeat, and of the medians)."""
    by_mode: dict[str, list[dict]] = {}
    for key, r in runs.items():
        if "samples_per_s" in r:
            by_mode.setdefault(key.split("@")[0], []).append(r)
    out: dict[str, Any] = {}
    for mode, rs in by_mode.items():
        steps = [s for r in rs for s in r["step_s_all"][1:]]
        out[mode] = {"repeats": len(rs),
                     "samples_per_s": [r["samples_per_s_steady"] for r in rs],
                     "samples_per_s_median": round(statistics.median(
                         r["samples_per_s_steady"] for r in rs), 3),
                     "step_s_pooled_median": round(statistics.median(steps), 3),
                     "step_s_pooled_spread": [round(min(steps), 3), round(max(steps), 3)],
                     "predicted_period_s": rs[0]["predicted_period_s"]}
    sync = out.get("sync")
    for mode, o in out.items():
        if sync and mode != "sync":
            o["over_sync_samples_per_s"] = round(
                o["samples_per_s_median"] / sync["samples_per_s_median"], 3)
            o["over_sync_by_repeat"] = [round(a / b, 3) for a, b in zip(
                o["samples_per_s"], sync["samples_per_s"])]
    return out


def plot(path: Path, png: Path) -> None:
    """Both timelines (node spans per step) one above the other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = json.loads(path.read_text())
    modes = {}  # (section, mode) -> run: every throughput section of the file, first repeats
    sections = [(k, v) for k, v in res.items() if k.startswith("throughput")
                and isinstance(v, dict)]
    for section, runs in sections:
        for k, v in runs.items():
            if "events" in v and "@" not in k:
                modes[(section, k)] = v
    fig, axes = plt.subplots(len(modes), 1, figsize=(12, 1.9 * len(modes) + 0.6), sharex=True)
    axes = [axes] if len(modes) == 1 else axes
    colors = {"generate": "tab:blue", "logp": "tab:orange", "train": "tab:green",
              "reward": "tab:red", "ref_logp": "tab:purple", "param_update": "tab:gray"}
    for ax, ((section, name), r) in zip(axes, modes.items()):
        nodes = [n for n in colors if any(e["node"] == n for e in r["events"])]
        for e in r["events"]:
            y = nodes.index(e["node"])
            ax.barh(y, e["end"] - e["start"], left=e["start"], color=colors[e["node"]],
                    edgecolor="black", linewidth=0.3)
            if e["node"] == "generate":
                ax.text(e["start"], y, str(e["step"]), va="center", fontsize=6)
        ax.set_yticks(range(len(nodes)), nodes)
        sigma = r["response_len"]["sigma"]
        steps = r["step_s_all"][1:]
        kernel = ", varlen attention" if section.endswith(("varlen", "rolloutlogp")) else ""
        ax.set_title(f"sigma {sigma:g}, {name}{kernel}: steps after the first "
                     f"{', '.join(f'{x:.1f}' for x in steps)} s (predicted "
                     f"{r['predicted_period_s']:.1f} s), lag max {r['lag_max']:g}", fontsize=9)
    axes[-1].set_xlabel("seconds since the first task")
    fig.suptitle(f"{res['device']['name']}: {res['workload'][:110]}", fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> int:
    """Run the parts, print a table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="throughput,decode,learning")
    parser.add_argument("--modes", default="sync,partial-lag1,partial-lag2")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=1, help="rounds of alternated modes")
    parser.add_argument("--decode-rows", type=int, help="rows of the decode part's batch")
    parser.add_argument("--decode-max", type=int, help="longest response of the decode part")
    parser.add_argument("--learning-steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default="gpu-longtail-1gpu")
    parser.add_argument("--cpu", action="store_true", help="rehearse on the CPU, tiny shapes")
    parser.add_argument("--plot", type=Path, help="draw the timelines of this result file")
    parser.add_argument("--png", type=Path, default=ROOT / "docs" / "gpu-longtail-1gpu.png")
    parser.add_argument("overrides", nargs="*", help="key=value for the throughput graph")
    args = parser.parse_args()
    if args.plot:
        plot(args.plot, args.png)
        return 0
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_longtail: no CUDA device here; rehearse with --cpu")
        return 0
    overrides = [*(CPU if args.cpu else []), *args.overrides]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    res: dict[str, Any] = {
        "machine": machine(), "device": device_info(dry=args.cpu),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv), "overrides": overrides,
        "workload": "BENCHMARK MODE (generate.forced_lengths): response lengths forced per "
                    "sample, eos ignored; " + " ".join(overrides or ["longtail-1gpu.yaml"]),
        "throughput": {}}
    runs = Path(tempfile.mkdtemp(prefix="rlgraph-longtail-"))
    parts = args.parts.split(",")

    def save() -> None:
        path.write_text(json.dumps(res, indent=1, default=str) + "\n")

    if "trainshapes" in parts:
        res["train_shapes"] = train_shapes_part(args.cpu, overrides)
        save()
    if "sweep" in parts:
        res["step_sweep"] = step_sweep_part(args.cpu, overrides)
        save()
    if "compiled" in parts:  # varlen attention in the torch.compile'd step against without
        res["step_sweep_compiled"] = step_sweep_part(args.cpu, overrides, compiled=True)
        save()
    if "decode" in parts:
        res["decode"] = decode_part(args.cpu, overrides, args.decode_rows, args.decode_max)
        print("decode", json.dumps(res["decode"]), flush=True)
        save()
    if "throughput" in parts:
        # modes alternated, `--repeats` rounds: repeat r of a mode is keyed "mode@r" (r > 0)
        for rep in range(args.repeats):
            for mode in args.modes.split(","):
                key = mode if rep == 0 else f"{mode}@{rep}"
                graph = GRAPHS / "longtail-1gpu.yaml"
                ov = [*overrides, *MODES[mode]]
                try:
                    res["throughput"][key] = run_mode(
                        mode, graph, without_logp(graph, ov) if mode in NO_LOGP else ov,
                        args.steps, runs, forced=True, progress=args.out)
                except Exception as exc:  # record it and go on to the next mode
                    res["throughput"][key] = {"error": f"{type(exc).__name__}: {exc}"}
                r = res["throughput"][key]
                print(key, json.dumps({k: v for k, v in r.items() if k != "events"}),
                      flush=True)
                res["summary"] = summarize(res["throughput"])
                save()
    if "learning" in parts:
        res["learning"] = learning_part(args.learning_steps, args.cpu, runs)
        print("learning", json.dumps(res["learning"]), flush=True)
        save()
    print(f"\n{'mode':<16}{'step s':>9}{'samples/s':>11}{'predicted':>11}{'trained mean':>14}"
          f"{'p99':>8}{'lag max':>9}")
    for mode, r in res["throughput"].items():
        if "error" in r:
            print(f"{mode:<16} failed: {r['error'][:90]}")
            continue
        tr = r.get("lengths", {}).get("trained", {})
        print(f"{mode:<16}{r['step_s_median']:>9.3f}{r['samples_per_s']:>11.1f}"
              f"{r['predicted_period_s']:>11.3f}{tr.get('mean', 0):>14.1f}"
              f"{tr.get('p99', 0):>8.0f}{r['lag_max']:>9.0f}")
    return 0 if all("error" not in r for r in res["throughput"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
