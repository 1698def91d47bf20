"""Async vs sync on the long-tail workload (the project's headline), measured side by side.

Runs `rlgraph run graphs/longtail.yaml` (a tiny model learning long-tailed countdowns with
GRPO on this machine's CPU cores) in each mode below, the same steps and so the same samples:

- sync: one group holding every task on both cores, max_lag 0 (verl's hybrid engine);
- sync_1core (a control, not an async mode): the same colocated plan on one core, one torch
  thread: whether the two-thread sync gains anything from its second thread (a tiny model's
  decode and train barely parallelise, and a thread that waits for a preempted partner
  stalls the step);
- sync_replicas: the colocated plan as two data-parallel replicas of one core (and one torch
  thread) each, `replicas: 2` (rlgraph.process.replicas): each generates and trains on half of every
  step's prompts, gloo sums the gradients;
- one_step_off: trainer | rollout groups of one core each, max_lag 1 (verl's one-step-off);
- max_lag_2: the same groups, max_lag 2;
- partial_rollout: the same groups, max_lag 2, `schedule.partial_rollout: true` (skipped with
  the runtime's reason while `rlgraph run` refuses it). max_lag 2, not 1: generate(t) runs
  beside train(t-1) on version t-1, so a sample it leaves unfinished would be trained at t+1
  with tokens two versions old; at max_lag 1 the rollout cache carries nothing.

Per mode: samples/s over the steady steps (without the first WARMUP_STEPS, where caches and
the pipeline fill, and the last max_lag + 1, where it drains; start-up is never counted),
the train time to a reward level (the level: LEVEL_FRACTION of the lowest final reward, so
every mode can reach it; reward as a ROLLING-step running mean), the final reward (mean of the
last 10 steps), and the compiler's predicted speedup over sync, three ways:

- uncalibrated: `compile_plan(mode)` alone (analytic cost model, `speedup_vs_sync`);
- calibrated: node times measured in the sync run's trace carried to the mode's plan as
  the compiler carries a calibration to its own sync baseline: each node's measured/modelled
  ratio in the sync plan times its modelled time in the mode's plan (so a group of one core
  costs what the model says one core costs relative to two, and partial rollout's generate
  what the model says its mean length costs relative to the max); then the period of
  `compile_plan(mode, calibration=those)` against `compile_plan(sync, calibration=trace)`;
- calibrated as is: `compile_plan(mode, calibration=the sync trace)`, what `rlgraph compile
  --calibrate SYNC_RUN` says: each node costs what it measured on two threads (no thread
  effect); the calibrated figure above assumes the model's perfect scaling with slots; CPU
  threads on a tiny model fall between the two;
- calibrated on one core (with the sync_1core control): node times of the one-thread sync
  trace (the thread count of the split groups) carried to the mode's plan as above, against
  `compile_plan(sync, calibration=sync trace)`; `err` in the table is this one's;
- as measured: `compile_plan(mode, calibration=the mode's own trace)`: the schedule model
  alone, given each node's measured time (known only after the run).

Each mode runs `--repeats` times (default 3), interleaved A B C D D C B A A B C D so slow
spells of other load on the machine hit every mode alike. Every figure is the median run's
(by samples/s), with its spread: samples/s median, min and max over the repeats, and the
speedup over sync per repeat (mode run r against sync run r, measured side by side) as
median, min and max. Every run's figure is kept in the JSON.

    python bench/async_vs_sync.py [--steps 40] [--modes sync,one_step_off] [--runs DIR]

Writes bench/results/async_vs_sync.json and bench/results/async_vs_sync.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, machine, mean, write_result

GRAPH = ROOT / "graphs" / "longtail.yaml"
WARMUP_STEPS = 3
LEVEL_FRACTION = 0.9
ROLLING = 5
SPEEDUP_TARGET = 1.5
PREDICTION_TARGET = 0.15
MODES: dict[str, tuple[str, list[str]]] = {
    "sync": ("colocated sync, max_lag 0 (verl hybrid engine)",
             ["groups=COLOCATED", "schedule.max_lag=0"]),
    "sync_1core": ("control: colocated sync on one core (one torch thread)",
                   ["groups=COLOCATED", "schedule.max_lag=0", "cluster.cpus=1"]),
    "sync_replicas": ("colocated sync as two data-parallel replicas of one core each",
                      ["groups=COLOCATED_REPLICAS", "schedule.max_lag=0"]),
    "one_step_off": ("trainer | rollout, max_lag 1 (one-step-off)", ["schedule.max_lag=1"]),
    "max_lag_2": ("trainer | rollout, max_lag 2", ["schedule.max_lag=2"]),
    "partial_rollout": ("trainer | rollout, max_lag 2, partial rollout",
                        ["schedule.max_lag=2", "schedule.partial_rollout=true"]),
}


def colocated(graph: Path, replicas: int = 1) -> str:
    """The override putting every grouped task of the graph in one group on all cores (as
    `replicas` processes)."""
    sys.path.insert(0, str(ROOT))
    from rlgraph.config.load import load_spec

    tasks = [t for g in load_spec(graph).groups.values() for t in g.tasks]
    return (f"groups={{colocated: {{share: 1.0, tasks: [{', '.join(tasks)}], "
            f"replicas: {replicas}}}}}")


def refusal(graph: Path, overrides: list[str]) -> str | None:
    """Why `rlgraph run` would refuse this mode before starting (None: it runs it)."""
    sys.path.insert(0, str(ROOT))
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import load_spec
    from rlgraph.errors import RLGraphError
    from rlgraph.runtime.runner import Runner, RunOptions

    try:
        spec = load_spec(graph, overrides)
        Runner(compile_plan(spec), RunOptions(out_dir=Path(tempfile.mkdtemp()), steps=1))
    except RLGraphError as err:
        return err.render() if hasattr(err, "render") else str(err)
    return None


def run_mode(graph: Path, overrides: list[str], steps: int, out: Path) -> float | str:
    """`rlgraph run` as a user would; its wall time (start-up included), or why it failed."""
    cmd = [sys.executable, "-m", "rlgraph", "run", str(graph), *overrides, "--steps",
           str(steps), "--out", str(out), "--no-progress"]
    print("$", " ".join(cmd[2:]), flush=True)
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        return f"rlgraph run failed with status {proc.returncode}: " + \
            (proc.stderr.strip().splitlines() or ["?"])[-1]
    return time.time() - start


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.strip()]


def measure(rows: list[dict[str, Any]], max_lag: int) -> dict[str, Any]:
    """Steady samples/s, the reward curve against train time, response lengths."""
    steady = rows[WARMUP_STEPS:len(rows) - max_lag - 1]
    clock, curve = 0.0, []
    for i, r in enumerate(rows):
        clock += r["time/step_s"]
        window = [x["reward/mean"] for x in rows[max(0, i - ROLLING + 1):i + 1]]
        curve.append({"step": r["step"], "time_s": clock, "reward": r["reward/mean"],
                      "reward_rolling": mean(window), "window_full": i >= ROLLING - 1,
                      "length_mean": r.get("response/length_mean"),
                      "generate_s": r.get("time/generate_s")})
    return {
        "steady_steps": [steady[0]["step"], steady[-1]["step"]],
        "samples_per_s": sum(r["samples"] for r in steady) / sum(r["time/step_s"] for r in steady),
        "step_s": mean([r["time/step_s"] for r in steady]),
        "train_time_s": clock,
        "reward_first5": mean([r["reward/mean"] for r in rows[:5]]),
        "reward_final": mean([r["reward/mean"] for r in rows[-10:]]),
        "length_mean": mean([r["response/length_mean"] for r in rows]),
        "lag_max": max(r["lag/max"] for r in rows),
        "curve": curve,
    }


def time_to(curve: list[dict[str, Any]], level: float) -> float | None:
    """Train seconds until the rolling reward (over a full window, so one lucky first batch
    does not count) first reaches `level` (None: never)."""
    return next((c["time_s"] for c in curve
                 if c["window_full"] and c["reward_rolling"] >= level), None)


def predictions(graph: Path, modes: dict[str, list[str]], runs: dict[str, Path]
                ) -> dict[str, dict[str, float]]:
    """Predicted period and speedup over sync per mode (see the module docstring)."""
    sys.path.insert(0, str(ROOT))
    from rlgraph.compiler import compile_plan, load_calibration
    from rlgraph.config.load import load_spec

    def plan(name: str, calibration: Any = None) -> dict[str, Any]:
        return compile_plan(load_spec(graph, modes[name]), calibration)

    def carry(base: str, measured: dict[str, float], model: dict[str, Any]
              ) -> dict[str, float]:
        """Measured seconds of plan `base`, scaled by the model's ratio mode / base."""
        ref = {n: c["seconds"] for n, c in plan(base)["costs"].items()}
        return {n: measured[n] * model["costs"][n]["seconds"] / ref[n]
                for n in measured if n in model["costs"] and ref.get(n)}

    measured = load_calibration(runs["sync"] / "trace.json")
    one_core = (load_calibration(runs["sync_1core"] / "trace.json")
                if "sync_1core" in runs else None)
    sync_cal = plan("sync", measured)["schedule"]["period_s"]
    out = {}
    for name in modes:
        model = plan(name)
        carried = carry("sync", measured, model)
        calibrated = plan(name, carried)["schedule"]["period_s"]
        if one_core is not None:
            period = plan(name, carry("sync_1core", one_core, model))["schedule"]["period_s"]
            out.setdefault(name, {}).update(one_core_period_s=period,
                                            one_core_speedup=sync_cal / period)
        as_is = plan(name, measured)["schedule"]["period_s"]
        own = plan(name, runs[name] / "trace.json")["schedule"]["period_s"]
        out.setdefault(name, {}).update({
            "uncalibrated_period_s": model["schedule"]["period_s"],
            "uncalibrated_speedup": model["schedule"]["speedup_vs_sync"],
            "calibrated_period_s": calibrated,
            "calibrated_speedup": sync_cal / calibrated,
            "as_is_period_s": as_is,
            "as_is_speedup": sync_cal / as_is,
            "own_trace_period_s": own,
            "calibrated_costs_s": carried,
        })
    return out


