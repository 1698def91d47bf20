"""Four GPUs end to end: dots.rl Examples 1 and 2 against the colocated synchronous baseline,
run one after another by `rlgraph run`'s Runner on one 4-GPU machine (one script per device call).

  PYTHONUNBUFFERED=1 python bench/gpu4.py --out DIR [--transport object_store|nccl]
                                          [--steps N] [--plans a,b,c]

Plans (bench/graphs_gpu4/): `separation` (Example 1: logp, ref_logp, train, generate on one
GPU each; a second param_update keeps logp's policy current), `hybrid` (Example 2: [logp,
train] on 2 GPUs, ref_logp on 1, generate on 1) and `colocated-sync` (every task in one group
on all 4 GPUs, max_lag 0). A group runs one data-parallel replica per GPU
(rlgraph.process.replicas), so every allocated GPU is driven (an earlier runtime, one actor per
group, drove only the first GPU of each group); each plan also reports samples/s per GPU.

Per plan: median step time and samples/s (step 0, with CUDA warm-up, left out), the compiler's
period before and after calibration with the run's own node times (`rlgraph compile
--calibrate RUN_DIR`), measured and calibrated idle per group, weight-sync seconds and GB/s
per param_update node, and a timeline PNG (calibrated prediction above, measured below).
Writes DIR/gpu4-TAG.json after every plan (a timeout still leaves data), DIR/gpu4-TAG-PLAN.png
and DIR/gpu4-TAG-runs.tar.gz (plan, trace, metrics of each run; no checkpoints).
RLGRAPH_GPU4_DRY=1 rehearses the same code on a local CPU cluster with the tiny preset.
On the device machine (no ray / pydantic there) carry the wheel folder `.whl` that
../shared/tools/device-wheels.sh builds and start with `python3 -m pip install -q --no-index
--no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD`. One call with
the three plans takes about 4.5 minutes on 4x H200 (bench/results/gpu4-*.json).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import device_info, machine, run_figures  # noqa: E402

GRAPHS = ROOT / "bench" / "graphs_gpu4"
PLANS = ("separation", "hybrid", "colocated-sync")
DRY = os.environ.get("RLGRAPH_GPU4_DRY") == "1"
# a CPU rehearsal: same graphs and code on a local cluster, tiny model, few samples
DRY_OVERRIDES = ["cluster={local: true, cpus: 4}", "model={preset: tiny}",
                 "data.prompts_per_step=4", "data.samples_per_prompt=2",
                 "data.response_len={mean: 4, max: 4}", "nodes.train.micro_batch=null"]
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def steady(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows after the first (its step holds CUDA warm-up and the first weight transfer)."""
    return rows[1:] or rows


def weight_sync(events: list[dict[str, Any]], kinds: dict[str, str]) -> dict[str, Any]:
    """Per param_update node: median seconds (driver submit to receiver commit is not it:
    export start to commit end, as traced), bytes and GB/s over the steady steps."""
    out = {}
    for node, kind in kinds.items():
        if kind != "param_update":
            continue
        spans = [e for e in events if e["node"] == node]
        later = [e for e in spans if e["step"] >= 1] or spans
        secs = [e["end"] - e["start"] for e in later]
        nbytes = max((e.get("bytes") or 0 for e in spans), default=0)
        s = statistics.median(secs) if secs else 0.0
        out[node] = {"s_median": round(s, 4), "bytes": nbytes,
                     "GBps": round(nbytes / s / 1e9, 2) if s > 0 and nbytes else None,
                     "count": len(spans)}
    return out


def trace_idle(events: list[dict[str, Any]], groups: list[str]) -> dict[str, float]:
    """Idle fraction of each group from the whole trace, between the ends of the first and
    the last train span (steady state). metrics.jsonl's idle/<group> of step t sees only the
    spans finished when train(t) ends, so a task still running then (generate(t+1) beside
    train(t)) counts as idle there; the trace has every span."""
    trains = sorted(e["end"] for e in events if e.get("kind", e["node"]) == "train")
    lo, hi = (trains[0], trains[-1]) if len(trains) > 1 else (0.0, max(e["end"] for e in events))
    out = {}
    for group in groups:
        spans = sorted((max(lo, e["start"]), min(hi, e["end"])) for e in events
                       if group in (e.get("occupies") or []) and e["end"] > lo and e["start"] < hi)
        busy, cur = 0.0, None
        for start, end in spans:  # union: a param_update may overlap its receiver's work
            if cur is None or start > cur[1]:
                busy += cur[1] - cur[0] if cur else 0.0
                cur = [start, end]
            else:
                cur[1] = max(cur[1], end)
        busy += cur[1] - cur[0] if cur else 0.0
        out[group] = round(1.0 - busy / max(hi - lo, 1e-9), 3)
    return out


