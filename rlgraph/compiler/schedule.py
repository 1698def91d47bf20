"""Discrete-event simulation of the unrolled graph, and the policy that picks the next task.

A task is one step of one node, `(node, step)`. Its states, named once in `TaskState`:

    waiting --(data, back edge, previous step, channel room all met)--> ready
    ready   --(all its groups free and the policy picks it)-----------> running
    running --(its duration elapsed)----------------------------------> done

Policy (`LowestStepFirst`, shared with the Ray runtime, `rlgraph.runtime.pipeline`): go
through the ready tasks by lowest step, ties broken by the step's topological order, and
start each whose groups are ALL free; the first task that cannot start (the oldest blocked
one) holds its free groups, so it starts as soon as its busy groups free, and the others
backfill the groups nobody holds; repeat until none can start. No preemption. Holding for
only the oldest blocked task keeps one busy group from idling every other (a task that
spans several groups). A weight sync holds only its sender's group (param_update(t) runs on
the trainer after train(t); the receiver stages the version beside generation, which pays
only the switch), so the trainer never waits for a generate to finish. A node in no group
starts as soon as it is ready (it only waits for its inputs, its own previous step and
channel room).

The simulator keeps the same states in flat per-task arrays (`remaining` dependency counts
for waiting tasks, one heap of ready tasks per occupancy signature, a heap of running tasks
by end time, `busy` groups) so a 1000-node graph simulates tens of steps in a fraction of a
second. The steady-state period comes from detecting the periodic regime: the greedy
schedule of a deterministic system eventually repeats, every node's start shifting by the
same `c * period` each `c` steps; the last `max_distance + 2` steps are ignored (no later
steps compete with them, so they run early). Cyclicities up to MAX_CYCLE are searched at
every step; a longer one is found where the last step's relative start times recur. Without
a detected regime the simulation is doubled up to MAX_STEPS steps (or MAX_TASKS tasks); then
the period is estimated between the last step and the earlier step whose relative start
times come closest to it (a quasi-periodic regime, or one approached slowly, never repeats
within reach). Every reported period is at least the proven lower bound
(`period_bound.schedule_bound`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from rlgraph.compiler.period_bound import schedule_bound
from rlgraph.compiler.timed_graph import TimedGraph, piece_name

MAX_CYCLE = 8  # cyclicities (steps per repeat) searched at every step; longer ones recur
MAX_STEPS = 1024  # simulated steps at most before the period is estimated
MAX_TASKS = 400_000  # simulation size cap (steps x nodes)


class TaskState(str, Enum):
    """Where a task `(node, step)` is; the simulator and the runtime use the same words."""

    WAITING = "waiting"  # an input, the back edge, its previous step or channel room is missing
    READY = "ready"  # every dependency met; waits for its groups
    RUNNING = "running"  # holds its groups
    DONE = "done"


@dataclass(frozen=True)
class LowestStepFirst:
    """The scheduling policy: lowest step first, then the step's topological order; the
    oldest blocked task holds its free groups (`reserve`), the rest backfill."""

    order: Mapping[str, int]  # node -> position in the step's topological order
    reserve: bool = True  # a blocked task holds its free groups from lower-priority tasks

    name = "lowest-step-first"

    @classmethod
    def of(cls, names: Sequence[str], reserve: bool = True) -> LowestStepFirst:
        """The policy for nodes listed in step order (`rlgraph.graph.step_order`)."""
        return cls({name: i for i, name in enumerate(names)}, reserve)

    def key(self, node: str, step: int) -> tuple[int, int]:
        """Sort key of a task: smaller runs first."""
        return (step, self.order[node])

    def pick(self, ready: Iterable[tuple[str, int]], occupies: Mapping[str, Collection[str]],
             busy: Collection[str]) -> tuple[str, int] | None:
        """The ready task `(node, step)` to start now, or None. In key order: a task whose
        groups are all free (and not held) starts; with `reserve`, a task blocked by a busy
        group holds its other groups, so lower-priority tasks cannot take them. Call it again
        after each start until it returns None."""
        held: set[str] = set()
        for node, step in sorted(ready, key=lambda task: self.key(*task)):
            groups = occupies.get(node, ())
            if not any(g in busy or g in held for g in groups):
                return (node, step)
            if self.reserve and not held:
                held.update(groups)
        return None


@dataclass(frozen=True)
class MiniBatchFirst(LowestStepFirst):
    """`LowestStepFirst` over a streaming pipeline's tasks: call m of a node runs on
    mini-batch m % k of version m // k, keyed as the simulator keys that piece (version, its
    place in `timed_graph.streamed_order`); a weight carrier's step is a version already."""

    k: int = 1
    carriers: frozenset[str] = frozenset()

    def key(self, node: str, step: int) -> tuple[int, int]:
        """Sort key of a task: smaller runs first."""
        if node in self.carriers:
            return (step, self.order[node])
        return (step // self.k, self.order[piece_name(node, step % self.k)])


@dataclass
class Simulation:
    """Start and end times of every task of a simulated run, `[step * n + node]`."""

    tg: TimedGraph
    steps: int
    start: list[float]
    end: list[float]

    def row(self, step: int) -> list[float]:
        """Start times of every node at one step."""
        n = self.tg.n
        return self.start[step * n:(step + 1) * n]

    def events(self, steps: int) -> list[dict[str, Any]]:
        """Event dicts of the first `steps` steps, by start time (the plan's `events`)."""
        tg, n = self.tg, self.tg.n
        occupies = [[tg.groups[g] for g in occ] for occ in tg.occupies]
        out = []
        for t in range(min(steps, self.steps)):
            for i in range(n):
                occ = occupies[i]
                event = {"node": tg.node_of(i), "step": t, "start": self.start[t * n + i],
                         "end": self.end[t * n + i], "group": occ[0] if occ else None,
                         "occupies": list(occ)}
                if tg.mini_batch_of(i) is not None:  # streaming: one event per mini-batch
                    event["mini_batch"] = tg.mini_batch_of(i)
                event["_order"] = i
                out.append(event)
        out.sort(key=lambda e: (e["start"], e["step"], e["_order"]))
        for event in out:
            del event["_order"]
        return out


def simulate(tg: TimedGraph, steps: int, policy: LowestStepFirst | None = None,
             first_step: Mapping[int, float] | None = None) -> Simulation:
    """Run `steps` steps of the timed graph under the policy (see the module docstring).
    `first_step`: seconds of some nodes (by index) at step 0 alone, where a run's first step
    costs otherwise (the runtime skips the old-log-prob forward of its on-policy batch 0)."""
    n = tg.n
    first = dict(first_step or {})
    policy = policy or LowestStepFirst.of(tg.names)
    dur = tg.duration
    cap = tg.capacity
    data_succ: list[list[int]] = [[] for _ in range(n)]
    data_pred: list[list[int]] = [[] for _ in range(n)]
    for u, v in tg.data_edges:
        data_succ[u].append(v)
        data_pred[v].append(u)
    back_succ: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    back_in: list[list[int]] = [[] for _ in range(n)]
    for u, v, d in (*tg.back_edges, *((a, b, 1) for a, b in tg.wraps)):  # wraps: streaming
        back_succ[u].append((v, d))
        back_in[v].append(d)

    remaining = []
    for t in range(steps):  # dependency counts of every task (see the module docstring)
        remaining += [len(data_pred[i]) + (t > 0) + sum(1 for d in back_in[i] if t >= d)
                      + (len(data_succ[i]) if cap is not None and t >= cap else 0)
                      for i in range(n)]
    signature: dict[tuple[int, ...], int] = {}
    sig_of = [signature.setdefault(occ, len(signature)) if occ else -1 for occ in tg.occupies]
    sig_groups = list(signature)
    group_sigs: list[list[int]] = [[] for _ in tg.groups]
    for s, occ in enumerate(sig_groups):
        for g in occ:
            group_sigs[g].append(s)
    ready: list[list[tuple[tuple[int, int], int]]] = [[] for _ in sig_groups]
    busy = [False] * len(tg.groups)
    running: list[tuple[float, int]] = []
    start = [math.nan] * (steps * n)
    end = [math.nan] * (steps * n)
    dirty: set[int] = set()  # signatures whose groups freed or that got a ready task
    waiting: set[int] = set()  # signatures with ready tasks
    now = 0.0

    def begin(task: int) -> None:
        t, i = divmod(task, n)
        start[task] = now
        end[task] = now + (first.get(i, dur[i]) if t == 0 else dur[i])
        heapq.heappush(running, (end[task], task))
        for g in tg.occupies[i]:
            busy[g] = True
        if cap is not None and t + cap < steps:
            for u in data_pred[i]:  # a channel slot frees: u may produce step t + cap
                release((t + cap) * n + u)

    def release(task: int) -> None:
        remaining[task] -= 1
        if remaining[task] == 0:
            i = task % n
            if sig_of[i] < 0:
                begin(task)
            else:
                heapq.heappush(ready[sig_of[i]], (policy.key(tg.names[i], task // n), task))
                dirty.add(sig_of[i])
                waiting.add(sig_of[i])

    for task in [task for task in range(steps * n) if remaining[task] == 0]:
        remaining[task] = 1
        release(task)
    while True:
        while dirty and policy.reserve:  # scan every waiting signature in key order
            dirty.clear()
            held: tuple[int, ...] = ()
            for _, s in sorted([(ready[s][0][0], s) for s in waiting]):
                groups = sig_groups[s]
                while ready[s]:
                    blocked = False
                    for g in groups:
                        if busy[g] or g in held:
                            blocked = True
                            break
                    if blocked:
                        held = held or groups  # the oldest blocked task holds its groups
                        break
                    begin(heapq.heappop(ready[s])[1])
                if not ready[s]:
                    waiting.discard(s)
                if dirty:  # a start readied tasks (channel room): rescan in key order
                    break
        while dirty:  # backfilling: only signatures whose groups just freed or got work
            candidates = []
            for s in dirty:
                if ready[s]:
                    for g in sig_groups[s]:
                        if busy[g]:
                            break
                    else:
                        candidates.append((ready[s][0][0], s))
            dirty.clear()
            heapq.heapify(candidates)
            while candidates and not dirty:
                _, s = heapq.heappop(candidates)
                if not ready[s] or any(busy[g] for g in sig_groups[s]):
                    continue
                begin(heapq.heappop(ready[s])[1])
            dirty.update(s for _, s in candidates)
        if not running:
            break
        now = running[0][0]
        while running and running[0][0] <= now:
            task = heapq.heappop(running)[1]
            t, i = divmod(task, n)
            for g in tg.occupies[i]:
                busy[g] = False
                dirty.update(group_sigs[g])
            for v in data_succ[i]:
                release(t * n + v)
            if t + 1 < steps:
                release(task + n)
            for v, d in back_succ[i]:
                if t + d < steps:
                    release((t + d) * n + v)
    if any(r > 0 for r in remaining):
        raise RuntimeError("simulation stalled: a task never became ready (a bug: "
                           "build_graph refuses graphs that deadlock)")
    return Simulation(tg, steps, start, end)


@dataclass
class SteadyState:
    """The periodic regime of a simulation (or an estimate of its period if none was found)."""

    period: float
    cyclicity: int  # steps per repeat; 0 when estimated
    first_step: int  # first step of the detected regime
    sim: Simulation
    exact: bool = field(default=True)


def _tolerance(sim: Simulation) -> float:
    """How far two start times may differ and count as equal (float rounding of the run)."""
    span = max((e for e in sim.end if e == e), default=0.0)
    return 1e-9 * max(span, 1e-300)


def _offsets(sim: Simulation, step: int) -> list[float]:
    """Each node's start at `step` less the first node's: the step's shape."""
    row = sim.row(step)
    return [x - row[0] for x in row]


def detect_period(sim: Simulation) -> SteadyState | None:
    """The periodic regime: every node's start shifts by the same amount every c steps over
    at least 2c + max_distance + 2 consecutive steps (before the last steps' end effects);
    c up to MAX_CYCLE first, then a longer cyclicity (`_long_cycle`)."""
    tg = sim.tg
    dmax = tg.max_distance()
    hi = sim.steps - dmax - 2
    tol = _tolerance(sim)
    for c in range(1, MAX_CYCLE + 1):
        need = 2 * c + dmax + 2
        run, shift = 0, math.nan
        for t in range(0, hi - c):
            a, b = sim.row(t), sim.row(t + c)
            delta = b[0] - a[0]
            uniform = all(abs((y - x) - delta) <= tol for x, y in zip(a, b))
            if uniform and run and abs(delta - shift) <= tol:
                run += 1
            else:
                run, shift = (1, delta) if uniform else (0, math.nan)
            if run >= need:
                first = t - run + 1
                period = (sim.row(first + c)[0] - sim.row(first)[0]) / c
                return SteadyState(max(period, 0.0), c, first, sim)
    return _long_cycle(sim, hi, dmax, tol)


def _long_cycle(sim: Simulation, hi: int, dmax: int, tol: float) -> SteadyState | None:
    """A regime of more than MAX_CYCLE steps per repeat: the nearest earlier step `a` whose
    offsets (`_offsets`) equal the last usable step's gives c = last - a; it holds when
    every node shifts by the same amount from step t to t + c for 2c + dmax + 2 consecutive
    t ending at `a` (as `detect_period` asks of short ones)."""
    last = hi - 1
    if last < 0:
        return None
    shape, top = _offsets(sim, last), sim.row(last)
    for a in range(last - MAX_CYCLE - 1, -1, -1):
        c = last - a
        need = 2 * c + dmax + 2
        if need > a + 1:  # the run would start before step 0
            return None
        if any(abs(x - y) > tol for x, y in zip(_offsets(sim, a), shape)):
            continue
        delta, run = top[0] - sim.row(a)[0], 0
        for t in range(a, -1, -1):
            if any(abs((v - u) - delta) > tol for u, v in zip(sim.row(t), sim.row(t + c))):
                break
            run += 1
        if run >= need:
            first = a - run + 1
            period = (sim.row(first + c)[0] - sim.row(first)[0]) / c
            return SteadyState(max(period, 0.0), c, first, sim)
    return None


def estimate_period(sim: Simulation) -> tuple[float, float, int]:
    """(period, its error, first step) of a run without a detected regime: the start shift
    per step between the last usable step and the step of the middle half whose offsets come
    closest to it (a near repeat: the error is that distance over the steps between)."""
    tg = sim.tg
    hi = max(1, sim.steps - tg.max_distance() - 3)  # the last usable step
    shape = _offsets(sim, hi)
    lo, best = max(0, hi // 4), math.inf
    for t in range(max(0, hi // 4), max(1, hi - hi // 4)):
        gap = max(abs(x - y) for x, y in zip(_offsets(sim, t), shape))
        if gap < best:
            lo, best = t, gap
    lo = min(lo, hi - 1)
    steps = hi - lo
    return (sim.row(hi)[0] - sim.row(lo)[0]) / steps, (best + _tolerance(sim)) / steps, lo


def steady_state(tg: TimedGraph, policy: LowestStepFirst | None = None,
                 min_steps: int = 16) -> SteadyState:
    """Simulate until the periodic regime shows (doubling the steps), or estimate the period
    at MAX_STEPS steps (MAX_TASKS tasks); never under the proven bound."""
    steps = max(min_steps, 4 * (tg.max_distance() + 2))
    while True:
        sim = simulate(tg, steps, policy)
        found = detect_period(sim)
        if found is not None:  # a slow approach can pass for a cycle a hair under the bound
            return replace(found, period=max(found.period, schedule_bound(tg).seconds))
        if steps >= MAX_STEPS or 2 * steps * max(tg.n, 1) > MAX_TASKS:
            period, error, lo = estimate_period(sim)
            bound = schedule_bound(tg).seconds  # proven: an estimate within its error of it
            period = bound if period - error <= bound else period  # is the bound
            return SteadyState(max(period, 0.0), 0, lo, sim, exact=False)
        steps *= 2


def utilization(tg: TimedGraph, period: float) -> dict[str, float]:
    """Busy fraction of each group in steady state: its work per step over the period."""
    loads = tg.group_loads()
    return {g: (min(1.0, loads[k] / period) if period > 0 else 0.0)
            for k, g in enumerate(tg.groups)}
