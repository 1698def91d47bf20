"""Plan-search benchmark: `rlgraph tune` on the seed configs, at their size and at 64 GPUs.

    python bench/tune_bench.py            # writes bench/results/tune.json

For every graph in graphs/ (the hand-tuned seed configs) it records the user's period, the
tuned period and the improvement (user / tuned, both predicted by the same compiler in
this run), the colocated synchronous period, the chosen groups, lag and bottleneck, and the
search time (wall and CPU: other jobs share this machine). Each GPU graph is searched again
on 8 nodes x 8 GPUs (`cluster.nodes=8`), and so are the synthetic 64-GPU spaces of
tests/unit/tune/graphs_tune/ (every group size accepted; six GPU tasks). Target: a 64-GPU
space in under 10 s. Side by side in this run, on the seed graphs at their own size: the
bound-pruned search against simulating every candidate of the same space (same best plan,
how many times faster); and on eight GPU tasks (4140 partitions) the seeded local search
against the exact enumeration.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import machine  # noqa: E402

from rlgraph.config.load import load_spec  # noqa: E402
from rlgraph.config.schema import Spec  # noqa: E402
from rlgraph.tune.evaluate import Evaluator  # noqa: E402
from rlgraph.tune.ranking import Leaderboard  # noqa: E402
from rlgraph.tune.search import _plan_of, _Search, tune  # noqa: E402
from rlgraph.tune.space import SearchSpace  # noqa: E402

OUT = ROOT / "bench" / "results" / "tune.json"
TARGET_64_S = 10.0


EIGHT_TASKS = ["nodes.critic2={kind: logp, cost: {gpu_seconds: 20}}",
               "nodes.rm2={kind: ref_logp, cost: {seconds: 1.5}}",
               "groups.critic.tasks=[critic, rm, critic2, rm2]"]


def timed_tune(spec: Spec, method: str = "auto") -> tuple[Any, float, float]:
    """tune() with its wall and CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = tune(spec, method=method)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def brute_force(spec: Spec) -> tuple[tuple, int, float]:
    """Best rank key simulating every candidate (no pruning), candidates, wall seconds."""
    started = time.perf_counter()
    space = SearchSpace(spec)
    evaluator = Evaluator(space)
    board = Leaderboard(1)
    entries = _Search(space, evaluator, board, math.inf).entries() or []
    for _, _, _, cand in entries:
        ev = evaluator.evaluate(cand)
        if ev.feasible:
            board.offer(_plan_of(ev, space))
    return board.ranked()[0].key(), len(entries), time.perf_counter() - started


def record(path: Path, overrides: list[str], method: str = "auto") -> dict[str, Any]:
    """One graph's search, as JSON."""
    spec = load_spec(path, overrides)
    result, wall, cpu = timed_tune(spec, method)
    best, mine = result.best, result.input
    return {
        "graph": str(path.relative_to(ROOT)), "overrides": overrides,
        "gpus": spec.cluster.slots(), "local": spec.cluster.local,
        "grouped_tasks": len(SearchSpace(spec).tasks),
        "method": result.method, "exact": result.exact,
        "search_wall_s": wall, "search_cpu_s": cpu, "stats": result.stats,
        "input_period_s": mine.period_s if mine else None,
        "input_error": result.input_error,
        "tuned_period_s": best.period_s,
        "improvement_vs_input": mine.period_s / best.period_s if mine else None,
        "sync_period_s": result.sync_period_s,
        "speedup_vs_sync": result.speedup_vs_sync(best),
        "best": best.to_dict(),
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    """Run everything, print a line per graph, write bench/results/tune.json."""
    seeds = sorted((ROOT / "graphs").glob("*.yaml"))
    runs, runs_64, pruning = [], [], []
    for path in seeds:
        runs.append(record(path, []))
        r = runs[-1]
        print(f"{path.stem:32s} {r['gpus']:3d} GPUs  {r['search_wall_s']:6.2f} s  "
              f"yours {r['input_period_s']:.4g} s -> {r['tuned_period_s']:.4g} s "
              f"(x{r['improvement_vs_input'] or float('nan'):.2f}; sync x"
              f"{r['speedup_vs_sync']:.2f})")
        spec = load_spec(path)
        key, candidates, brute_s = brute_force(spec)
        tuned = (float(f"{r['tuned_period_s']:.9g}"), r["best"]["max_lag"])
        pruning.append({"graph": path.stem, "candidates": candidates,
                        "brute_force_wall_s": brute_s, "tune_wall_s": r["search_wall_s"],
                        "brute_force_period_s": key[0],
                        "same_best": key[:2] <= tuned,
                        "times_faster": brute_s / max(r["search_wall_s"], 1e-9)})
    big = [(p, ["cluster.nodes=8", "cluster.gpus_per_node=8"]) for p in seeds
           if not load_spec(p).cluster.local]
    tests = ROOT / "tests" / "unit" / "tune" / "graphs_tune"
    big += [(tests / "wide-64.yaml", []), (tests / "six-tasks-64.yaml", []),
            (tests / "six-tasks-64.yaml", EIGHT_TASKS)]
    for path, overrides in big:
        runs_64.append(record(path, overrides))
        r = runs_64[-1]
        print(f"{path.stem:32s} {r['gpus']:3d} GPUs  {r['search_wall_s']:6.2f} s  "
              f"{r['method']}{' (exact)' if r['exact'] else ''}, "
              f"x{r['improvement_vs_input'] or float('nan'):.2f} over the input")
    local = record(tests / "six-tasks-64.yaml", EIGHT_TASKS, "local search")
    exact = runs_64[-1]
    print(f"eight tasks, local search (seed 0): {local['search_wall_s']:.2f} s, period "
          f"{local['tuned_period_s']:.4g} s vs exact {exact['tuned_period_s']:.4g} s in "
          f"{exact['search_wall_s']:.2f} s")
    worst_64 = max(r["search_wall_s"] for r in runs_64)
    improvements = [r["improvement_vs_input"] for r in runs if r["improvement_vs_input"]]
    result = {
        "machine": {**machine(), "load_average": list(os.getloadavg())},
        "command": "python bench/tune_bench.py",
        "seed_graphs": runs,
        "gpus_64": runs_64,
        "pruning_vs_brute_force": pruning,
        "local_search_vs_enumeration_8_tasks": {
            "local_search": local, "enumeration": exact,
            "same_period": abs(local["tuned_period_s"] / exact["tuned_period_s"] - 1) < 1e-9},
        "summary": {
            "never_worse_than_input": all(
                r["input_period_s"] is None
                or r["tuned_period_s"] <= r["input_period_s"] * (1 + 1e-9)
                for r in runs + runs_64),
            "improvement_vs_input_min": min(improvements),
            "improvement_vs_input_max": max(improvements),
            "improvement_vs_input_geomean": math.exp(
                sum(math.log(x) for x in improvements) / len(improvements)),
            "search_64_gpus_max_wall_s": worst_64,
            "search_64_gpus_target_s": TARGET_64_S,
            "search_64_gpus_within_target": worst_64 < TARGET_64_S,
        },
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"64-GPU searches: at most {worst_64:.2f} s (target {TARGET_64_S:g} s); "
          f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
