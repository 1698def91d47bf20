"""Orchestration overhead of the Ray runtime at quickstart scale.

Overhead per step = step time minus the busy time on the critical path: from the measured
trace, walk back from the last train span through the dependency that released each span
last (data inputs, its own previous step, the previous task on its groups, the
param_update that gave generate its version); the gaps between those spans are the time
the runtime itself took (dispatch, moving batches, the driver's reaction). Target: < 5%.

`--fuse both` runs the graph with fused actor calls (runtime.executor: a group's chained
tasks in one call, the default) and without, `--repeats` times each, interleaved, and
reports both overheads per step (medians and ranges) side by side.

    python bench/runtime_overhead.py [--steps 30] [--run-dir DIR]
    python bench/runtime_overhead.py --graph G --fuse both --repeats 3 --out NAME.json

Writes bench/results/runtime_overhead.json (`--out` to write elsewhere).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import machine, quickstart_args, spread, write_result

TARGET = 0.05
WARMUP_STEPS = 2  # the first steps pay one-off costs (allocator, first forward)



def run(graph: Path, steps: int, out: Path, overrides: list[str], fuse: bool = True) -> float:
    """Run the graph in-process with the runtime; returns the wall time."""
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import load_spec
    from rlgraph.runtime.runner import Runner, RunOptions

    spec = load_spec(graph, overrides)
    spec.schedule.steps = steps
    plan = compile_plan(spec)
    start = time.time()
    Runner(plan, RunOptions(out_dir=out, steps=steps, tensorboard=False, fuse=fuse)).run()
    return time.time() - start


def measure(out: Path) -> dict:
    """Overhead on the critical path of the finished run in `out`."""
    from rlgraph.compiler.plan import Plan
    from rlgraph.report.chrome_trace import events_from_trace
    from rlgraph.runtime.tracing import critical_path

    plan = Plan.read(out / "plan.json")
    events = events_from_trace(json.loads((out / "trace.json").read_text()))
    path = critical_path(events, plan.graph, first_step=WARMUP_STEPS)
    gaps = [b["start"] - a["end"] for a, b in zip(path.spans, path.spans[1:])]
    return {
        "steps_measured": path.steps,
        "first_step": WARMUP_STEPS,
        "critical_path_wall_s": path.wall_s,
        "critical_path_busy_s": path.busy_s,
        "overhead_s": path.overhead_s,
        "step_s": path.wall_s / max(path.steps, 1),
        "overhead_per_step_s": path.overhead_s / max(path.steps, 1),
        "overhead_fraction": path.overhead_fraction,
        "hops_on_path": len(gaps),
        "hop_gap_ms": {"median": statistics.median(gaps) * 1e3 if gaps else 0.0,
                       "p90": sorted(gaps)[int(0.9 * (len(gaps) - 1))] * 1e3 if gaps else 0.0,
                       "max": max(gaps) * 1e3 if gaps else 0.0},
        "path_nodes": [f"{e['node']}({e['step']})" for e in path.spans],
    }


def compare(args) -> int:
    """Fused and unfused runs of one graph, interleaved; overhead per step of each."""
    runs: dict[str, list[dict]] = {"fused": [], "unfused": []}
    for repeat in range(args.repeats):
        order = ["fused", "unfused"] if repeat % 2 == 0 else ["unfused", "fused"]
        for mode in order:
            out = Path(tempfile.mkdtemp(prefix=f"rlgraph-overhead-{mode}-"))
            wall = run(Path(args.graph), args.steps, out, args.overrides, mode == "fused")
            got = {"run_wall_s": wall, **measure(out)}
            got.pop("path_nodes")
            runs[mode].append(got)
            print(f"{mode}: step {got['step_s'] * 1e3:.1f} ms, overhead "
                  f"{got['overhead_per_step_s'] * 1e3:.1f} ms a step", flush=True)
    summary = {mode: {key: spread([r[key] for r in rs]) for key in
                      ("step_s", "overhead_per_step_s", "overhead_fraction")}
               for mode, rs in runs.items()}
    ratio = [f["overhead_per_step_s"] - u["overhead_per_step_s"]
             for f, u in zip(runs["fused"], runs["unfused"])]
    result = {"benchmark": "runtime_overhead", "machine": machine(),
              "command": "python bench/runtime_overhead.py " + " ".join(sys.argv[1:]),
              "graph": str(Path(args.graph).name), "steps": args.steps,
              "first_step": WARMUP_STEPS, "repeats": args.repeats,
              "load_average_1_5_15": os.getloadavg(), "summary": summary,
              "fused_minus_unfused_overhead_s_same_repeat": spread(ratio), "runs": runs}
    write_result(args.out, result)
    for mode, figures in summary.items():
        print(f"{mode}: overhead {figures['overhead_per_step_s']['median'] * 1e3:.1f} ms a step "
              f"(step {figures['step_s']['median'] * 1e3:.1f} ms)")
    print(f"wrote bench/results/{args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--fuse", choices=["on", "off", "both"], default="on")
    extra.add_argument("--repeats", type=int, default=3)
    extra.add_argument("--out", default="runtime_overhead.json")
    known, rest = extra.parse_known_args(argv)
    args = quickstart_args(__doc__.splitlines()[0], rest, steps=30)
    args.fuse, args.repeats, args.out = known.fuse, known.repeats, known.out
    if args.fuse == "both":
        return compare(args)

    if args.run_dir:
        out, wall = Path(args.run_dir), None
    else:
        out = Path(tempfile.mkdtemp(prefix="rlgraph-overhead-"))
        wall = run(Path(args.graph), args.steps, out, args.overrides, args.fuse == "on")
    got = measure(out)
    result = {
        "benchmark": "runtime_overhead",
        "machine": machine(),
        "graph": str(Path(args.graph).name),
        "fused": args.fuse == "on",
        "run_wall_s": wall,
        **got,
        "target_fraction": TARGET,
        "passed": got["overhead_fraction"] < TARGET,
    }
    write_result(args.out, result)
    print(f"step {got['step_s'] * 1e3:.0f} ms, of which runtime overhead "
          f"{got['overhead_per_step_s'] * 1e3:.1f} ms ({got['overhead_fraction']:.1%}, "
          f"target < {TARGET:.0%}) over {got['steps_measured']} steps; "
          f"{got['hops_on_path']} hops on the critical path, median gap "
          f"{got['hop_gap_ms']['median']:.1f} ms; wrote bench/results/{args.out}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
