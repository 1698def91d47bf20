"""The runtime's scheduler: node state machines, bounded channels, versions and groups.

This module is pure Python (no Ray): the driver feeds it completions and asks it which tasks
may start, so tests drive it step by step with a fake executor and a simulated clock.

The loop is `drive(pipeline, executor, on_done)`, the only one: start what the pipeline
allows, wait for completions, hand them back. The executor is a parameter (dask's
`get_async(apply)`): `RayExecutor` runs tasks on actors (`runtime.runner`), `InlineExecutor`
runs each in the driver as it starts (`runtime.serial`, dask's `get_sync`). The version gate
and channel capacities come from the plan (`Pipeline.of`), derived once by the lag pass.

State (all here, as in dask's local scheduler):
- `machines`: one `NodeMachine` per node (IDLE -> WAITING_INPUT -> PROCESSING -> ...);
- `channels`: one bounded `Channel` per data edge, capacities from the plan;
- `holders`: per group, the tasks holding it, running or queued behind (tasks of one group
  never overlap; param_update holds its sender's group only: the receiver stages the version
  in the generate actor's `sync` concurrency group, beside generate, and its completion
  means "staged whole", which is what the back edge waits for);
- `versions`: the policy version each generate node's workspace holds (and each logp node's
  that param_update feeds from another group);
- `generated`: generate outputs not yet trained on (the rollout buffer of a checkpoint).

Rules:
- a node runs its steps in order, each once;
- a task is ready when every data input of its step is in its channels, every out-channel
  has room for its output (the simulator's "channel room": a producer never runs more than
  `capacity` steps ahead of its consumer) and, for generate of step t, its workspace holds
  version >= t - max_lag (the back edge);
- among ready tasks, the compiler's scheduling policy (`LowestStepFirst` from
  `rlgraph.compiler.schedule`, the one its simulator uses) picks who starts, one at a time,
  among those whose groups are all free: the measured order is the predicted order;
- a finished task's output enters its out-channels (WAITING_OUTPUT -> IDLE); the room
  checked at start guarantees it fits, so WAITING_OUTPUT only lasts while a stop drains.

Chaining (what keeps the driver off the critical path): while tasks X1..Xn hold group g
(running, or queued behind each other), the next task Y of g may be handed to g's actor at
once, queued behind Xn, when the policy is bound to pick Y the moment they end anyway: Y
holds g only, no Xi is of Y's node, Y has the lowest key among the next unstarted steps of
every node occupying g (so nothing that becomes ready meanwhile can overtake it), and each
of Y's inputs is already in its channel or is some Xi's output of the same step (`Pending`:
the executor passes Xi's output reference). Y then starts when Xn ends without waiting for
the driver to hear of X1..Xn; the schedule is the one the simulator predicts. Fusion: when
nothing outside g waits for any Xi (`_fusable`), Y is marked `fuse` and the executor may
run it in the same actor call as the Xi not yet sent (one call, every task's output and
span returned), which saves the per-call hand-off between tasks on one actor.

Streaming (`schedule.stream.mini_batches` K > 1): every node but the weight carriers runs
once per mini-batch, so its steps are optimizer steps m = t*K + j (mini-batch j of version t);
`steps` still counts versions and `start_step` counts a node's calls (mini-steps). The back
edge gates generate(m) on version >= m // K - max_lag; train's output enters a weight
carrier's channel only at a version's last mini-batch, keyed by the version, so param_update
runs once per version. Chaining is off (a carrier's step is not its input's). A group that
generates and trains streams by time-slicing (its tasks never overlap); its param_update
refreshes the engine's snapshot after every version but the last (`last_step`).

The simulator's task states map onto the machines': waiting = IDLE / WAITING_INPUT with a
missing input, ready = WAITING_INPUT with everything met, running = PROCESSING, done =
the step's output emitted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import networkx as nx

from rlgraph.compiler.lag import channel_capacities, version_gate
from rlgraph.compiler.schedule import LowestStepFirst, MiniBatchFirst
from rlgraph.compiler.timed_graph import streamed_order
from rlgraph.errors import RLGraphError
from rlgraph.graph import step_order
from rlgraph.nodes import KINDS
from rlgraph.runtime.channels import Channel
from rlgraph.runtime.state_machine import NodeMachine, NodeState
from rlgraph.runtime.tasks import Completion, Executor, Pending, Task
from rlgraph.versions import oldest_trainable

if TYPE_CHECKING:
    from rlgraph.compiler.plan import Plan


def drive(pipeline: Pipeline, executor: Executor, on_done: Callable[[Completion], None], *,
          stop_requested: Callable[[], bool] = lambda: False, wait_s: float | None = None,
          after_wait: Callable[[], None] = lambda: None,
          give_up: Callable[[], bool] = lambda: False) -> bool:
    """The one scheduling loop: start every task the pipeline allows, wait for any to finish,
    hand each completion to the pipeline and then to `on_done`, until every node is done or
    a stop has drained. A stop recalls the tasks sent but not started (queued in an actor
    behind others): each comes back `recalled` and its step is withdrawn, so a stop asked
    before train step k starts ends at k. A stop that waited long enough (`give_up`, asked
    while stopping) abandons the tasks still in flight, each withdrawn as if it never ran
    (the executor must offer `abandon`). Returns True when it stopped early."""
    stopped = False
    while True:
        if stop_requested() and not pipeline.stopping:
            pipeline.stop()
            executor.recall(pipeline.halted)  # what waits in an actor's queue stays there
            stopped = True
        _start_all(pipeline, executor)
        if not len(executor):
            if pipeline.finished or pipeline.stopping:
                return stopped
            raise RuntimeError("the pipeline stalled with nothing running:\n"
                               + pipeline.describe())
        for done in executor.wait(timeout=wait_s):
            if done.recalled:
                pipeline.withdraw(done.task.node, done.task.step)
                continue
            pipeline.complete(done.task.node, done.task.step, done.output,
                              done.info.get("version"))
            on_done(done)
        _start_all(pipeline, executor)  # react first, write metrics after
        after_wait()
        if pipeline.stopping and len(executor) and give_up():
            for task in executor.abandon():  # type: ignore[attr-defined]
                pipeline.withdraw(task.node, task.step)
            return True


def _start_all(pipeline: Pipeline, executor: Executor) -> None:
    """Submit every task the pipeline starts now, then send them together (the Ray executor
    fuses the chained ones into one actor call each, `runtime.executor`)."""
    for task in pipeline.startable():
        executor.submit(task)
    executor.flush()


class Pipeline:
    """Decides which node instances start, given completions; knows nothing of Ray."""

    def __init__(
        self,
        graph: nx.DiGraph,
        *,
        steps: int,
        max_lag: int | None = None,
        capacities: Mapping[str, int] | None = None,
        start_step: int = 0,
        policy: LowestStepFirst | None = None,
        preloaded: dict[tuple[str, int], Any] | None = None,
        chaining: bool = True,
    ) -> None:
        """`max_lag` (the version gate) and `capacities` ("src->dst" -> steps) default to
        what the compiler's lag pass derives from `graph` (`Pipeline.of` takes the plan's)."""
        self.graph = graph
        self.steps = steps
        self.max_lag = version_gate(graph) if max_lag is None else max_lag
        self.k = int(graph.graph.get("mini_batches", 1))  # calls per version (streaming)
        self.start_step = start_step
        order = step_order(graph)
        self.kinds: dict[str, str] = dict(graph.nodes(data="kind"))
        self.roles = {name: KINDS[kind] for name, kind in self.kinds.items()}
        if policy is None and self.k > 1:
            pieces = {name: i for i, name in enumerate(streamed_order(graph))}
            policy = MiniBatchFirst(pieces, k=self.k, carriers=frozenset(
                n for n in order if self.roles[n].carries_weights))
        self.policy = policy or LowestStepFirst.of(order)
        self.machines = {
            name: NodeMachine(name, self.kinds[name], tuple(graph.nodes[name]["occupies"]),
                              step=self.first_step(name) - 1)
            for name in order
        }
        capacities = channel_capacities(graph) if capacities is None else capacities
        self.channels: dict[tuple[str, str], Channel] = {}
        for src, dst, distance in graph.edges(data="distance"):
            if distance == 0:
                self.channels[(src, dst)] = Channel(src, dst, int(capacities[f"{src}->{dst}"]))
        # steps between a weight carrier's step and the first step that waits for it
        self.reach = {u: d for u, _, d in graph.edges(data="distance") if d > 0}
        self.holders: dict[str, list[tuple[str, int]]] = {}  # group -> tasks holding it, in order
        for name in order:
            for group in self.machines[name].occupies:
                self.holders.setdefault(group, [])
        self.members = {g: [n for n in order if g in self.machines[n].occupies]
                        for g in self.holders}
        self.claimed: set[tuple[str, str, int]] = set()  # (src, dst, step) taken before emitted
        self.chaining = chaining and self.k == 1
        self.trains = [n for n in order if self.roles[n].advances_policy]
        self.trained: dict[str, int] = {n: start_step for n in self.trains}
        self.versions: dict[str, int] = {}
        self.feeders: dict[str, list[str]] = {}
        for name in order:
            feeders = [src for src, _, d in graph.in_edges(name, data="distance") if d > 0]
            if self.roles[name].samples or feeders:  # holds weights a param_update sends
                self.versions[name] = start_step // self.k
                self.feeders[name] = feeders
                unfed = not feeders and not self._colocated_train(name)
                if self.roles[name].samples and unfed:
                    raise RLGraphError(
                        f"generate node '{name}' never receives new weights: it has no "
                        "param_update and shares no group with train "
                        "(add a param_update node with dst: " + name + ")"
                    )
        self.generated: dict[tuple[str, int], Any] = {}
        self.stopping = False
        self.stop_before = 0  # streaming: the first call a stop does not run (see `stop`)
        for (node, step), output in sorted((preloaded or {}).items(), key=lambda kv: kv[0][1]):
            self._preload(node, step, output)
        self._settle()

    @classmethod
    def of(cls, plan: Plan, *, steps: int, **options: Any) -> Pipeline:
        """The pipeline of a compiled plan: its graph, version gate and channel capacities."""
        return cls(plan.graph, steps=steps, max_lag=plan.lag.max_lag, capacities=plan.channels,
                   **options)

    # ------------------------------------------------------------------ queries

    def first_step(self, node: str) -> int:
        """The first step `node` runs: `start_step`, in versions for a weight carrier."""
        return self.start_step // self.k if self.roles[node].carries_weights else self.start_step

    def last_step(self, node: str) -> int:
        """One past the last step `node` runs: a weight carrier skips weights nobody will use
        (its step s feeds step s + distance of its back edge), except a colocated streaming
        group's, which refreshes its engine's snapshot after every version but the last
        (verl: weights reach the rollout every K optimizer steps); streaming nodes run K
        calls per version."""
        if node in self.reach and not (self.k > 1 and self._within_group(node)):
            return max(self.first_step(node), self.steps - self.reach[node])
        if node in self.reach:  # a colocated streaming engine's snapshot: fresh every version
            return max(self.first_step(node), self.steps - 1)
        if self.roles[node].carries_weights:
            return self.steps
        return self.steps * self.k

    def _key(self, channel: Channel, step: int) -> int | None:
        """The key step `step` of the channel's source takes in it; None when streaming skips
        it (train's output enters a weight carrier's channel once per version)."""
        if self.k == 1 or not self.roles[channel.dst].carries_weights \
                or self.roles[channel.src].carries_weights:
            return step
        return step // self.k if (step + 1) % self.k == 0 else None

    def _within_group(self, carrier: str) -> bool:
        """A weight carrier whose sender and receiver share a group (a local copy)."""
        spec = self.graph.nodes[carrier]["spec"]
        src, dst = (self.graph.nodes[n]["group"] for n in (spec.src, spec.dst))
        return src is not None and src == dst

    def _colocated_train(self, generate: str) -> str | None:
        group = self.graph.nodes[generate]["group"]
        return next((t for t in self.trains if group and self.graph.nodes[t]["group"] == group),
                    None)

    def _inputs(self, node: str) -> list[str]:
        return [src for (src, dst) in self.channels if dst == node]

    def _outputs(self, node: str) -> list[Channel]:
        return [ch for (src, _), ch in self.channels.items() if src == node]

    @property
    def busy(self) -> set[str]:
        """Groups held by a running or queued task."""
        return {g for g, tasks in self.holders.items() if tasks}

    def version_ok(self, node: str, step: int) -> bool:
        """The back edge: generate (or a logp fed by param_update) of step t needs version
        >= t - max_lag."""
        if node not in self.versions:
            return True
        return self.versions[node] >= oldest_trainable(step, self.max_lag, self.k)

    def _inputs_ready(self, machine: NodeMachine) -> bool:
        return all(self.channels[(src, machine.name)].has(machine.step)
                   for src in self._inputs(machine.name))

    def _room(self, node: str, step: int) -> bool:
        """Every out-channel that step `step`'s output enters has room."""
        return all(ch.has_room() for ch in self._outputs(node)
                   if self._key(ch, step) is not None)

    def _ready(self, machine: NodeMachine) -> bool:
        return (machine.state is NodeState.WAITING_INPUT and self._inputs_ready(machine)
                and self._room(machine.name, machine.step)
                and self.version_ok(machine.name, machine.step))

    def candidates(self) -> list[NodeMachine]:
        """Machines whose step could start now if their groups were free, best first."""
        ready = [m for m in self.machines.values() if self._ready(m)]
        return sorted(ready, key=lambda m: self.policy.key(m.name, m.step))

    @property
    def running(self) -> list[NodeMachine]:
        """Machines whose worker runs now."""
        return [m for m in self.machines.values() if m.state is NodeState.PROCESSING]

    @property
    def finished(self) -> bool:
        """True when every machine is DONE."""
        return all(m.state is NodeState.DONE for m in self.machines.values())

    def trained_steps(self) -> int:
        """Train steps finished by every train node (the next step to train)."""
        return min(self.trained.values()) if self.trained else self.start_step

    # ------------------------------------------------------------------ moves

    def startable(self) -> list[Task]:
        """Start every task the policy picks now (groups marked busy, inputs taken), then
        chain what may queue behind a running task. A start frees channel room, which can
        make a producer ready at once, as in the simulator."""
        tasks = []
        while True:
            ready = {(m.name, m.step): m for m in self.machines.values() if self._ready(m)}
            occupies = {m.name: m.occupies for m in ready.values()}
            pick = self.policy.pick(ready, occupies, self.busy)
            if pick is None:
                break
            tasks.append(self._start(ready[pick], None))
        while self.chaining and (chained := self._chain()) is not None:
            tasks.append(chained)
        return tasks

    def _start(self, machine: NodeMachine, behind: tuple[str, int] | None,
               queue: tuple[tuple[str, int], ...] = (), fuse: bool = False) -> Task:
        inputs: dict[str, Any] = {}
        for src in self._inputs(machine.name):
            if (src, machine.step) in queue:
                self.claimed.add((src, machine.name, machine.step))
                inputs[src] = Pending(src, machine.step)
            else:
                inputs[src] = self.channels[(src, machine.name)].take(machine.step)
        for group in machine.occupies:
            self.holders[group].append((machine.name, machine.step))
        machine.start()
        return Task(machine.name, machine.kind, machine.step, machine.occupies, inputs, behind,
                    fuse)

    def _next_step(self, machine: NodeMachine) -> int | None:
        """The step this node runs next, whether armed or not (None: no further step)."""
        if machine.state is NodeState.DONE:
            return None
        nxt = machine.step if machine.state is NodeState.WAITING_INPUT else machine.step + 1
        return None if self.halted(machine.name, nxt) or nxt >= self.last_step(
            machine.name) else nxt

    def _chain(self) -> Task | None:
        """A task that may queue behind the running and queued tasks of its group (see the
        module docstring); `fuse` when it may share their actor call (`_fusable`)."""
        for group, holding in self.holders.items():
            if not holding:
                continue
            nexts = [(n, s) for n in self.members[group]
                     if (s := self._next_step(self.machines[n])) is not None]
            if not nexts:
                continue
            node, step = min(nexts, key=lambda task: self.policy.key(*task))
            machine, queue = self.machines[node], tuple(holding)
            if (machine.state is not NodeState.WAITING_INPUT or machine.step != step
                    or machine.occupies != (group,) or not self.version_ok(node, step)
                    or any(n == node for n, _ in queue)
                    or not all(ch.has_room() for ch in self._outputs(node))):
                continue
            if all(self.channels[(src, node)].has(step) or (src, step) in queue
                   for src in self._inputs(node)):
                return self._start(machine, queue[-1], queue, self._fusable(group, queue))
        return None

    def _fusable(self, group: str, queue: tuple[tuple[str, int], ...]) -> bool:
        """Whether a task queued behind `queue` may run in one actor call with it (its
        completions then all arrive when the call ends): only when nothing outside `group`
        waits for any queued task, i.e. every consumer of each, and everything a weight
        carrier among them feeds, occupies `group` alone."""

        def internal(node: str) -> bool:
            return all(self.machines[dst].occupies == (group,) and (
                not self.roles[dst].carries_weights or internal(dst))
                for dst in self.graph.successors(node))

        return all(internal(node) for node, _ in queue)

    def complete(self, node: str, step: int, output: Any, version: int | None = None) -> None:
        """`(node, step)` returned `output`; param_update reports the version it delivered."""
        machine = self.machines[node]
        if machine.state is not NodeState.PROCESSING or machine.step != step:
            raise RuntimeError(f"completion of {node}({step}) while it is "
                               f"{machine.state.value} at step {machine.step}")
        machine.finish(output)
        for group in machine.occupies:
            self.holders[group].remove((node, step))
        role = self.roles[node]
        if role.carries_weights:
            dst = self.graph.nodes[node]["spec"].dst
            delivered = step + 1 if version is None else version
            if dst in self.versions:
                self.versions[dst] = max(self.versions[dst], delivered)
        elif role.advances_policy:
            self.trained[node] = step + 1
            for gen in self.versions:
                if not self.feeders[gen] and self._colocated_train(gen) == node:
                    self.versions[gen] = step + 1
            done = self.trained_steps()
            for key in [k for k in self.generated if k[1] < done]:
                del self.generated[key]
        self._settle()

    def stop(self) -> None:
        """Start nothing new; running tasks finish and their outputs still enter channels.
        Streaming finishes the version train is in first (its remaining mini-batches, and
        the weight syncs they wait for), so a run stops, and checkpoints, between versions."""
        self.stopping = True
        if self.k > 1:
            calls = [m.step + 1 if m.state in (NodeState.PROCESSING, NodeState.WAITING_OUTPUT)
                     else self.trained[m.name] for m in map(self.machines.get, self.trains)]
            self.stop_before = -(-max(calls, default=0) // self.k) * self.k
        for machine in self.machines.values():
            if (machine.state is NodeState.WAITING_INPUT
                    and self.halted(machine.name, machine.step)):
                machine.close()
        self._settle()

    def withdraw(self, node: str, step: int) -> None:
        """`(node, step)` never started (a stop recalled it from its actor, or a task before
        it in its fused call failed): the node is done at its previous step and frees its
        groups (a generate output it took stays in the rollout buffer until trained on)."""
        machine = self.machines[node]
        if machine.state is not NodeState.PROCESSING or machine.step != step:
            raise RuntimeError(f"withdrawal of {node}({step}) while it is "
                               f"{machine.state.value} at step {machine.step}")
        machine.withdraw()
        for group in machine.occupies:
            self.holders[group].remove((node, step))
        self._settle()

    def halted(self, node: str, step: int) -> bool:
        """Whether a stop keeps step `step` of `node` from starting (see `stop`)."""
        if not self.stopping:
            return False
        if self.k == 1:
            return True
        if self.roles[node].carries_weights:
            return step >= self.stop_before // self.k - 1
        return step >= self.stop_before

    def _preload(self, node: str, step: int, output: Any) -> None:
        """Resume: generate's step `step` was done before the stop (from the rollout buffer)."""
        machine = self.machines[node]
        if not self.roles[node].samples or machine.step != step - 1:
            raise RuntimeError(f"cannot preload {node}({step}) after step {machine.step}")
        for channel in self._outputs(node):
            channel.put(step, output)
        self.generated[(node, step)] = output
        machine.step = step

    def _settle(self) -> None:
        """Emit outputs that fit, then arm or close idle machines, until nothing moves."""
        moved = True
        while moved:
            moved = False
            for machine in self.machines.values():
                if machine.state is NodeState.WAITING_OUTPUT:
                    outs = [ch for ch in self._outputs(machine.name)
                            if (ch.src, ch.dst, machine.step) not in self.claimed
                            and self._key(ch, machine.step) is not None]
                    if all(ch.has_room() for ch in outs):
                        self.claimed -= {(machine.name, ch.dst, machine.step)
                                         for ch in self._outputs(machine.name)}
                        step = machine.step
                        output = machine.emit()
                        for ch in outs:
                            ch.put(self._key(ch, step), output)
                        if self.roles[machine.name].samples:
                            self.generated[(machine.name, machine.step)] = output
                        moved = True
                if machine.state is NodeState.IDLE:
                    nxt = machine.step + 1
                    if self.halted(machine.name, nxt) or nxt >= self.last_step(machine.name):
                        machine.close()
                    else:
                        machine.arm(nxt)
                    moved = True

    def rollout_buffer(self) -> dict[tuple[str, int], Any]:
        """Generate outputs of steps not yet trained (what a checkpoint must keep)."""
        done = self.trained_steps()
        buffer = {k: v for k, v in self.generated.items() if k[1] >= done}
        for m in self.machines.values():
            if self.roles[m.name].samples and m.state is NodeState.WAITING_OUTPUT:
                buffer[(m.name, m.step)] = m.output
        return dict(sorted(buffer.items(), key=lambda kv: kv[0][1]))

    def describe(self) -> str:
        """One line per machine and channel: for deadlock reports."""
        lines = [f"{m.name}: {m.state.value} step {m.step}" for m in self.machines.values()]
        lines += [f"{ch.name}: steps {sorted(ch.items)} / {ch.capacity}"
                  for ch in self.channels.values()]
        lines.append(f"holders: {self.holders}; versions: {self.versions}")
        return "\n".join(lines)

