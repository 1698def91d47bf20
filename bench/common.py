"""What the benchmarks share: where results go, which machine produced them, and the few
statistics every result file reports (mean; median with min and max)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import threading
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


@contextlib.contextmanager
def mirrored(src: Path, dst: Path, every_s: float = 5.0) -> Iterator[None]:
    """Copy `src` (a run's metrics.jsonl, written step by step) to `dst` every `every_s`
    seconds while the block runs, so a benchmark cut off mid-mode (a device call's time
    limit) still leaves the steps it finished; `dst` is removed when the block completes
    (its figures are then in the result file)."""
    done = threading.Event()

    def copy() -> None:
        with contextlib.suppress(OSError):
            if src.is_file():
                shutil.copyfile(src, dst)

    def loop() -> None:
        while not done.wait(every_s):
            copy()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    except BaseException:
        done.set()
        copy()  # what the mode finished before it failed
        raise
    done.set()
    thread.join()
    dst.unlink(missing_ok=True)


def mean(values: list[float]) -> float:
    """The mean, or nan for no values."""
    return sum(values) / len(values) if values else float("nan")


def spread(values: list[float], digits: int | None = None) -> dict[str, float]:
    """Median, min and max (rounded to `digits` where given)."""
    out = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out if digits is None else {k: round(v, digits) for k, v in out.items()}


def machine() -> dict:
    """Where the figures come from, and which revision of the static decode engine made them
    (`rlgraph.pricing.engine_revisions.CURRENT_ENGINE`: bench/own_runs.py prices a result as the
    revision it records)."""
    from rlgraph.pricing.engine_revisions import CURRENT_ENGINE

    return {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "engine_revision": CURRENT_ENGINE}


def device_info(dry: bool = False) -> dict:
    """Which GPUs ran a GPU benchmark (`dry`: a rehearsal on CPU)."""
    import torch

    if dry or not torch.cuda.is_available():
        return {"gpus": 0, "name": "cpu (dry run)" if dry else "cpu"}
    return {"gpus": torch.cuda.device_count(), "name": torch.cuda.get_device_name(0),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def run_figures(spec, plan: dict, result, step_s: float, calibrated: dict) -> dict:
    """What the GPU end-to-end benchmarks record of every run: its groups (tasks, GPUs,
    replicas), lag, steps, samples and step time, each node's median span after step 0, and
    the predicted and calibrated periods."""
    import statistics

    # per row: a streamed run writes one row per optimizer step, K a version
    samples = spec.data.prompts_per_step * spec.data.samples_per_prompt
    samples //= spec.schedule.mini_batches
    node_s: dict[str, list[float]] = {}
    for e in result.events:
        if e["step"] >= 1:
            node_s.setdefault(e["node"], []).append(e["end"] - e["start"])
    return {
        "groups": {g["name"]: {"tasks": g["tasks"], "gpus": g["gpus"],
                               "replicas": g.get("replicas", 1)}
                   for g in plan["placement"]["groups"]},
        "max_lag": spec.schedule.max_lag,
        "steps": len(result.rows),
        "samples_per_step": samples,
        "step_s_median": round(step_s, 4),
        "step_s_all": [round(r["time/step_s"], 4) for r in result.rows],
        "samples_per_s": round(samples / step_s, 2),
        "node_s_median": {k: round(statistics.median(v), 4) for k, v in node_s.items()},
        "predicted_period_s": round(plan["schedule"]["period_s"], 4),
        "calibrated_period_s": round(calibrated["schedule"]["period_s"], 4),
        "measured_over_calibrated": round(step_s / calibrated["schedule"]["period_s"], 3),
        "lag_max": max((r["lag/max"] for r in result.rows), default=0.0),
        "lag_violations": result.lag_violations,
        "startup_s": round(result.startup_s, 2),
    }


def quickstart_args(description: str, argv: list[str] | None, steps: int | None = None
                    ) -> argparse.Namespace:
    """The options every quickstart benchmark takes: the graph, a finished run to reuse
    instead of running, key=value overrides and (where it applies) the number of steps."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--graph", default=str(ROOT / "graphs" / "quickstart.yaml"))
    if steps is not None:
        parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--run-dir", help="use this finished run instead of running")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides")
    return parser.parse_args(argv)


def write_result(name: str, result: dict) -> Path:
    """Write `result` to bench/results/NAME (indented JSON) and return the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path
