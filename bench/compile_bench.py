"""Compile-time benchmark: seed graphs, synthetic wide fan-out graphs, and the CLI process.

    python bench/compile_bench.py            # writes bench/results/compile.json

Targets: every seed graph compiles in under 20 ms in process (placement, costs,
lag, bound, the simulation, the max_lag sweep and the synchronous baseline included); a
1000-node graph in under 2 s; `rlgraph compile graphs/quickstart.yaml` as a fresh process, as a
user runs it (summary printed, plan and timeline files written, bytecode cached), in under
1 s wall (the compile path imports neither torch nor ray); `--json` is timed beside it.
Wall and CPU time are both recorded: other jobs share this machine, and CPU time is what
the compiler itself spends. Ratios
measured side by side in this run: the CLI process over a bare `python -c pass`, and the
1000-node graph over the 100-node one (the scaling of the passes).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import machine  # noqa: E402

from rlgraph.compiler import compile_plan  # noqa: E402
from rlgraph.config.load import load_spec, validate_spec  # noqa: E402
from rlgraph.config.schema import Spec  # noqa: E402
from rlgraph.errors import SourceMap  # noqa: E402

OUT = ROOT / "bench" / "results" / "compile.json"
SEED_TARGET_MS = 20.0
LARGE_TARGET_S = 2.0
CLI_TARGET_S = 1.0


def synthetic_spec(n_nodes: int, max_lag: int = 1) -> Spec:
    """Wide fan-out: k generate -> reward pairs feeding one train, a param_update per
    generate; generates spread over up to 16 one-GPU rollout groups; 3k + 1 nodes."""
    k = max(1, round((n_nodes - 1) / 3))
    rollouts = 1 << (min(k, 16).bit_length() - 1)
    nodes: dict[str, Any] = {"train": {"kind": "train"}}
    groups: dict[str, Any] = {"trainer": {"share": 0.5, "tasks": ["train"]}}
    groups.update({f"rollout{j}": {"share": 0.5 / rollouts, "tasks": []}
                   for j in range(rollouts)})
    edges = []
    for i in range(k):
        nodes[f"gen{i}"] = {"kind": "generate", "cost": {"seconds": 1.0 + (i % 7) / 10}}
        nodes[f"reward{i}"] = {"kind": "reward"}
        nodes[f"sync{i}"] = {"kind": "param_update", "src": "train", "dst": f"gen{i}"}
        groups[f"rollout{i % rollouts}"]["tasks"].append(f"gen{i}")
        edges += [f"gen{i} -> reward{i}", f"reward{i} -> train", f"train -> sync{i}",
                  f"sync{i} -> gen{i}"]
    data = {"name": f"synthetic-{n_nodes}",
            "cluster": {"nodes": 4, "gpus_per_node": 8, "gpu": "H100"},
            "model": {"preset": "qwen2.5-0.5b"},
            "data": {"prompts_per_step": 32, "samples_per_prompt": 4},
            "groups": groups, "nodes": nodes, "edges": edges,
            "schedule": {"max_lag": max_lag}}
    return validate_spec(data, SourceMap())


def timed(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
    """Median and min wall / CPU milliseconds of `fn`, and its first (cold) call."""
    first = time.perf_counter()
    fn()
    first = (time.perf_counter() - first) * 1e3
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall.append((time.perf_counter() - w) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
    return {"wall_ms_median": statistics.median(wall), "wall_ms_min": min(wall),
            "cpu_ms_median": statistics.median(cpu), "first_call_wall_ms": first,
            "repeats": repeats}


def plan_summary(plan: dict[str, Any]) -> dict[str, Any]:
    s = plan["schedule"]
    return {"period_s": s["period_s"], "bound_s": s["bound_s"],
            "sync_period_s": s["sync_period_s"], "speedup_vs_sync": s["speedup_vs_sync"],
            "steps_simulated": s["steps_simulated"], "bottleneck": s["bottleneck"]}


def bench_seeds() -> list[dict[str, Any]]:
    out = []
    for path in sorted((ROOT / "graphs").glob("*.yaml")):
        spec = load_spec(path)
        row = {"graph": str(path.relative_to(ROOT)), "nodes": len(spec.nodes)}
        row.update(timed(lambda spec=spec: compile_plan(spec), repeats=20))
        row.update(plan_summary(compile_plan(spec)))
        row["under_target"] = row["cpu_ms_median"] < SEED_TARGET_MS
        out.append(row)
        print(f"{row['graph']:42} {row['wall_ms_median']:7.2f} ms wall {row['cpu_ms_median']:7.2f}"
              f" ms cpu  period {row['period_s']:.4g} s  speedup {row['speedup_vs_sync']:.2f}")
    return out


def bench_synthetic() -> list[dict[str, Any]]:
    out = []
    for n in (10, 100, 1000):
        spec = synthetic_spec(n)
        row = {"graph": f"synthetic fan-out {n}", "nodes": len(spec.nodes)}
        row.update(timed(lambda spec=spec: compile_plan(spec), repeats=5 if n < 1000 else 3))
        row.update(plan_summary(compile_plan(spec)))
        row["under_target"] = n < 1000 or row["cpu_ms_median"] < LARGE_TARGET_S * 1e3
        out.append(row)
        print(f"{row['graph']:42} {row['wall_ms_median']:7.1f} ms wall {row['cpu_ms_median']:7.1f}"
              f" ms cpu  ({row['nodes']} nodes, {row['steps_simulated']} steps simulated)")
    return out


def _process_seconds(argv: list[str], repeats: int, env: dict[str, str] | None = None
                     ) -> tuple[float, float, float, int, str]:
    """Median wall, min wall and median CPU (user + system) seconds of a fresh process."""
    walls, cpus, code, err = [], [], 0, ""
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        result = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        code, err = result.returncode, result.stderr[-500:]
    return statistics.median(walls), min(walls), statistics.median(cpus), code, err


def user_env(cache: Path) -> dict[str, str]:
    """The environment of a user's shell: bytecode written and reused (an installed
    package's .pyc files; here in `cache`, warmed by a first untimed run), whatever this
    shell's PYTHONDONTWRITEBYTECODE says."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(cache)}


