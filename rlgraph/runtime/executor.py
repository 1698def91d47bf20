"""Runs the pipeline's tasks on Ray actors and reports completions, one small message each.

`flush` sends each submitted task to its node's actor with the input batches as object
references (Ray moves the data actor to actor); a chained task goes out at once, queued
behind the running task it follows on the same actor (Ray runs an actor's default-group
tasks in submission order): an input that is that task's output goes as its (pending)
reference. `wait` blocks in `ray.wait` until at least one task is done and returns every
finished one with its output reference and its `info` (span and summary). Per task (or
fused chain, below) the driver makes one actor call (two for param_update: the sender's
half on the train actor, the receiver's half in the generate actor's `sync` group, both
sent at once) and reads one small dict: no per-tensor traffic.
param_update completes when the receiver has the version staged whole; the sender's
reference is watched only so that its failure is reported, not waited on. A node whose
consumers all run on its own actor (logp and ref_logp feeding train in the trainer group)
keeps its output there (`keep`): only a stub moves.

Fusion: `submit` only buffers; the buffer goes out when the loop next waits (`flush`), and
a task the pipeline marks `fuse` joins the unsent call of the tasks it is queued behind on
the same actor (`GroupActor.run_chain`): the actor runs them in order, hands each output to
the next in memory and returns every task's output and info, so each still completes with
its own span and output reference, all when the call ends. That saves the per-call hand-off
(Ray resolving the previous task's output, the next call's dispatch) between tasks on one
actor: for colocated sync, generate -> reward -> train becomes one call a step. A fused call
fails as separate calls would: the tasks before the one that raised complete, that one's
`TaskFailure` raises as its own error would, the rest did not run; an actor that dies during
the call is reported as running one of its tasks (which one is not known).

Failures and stops. The tasks of a `wait` that finished are handed back even when another
of them failed; the failure raises at the next `flush` or `wait`, before anything more is
sent, so the pipeline (and an emergency checkpoint) holds every output that exists. A stop
`recall`s the tasks sent but not started: the actors drop them (`GroupActor.recall`) and
each comes back as a `recalled` completion, whose step the pipeline withdraws.

Tasks whose result the driver knows (`DriverKnown`) are not sent at all: a validate node off
its `every` steps, a logp node whose forward the compiler proved redundant (its output is
its input batch; train checks the versions of each batch again and runs the forward itself
for one that is off-policy) and a param_update inside one actor (the policy is already the
trained one; not when the group streams: the actor then refreshes its engine's snapshot).
Each completes as a span of no length and costs no actor call; validate and
logp complete at once even when chained behind a running task (logp's output is then that
task's pending reference), which frees the group's chain slot for the next real task: it
queues behind the running one instead of waiting for the driver. A param_update completes
once the train step it follows has (the version it delivers exists only then).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from rlgraph.config.schema import Spec
from rlgraph.errors import RLGraphError
from rlgraph.nodes import KINDS
from rlgraph.runtime.actors import CONTROL
from rlgraph.runtime.tasks import Completion, NotRun, Pending, Task, TaskFailure
from rlgraph.runtime.weight_sync import Route, local_update_info, start_param_update


def _first_line(err: BaseException) -> str:
    """The first line of an error's text (Ray's run on over several)."""
    return (str(err).splitlines() or [""])[0]


class WorkerError(RLGraphError):
    """A worker failed on a task; the message names the node, the step and the cause."""


class RemoteTraceback(Exception):
    """The traceback of a task that failed in an actor, as text (the cause of its
    WorkerError, so error.log shows where it raised)."""


def raise_failure(failure: TaskFailure) -> None:
    """Raise a fused task's failure as its own call's would have been raised (`_get`)."""
    if isinstance(failure.error, RLGraphError):
        raise failure.error
    what = f"{type(failure.error).__name__}: {_first_line(failure.error)}"
    raise WorkerError(f"{failure.node} failed at step {failure.step}: {what}") from (
        RemoteTraceback(failure.trace))


class DriverKnown:
    """Which tasks the driver completes without an actor call, and with what (see above)."""

    def __init__(self, spec: Spec, routes: dict[str, Route]) -> None:
        from rlgraph.nodes.logp import skip_reason

        roles = {n: KINDS[s.kind] for n, s in spec.nodes.items()}
        self.every = {n: s.every for n, s in spec.nodes.items() if roles[n].validates}
        self.skipped_logp = ({n for n in spec.nodes if roles[n].proximal_logp}
                             if skip_reason(spec) is not None else set())
        # within one actor nothing moves, except a streaming group's engine snapshot (the
        # actor copies it: `ParamUpdateWorker.local`)
        self.local_updates = {n for n, r in routes.items() if r.src_actor is r.dst_actor
                              and spec.schedule.stream is None}

    def output(self, task: Task, inputs: list[Any]) -> tuple[Any, dict[str, Any]] | None:
        """(output, info) of `task` if the driver knows them (times filled in later)."""
        if task.node in self.every and task.step % self.every[task.node]:
            return {"step": task.step}, {"summary": {}}
        if task.node in self.skipped_logp and len(inputs) == 1:
            return inputs[0], {"summary": {}}
        if task.node in self.local_updates:
            return None, local_update_info(task.step + 1)
        return None


class _Call:
    """Tasks for one actor, sent as one call (`run`, or `run_chain` for several)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self.tasks: list[tuple[Task, float]] = []  # (task, submitted)
        self.inputs: list[list[Any]] = []  # per task: a value / reference, or a _Link
        self.outputs: list[Any] = []  # output references, once sent


