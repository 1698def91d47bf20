"""`rlgraph run`: load and compile the graph, print the plan, run it with a progress bar.

Writes the run dir (default `runs/<name>-<YYYYmmdd-HHMMSS>/`): plan.json and the predicted
timeline first (so they exist even if the run fails), then metrics.jsonl, TensorBoard
events, ledger.jsonl and trace.json as it goes, and at the end (or on Ctrl-C) a checkpoint
and timeline.html / .png with predicted and measured side by side. The first Ctrl-C stops
cleanly with a checkpoint; a second one aborts at once.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rlgraph.errors import RLGraphError
from rlgraph.runtime.runner import Runner, RunOptions, RunResult
from rlgraph.spec import Spec, load_spec


class RunDirError(RLGraphError):
    """A --resume / --out folder that cannot be used."""


def default_run_dir(name: str, now: float | None = None) -> Path:
    """runs/<name>-<YYYYmmdd-HHMMSS>/."""
    safe = re.sub(r"[^\w.-]+", "-", name).strip("-.") or "run"
    return Path("runs") / f"{safe}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"


class RunProgress:
    """A progress line per step: a rich bar on a terminal, a plain line every 10% otherwise."""

    def __init__(self, total: int, first: int, enabled: bool = True) -> None:
        self.total, self.first, self.count = total, first, 0
        self.started = time.time()
        self.bar = None
        self.terminal = enabled and sys.stdout.isatty()
        if self.terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(),
                                TextColumn("{task.fields[info]}"), TextColumn("ETA"),
                                TimeRemainingColumn())
            self.task = self.bar.add_task("run", total=total, completed=first, info="")
            self.bar.start()
        self.enabled = enabled

    @staticmethod
    def describe(row: dict[str, Any]) -> str:
        """`reward 0.41  lag 1 (max 1)  9.3 samples/s`."""
        return (f"reward {row.get('reward/mean', math.nan):.3f}  lag {row.get('lag/mean', 0):.2f}"
                f" (max {row.get('lag/max', 0):g})  "
                f"{row.get('throughput/samples_per_s', 0):.1f} samples/s")

    def update(self, row: dict[str, Any]) -> None:
        """Show the step just trained."""
        self.count += 1
        done = row["step"] + 1
        if self.bar is not None:
            self.bar.update(self.task, completed=done, info=self.describe(row))
        elif self.enabled:
            every = max(1, (self.total - self.first) // 10)
            if self.count % every == 0 or done == self.total:
                rate = (time.time() - self.started) / self.count
                eta = rate * (self.total - done)
                print(f"step {done}/{self.total}  {self.describe(row)}  ETA {eta:.0f}s",
                      flush=True)

    def close(self) -> None:
        """Stop redrawing."""
        if self.bar is not None:
            self.bar.stop()


def prepare(args: argparse.Namespace) -> tuple[Spec, dict[str, Any], Path]:
    """Spec with overrides and --steps, the compiled plan, and the run dir. A resumed run
    takes the spec it was started with (DIR/plan.json) and its step count, unless told."""
    from rlgraph.cli import compile_spec

    overrides = list(getattr(args, "overrides", None) or [])
    steps = getattr(args, "steps", None)
    if steps is not None and steps < 1:
        raise RunDirError(f"--steps {steps}: give a positive number of train steps")
    if getattr(args, "resume", None):
        out = Path(args.resume)
        spec, saved_steps = _resumed_spec(out, str(args.graph), overrides)
        steps = steps or saved_steps
    else:
        spec = load_spec(args.graph, overrides)
        out = Path(args.out) if getattr(args, "out", None) else default_run_dir(spec.name)
    if steps:
        spec.schedule.steps = int(steps)
    return spec, compile_spec(spec), out


def _resumed_spec(out: Path, graph: str, overrides: list[str]) -> tuple[Spec, int | None]:
    """The spec of the run in `out` (from its plan.json) with `overrides` on top. Its source
    stays the graph file, so relative data and reward paths resolve as they did."""
    from rlgraph.errors import SourceMap
    from rlgraph.spec import apply_overrides, parse_yaml, validate_spec

    plan_file, meta_file = out / "plan.json", out / "checkpoint" / "meta.json"
    if not plan_file.exists():
        raise RunDirError(f"--resume {out}: no plan.json there (give the folder a run wrote)")
    try:
        data = json.loads(plan_file.read_text())["spec"]
    except (json.JSONDecodeError, KeyError):
        raise RunDirError(f"{plan_file}: not a plan written by rlgraph run") from None
    try:
        source = parse_yaml(Path(graph).read_text(), graph)[1]
    except (OSError, RLGraphError):
        source = SourceMap(path=graph)
    apply_overrides(data, overrides, source)
    steps = json.loads(meta_file.read_text()).get("steps") if meta_file.exists() else None
    return validate_spec(data, source), steps


def run_main(args: argparse.Namespace) -> int:
    """Entry point of `rlgraph run` (called by rlgraph.cli); returns the exit status."""
    from rlgraph.cli import write_plan
    from rlgraph.summary import print_summary

    spec, plan, out = prepare(args)
    resume = bool(getattr(args, "resume", None))
    steps = spec.schedule.steps
    print_summary(plan, footer=f"running {steps} steps into {out}/")
    write_plan(out, plan)
    progress: RunProgress | None = None

    def on_ready(runner: Runner) -> None:
        nonlocal progress
        for note in runner.notes[printed:]:  # what the actors measured at start-up
            print(f"note: {note}", file=sys.stderr, flush=True)
        progress = RunProgress(steps, runner.first_step, enabled=getattr(args, "progress", True))

    def on_step(row: dict[str, Any]) -> None:
        if progress is not None:
            progress.update(row)

    options = RunOptions(out_dir=out, steps=steps, address=getattr(args, "address", None),
                         resume=resume, on_step=on_step, on_ready=on_ready,
                         checkpoint_every=int(getattr(args, "checkpoint_every", 0) or 0))
    runner = Runner(spec, plan, options)
    for note in runner.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    printed = len(runner.notes)
    previous = _install_sigint(runner)
    try:
        result = runner.run()
    finally:
        signal.signal(signal.SIGINT, previous)
        if progress is not None:
            progress.close()
    return finish(out, plan, result, args)


def _install_sigint(runner: Runner) -> Any:
    """First Ctrl-C: stop cleanly with a checkpoint; a second one: abort."""
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: Any) -> None:
        print("\nstopping after the running tasks (Ctrl-C again to abort) ...",
              file=sys.stderr, flush=True)
        runner.request_stop()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    try:
        signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: no handler, Ctrl-C is the caller's business
        return previous
    return previous


def finish(out: Path, plan: dict[str, Any], result: RunResult, args: argparse.Namespace) -> int:
    """Timeline files with predicted and measured, and the closing lines."""
    from rlgraph.timeline import write_timeline

    write_timeline(out, plan, measured=result.events)
    rows = result.rows
    if rows:
        head = [r["reward/mean"] for r in rows[:10]]
        tail = [r["reward/mean"] for r in rows[-10:]]
        lag_max = max(r["lag/max"] for r in rows)
        print(f"trained steps {result.first_step}..{result.next_step - 1}: reward/mean "
              f"{sum(head) / len(head):.3f} (first {len(head)}) -> {sum(tail) / len(tail):.3f} "
              f"(last {len(tail)}); lag/max {lag_max:g} <= bound "
              f"{plan['lag']['max_policy_lag']}; {result.wall_s:.1f}s running + "
              f"{result.startup_s:.1f}s start-up")
    if rows and "val/accuracy" in rows[-1]:
        last = rows[-1]
        print(f"final validation (policy version {last['val/policy_version']:g}): accuracy "
              f"{last['val/accuracy']:.3f} (exact match), reward/mean "
              f"{last['val/reward/mean']:.3f} on {last['val/samples']:g} held-out prompts")
    if result.lag_violations:
        print(f"WARNING: {result.lag_violations} steps trained on tokens older than the proven "
              f"bound {plan['lag']['max_policy_lag']} (a runtime bug; see metrics.jsonl)",
              file=sys.stderr)
    print(f"wrote {out}/: plan.json metrics.jsonl trace.json timeline.html timeline.png "
          f"checkpoint/ tensorboard/")
    if result.stopped:
        graph = getattr(args, "graph", "graph.yaml")
        print(f"stopped at step {result.next_step}; continue with: rlgraph run {graph} "
              f"--resume {out}", file=sys.stderr)
        return 130
    return 0