def run_one(name: str, args: argparse.Namespace, runs: Path) -> dict[str, Any]:
    """One plan for `args.steps` train steps: measured, predicted, calibrated; its PNG."""
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import load_spec
    from rlgraph.report.chrome_trace import events_from_trace
    from rlgraph.report.timeline import write_timeline
    from rlgraph.runtime.runner import Runner, RunOptions

    path = GRAPHS / f"{name}.yaml"
    overrides = list(args.overrides) + (DRY_OVERRIDES if DRY else [])
    base = load_spec(path, overrides)
    owner = {t: g for g, gs in base.groups.items() for t in gs.tasks}
    sync_nodes = [n for n, s in base.nodes.items()
                  if s.kind == "param_update" and owner.get(s.src) != owner.get(s.dst)]
    if args.transport != "auto":
        overrides += [f"nodes.{n}.transport={args.transport}" for n in sync_nodes]
    spec = load_spec(path, overrides)
    plan = compile_plan(spec)
    run_dir = runs / name
    began = time.time()
    result = Runner(plan, RunOptions(out_dir=run_dir, steps=args.steps,
                                           tensorboard=False)).run()
    wall = time.time() - began
    rows = steady(result.rows)
    step_s = statistics.median(r["time/step_s"] for r in rows)
    samples = spec.data.prompts_per_step * spec.data.samples_per_prompt
    calibrated = compile_plan(spec, calibration=run_dir)
    (run_dir / "plan-calibrated.json").write_text(calibrated.to_json())
    measured = events_from_trace(json.loads((run_dir / "trace.json").read_text()))
    write_timeline(run_dir, plan, measured)  # what `rlgraph timeline RUN_DIR` draws
    cal_dir = run_dir / "calibrated"
    write_timeline(cal_dir, calibrated, measured)
    shutil.copy(cal_dir / "timeline.png", args.out / f"gpu4-{args.tag}-{name}.png")
    kinds = {n: s.kind for n, s in spec.nodes.items()}
    groups = plan["placement"]["groups"]
    gpu_groups = [g for g in groups if g.get("gpus")]
    driven = sum(int(g.get("replicas", 1)) for g in gpu_groups)  # a replica drives one GPU
    allocated = sum(int(g["gpus"]) for g in gpu_groups)
    util = calibrated["schedule"].get("utilization", {})
    sync_keys = sorted({k for r in rows for k in r if k.startswith(("sync/", "generate/"))})
    return {
        "graph": f"bench/graphs_gpu4/{name}.yaml",
        "transport": args.transport if sync_nodes else "local",
        **run_figures(spec, plan, result, step_s, calibrated),
        "gpus_allocated": allocated,
        "gpus_driven": driven,
        "samples_per_s_per_gpu_driven": round(samples / step_s / max(driven, 1), 2),
        "samples_per_s_per_gpu_allocated": round(samples / step_s / max(allocated, 1), 2),
        "predicted_speedup_vs_sync": plan["schedule"].get("speedup_vs_sync"),
        "calibrated_bottleneck": calibrated["schedule"].get("bottleneck"),
        "idle_measured": trace_idle(measured, [g["name"] for g in groups]),
        "idle_metrics_jsonl": {g["name"]: median([r.get(f"idle/{g['name']}", 0.0) for r in rows])
                               for g in groups},
        "idle_calibrated": {g: round(1.0 - u, 3) for g, u in util.items()},
        "weight_sync": weight_sync(result.events, kinds),
        "sync_metrics": {k: median([r[k] for r in rows if isinstance(r.get(k), int | float)])
                         for k in sync_keys},
        "reward_mean_last": result.rows[-1].get("reward/mean") if result.rows else None,
        "wall_s": round(wall, 2),
    }