def plot(results: dict[str, dict[str, Any]], level: float, path: Path) -> None:
    """Rolling reward of every mode against train time (start-up excluded)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4), dpi=120)
    for name, res in results.items():
        curve = res["measured"]["curve"]
        ax.plot([c["time_s"] for c in curve], [c["reward_rolling"] for c in curve], lw=2,
                label=f"{name}: {res['measured']['samples_per_s']:.1f} samples/s")
    ax.axhline(level, color="grey", lw=1, ls="--", label=f"level {level:.2f}")
    ax.set_xlabel("train time (s, start-up excluded)")
    ax.set_ylabel(f"reward/mean ({ROLLING}-step mean)")
    ax.set_title("longtail: same samples per mode, 2 CPU cores", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default=str(GRAPH))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode, interleaved "
                        "(A B C D D C B A ...); figures are medians with min and max")
    parser.add_argument("--runs", help="folder of earlier runs (MODE/) to reuse; default: "
                        "run every mode into a fresh temporary folder")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every mode")
    args = parser.parse_args(argv)
    graph, wanted = Path(args.graph), args.modes.split(",")
    if wanted[0] != "sync":
        raise SystemExit("--modes must start with sync: it is the baseline")
    root = Path(args.runs) if args.runs else Path(tempfile.mkdtemp(prefix="rlgraph-async-"))
    modes, runs, results, skipped = {}, {}, {}, {}
    order = [n for r in range(args.repeats) for n in (wanted if r % 2 == 0 else wanted[::-1])]
    for i, name in enumerate(order):
        desc, overrides = MODES[name]
        placeholders = {"groups=COLOCATED": colocated(graph),
                         "groups=COLOCATED_REPLICAS": colocated(graph, replicas=2)}
        overrides = [placeholders.get(o, o) for o in [*overrides, *args.overrides]]
        if name in skipped:
            continue
        why = refusal(graph, overrides)
        if why:
            print(f"skip {name}: {why}", flush=True)
            skipped[name] = why
            continue
        out = root / f"{name}-{order[:i].count(name)}"
        wall: float | str | None = None
        load = os.getloadavg()[0]
        if not (out / "metrics.jsonl").exists():
            wall = run_mode(graph, overrides, args.steps, out)
            if isinstance(wall, str):
                if name == "sync":
                    raise SystemExit(wall)
                print(f"skip {name}: {wall}", flush=True)
                skipped[name] = wall
                continue
            print(f"  {name}: {wall:.0f} s wall (load average before: {load:.1f})", flush=True)
        lag = int(next(o.split("=")[1] for o in overrides if o.startswith("schedule.max_lag")))
        run = {"dir": str(out), "wall_s": wall, "load_before": load,
               "measured": measure(rows_of(out), lag)}
        res = results.setdefault(name, {"description": desc, "overrides": overrides,
                                        "runs": []})
        res["runs"].append({k: v for k, v in run.items() if k != "measured"}
                           | {"samples_per_s": run["measured"]["samples_per_s"]})
        res.setdefault("_measured", []).append((run["measured"], out))
        modes[name] = overrides
    for name, res in results.items():  # the median run of every mode, and the spread
        ranked = sorted(res.pop("_measured"), key=lambda m: m[0]["samples_per_s"])
        res["measured"], runs[name] = ranked[(len(ranked) - 1) // 2]
        rates = [m["samples_per_s"] for m, _ in ranked]
        res["samples_per_s_spread"] = {"median": statistics.median(rates), "min": min(rates),
                                       "max": max(rates), "repeats": len(rates)}
    base = [r["samples_per_s"] for r in results["sync"]["runs"]]
    for res in results.values():
        ratios = [r["samples_per_s"] / b for r, b in zip(res["runs"], base)]
        res["speedup_spread"] = {"median": statistics.median(ratios), "min": min(ratios),
                                 "max": max(ratios), "paired_repeats": len(ratios)}
    for name, pred in predictions(graph, modes, runs).items():
        results[name]["predicted"] = pred
    level = LEVEL_FRACTION * min(r["measured"]["reward_final"] for r in results.values())
    lines = [f"{'mode':16} {'samples/s':>9} {'speedup':>8} {'pred(uncal)':>11} "
             f"{'pred(cal)':>9} {'pred(as is)':>11} {'pred(1core)':>11} {'err':>5} {'t→level':>8} "
             f"{'final':>6}  speedup median [min, max] per repeat; samples/s of every run"]
    for name, res in results.items():
        m, p = res["measured"], res["predicted"]
        m["speedup"] = (res["samples_per_s_spread"]["median"]
                        / results["sync"]["samples_per_s_spread"]["median"])
        m["time_to_level_s"] = time_to(m["curve"], level)
        p["calibrated_error"] = (m["speedup"] - p["calibrated_speedup"]) / p["calibrated_speedup"]
        one = p.get("one_core_speedup", float("nan"))
        p["one_core_error"] = (m["speedup"] - one) / one
        p["own_trace_error"] = (m["step_s"] - p["own_trace_period_s"]) / p["own_trace_period_s"]
        ttl = f"{m['time_to_level_s']:.0f} s" if m["time_to_level_s"] is not None else "never"
        lines.append(f"{name:16} {m['samples_per_s']:9.1f} {m['speedup']:7.2f}x "
                     f"{p['uncalibrated_speedup']:10.2f}x {p['calibrated_speedup']:8.2f}x "
                     f"{p['as_is_speedup']:10.2f}x {one:10.2f}x {p['one_core_error']:+5.0%} "
                     f"{ttl:>8} "
                     f"{m['reward_final']:6.2f}  "
                     f"{res['speedup_spread']['median']:.2f}x [{res['speedup_spread']['min']:.2f}, "
                     f"{res['speedup_spread']['max']:.2f}]; "
                     + ", ".join(f"{r['samples_per_s']:.1f}" for r in res["runs"]))
    best = max((r["measured"]["speedup"] for n, r in results.items()
                if not n.startswith("sync")),
               default=float("nan"))
    result = {
        "benchmark": "async_vs_sync",
        "machine": machine(),
        "graph": str(graph.relative_to(ROOT)) if graph.is_relative_to(ROOT) else str(graph),
        "steps": args.steps,
        "extra_overrides": args.overrides,
        "level": level,
        "targets": {"best_async_speedup": SPEEDUP_TARGET,
                    "prediction_within": PREDICTION_TARGET},
        "best_async_speedup": best,
        "modes": results,
        "skipped": skipped,
        "table": lines,
    }
    write_result("async_vs_sync.json", result)
    plot(results, level, RESULTS / "async_vs_sync.png")
    print("\n".join(lines))
    for name, why in skipped.items():
        print(f"{name}: skipped ({why})")
    print(f"level {level:.2f} = {LEVEL_FRACTION} x the lowest final reward; best async "
          f"{best:.2f}x sync (target >= {SPEEDUP_TARGET}x); wrote bench/results/"
          "async_vs_sync.json, async_vs_sync.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
