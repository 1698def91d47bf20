"""The CPU learning check of in-flight weight updates: the quickstart's task (tiny preset after
its warm start, add_small) learned by the synchronous plan and by partial rollout with
in-flight updates (max_lag 2, kv keep, stale: finish), several seeds each, in one process by
the serial driver (`rlgraph.runtime.serial.run_serial`: the runtime's pipeline, its lag gate
and its weight moves; rows stay in the engine from one call to the next and new versions
arrive between calls, so kept KV spans versions). The in-flight reward must land within the
synchronous runs' run-to-run spread, with no lag violation and no token left out as stale.

    python bench/inflight_learning.py [--steps 40] [--seeds 0,1,2] [--out DIR]

Writes OUT/inflight-learning.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUICK = {  # the quickstart's RL settings (graphs/quickstart.yaml) on a smaller batch
    "model": {"preset": "tiny", "warm_start": {"steps": 30, "lr": 1e-3, "batch_size": 64}},
    "data": {"task": "add_small", "prompts_per_step": 8, "samples_per_prompt": 8,
             "prompt_len": 8, "response_len": {"mean": 2, "max": 4}},
    "algorithm": {"name": "grpo", "kl_coef": 0.0},
    "train": {"lr": 3e-4, "warmup_steps": 10},
}
PLANS = {  # name -> (max_lag, generate settings, partial rollout)
    "sync": (0, {}, False),
    "partial-lag2-inflight": (2, {"inflight": True, "sync_every": 1, "stale": "finish"}, True),
}


def spec_of(plan: str) -> Any:
    """The graph of one plan: two groups (generate | train), as rl_support.make_spec."""
    from rlgraph.config.load import validate_spec
    from rlgraph.errors import SourceMap

    lag, generate, partial = PLANS[plan]
    raw = {
        "name": f"inflight-learning-{plan}",
        "cluster": {"local": True, "cpus": 2},
        "model": QUICK["model"], "data": QUICK["data"], "algorithm": QUICK["algorithm"],
        "groups": {"trainer": {"share": 0.5, "tasks": ["train"]},
                   "rollout": {"share": 0.5, "tasks": ["generate"]}},
        "nodes": {"generate": {"kind": "generate", **generate}, "reward": {"kind": "reward"},
                  "train": {"kind": "train", **QUICK["train"]},
                  "param_update": {"kind": "param_update", "src": "train", "dst": "generate"}},
        "schedule": {"max_lag": lag, "partial_rollout": partial},
    }
    return validate_spec(raw, SourceMap())


def learning_runs(steps: int, seeds: list[int], plans: list[str]) -> dict[str, Any]:
    """Each plan and seed run serially: reward per step, its last-10 mean, lag and the
    tokens train left out as stale."""
    import torch

    from rlgraph.runtime.serial import run_serial

    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    for plan in plans:
        for seed in seeds:
            began = time.perf_counter()
            run = run_serial(spec_of(plan), steps, seed=seed)
            rewards = [m["metrics"]["reward/mean"] for m in run.metrics]
            tail = rewards[-min(10, len(rewards)):]
            out[f"{plan}@{seed}"] = {
                "plan": plan, "seed": seed,
                "reward_last10": round(sum(tail) / len(tail), 4),
                "reward": [round(r, 4) for r in rewards],
                "lag_max": max(m["metrics"]["lag/max"] for m in run.metrics),
                "stale_tokens": sum(m["metrics"].get("lag/stale_tokens", 0.0)
                                    for m in run.metrics),
                "kept_rows": sum(m.get("rollout/kept", 0.0)
                                 for m in run.node_metrics.get("generate", [])),
                "refilled_groups": sum(m.get("rollout/refilled", 0.0)
                                       for m in run.node_metrics.get("generate", [])),
                "wall_s": round(time.perf_counter() - began, 1)}
    return out


def verdict(runs: dict[str, Any], max_lag: int = 2) -> dict[str, Any]:
    """The synchronous runs' spread (min, max of their last-10 rewards) and whether every
    in-flight run lies within it widened by its width, within the lag bound, none stale."""
    sync = [r["reward_last10"] for r in runs.values() if r["plan"] == "sync"]
    lo, hi = min(sync), max(sync)
    width = hi - lo
    inflight = [r for r in runs.values() if r["plan"] != "sync"]
    return {"sync_spread": [lo, hi],
            "inflight_last10": [r["reward_last10"] for r in inflight],
            "within_spread": all(lo - width <= r["reward_last10"] <= hi + width
                                 for r in inflight),
            "no_lag_violation": all(r["lag_max"] <= max_lag and r["stale_tokens"] == 0
                                    for r in inflight)}


def main() -> int:
    """Run, print and write the result."""
    from bench.common import machine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    os.environ.setdefault("RLGRAPH_CACHE", tempfile.mkdtemp())  # the warm start, once
    runs = learning_runs(args.steps, [int(s) for s in args.seeds.split(",")], list(PLANS))
    result = {"benchmark": "inflight_learning", "machine": machine(),
              "command": " ".join(["python bench/inflight_learning.py", *sys.argv[1:]]),
              "steps": args.steps, "plans": {p: {"max_lag": v[0], "generate": v[1],
                                                 "partial_rollout": v[2]}
                                             for p, v in PLANS.items()},
              "runs": runs, "verdict": verdict(runs)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inflight-learning.json").write_text(json.dumps(result, indent=1) + "\n")
    for key, r in runs.items():
        print(f"{key:<28} reward last10 {r['reward_last10']:.3f}  lag max {r['lag_max']:g}  "
              f"stale {r['stale_tokens']:g}  kept rows {r['kept_rows']:g}  {r['wall_s']} s")
    print(json.dumps(result["verdict"]))
    return 0 if result["verdict"]["within_spread"] and result["verdict"]["no_lag_violation"] \
        else 1


if __name__ == "__main__":
    raise SystemExit(main())