def pack_runs(runs: Path, dest: Path) -> None:
    """Each run's plan, calibrated plan, trace, metrics, timelines and error log (no
    checkpoints) into one tar.gz: the device call returns at most 8 files."""
    keep = {"plan.json", "plan-calibrated.json", "trace.json", "metrics.jsonl", "error.log",
            "timeline.png", "timeline.html"}
    with tarfile.open(dest, "w:gz") as tar:
        for file in sorted(runs.rglob("*")):
            if file.is_file() and file.name in keep and "checkpoint" not in file.parts:
                tar.add(file, arcname=str(file.relative_to(runs)))


def table(results: dict[str, Any]) -> str:
    """The short table the device call's output ends with."""
    head = (f"{'plan':<16}{'tr':>5}{'GPUs':>6}{'step s':>8}{'samp/s':>8}{'/GPUdrv':>8}"
            f"{'pred':>7}{'calib':>7}{'sync s':>11}{'GB/s':>11}  idle (measured)")
    lines = [head]
    for name, r in results["runs"].items():
        if "error" in r:
            lines.append(f"{name:<16} failed: {r['error'][:100]}")
            continue
        syncs = [v for v in r["weight_sync"].values() if v["s_median"]]
        sync_s = "/".join(f"{v['s_median']:.2f}" for v in syncs) or "-"
        gbps = "/".join(f"{v['GBps']:.1f}" for v in syncs if v["GBps"]) or "-"
        idle = " ".join(f"{g}={v:.0%}" for g, v in r["idle_measured"].items() if v is not None)
        tr = {"object_store": "os", "nccl": "nccl"}.get(r["transport"], "-")
        lines.append(f"{name:<16}{tr:>5}{r['gpus_driven']:>3}/{r['gpus_allocated']:<2}"
                     f"{r['step_s_median']:>8.3f}{r['samples_per_s']:>8.0f}"
                     f"{r['samples_per_s_per_gpu_driven']:>8.0f}{r['predicted_period_s']:>7.3f}"
                     f"{r['calibrated_period_s']:>7.3f}{sync_s:>11}{gbps:>11}  {idle}")
    base = results["runs"].get("colocated-sync", {})
    for name, r in results["runs"].items():
        if name != "colocated-sync" and "samples_per_s" in r and "samples_per_s" in base:
            lines.append(f"{name} / colocated-sync samples/s: "
                         f"{r['samples_per_s'] / base['samples_per_s']:.2f}x")
    return "\n".join(lines)


def main() -> int:
    """Run the plans one after another, writing the JSON after each; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3 if DRY else 10)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--transport", choices=("auto", "object_store", "nccl"),
                        default="object_store")
    parser.add_argument("--tag", help="file name part (default: the transport; dry-...)")
    parser.add_argument("--plans", default=",".join(PLANS))
    parser.add_argument("overrides", nargs="*", help="key=value for every graph")
    args = parser.parse_args()
    args.tag = args.tag or (f"dry-{args.transport}" if DRY else args.transport)
    args.out.mkdir(parents=True, exist_ok=True)
    dest = args.out / f"gpu4-{args.tag}.json"
    results: dict[str, Any] = {"machine": machine(), "device": device_info(DRY),
                               "transport": args.transport, "steps": args.steps,
                               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "runs": {}}
    runs = Path(tempfile.mkdtemp(prefix="rlgraph-gpu4-"))
    for name in args.plans.split(","):
        log(f"{name}: start")
        try:
            results["runs"][name] = run_one(name, args, runs)
        except Exception as exc:  # record it and go on to the next plan
            results["runs"][name] = {"error": f"{type(exc).__name__}: {exc}",
                                     "traceback": traceback.format_exc()[-3000:]}
            err = runs / name / "error.log"
            if err.exists():
                results["runs"][name]["error_log"] = err.read_text()[-3000:]
        log(f"{name}: {json.dumps(results['runs'][name])}")
        dest.write_text(json.dumps(results, indent=2) + "\n")
        shutil.rmtree(runs / name / "checkpoint", ignore_errors=True)
        pack_runs(runs, args.out / f"gpu4-{args.tag}-runs.tar.gz")
    print("\n" + table(results), flush=True)
    return 0 if all("error" not in r for r in results["runs"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
