"""Does the quickstart learn, and in how long? Runs `rlgraph run graphs/quickstart.yaml`
exactly as a user would (a subprocess, default steps), times it, and records the reward curve.

Targets: the whole command finishes in under 5 minutes on a 2-core machine, and
mean reward/mean over the last 10 steps is at least 0.3 above the first 10.

    python bench/learning.py [--run-dir DIR] [--graph graphs/quickstart.yaml]

Writes bench/results/learning.json and bench/results/learning.png.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS, ROOT, machine, mean, quickstart_args, write_result

WALL_TARGET_S = 300.0
GAIN_TARGET = 0.3



def run_quickstart(graph: Path, run_dir: Path, extra: list[str]) -> float:
    """`rlgraph run GRAPH --out RUN_DIR`; returns its wall time in seconds."""
    cmd = [sys.executable, "-m", "rlgraph", "run", str(graph), "--out", str(run_dir), *extra]
    print("$", " ".join(cmd), flush=True)
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    wall = time.time() - start
    sys.stdout.write(proc.stdout[-3000:])
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-5000:])
        raise SystemExit(f"rlgraph run failed with status {proc.returncode}")
    return wall


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Reward per step with a 10-step running mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    reward = [r["reward/mean"] for r in rows]
    smooth = [mean(reward[max(0, i - 9):i + 1]) for i in range(len(reward))]
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
    ax.plot(steps, reward, color="#9ecae1", lw=1, label="reward/mean")
    ax.plot(steps, smooth, color="#08519c", lw=2, label="10-step mean")
    ax.set_xlabel("train step")
    ax.set_ylabel("reward/mean")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = quickstart_args(__doc__.splitlines()[0], argv)
    wall = None
    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="rlgraph-learning-"))
        wall = run_quickstart(Path(args.graph), run_dir, args.overrides)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]
    first = mean([r["reward/mean"] for r in rows[:10]])
    last = mean([r["reward/mean"] for r in rows[-10:]])
    plan = json.loads((run_dir / "plan.json").read_text())
    result = {
        "benchmark": "learning",
        "machine": machine(),
        "command": f"rlgraph run {Path(args.graph).relative_to(ROOT)} "
                   + " ".join(args.overrides),
        "graph": plan["spec"],
        "wall_s": wall,
        "wall_target_s": WALL_TARGET_S,
        "steps": len(rows),
        "train_time_s": sum(r["time/step_s"] for r in rows),
        "reward_first10": first,
        "reward_last10": last,
        "reward_gain": last - first,
        "gain_target": GAIN_TARGET,
        "lag_max": max(r["lag/max"] for r in rows),
        "max_policy_lag": plan["lag"]["max_policy_lag"],
        "passed": (wall is None or wall < WALL_TARGET_S) and last - first >= GAIN_TARGET,
        "curve": [{k: r.get(k) for k in ("step", "reward/mean", "lag/max", "lag/mean",
                                         "time/step_s", "loss/kl", "policy/version")}
                  for r in rows],
    }
    write_result("learning.json", result)
    title = (f"quickstart: reward {first:.2f} (first 10) -> {last:.2f} (last 10)"
             + (f", {wall:.0f} s wall" if wall else ""))
    plot(rows, RESULTS / "learning.png", title)
    print(f"{title}; gain {last - first:+.2f} (target >= {GAIN_TARGET}); "
          f"lag/max {result['lag_max']:g} <= {result['max_policy_lag']}; "
          f"wrote bench/results/learning.json, learning.png")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
