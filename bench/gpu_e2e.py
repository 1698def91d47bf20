"""End to end on GPUs: `rlgraph run`'s Runner on a 2-GPU machine, split one-step-off vs
colocated synchronous, side by side in one process on one machine.

  PYTHONUNBUFFERED=1 python bench/gpu_e2e.py [--steps N] [--out DIR]

Runs bench/graphs_gpu/split-one-step-off.yaml (train on GPU 0, generate on GPU 1, max_lag 1,
weights through the Ray object store) and bench/graphs_gpu/colocated-sync.yaml (every task in
one group holding both GPUs, max_lag 0) for a few steps each on a local Ray cluster that the
runtime starts with the machine's GPUs. Records samples/s and step time (steady state: the
first step, which includes CUDA warm-up, is left out), the compiler's predicted period, the
period recompiled with the run's measured node times (`rlgraph compile --calibrate RUN_DIR`)
and the measured one; writes OUT/gpu-e2e.json (default bench/results/gpu-e2e.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import machine  # noqa: E402

GRAPHS = ROOT / "bench" / "graphs_gpu"
RUNS = ("split-one-step-off", "colocated-sync")


def device_info() -> dict:
    """Which GPUs ran it."""
    import torch

    if not torch.cuda.is_available():
        return {"gpus": 0}
    return {"gpus": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def run_one(name: str, steps: int, out: Path, overrides: list[str], runs: Path) -> dict:
    """One graph for `steps` train steps: measured step time and samples/s, predicted and
    calibrated periods. The run dir (checkpoints of GB size) stays in a temporary folder;
    its trace.json is copied to OUT/trace-NAME.json."""
    from rlgraph.compiler import compile_plan
    from rlgraph.runtime.runner import Runner, RunOptions
    from rlgraph.spec import load_spec

    spec = load_spec(GRAPHS / f"{name}.yaml", overrides)
    plan = compile_plan(spec)
    run_dir = runs / name
    began = time.time()
    result = Runner(spec, plan, RunOptions(out_dir=run_dir, steps=steps,
                                           tensorboard=False)).run()
    steady = [r["time/step_s"] for r in result.rows[1:]] or [r["time/step_s"]
                                                             for r in result.rows]
    step_s = statistics.median(steady)
    samples = spec.data.prompts_per_step * spec.data.samples_per_prompt
    calibrated = compile_plan(spec, calibration=run_dir)
    shutil.copy(run_dir / "trace.json", out / f"trace-{name}.json")
    node_s: dict[str, list[float]] = {}
    for e in result.events:
        if e["step"] >= 1:
            node_s.setdefault(e["node"], []).append(e["end"] - e["start"])
    return {
        "graph": f"bench/graphs_gpu/{name}.yaml",
        "groups": {g["name"]: {"tasks": g["tasks"], "gpus": g["gpus"]}
                   for g in plan["placement"]["groups"]},
        "max_lag": spec.schedule.max_lag,
        "steps": len(result.rows),
        "samples_per_step": samples,
        "step_s_median": round(step_s, 4),
        "step_s_all": [round(r["time/step_s"], 4) for r in result.rows],
        "samples_per_s": round(samples / step_s, 2),
        "node_s_median": {k: round(statistics.median(v), 4) for k, v in node_s.items()},
        "predicted_period_s": round(plan["schedule"]["period_s"], 4),
        "calibrated_period_s": round(calibrated["schedule"]["period_s"], 4),
        "measured_over_calibrated": round(step_s / calibrated["schedule"]["period_s"], 3),
        "lag_max": max((r["lag/max"] for r in result.rows), default=0.0),
        "lag_violations": result.lag_violations,
        "startup_s": round(result.startup_s, 2),
        "wall_s": round(time.time() - began, 2),
        "bottleneck_calibrated": calibrated["schedule"]["bottleneck"],
    }


def main() -> int:
    """Run both graphs, print a table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("overrides", nargs="*", help="key=value for both graphs (CPU checks)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"machine": machine(), "device": device_info(), "runs": {}}
    runs = Path(tempfile.mkdtemp(prefix="rlgraph-gpu-e2e-"))
    for name in RUNS:
        try:
            results["runs"][name] = run_one(name, args.steps, args.out, args.overrides, runs)
        except Exception as exc:  # record it and go on to the other plan
            results["runs"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            if (runs / name / "error.log").exists():
                shutil.copy(runs / name / "error.log", args.out / f"error-{name}.log")
        print(name, json.dumps(results["runs"][name]), flush=True)
    split, sync = (results["runs"].get(n, {}) for n in RUNS)
    if "samples_per_s" in split and "samples_per_s" in sync:
        results["split_over_sync_samples_per_s"] = round(
            split["samples_per_s"] / sync["samples_per_s"], 3)
    print(f"\n{'plan':<22}{'step s':>9}{'samples/s':>11}{'predicted':>11}{'calibrated':>12}"
          f"{'lag max':>9}")
    for name, r in results["runs"].items():
        if "error" in r:
            print(f"{name:<22} failed: {r['error'][:90]}")
            continue
        print(f"{name:<22}{r['step_s_median']:>9.3f}{r['samples_per_s']:>11.1f}"
              f"{r['predicted_period_s']:>11.3f}{r['calibrated_period_s']:>12.3f}"
              f"{r['lag_max']:>9.0f}")
    (args.out / "gpu-e2e.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all("error" not in r for r in results["runs"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
