"""What the RL core learns and what each worker costs, without Ray: the quickstart's graph
run by the serial driver (`rlgraph.runtime.serial.run_serial`, same workers, same lag, one process).

The Ray runtime adds orchestration to these numbers and overlaps generate with train; this
benchmark separates the two: per-step seconds of every worker at quickstart scale, the
reward curve and its first-10 / last-10 gain.

    python bench/serial_learning.py [--graph graphs/quickstart.yaml] [key=value ...]

Writes bench/results/serial_learning.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import machine  # noqa: E402

from rlgraph.config.load import load_spec  # noqa: E402
from rlgraph.runtime.serial import run_serial  # noqa: E402


def main() -> None:
    """Run, print and record."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default=str(ROOT / "graphs" / "quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "serial_learning.json"))
    parser.add_argument("overrides", nargs="*", help="graph.yaml overrides, key=value")
    args = parser.parse_args()
    spec = load_spec(args.graph, args.overrides)
    torch.set_num_threads(1)  # one core per group, as the runtime gives each actor
    os.environ.setdefault("RLGRAPH_CACHE", tempfile.mkdtemp())  # warm start timed too
    run = run_serial(spec, args.steps)
    rewards = [m["metrics"]["reward/mean"] for m in run.metrics]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    result = {
        "benchmark": "serial_learning",
        "machine": {**machine(), "torch": torch.__version__, "threads_per_worker": 1},
        "command": " ".join(["python bench/serial_learning.py", *sys.argv[1:]]),
        "graph": spec.to_yaml_dict(),
        "steps": len(rewards),
        "setup_s": round(run.setup_s, 2),
        "wall_s": round(run.wall_s, 2),
        "seconds_per_step": {k: round(v, 4) for k, v in run.seconds.items()},
        "reward_first10": round(first, 4),
        "reward_last10": round(last, 4),
        "gain": round(last - first, 4),
        "reward_per_10_steps": [round(sum(rewards[i:i + 10]) / len(rewards[i:i + 10]), 3)
                                for i in range(0, len(rewards), 10)],
        "lag_max": max(m["metrics"]["lag/max"] for m in run.metrics),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "graph"}, indent=2))


if __name__ == "__main__":
    main()