def bench_cli(repeats: int = 7) -> dict[str, Any]:
    """`rlgraph compile` as a user runs it (summary printed, files written), and `--json`,
    each as a fresh process, beside a bare `python -c pass`."""
    if importlib.util.find_spec("rlgraph.cli.main") is None:
        return {"skipped": "rlgraph.cli.main does not exist in this checkout"}
    graph = ROOT / "graphs" / "quickstart.yaml"
    if not graph.exists():
        return {"skipped": "graphs/quickstart.yaml does not exist in this checkout"}
    with tempfile.TemporaryDirectory() as tmp:
        env, out = user_env(Path(tmp) / "pycache"), str(Path(tmp) / "out")
        commands = {
            "summary": ["compile", str(graph), "-o", out],
            "json": ["compile", str(graph), "--json"],
        }
        for words in commands.values():  # warm the bytecode cache, as a user's second run
            subprocess.run([sys.executable, "-m", "rlgraph", *words], capture_output=True,
                           cwd=ROOT, env=env)
        python, _, python_cpu, _, _ = _process_seconds(
            [sys.executable, "-c", "pass"], repeats, env)
        rows: dict[str, Any] = {}
        for name, words in commands.items():  # interleaved would share one load: close enough
            wall, wall_min, cpu, code, err = _process_seconds(
                [sys.executable, "-m", "rlgraph", *words], repeats, env)
            shown = " ".join(["rlgraph", *words]).replace(str(ROOT) + "/", "").replace(out, "DIR")
            row = {"command": shown, "wall_s_median": wall, "wall_s_min": wall_min,
                   "cpu_s_median": cpu, "exit_code": code, "repeats": repeats,
                   "cli_over_python_startup": wall / python,
                   "under_target": wall < CLI_TARGET_S and code == 0}
            if code:
                row["stderr_tail"] = err
            rows[name] = row
            print(f"{shown}: {wall:.3f} s wall median ({wall_min:.3f} min), "
                  f"{cpu:.3f} s CPU, exit {code}")
    print(f"bare python {python:.3f} s wall, {python_cpu:.3f} s CPU")
    return {**rows, "python_startup_s_median": python, "python_startup_cpu_s_median": python_cpu,
            "bytecode": "written and reused (PYTHONPYCACHEPREFIX, warmed by one untimed run)",
            "under_target": all(r["under_target"] for r in rows.values())}


def main() -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    load_before = os.getloadavg()
    seeds = bench_seeds()
    synthetic = bench_synthetic()
    cli = bench_cli()
    by_nodes = {r["nodes"]: r for r in synthetic}
    result = {
        "benchmark": "compile", "command": "python bench/compile_bench.py",
        "machine": {**machine(), "load_avg_before": load_before,
                    "load_avg_after": os.getloadavg()},
        "targets": {"seed_graph_ms": SEED_TARGET_MS, "nodes_1000_s": LARGE_TARGET_S,
                    "cli_process_s": CLI_TARGET_S},
        "seed_graphs": seeds,
        "synthetic": synthetic,
        "cli": cli,
        "ratios": {
            "synthetic_1000_over_100_cpu": by_nodes[1000]["cpu_ms_median"]
            / by_nodes[100]["cpu_ms_median"],
            "cli_over_python_startup": cli.get("summary", {}).get("cli_over_python_startup"),
        },
        "all_under_target": all(r["under_target"] for r in seeds + synthetic)
        and cli.get("under_target", True),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}; all under target: {result['all_under_target']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
