"""The work the scheduling loop (`runtime.pipeline.drive`) hands an executor and gets back:
a `Task` started, its `Completion`, and the executors' interface, with the inline one.
`NotRun` and `TaskFailure` are what an actor returns, in place of a task's info, for a task
it did not start or one that raised inside a fused call (`GroupActor.run_chain`)."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Pending:
    """An input that is the output of a task still running (the task a chained one follows)."""

    node: str
    step: int


@dataclass(frozen=True)
class Task:
    """One node instance `(node, step)` started, with its inputs taken from channels.

    `behind` names the running task it is queued behind (chaining), or None; the task must
    not start before that one ends. `fuse`: it may run in one actor call with the tasks it
    is queued behind (nothing outside its group waits for them; `Pipeline._fusable`)."""

    node: str
    kind: str
    step: int
    occupies: tuple[str, ...]
    inputs: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    behind: tuple[str, int] | None = None
    fuse: bool = False


@dataclass
class Completion:
    """A finished task: its output (an object reference on Ray) and the info dict it returned;
    `recalled`: the task never started (a stop recalled it from its actor's queue)."""

    task: Task
    output: Any
    info: dict[str, Any]
    submitted: float = 0.0  # wall-clock time the driver sent it
    recalled: bool = False


@dataclass(frozen=True)
class NotRun:
    """The info of a task its actor did not start: a stop recalled it before it started, or
    it came after a task of its fused call that failed or was recalled."""

    reason: str


@dataclass(frozen=True)
class TaskFailure:
    """The info of a task that raised inside a fused call (the call itself returns, so the
    tasks before it keep their outputs): the error, or its text where it does not pickle."""

    node: str
    step: int
    error: BaseException
    trace: str  # the remote traceback, for error.log

    @classmethod
    def of(cls, node: str, step: int, error: BaseException) -> TaskFailure:
        """The failure of `(node, step)`, safe to send back to the driver."""
        import pickle

        trace = "".join(traceback.format_exception(error))
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:  # an exception that does not survive pickling: keep its text
            error = RuntimeError(f"{type(error).__name__}: {error}")
        return cls(node, step, error, trace)


class Executor(Protocol):
    """Runs the tasks the pipeline starts: on Ray actors (`RayExecutor`) or inline, one at a
    time, in the driver (`InlineExecutor`)."""

    def submit(self, task: Task) -> None:
        """Start `task`."""
        ...

    def flush(self) -> None:
        """Send the tasks submitted since the last flush (together, where they may fuse)."""
        ...

    def wait(self, timeout: float | None = None) -> list[Completion]:
        """Tasks finished since the last call (at least one unless `timeout` passes)."""
        ...

    def recall(self, halted: Callable[[str, int], bool]) -> None:
        """A stop: tasks sent but not started, for which `halted(node, step)`, do not start;
        each then comes back from `wait` as a `recalled` completion."""
        ...

    def __len__(self) -> int:
        """Tasks submitted and not yet returned by `wait`."""
        ...


class InlineExecutor:
    """Runs each task in the driver the moment it is submitted (dask's `get_sync`): the same
    loop, one task at a time, deterministic. `run(task)` returns (output, info); the info
    gets the task's `start` and `end` (time.perf_counter)."""

    def __init__(self, run: Callable[[Task], tuple[Any, dict[str, Any]]]) -> None:
        self.run = run
        self.done: list[Completion] = []

    def submit(self, task: Task) -> None:
        """Run `task` now; its completion waits for the next `wait`."""
        start = time.perf_counter()
        output, info = self.run(task)
        self.done.append(Completion(task, output, {**info, "start": start,
                                                   "end": time.perf_counter()}, start))

    def flush(self) -> None:
        """Nothing to send: `submit` ran the task already."""

    def wait(self, timeout: float | None = None) -> list[Completion]:
        """The tasks run since the last call, in the order they ran."""
        done, self.done = self.done, []
        return done

    def recall(self, halted: Callable[[str, int], bool]) -> None:
        """Nothing to recall: every task ran when it was submitted."""

    def __len__(self) -> int:
        return len(self.done)