class _Link:
    """The output of task `index` of a call not sent yet."""

    def __init__(self, call: _Call, index: int) -> None:
        self.call, self.index = call, index


class RayExecutor:
    """Submits tasks to the node's actor and collects completions with `ray.wait`."""

    def __init__(self, actors: dict[str, Any], routes: dict[str, Route],
                 keep: dict[str, int] | None = None, known: DriverKnown | None = None,
                 fuse: bool = True) -> None:
        self.known = known
        self.fuse = fuse  # False: every task its own call (the unfused baseline)
        self.local: list[list[Any]] = []  # driver-known tasks: [task, output, info, sent]
        self.known_outputs: dict[tuple[str, int], Any] = {}  # their outputs, until completed
        self.actors = actors  # node -> actor (colocated nodes share one)
        self.routes = routes  # param_update node -> route
        self.keep = keep or {}  # node -> consumers on its own actor (its output stays there)
        self.pending: dict[Any, tuple[Task, Any, float]] = {}  # info ref -> task, output, sent
        self.refs: dict[tuple[str, int], tuple[Any, Any, str]] = {}  # running: output, info
        self.senders: dict[Any, Task] = {}  # param_update senders' refs, watched for failures
        self.buffer: list[tuple[Task, float]] = []  # submitted, not sent yet (`flush`)
        self.fused: dict[Any, list[Task]] = {}  # info ref -> every task of its fused call
        self.failure: BaseException | None = None  # raised at the next flush or wait

    def submit(self, task: Task) -> None:
        """Start `task` on its actor (queued behind `task.behind` when chained); it goes out
        at the next `flush` (the next `wait`), fused with the tasks before it where it may."""
        self.buffer.append((task, time.time()))

    def flush(self) -> None:
        """Send the buffered tasks in order: a `fuse` task joins its actor's open call; a
        weight update, or a task that may not fuse, first sends the open call before it."""
        self._raise_failure()
        buffered, self.buffer = self.buffer, []
        links: dict[tuple[str, int], Any] = {}  # outputs of this flush's tasks
        calls: dict[int, _Call] = {}  # actor id -> its open call
        for task, sent in buffered:
            values = [self._pending_output(v, links) if isinstance(v, Pending) else v
                      for v in task.inputs.values()]
            known = self.known.output(task, values) if self.known is not None else None
            if known is not None:
                self.local.append([task, *known, sent])
                links[(task.node, task.step)] = known[0]
                continue
            if task.node in self.routes:
                for call in list(calls.values()):
                    self._send(call, calls)
                info, sender = start_param_update(self.routes[task.node], task.step)
                if sender is not None:
                    self.senders[sender] = task
                self._track(task, None, info, sent)
                continue
            actor = self.actors[task.node]
            call = calls.get(id(actor))
            if call is not None and not (task.fuse and self.fuse):
                self._send(call, calls)
                call = None
            if call is None:
                call = calls[id(actor)] = _Call(actor)
            for k, value in enumerate(values):  # a link into another call: send that first
                if isinstance(value, _Link) and value.call is not call:
                    if not value.call.outputs:
                        self._send(value.call, calls)
                    values[k] = value.call.outputs[value.index]
            call.tasks.append((task, sent))
            call.inputs.append(values)
            links[(task.node, task.step)] = _Link(call, len(call.tasks) - 1)
        for call in list(calls.values()):
            self._send(call, calls)
        for item in self.local:  # a known output that is an output of a call sent now
            if isinstance(item[1], _Link):
                item[1] = item[1].call.outputs[item[1].index]
        for item in self.local:
            self.known_outputs[(item[0].node, item[0].step)] = item[1]

    def _send(self, call: _Call, calls: dict[int, _Call]) -> None:
        """One actor call for `call`'s tasks (`run` for one, `run_chain` for several)."""
        calls.pop(id(call.actor), None)
        if len(call.tasks) == 1:
            (task, sent), values = call.tasks[0], call.inputs[0]
            output, info = call.actor.run.options(num_returns=2).remote(
                task.node, task.step, list(task.inputs), *values,
                keep=self.keep.get(task.node, 0))
            call.outputs = [output]
            self._track(task, output, info, sent)
            return
        args: list[Any] = []
        plan = []
        for values in call.inputs:
            sources = []
            for value in values:
                if isinstance(value, _Link):  # an earlier task of this call
                    sources.append(-1 - value.index)
                else:
                    sources.append(len(args))
                    args.append(value)
            plan.append(sources)
        chain = [(task.node, task.step, list(task.inputs), sources,
                  self.keep.get(task.node, 0)) for (task, _), sources in zip(call.tasks, plan)]
        refs = call.actor.run_chain.options(num_returns=2 * len(chain)).remote(chain, *args)
        call.outputs = list(refs[0::2])
        tasks = [task for task, _ in call.tasks]
        for (task, sent), output, info in zip(call.tasks, refs[0::2], refs[1::2]):
            self._track(task, output, info, sent)
            self.fused[info] = tasks

    def _pending_output(self, pending: Pending, links: dict[tuple[str, int], Any]) -> Any:
        """The output (reference) of a task still running, or still to be completed here,
        or sent in this flush (a `_Link` while its call is open)."""
        key = (pending.node, pending.step)
        if key in links:
            return links[key]
        return self.refs[key][0] if key in self.refs else self.known_outputs[key]

    def _track(self, task: Task, output: Any, info: Any, sent: float) -> None:
        self.pending[info] = (task, output, sent)
        self.refs[(task.node, task.step)] = (output, info, task.kind)

    def __len__(self) -> int:
        return len(self.pending) + len(self.local) + len(self.buffer)

    def in_flight(self) -> list[Task]:
        """Tasks submitted and not yet returned by `wait`."""
        return ([task for task, _, _ in self.pending.values()]
                + [item[0] for item in self.local] + [task for task, _ in self.buffer])

    def abandon(self) -> list[Task]:
        """A stop that cannot wait any longer (a task that does not return): forget every task
        in flight and return them (their actors are killed when the run ends)."""
        tasks = self.in_flight()
        self.pending.clear()
        self.local.clear()
        self.buffer.clear()
        self.refs.clear()
        self.senders.clear()
        self.fused.clear()
        self.known_outputs.clear()
        return tasks

    def wait(self, timeout: float | None = None) -> list[Completion]:
        """Every task finished by now (at least one unless `timeout` passes first)."""
        self.flush()  # raises a failure the last wait saw
        ready = [item for item in self.local if self._may_complete(item[0])]
        if ready:  # driver-known tasks: done now, in the order they were submitted
            now = time.time()
            for item in ready:
                self.local.remove(item)
                self.known_outputs.pop((item[0].node, item[0].step), None)
            return [Completion(task, output, {**info, "start": now, "end": now}, sent)
                    for task, output, info, sent in ready]
        return self._wait_actors(timeout)

    def _may_complete(self, task: Task) -> bool:
        """A driver-known task completes at once, except a weight update: it delivers the
        version of the train step it follows, so not before that step has finished."""
        return (not KINDS[task.kind].carries_weights or task.behind is None
                or tuple(task.behind) not in self.refs)

    def _wait_actors(self, timeout: float | None) -> list[Completion]:
        import ray

        if not self.pending:
            return []
        refs = list(self.pending) + list(self.senders)
        ready, rest = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        for ref in [r for r in ready if r in self.senders]:
            try:
                self._get(ref, self.senders.pop(ref))  # raises if the sender failed
            except Exception as exc:
                self.failure = self.failure or exc
        ready = [r for r in self.pending if r in set(ready)]  # in the order they were sent
        try:
            fetched = dict(zip(ready, ray.get(ready)))  # one round trip for the batch
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError):
            fetched = {}  # one by one below: each failure names its task
        done, lost = [], set()  # lost: tasks that failed or never started
        for ref in ready:
            task, output, sent = self.pending.pop(ref)
            self.refs.pop((task.node, task.step), None)
            try:
                info = self.info(ref, task, fetched=fetched)
            except Exception as exc:  # the tasks that did finish are handed back first
                self.failure = self.failure or exc
                lost.add((task.node, task.step))
                continue
            finally:
                self.fused.pop(ref, None)
            if isinstance(info, NotRun):  # recalled by a stop, or after a failure
                done.append(Completion(task, None, {}, sent, recalled=True))
                lost.add((task.node, task.step))
                continue
            done.append(Completion(task, output, info, sent))
        # a driver-known weight update that waited for one of these ends with it, in the
        # same batch (after it): the next generate need not wait for another round; behind
        # a task that failed or never started, it never started either
        follow = [item for item in self.local if item[0].behind is not None
                  and self._may_complete(item[0])]
        now = time.time()
        for item in follow:
            self.local.remove(item)
            task, output, info, sent = item
            self.known_outputs.pop((task.node, task.step), None)
            if tuple(task.behind) in lost:
                done.append(Completion(task, None, {}, sent, recalled=True))
            else:
                done.append(Completion(task, output, {**info, "start": now, "end": now}, sent))
        return done

    def info(self, ref: Any, task: Task, timeout: float | None = None,
             fetched: dict[Any, Any] | None = None) -> dict[str, Any] | NotRun:
        """The info of a finished task (`NotRun` if it never started; from `fetched` when
        there); its failure, or its fused call's `TaskFailure`, raises as `_get` says."""
        info = fetched[ref] if fetched and ref in fetched else self._get(ref, task, timeout)
        if isinstance(info, TaskFailure):
            raise_failure(info)
        return info

    def _raise_failure(self) -> None:
        """Raise the failure the last `wait` saw (once its finished tasks were handed back)."""
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure

    def recall(self, halted: Callable[[str, int], bool]) -> None:
        """A stop: ask each actor not to start its tasks that `halted(node, step)` (weight
        updates excepted: both halves of one must run); the ones that had not started come
        back from `wait` as recalled, the others as they finish."""
        import ray

        by_actor: dict[int, tuple[Any, list[tuple[str, int]]]] = {}
        for task, _, _ in self.pending.values():
            if task.node in self.routes or not halted(task.node, task.step):
                continue
            actor = self.actors[task.node]
            by_actor.setdefault(id(actor), (actor, []))[1].append((task.node, task.step))
        refs = [actor.recall.options(concurrency_group=CONTROL).remote(tasks)
                for actor, tasks in by_actor.values()]
        with contextlib.suppress(ray.exceptions.RayActorError):  # `wait` reports a death
            ray.get(refs)  # in place before the loop waits again

    def _get(self, ref: Any, task: Task, timeout: float | None = None) -> Any:
        """The info of a finished task; a failure becomes a WorkerError (or the user's
        RLGraphError, e.g. a reward function that raised, unchanged)."""
        import ray

        try:
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            if isinstance(cause, RLGraphError):
                raise cause from None
            if isinstance(cause, ray.exceptions.RayActorError):  # an input's actor died
                raise WorkerError(f"an actor {task.node} depends on died at step {task.step}: "
                                  f"{_first_line(cause)}") from exc
            what = f"{type(cause).__name__}: {_first_line(cause)}" if cause else _first_line(exc)
            raise WorkerError(f"{task.node} failed at step {task.step}: {what}") from exc
        except ray.exceptions.RayActorError as exc:
            chain = self.fused.get(ref)
            running = (f"one of {', '.join(f'{t.node}({t.step})' for t in chain)} (one fused "
                       "call)" if chain else task.node)
            raise WorkerError(f"the actor running {running} died at step {task.step}: "
                              f"{_first_line(exc)}") from exc
