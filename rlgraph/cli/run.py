"""`rlgraph run`: load and compile the graph, print the plan, run it with a progress bar.

Writes the run dir (default `runs/<name>-<YYYYmmdd-HHMMSS>/`, claimed atomically and locked
for the run: runtime.run_dir): plan.json and the predicted timeline first (so they exist even
if the run fails), then metrics.jsonl, TensorBoard events, ledger.jsonl and trace.json as it
goes, a checkpoint every `--checkpoint-every` steps, and at the end (or on Ctrl-C / SIGTERM,
or a failure that leaves the trainer intact) a checkpoint and timeline.html / .png with
predicted and measured side by side. The first Ctrl-C or SIGTERM stops cleanly with a
checkpoint (exit 130 / 143); a second one aborts at once. `--resume DIR` runs the graph given
on the command line, refused when it differs from the run's (see runtime.run_dir).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any

from rlgraph.cli.run_log import RunLog
from rlgraph.compiler.plan import Plan
from rlgraph.compiler.references import base_dir, code_from_files
from rlgraph.config.load import load_spec
from rlgraph.config.schema import Spec
from rlgraph.engines.sglang_engine import refuse_unrunnable
from rlgraph.envs.load import check_envs
from rlgraph.errors import RLGraphError, SpecError, shown
from rlgraph.pricing.engine_revisions import CURRENT_ENGINE
from rlgraph.runtime import run_dir
from rlgraph.runtime.run_dir import RunDirError, default_run_dir
from rlgraph.runtime.runner import CHECKPOINT_EVERY_S, Runner, RunOptions, RunResult

__all__ = ["RunDirError", "default_run_dir", "prepare", "run_main"]


class RunProgress:
    """A progress line per step: a rich bar on a terminal, a plain line every 10% otherwise."""

    def __init__(self, total: int, first: int, enabled: bool = True, per_step: int = 1,
                 terminal: Any = None, log: Any = None) -> None:
        """`total` and `first` in train steps (policy versions); a streamed run's rows come
        `per_step` to a version (its optimizer steps), and `first` counts those."""
        self.per_step = max(1, per_step)
        self.total, self.first, self.count = total, first // self.per_step, 0
        self.started = time.time()
        self.bar = None
        self.log = log  # a RunLog: the terminal's bar is logged as plain lines
        screen = terminal or sys.stdout
        self.terminal = enabled and screen.isatty()
        if self.terminal:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(),
                                TextColumn("{task.fields[info]}"), TextColumn("ETA"),
                                TimeRemainingColumn(), console=Console(file=screen))
            self.task = self.bar.add_task("run", total=total, completed=self.first, info="")
            self.bar.start()
        self.enabled = enabled

    @staticmethod
    def describe(row: dict[str, Any]) -> str:
        """`reward 0.41  lag 1 (max 1)  9.3 samples/s`."""
        return (f"reward {row.get('reward/mean', math.nan):.3f}  lag {row.get('lag/mean', 0):.2f}"
                f" (max {row.get('lag/max', 0):g})  "
                f"{row.get('throughput/samples_per_s', 0):.1f} samples/s")

    def update(self, row: dict[str, Any]) -> None:
        """Show the step just trained (a streamed run: at the last mini-batch of a version)."""
        if (row["step"] + 1) % self.per_step:
            return
        self.count += 1
        done = (row["step"] + 1) // self.per_step
        every = max(1, (self.total - self.first) // 10)
        due = self.count % every == 0 or done == self.total
        rate = (time.time() - self.started) / self.count
        line = (f"step {done}/{self.total}  {self.describe(row)}  "
                f"ETA {rate * max(self.total - done, 0):.0f}s")
        if self.bar is not None:
            self.bar.update(self.task, completed=done, info=self.describe(row))
            if due and self.log is not None:
                self.log.line(line)
        elif self.enabled and due:
            print(line, flush=True)

    def close(self) -> None:
        """Stop redrawing."""
        if self.bar is not None:
            self.bar.stop()


def prepare(args: argparse.Namespace) -> tuple[Spec, Plan, Path]:
    """Spec with overrides and --steps, the compiled plan, and the run dir. A resumed run
    takes the graph on the command line (refused if it differs from the run's in anything
    but the step count and checkpoint keeping) and the run's step count, unless --steps or
    a `schedule.steps=N` override says otherwise. A fresh default run dir is claimed here."""
    from rlgraph.cli.main import compile_spec

    overrides = list(getattr(args, "overrides", None) or [])
    steps = getattr(args, "steps", None)
    if steps is not None and steps < 1:
        raise RunDirError(f"--steps {steps}: give a positive number of train steps")
    every = getattr(args, "checkpoint_every", None)
    if every is not None and every < 0:
        raise RunDirError(f"--checkpoint-every {every}: give a step count, or 0 for none")
    spec = load_spec(args.graph, overrides)
    refuse_code_from_files(spec, bool(getattr(args, "trust_code", False)))
    refuse_other_system(spec)
    check_envs(spec, base_dir(spec))  # an env that cannot be built: one line, nothing started
    resume = getattr(args, "resume", None)
    given_out = getattr(args, "out", None)
    if resume:
        out = Path(resume)
        if given_out and Path(given_out).absolute() != out.absolute():
            raise RunDirError(f"--resume {shown(out)} continues that run in its own folder; "
                              f"-o {shown(given_out)} cannot move it (drop -o, or copy the "
                              f"run dir there and resume the copy)")
        meta = run_dir.check_resume(out, spec.to_yaml_dict(), str(args.graph))
        # a streamed run's checkpoint counts optimizer steps; --steps counts versions
        args.resumed_step = int(meta["step"]) // spec.schedule.mini_batches
        if steps is None and not sets_steps(overrides):
            steps = meta.get("steps")
    elif given_out:
        out = Path(given_out)
        run_dir.refuse_reuse(out, spec.name)
    else:
        out = None
    if steps:
        spec.schedule.steps = int(steps)
    plan = compile_spec(spec)  # a graph the compiler refuses leaves no run dir behind
    refuse_unrunnable(spec)  # an engine this machine cannot build: no run dir either
    if out is None:
        out = run_dir.claim_default_dir(spec.name)
    if not resume:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RunDirError(f"cannot create the run dir {shown(out)}: {exc.strerror or exc}"
                              f" (give a writable folder with --out)") from None
        run_dir.mark(out, spec.name)
    return spec, plan, out


def exact_resume(err: RLGraphError, command: str, out: Path) -> None:
    """A failure's "--resume DIR" advice (the rescue's, a full disk's) as the whole command
    that continues the run, overrides included."""
    bare = f"--resume {out}"
    if isinstance(err, SpecError):
        err.message = err.message.replace(bare, command) if bare in err.message and (
            command not in err.message) else err.message
    elif len(err.args) == 1 and isinstance(err.args[0], str) and bare in err.args[0] and (
            command not in err.args[0]):
        err.args = (err.args[0].replace(bare, command),)


def sets_steps(overrides: list[str]) -> bool:
    """Whether an override sets `schedule.steps`."""
    return any(o.partition("=")[0].strip() == "schedule.steps" for o in overrides)


def continue_command(args: argparse.Namespace, out: Path, steps: int | None = None) -> str:
    """The exact command that continues the run in `out` (the graph, its overrides and the
    options that matter), quoted for a POSIX shell."""
    words = ["rlgraph", "run", str(getattr(args, "graph", "graph.yaml")),
             *(getattr(args, "overrides", None) or []), "--resume", str(out)]
    if steps is not None:
        words += ["--steps", str(steps)]
    for flag, name in (("--trust-code", "trust_code"), ("--verify-weights", "verify_weights")):
        if getattr(args, name, False):
            words.append(flag)
    if getattr(args, "checkpoint_every", None) is not None:
        words += ["--checkpoint-every", str(args.checkpoint_every)]
    if getattr(args, "address", None):
        words += ["--address", str(args.address)]
    text = shlex.join(words)
    # what a terminal cannot show (a line break, an undecodable byte) printed escaped
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def refuse_other_system(spec: Spec) -> None:
    """`rlgraph run` runs rlgraph's runtime: a graph priced as another system
    (`pricing.system: verl`), or as an older revision of its static engine
    (`pricing.engine_revision`), describes a run this runtime would not be, so it is
    refused."""
    if spec.pricing.system != "rlgraph" and not spec.cluster.local:
        err = SpecError(f"this graph is priced as {spec.pricing.system} (pricing.system); "
                        f"rlgraph run runs rlgraph's own runtime", ("pricing", "system"),
                        hint="set pricing.system: rlgraph to run it here, or compare with "
                        "`rlgraph compile --baseline verl`")
        err.source = spec.source
        raise err
    revision = spec.pricing.engine_revision
    if revision not in (None, CURRENT_ENGINE) and not spec.cluster.local:
        err = SpecError(f"this graph is priced as the {revision} revision of the static "
                        f"engine (pricing.engine_revision); rlgraph run runs today's "
                        f"({CURRENT_ENGINE})", ("pricing", "engine_revision"),
                        hint="remove pricing.engine_revision to run it here")
        err.source = spec.source
        raise err


def refuse_code_from_files(spec: Spec, trusted: bool) -> None:
    """A run executes no Python code from a file (a `file.py:function` reward, or a module
    found only beside the graph or in the working directory) unless `--trust-code` says so:
    a graph.yaml is data, and running one must not run code somebody put beside it."""
    found = [] if trusted else code_from_files(spec)
    if found:
        key, ref, path = found[0]
        err = SpecError(f"'{ref}' would run Python code from {shown(path)}; rlgraph runs no "
                        "code from files unless you say so", key,
                        hint="read that file, then rerun with --trust-code")
        err.source = spec.source
        raise err


def run_main(args: argparse.Namespace) -> int:
    """Entry point of `rlgraph run` (called by rlgraph.cli.main); returns the exit status."""
    spec, plan, out = prepare(args)
    resume = bool(getattr(args, "resume", None))
    steps = spec.schedule.steps
    if resume and getattr(args, "resumed_step", 0) >= steps:
        done = args.resumed_step
        print(f"the run in {shown(out)} is already complete: it trained {done} of {steps} "
              f"steps; to train on, give more steps, e.g. "
              f"{continue_command(args, out, steps=done + steps)}")
        return 0
    lock = run_dir.hold(out)
    try:
        with RunLog(out) as log:
            try:
                return _run(args, spec, plan, out, log)
            except RLGraphError as err:  # printed by the caller; the log keeps it too
                exact_resume(err, continue_command(args, out), out)
                log.line(f"rlgraph: {err.render()}")
                raise
            except OSError as exc:  # a full disk, a folder made read-only mid-run
                err = RunDirError(f"cannot write into the run dir {shown(out)}: "
                                  f"{exc.strerror or exc}"
                                  + (f" ({shown(exc.filename)})" if exc.filename else "")
                                  + f"; free space, then continue with "
                                  f"{continue_command(args, out)}")
                log.line(f"rlgraph: {err}")
                raise err from None
    finally:
        run_dir.release(out, lock)


def _run(args: argparse.Namespace, spec: Spec, plan: Plan, out: Path, log: RunLog) -> int:
    from rlgraph.cli.main import write_plan
    from rlgraph.report.summary import print_summary

    resume = bool(getattr(args, "resume", None))
    steps, per_step = spec.schedule.steps, spec.schedule.mini_batches
    footer = f"running {steps} steps into {out}/"
    warm = spec.model.warm_start.steps
    if warm and not resume:  # minutes with no step to show, the first time
        cache = os.environ.get("RLGRAPH_CACHE", "~/.cache/rlgraph")
        footer += (f"; first a supervised warm start of {warm} steps (the first run of this "
                   f"model and data computes it, later ones read it from {cache})")
    print_summary(plan, footer=footer)
    write_plan(out, plan)
    progress: RunProgress | None = None

    def on_ready(runner: Runner) -> None:
        nonlocal progress
        for note in runner.notes[printed:]:  # what the actors measured at start-up
            print(f"note: {note}", file=sys.stderr, flush=True)
        progress = RunProgress(steps, runner.first_step, enabled=getattr(args, "progress", True),
                               per_step=per_step, terminal=log.terminal, log=log)

    def on_step(row: dict[str, Any]) -> None:
        if progress is not None:
            progress.update(row)

    every = getattr(args, "checkpoint_every", None)
    verify = getattr(args, "verify_weights", None)
    options = RunOptions(out_dir=out, steps=steps, address=getattr(args, "address", None),
                         resume=resume, on_step=on_step, on_ready=on_ready,
                         checkpoint_every=int(every or 0),
                         checkpoint_every_s=CHECKPOINT_EVERY_S if every is None else 0.0,
                         verify_weights=bool(verify))
    runner = Runner(plan, options)
    for note in runner.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    printed = len(runner.notes)
    previous = _install_sigint(runner)
    terminated = _install_sigterm(runner)
    try:
        result = runner.run()
    finally:
        signal.signal(signal.SIGINT, previous)
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, terminated.pop("previous"))
        if progress is not None:
            progress.close()
    status = finish(out, plan, result, args)
    if terminated.get("signal") and result.stopped:
        print(f"terminated by SIGTERM: checkpoint at step {result.next_step // per_step} in "
              f"{out}/checkpoint", file=sys.stderr)
        return 128 + signal.SIGTERM
    return status


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


def _install_sigterm(runner: Runner) -> dict[str, Any]:
    """SIGTERM (a scheduler, `kill`, a container stop): stop cleanly with a checkpoint, as
    the first Ctrl-C does; a second SIGTERM ends the process at once."""
    state: dict[str, Any] = {"previous": signal.getsignal(signal.SIGTERM)}

    def handler(signum: int, frame: Any) -> None:
        print("\nSIGTERM: stopping after the running tasks with a checkpoint ...",
              file=sys.stderr, flush=True)
        state["signal"] = signum
        runner.request_stop()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    with contextlib.suppress(ValueError):  # not the main thread: leave SIGTERM alone
        signal.signal(signal.SIGTERM, handler)
    return state


def finish(out: Path, plan: Plan, result: RunResult, args: argparse.Namespace) -> int:
    """Timeline files with predicted and measured, and the closing lines."""
    from rlgraph.report.curves import write_curves
    from rlgraph.report.timeline import write_timeline

    write_timeline(out, plan, measured=result.events + result.env_events)
    rows = result.rows
    write_curves(out / "curves.png", rows, f"{plan.spec.name}: reward and lag",
                 plan.lag.max_policy_lag)
    if rows:
        head = [r["reward/mean"] for r in rows[:10]]
        tail = [r["reward/mean"] for r in rows[-10:]]
        lag_max = max(r["lag/max"] for r in rows)
        k = plan.spec.schedule.mini_batches
        what = (f"trained steps {result.first_step // k}..{result.next_step // k - 1}" + (
            f" ({result.next_step - result.first_step} optimizer steps)" if k > 1 else ""))
        print(f"{what}: reward/mean "
              f"{sum(head) / len(head):.3f} (first {len(head)}) -> {sum(tail) / len(tail):.3f} "
              f"(last {len(tail)}); lag/max {lag_max:g} <= bound "
              f"{plan.lag.max_policy_lag}; {result.wall_s:.1f}s running + "
              f"{result.startup_s:.1f}s start-up")
    if rows and "val/accuracy" in rows[-1]:
        last = rows[-1]
        print(f"final validation (policy version {last['val/policy_version']:g}): accuracy "
              f"{last['val/accuracy']:.3f} (exact match), reward/mean "
              f"{last['val/reward/mean']:.3f} on {last['val/samples']:g} held-out prompts")
    if result.lag_violations:
        print(f"WARNING: {result.lag_violations} steps trained on tokens older than the proven "
              f"bound {plan.lag.max_policy_lag} (a runtime bug; see metrics.jsonl)",
              file=sys.stderr)
    print(f"wrote {out}/: plan.json metrics.jsonl samples.jsonl curves.png trace.json "
          f"timeline.html timeline.png checkpoint/ tensorboard/")
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    if result.stopped:
        done = result.next_step // plan.spec.schedule.mini_batches
        print(f"stopped at step {done}; continue with: {continue_command(args, out)}",
              file=sys.stderr)
        return 130
    return 0
