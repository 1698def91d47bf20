"""Runs the pipeline's tasks on Ray actors and reports completions, one small message each.

`submit` sends a task to its node's actor with the input batches as object references (Ray
moves the data actor to actor); `wait` blocks in `ray.wait` until at least one task is
done and returns every finished one with its output reference and its `info` (span and
summary). Per task the driver makes one actor call (two for param_update: export and apply,
chained without a round trip) and reads one small dict: no per-tensor traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlgraph.errors import RLGraphError
from rlgraph.runtime.pipeline import Task
from rlgraph.runtime.weight_sync import submit_param_update


class WorkerError(RLGraphError):
    """A worker failed on a task; the message names the node, the step and the cause."""


@dataclass
class Completion:
    """A finished task: its output (an object reference) and the info dict it returned."""

    task: Task
    output: Any
    info: dict[str, Any]


@dataclass
class ParamRoute:
    """Where a param_update node moves weights: sender and receiver actors, bucket size."""

    src_actor: Any
    dst_actor: Any
    bucket_mb: float


class RayExecutor:
    """Submits tasks to the node's actor and collects completions with `ray.wait`."""

    def __init__(self, actors: dict[str, Any], routes: dict[str, ParamRoute]) -> None:
        self.actors = actors  # node -> actor (colocated nodes share one)
        self.routes = routes  # param_update node -> route
        self.pending: dict[Any, tuple[Task, Any]] = {}  # info ref -> (task, output ref)

    def submit(self, task: Task) -> None:
        """Start `task` on its actor."""
        if task.kind == "param_update":
            route = self.routes[task.node]
            info = submit_param_update(route.src_actor, route.dst_actor, route.bucket_mb)
            self.pending[info] = (task, None)
            return
        names = list(task.inputs)
        output, info = self.actors[task.node].run.options(num_returns=2).remote(
            task.node, task.step, names, *task.inputs.values())
        self.pending[info] = (task, output)

    def __len__(self) -> int:
        return len(self.pending)

    def wait(self, timeout: float | None = None) -> list[Completion]:
        """Every task finished by now (at least one unless `timeout` passes first)."""
        import ray

        if not self.pending:
            return []
        refs = list(self.pending)
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = []
        for ref in ready:
            task, output = self.pending.pop(ref)
            done.append(Completion(task, output, self._get(ref, task)))
        return done

    def _get(self, ref: Any, task: Task) -> dict[str, Any]:
        """The info dict of a finished task; a failure becomes a WorkerError (or the user's
        RLGraphError, e.g. a reward function that raised, unchanged)."""
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            if isinstance(cause, RLGraphError):
                raise cause from None
            what = f"{type(cause).__name__}: {cause}" if cause else str(exc).splitlines()[0]
            raise WorkerError(f"{task.node} failed at step {task.step}: {what}") from exc
        except ray.exceptions.RayActorError as exc:
            raise WorkerError(f"the actor running {task.node} died at step {task.step}: "
                              f"{str(exc).splitlines()[0]}") from exc

    def cancel_all(self) -> None:
        """Forget pending tasks (their actors are killed by the caller)."""
        self.pending.clear()
