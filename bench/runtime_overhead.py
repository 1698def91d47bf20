"""Orchestration overhead of the Ray runtime at quickstart scale.

Overhead per step = step time minus the busy time on the critical path: from the measured
trace, walk back from the last train span through the dependency that released each span
last (data inputs, its own previous step, the previous task on its groups, the
param_update that gave generate its version); the gaps between those spans are the time
the runtime itself took (dispatch, moving batches, the driver's reaction). Target: < 5%.

    python bench/runtime_overhead.py [--steps 30] [--run-dir DIR]

Writes bench/results/runtime_overhead.json.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import machine, quickstart_args, write_result

TARGET = 0.05
WARMUP_STEPS = 2  # the first steps pay one-off costs (allocator, first forward)



def run(graph: Path, steps: int, out: Path, overrides: list[str]) -> float:
    """Run the graph in-process with the runtime; returns the wall time."""
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import load_spec
    from rlgraph.runtime.runner import Runner, RunOptions

    spec = load_spec(graph, overrides)
    spec.schedule.steps = steps
    plan = compile_plan(spec)
    (out / "plan.json").write_text(json.dumps(plan))
    start = time.time()
    Runner(spec, plan, RunOptions(out_dir=out, steps=steps, tensorboard=False)).run()
    return time.time() - start


def main(argv: list[str] | None = None) -> int:
    args = quickstart_args(__doc__.splitlines()[0], argv, steps=30)

    from rlgraph.config.load import validate_spec
    from rlgraph.errors import SourceMap
    from rlgraph.graph import build_graph
    from rlgraph.report.chrome_trace import events_from_trace
    from rlgraph.runtime.tracing import critical_path

    if args.run_dir:
        out, wall = Path(args.run_dir), None
    else:
        out = Path(tempfile.mkdtemp(prefix="rlgraph-overhead-"))
        wall = run(Path(args.graph), args.steps, out, args.overrides)
    plan = json.loads((out / "plan.json").read_text())
    spec = validate_spec(plan["spec"], SourceMap())
    graph = build_graph(spec)
    events = events_from_trace(json.loads((out / "trace.json").read_text()))
    path = critical_path(events, graph, spec.schedule.max_lag, first_step=WARMUP_STEPS)
    gaps = [b["start"] - a["end"] for a, b in zip(path.spans, path.spans[1:])]
    per_step_s = path.overhead_s / max(path.steps, 1)
    step_s = path.wall_s / max(path.steps, 1)
    result = {
        "benchmark": "runtime_overhead",
        "machine": machine(),
        "graph": str(Path(args.graph).name),
        "steps_measured": path.steps,
        "first_step": WARMUP_STEPS,
        "run_wall_s": wall,
        "critical_path_wall_s": path.wall_s,
        "critical_path_busy_s": path.busy_s,
        "overhead_s": path.overhead_s,
        "step_s": step_s,
        "overhead_per_step_s": per_step_s,
        "overhead_fraction": path.overhead_fraction,
        "target_fraction": TARGET,
        "passed": path.overhead_fraction < TARGET,
        "hops_on_path": len(gaps),
        "hop_gap_ms": {"median": statistics.median(gaps) * 1e3 if gaps else 0.0,
                       "p90": sorted(gaps)[int(0.9 * (len(gaps) - 1))] * 1e3 if gaps else 0.0,
                       "max": max(gaps) * 1e3 if gaps else 0.0},
        "path_nodes": [f"{e['node']}({e['step']})" for e in path.spans],
    }
    write_result("runtime_overhead.json", result)
    print(f"step {step_s * 1e3:.0f} ms, of which runtime overhead {per_step_s * 1e3:.1f} ms "
          f"({path.overhead_fraction:.1%}, target < {TARGET:.0%}) over {path.steps} steps; "
          f"{len(gaps)} hops on the critical path, median gap "
          f"{result['hop_gap_ms']['median']:.1f} ms; wrote bench/results/runtime_overhead.json")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
