"""Streaming vs the same plan without it vs colocated sync, on the long-tail task (CPU).

Runs `rlgraph run graphs/longtail.yaml` (a tiny model learning long-tailed countdowns with
GRPO on this machine's CPU cores) in each mode, the same versions and so the same samples:

- sync: one group holding every task on both cores, max_lag 0 (verl's hybrid engine);
- split_lag0 / stream_lag0: trainer | rollout groups of one core each, max_lag 0, without
  and with `schedule.stream: {mini_batches: K}` (verl fully_async with staleness 0);
- split_lag1 / stream_lag1: the same at max_lag 1 (one-step-off, and streaming on top);
- colo_stream_lag0 / colo_stream_lag1: sync's one group streaming (generate and train
  time-sliced, the engine sampling from a snapshot refreshed once per version), max_lag 0,
  and max_lag 1 with partial rollout.

Streaming trains on each mini-batch of complete groups as generate emits it (K optimizer
steps per version, one weight sync per version) and generate refills finished rows with new
prompts (the rollout cache keeps the whole batch in flight), so the batch's long tail
overlaps training instead of idling the trainer. The same work: every mode takes K optimizer
steps per version on mini-batches of the same size (`nodes.train.mini_batches: K` where it
does not stream, verl's ppo_mini_batch_size), so only the pipeline differs.

Per mode: samples/s over the steady rows (without the first WARMUP versions and the last
max_lag + 1, start-up never counted), the final reward (mean over the last FINAL versions'
samples), the largest lag seen against the plan's bound, and the compiler's predicted
speedup over sync. Modes run `--repeats` times interleaved (A B C .. C B A ..) so slow spells
of other load hit every mode alike; each figure is the median run's with min and max, and
the ratios of interest are taken per repeat (runs of one repeat side by side).

    python bench/streaming.py [--steps 20] [--repeats 3] [--mini-batches 4] [--modes ..]
        [--name streaming.json]

Writes bench/results/streaming.json (or --name).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import ROOT, machine, spread, write_result

GRAPH = ROOT / "graphs" / "longtail.yaml"
WARMUP = 3  # versions
FINAL = 8  # versions whose samples give the final reward
TARGET = 1.3  # streaming over the same plan without it
COLOCATED = "groups={colocated: {share: 1.0, tasks: [logp, train, generate]}}"
PAIRS = {"lag0": ("stream_lag0", "split_lag0"), "lag1": ("stream_lag1", "split_lag1"),
         "colocated": ("colo_stream_lag0", "sync")}


def modes(k: int) -> dict[str, tuple[str, list[str]]]:
    """Mode -> (what it is, its overrides of graphs/longtail.yaml)."""
    stream = f"schedule.stream.mini_batches={k}"
    updates = f"nodes.train.mini_batches={k}"  # the same optimizer steps, not streamed
    return {
        "sync": ("colocated sync, max_lag 0 (verl hybrid engine)",
                 [COLOCATED, "schedule.max_lag=0", updates]),
        "split_lag0": ("trainer | rollout, max_lag 0", ["schedule.max_lag=0", updates]),
        "stream_lag0": (f"trainer | rollout, max_lag 0, streaming {k} mini-batches",
                        ["schedule.max_lag=0", stream]),
        "split_lag1": ("trainer | rollout, max_lag 1 (one-step-off)",
                       ["schedule.max_lag=1", updates]),
        "stream_lag1": (f"trainer | rollout, max_lag 1, streaming {k} mini-batches",
                        ["schedule.max_lag=1", stream]),
        "colo_stream_lag0": (f"colocated, max_lag 0, streaming {k} mini-batches (time-sliced)",
                             [COLOCATED, "schedule.max_lag=0", stream]),
        "colo_stream_lag1": (f"colocated, max_lag 1, partial rollout, streaming {k}",
                             [COLOCATED, "schedule.max_lag=1", "schedule.partial_rollout=true",
                              stream]),
    }


def run_mode(overrides: list[str], steps: int, out: Path) -> None:
    """`rlgraph run` as a user would."""
    cmd = [sys.executable, "-m", "rlgraph", "run", str(GRAPH), *overrides, "--steps",
           str(steps), "--out", str(out), "--no-progress", "--checkpoint-every", "0"]
    print("$", " ".join(cmd[2:]), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        raise SystemExit(f"rlgraph run failed with status {proc.returncode}")


def measure(out: Path) -> dict[str, Any]:
    """Steady samples/s, final reward, lag of one finished run."""
    plan = json.loads((out / "plan.json").read_text())
    k, lag = plan["lag"].get("mini_batches", 1), plan["lag"]["max_lag"]
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln]
    steady = rows[WARMUP * k:len(rows) - (lag + 1) * k]
    final = rows[-FINAL * k:]
    return {
        "samples_per_s": sum(r["samples"] for r in steady) / sum(r["time/step_s"]
                                                                  for r in steady),
        "reward_final": sum(r["reward/mean"] * r["samples"] for r in final)
        / sum(r["samples"] for r in final),
        "reward_first": sum(r["reward/mean"] for r in rows[:k * 2]) / (2 * k),
        "lag_max": max(r["lag/max"] for r in rows), "lag_bound": plan["lag"]["max_policy_lag"],
        "samples": sum(r["samples"] for r in rows), "rows": len(rows),
        "predicted_speedup_vs_sync": plan["schedule"]["speedup_vs_sync"],
        "predicted_period_s": plan["schedule"]["period_s"],
    }


def main(argv: list[str] | None = None) -> int:
    """Run every mode, interleaved, and write the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="versions per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mini-batches", type=int, default=4)
    parser.add_argument("--modes", default=None, help="comma-separated subset")
    parser.add_argument("--name", default="streaming.json", help="result file name")
    args = parser.parse_args(argv)
    table = modes(args.mini_batches)
    names = args.modes.split(",") if args.modes else list(table)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    work = Path(tempfile.mkdtemp(prefix="rlgraph-streaming-"))
    started = time.time()
    for r in range(args.repeats):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            out = work / f"{name}-{r}"
            run_mode(table[name][1], args.steps, out)
            runs[name].append(measure(out))
            print(f"  {name} repeat {r}: {runs[name][-1]['samples_per_s']:.1f} samples/s, "
                  f"final reward {runs[name][-1]['reward_final']:.3f}", flush=True)
    result: dict[str, Any] = {
        "benchmark": "streaming", "machine": machine(), "graph": str(GRAPH.relative_to(ROOT)),
        "steps": args.steps, "repeats": args.repeats, "mini_batches": args.mini_batches,
        "note": "CPU, 2 cores shared with other work on this machine: ratios are per repeat "
                "(runs side by side), figures are medians with min and max",
        "wall_s": time.time() - started, "modes": {}, "ratios": {}, "target": TARGET,
    }
    for name in names:
        figures = runs[name]
        result["modes"][name] = {
            "what": table[name][0], "overrides": table[name][1], "runs": figures,
            "samples_per_s": spread([f["samples_per_s"] for f in figures]),
            "reward_final": spread([f["reward_final"] for f in figures]),
            "lag_max": max(f["lag_max"] for f in figures), "lag_bound": figures[0]["lag_bound"],
            "predicted_speedup_vs_sync": figures[0]["predicted_speedup_vs_sync"]}
        if "sync" in runs and name != "sync":
            result["ratios"][f"{name}/sync"] = spread(
                [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(figures, runs["sync"])])
    for stream, plain in PAIRS.values():
        if stream in runs and plain in runs:
            ratios = [a["samples_per_s"] / b["samples_per_s"]
                      for a, b in zip(runs[stream], runs[plain])]
            result["ratios"][f"{stream}/{plain}"] = {**spread(ratios), "per_repeat": ratios,
                                                     "meets_target": statistics.median(
                                                         ratios) >= TARGET}
    path = write_result(args.name, result)
    for name in names:
        m = result["modes"][name]
        print(f"{name:12s} {m['samples_per_s']['median']:7.1f} samples/s "
              f"[{m['samples_per_s']['min']:.1f}, {m['samples_per_s']['max']:.1f}]  "
              f"final reward {m['reward_final']['median']:.3f}  lag {m['lag_max']} <= "
              f"{m['lag_bound']}  predicted {m['predicted_speedup_vs_sync']:.2f}x vs sync")
    for key, value in result["ratios"].items():
        print(f"{key:24s} {value['median']:.2f}x [{value['min']:.2f}, {value['max']:.2f}]")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
