"""Keeping a failed run's progress: an emergency checkpoint where the trainer's state is intact.

When the loop fails (a worker died, the reward function raised, a weight sync was corrupted,
any error), the runner calls `emergency_checkpoint` before the actors are killed:
1. train tasks already running are awaited (a bounded wait) and their rows and ledger lines
   written, so the checkpoint covers exactly the ledger;
2. the trainer's state is read; if its actor is gone, or its version is not the pipeline's
   trained step count, nothing is written and the previous checkpoint stays;
3. the rollout buffer is kept when it can be fetched, else dropped (without partial rollout
   a dropped batch is generated again from the same data positions; with partial rollout
   its caches are needed, so no checkpoint is written).
The message it returns ends the error line: where to resume, or why it cannot (steps in
policy versions, as `--steps` counts them, streamed runs included).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlgraph.errors import RLGraphError, SpecError
from rlgraph.nodes import KINDS
from rlgraph.runtime.checkpoint import CheckpointError, kept_step
from rlgraph.runtime.tasks import Completion

if TYPE_CHECKING:
    from rlgraph.runtime.executor import RayExecutor
    from rlgraph.runtime.pipeline import Pipeline
    from rlgraph.runtime.step_report import StepReport

DRAIN_S = 120.0  # longest wait for a train step already running when the run fails
FETCH_S = 60.0  # longest wait for the trainer's state or the rollout buffer


class StateMismatch(CheckpointError):
    """The trainer's state is not at the pipeline's step (a train step ran unrecorded)."""


def check_version(state: dict[str, Any], step: int) -> None:
    """The trainer's policy version equals the trained step count (what the ledger covers)."""
    version = int(state.get("policy_version", step))
    if version != step:
        raise StateMismatch(f"the trainer holds version {version}, the ledger ends at step "
                            f"{step}")


def fetch_rollout(pipeline: Pipeline, timeout: float | None, partial: bool
                  ) -> dict[tuple[str, int], Any]:
    """The rollout buffer's batches; with `timeout` (a rescue) an unreachable buffer is
    dropped, unless partial rollout needs it."""
    import ray

    buffer = pipeline.rollout_buffer()
    if not buffer:
        return {}
    try:
        return dict(zip(buffer, ray.get(list(buffer.values()), timeout=timeout)))
    except Exception:
        if timeout is None or partial:
            raise
        return {}


def _drain_train(pipeline: Pipeline, executor: RayExecutor, report: StepReport,
                 record: Callable[[Completion], dict[str, Any]]) -> None:
    """Finish the train tasks in flight and record them (ledger first)."""
    running = sorted(((ref, item) for ref, item in executor.pending.items()
                      if KINDS[item[0].kind].advances_policy), key=lambda kv: kv[1][0].step)
    for ref, (task, output, sent) in running:
        try:
            info = executor.info(ref, task, timeout=DRAIN_S)
            if not isinstance(info, dict):
                break  # never started (its fused call failed before it)
            done = Completion(task, output, info, sent)
            event = record(done)
            pipeline.complete(task.node, task.step, output, info.get("version"))
        except Exception:
            break  # it failed too (e.g. its reward input): the trainer did not move on
        executor.pending.pop(ref, None)
        report.pending.append((done, event))
    report.flush()


def emergency_checkpoint(out: Path, pipeline: Pipeline, executor: RayExecutor,
                         report: StepReport, record: Callable[[Completion], dict[str, Any]],
                         checkpoint: Callable[[float], Path]) -> str:
    """Write a checkpoint of a failed run if its trainer is intact; says what happened.
    `record` turns a completion into its trace event; `checkpoint(timeout)` writes one."""
    try:
        _drain_train(pipeline, executor, report, record)
        folder = checkpoint(FETCH_S)
    except Exception as exc:
        kept = kept_step(out)
        why = str(exc).splitlines()[0] if isinstance(exc, RLGraphError) else (
            "the trainer's state is lost" if "Actor" in type(exc).__name__ else
            f"{type(exc).__name__}")
        where = (f"resume from step {kept // pipeline.k} with --resume {out}"
                 if kept is not None else "no checkpoint to resume from")
        return f"no emergency checkpoint ({why}); {where}"
    return (f"progress kept: checkpoint at step {pipeline.trained_steps() // pipeline.k} in "
            f"{folder}; after fixing the cause, continue with --resume {out}")


def annotate(err: BaseException, note: str) -> None:
    """Append `note` to the one-line message of `err` (printed apart for other errors)."""
    if isinstance(err, SpecError):
        err.message = f"{err.message}; {note}"
    elif isinstance(err, RLGraphError) and len(err.args) == 1 and isinstance(err.args[0], str):
        err.args = (f"{err.args[0]}; {note}",)
    else:
        print(f"rlgraph: {note}", file=sys.stderr, flush=True)
