"""Does the compiler predict the measured step time? Run the quickstart, calibrate the
compiler with the run's trace (`rlgraph compile --calibrate RUN/trace.json`) and compare
its predicted period with the measured steady-state step time. Target: within 15%.

The measured step time is the mean of `time/step_s` over the steady steps (without the
first WARMUP_STEPS and the last max_lag + 1, where the pipeline fills and drains). The
uncalibrated (analytic cost model) prediction is recorded beside it.

    python bench/prediction.py [--steps 30] [--run-dir DIR]

Writes bench/results/prediction.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, machine, quickstart_args, write_result

TARGET = 0.15
WARMUP_STEPS = 3



def rlgraph(*words: str) -> subprocess.CompletedProcess:
    """Run the rlgraph CLI as a user would."""
    cmd = [sys.executable, "-m", "rlgraph", *words]
    print("$ rlgraph", " ".join(words), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-5000:])
        raise SystemExit(f"rlgraph {words[0]} failed with status {proc.returncode}")
    return proc


def main(argv: list[str] | None = None) -> int:
    args = quickstart_args(__doc__.splitlines()[0], argv, steps=30)
    graph = str(Path(args.graph))
    if args.run_dir:
        run_dir, wall = Path(args.run_dir), None
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="rlgraph-prediction-"))
        start = time.time()
        rlgraph("run", graph, *args.overrides, "--steps", str(args.steps), "--out", str(run_dir))
        wall = time.time() - start
    overrides = list(args.overrides)
    uncalibrated = json.loads(rlgraph("compile", graph, *overrides, "--json").stdout)
    calibrated = json.loads(rlgraph("compile", graph, *overrides, "--json", "--calibrate",
                                    str(run_dir / "trace.json")).stdout)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    max_lag = calibrated["lag"]["max_policy_lag"]
    steady = rows[WARMUP_STEPS:len(rows) - max_lag - 1]
    measured = sum(r["time/step_s"] for r in steady) / len(steady)
    predicted = calibrated["schedule"]["period_s"]
    error = (predicted - measured) / measured
    result = {
        "benchmark": "prediction",
        "machine": machine(),
        "graph": Path(graph).name,
        "run_wall_s": wall,
        "steps": len(rows),
        "steady_steps": [steady[0]["step"], steady[-1]["step"]],
        "measured_step_s": measured,
        "predicted_step_s": predicted,
        "relative_error": error,
        "target": TARGET,
        "passed": abs(error) <= TARGET,
        "uncalibrated_predicted_step_s": uncalibrated["schedule"]["period_s"],
        "uncalibrated_relative_error": (uncalibrated["schedule"]["period_s"] - measured)
        / measured,
        "calibrated_costs_s": {n: c["seconds"] for n, c in calibrated["costs"].items()},
        "bottleneck": calibrated["schedule"].get("bottleneck"),
    }
    write_result("prediction.json", result)
    print(f"measured {measured * 1e3:.0f} ms/step, predicted {predicted * 1e3:.0f} ms/step "
          f"after calibration ({error:+.1%}, target within {TARGET:.0%}); uncalibrated "
          f"{uncalibrated['schedule']['period_s'] * 1e3:.0f} ms; wrote "
          "bench/results/prediction.json")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
