"""`rlgraph tune`: search groups, GPUs per group, max_lag, partial rollout and generate tp
for the shortest steady-state period the compiler predicts.

Objective: least `period_s` among plans the placement pass accepts (memory fit, divisibility)
with max_lag at most the user's; ties (equal to 9 significant digits) go to the smaller lag,
then to fewer idle GPUs, then partial rollout off, then the user's own plan, then fewer
groups. The user's plan is always a candidate, so the result is never worse than it.

Method (the space is `rlgraph.tune.space.SearchSpace`, a candidate's evaluation
`rlgraph.tune.evaluate.Evaluator`):

- enumeration, when partitions x tp choices x partial settings are at most `PARTITION_LIMIT`
  (up to 8 grouped tasks): every candidate gets a cheap lower bound from per-group cost
  tables and is evaluated exactly (placement, costs, the exact bound, then the simulation
  only if the bound can still beat the K-th best plan), best lower bound first. Phase 1 does
  this for one water-filled size vector per partition, to learn a good K-th best period
  early; phase 2 for every size vector, never combining a group size whose own load already
  exceeds that period. The search stops when the next lower bound exceeds the K-th best
  period. This is exact: every skipped plan is provably no better.
- local search, for larger spaces (or when phase 2 passes `ENUMERATION_LIMIT` candidates or
  half the time budget): hill climbing from the user's plan, the colocated plan, the best
  plans so far and seeded random partitions (GPUs water-filled to the most loaded group),
  over moves of one task between groups, GPUs between two groups, lag, partial rollout and
  tp; neighbours whose lower bound cannot beat the current plan are never simulated.
  Deterministic for a seed.

Both stop at `time_budget_s` of wall time (default `TIME_BUDGET_S`, read at each call; the
result then says it is not exact).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from rlgraph.compiler import compile_plan, describe_bottleneck, sync_spec
from rlgraph.compiler.calibrate import as_calibration
from rlgraph.compiler.costs import calibration_scale, node_costs
from rlgraph.compiler.lag import prove_lag
from rlgraph.compiler.placement import place
from rlgraph.compiler.plan import Plan as CompiledPlan
from rlgraph.compiler.schedule import steady_state, utilization
from rlgraph.compiler.timed_graph import timed_graph
from rlgraph.config.schema import Spec
from rlgraph.errors import SpecError
from rlgraph.graph import build_graph
from rlgraph.tune.beyond import beyond_bound
from rlgraph.tune.evaluate import Evaluator, idle_gpus
from rlgraph.tune.ranking import Leaderboard, RankedPlan, TuneResult
from rlgraph.tune.space import (
    PRUNE_TOLERANCE,
    Candidate,
    Evaluation,
    SearchSpace,
    bell,
    in_flight,
    streamed,
)

PARTITION_LIMIT = 5_000  # partitions x tp choices x partial settings enumerated exactly
ENUMERATION_LIMIT = 400_000  # candidates (layouts x lags) whose bound can still win
TIME_BUDGET_S = 30.0
RESTARTS = 24  # local search: random restarts after the input and the colocated plan


def _plan_of(ev: Evaluation, space: SearchSpace) -> RankedPlan:
    cand, tg, bound = ev.candidate, ev.tg, ev.bound
    assert tg is not None and bound is not None and ev.period_s is not None and ev.spec
    groups = [{"name": n, "tasks": list(b), "gpus": s}
              for n, b, s in zip(space.names(cand.blocks), cand.blocks, cand.sizes)]
    util = utilization(tg, ev.period_s)
    return RankedPlan(groups, cand.max_lag, cand.partial_rollout, cand.tp, ev.period_s, ev.bound_s,
                ev.idle_gpus, describe_bottleneck(tg, bound, ev.period_s, util), ev.spec,
                candidate=cand, mini_batches=streamed(ev.spec), inflight=in_flight(ev.spec))


def _input_plan(spec: Spec, measured: dict[str, float] | None
                ) -> tuple[RankedPlan | None, str | None, CompiledPlan | None]:
    """The user's own plan as compile_plan sees it, or why the placement pass refuses it."""
    try:
        plan = compile_plan(spec, measured)
    except SpecError as err:
        err.source = err.source or spec.source
        return None, err.render(), None
    sched = plan.schedule
    groups = [{"name": g.name, "tasks": list(g.tasks), "gpus": g.gpus}
              for g in plan.placement.groups]
    graph, placement = build_graph(spec), place(spec)  # plan.json rounds utilization
    costs, _ = node_costs(spec, graph, placement, measured)
    tg = timed_graph(graph, {n: c.seconds for n, c in costs.items()}, list(placement.groups))
    idle = idle_gpus(tg, sched.period_s, placement, placement.slots)
    return RankedPlan(groups, spec.schedule.max_lag, spec.schedule.partial_rollout, None,
                sched.period_s, sched.bound_s, idle, sched.bottleneck, spec,
                origin="input", mini_batches=streamed(spec), inflight=in_flight(spec)), None, plan


def _sync_period(spec: Spec, scale: dict[str, float]) -> float:
    """The colocated synchronous baseline as compile_plan computes it."""
    base = sync_spec(spec)
    graph = build_graph(base)
    placement = place(base, strict=False)
    costs, _ = node_costs(base, graph, placement, scale=scale)
    tg = timed_graph(graph, {n: c.seconds for n, c in costs.items()}, list(placement.groups))
    return steady_state(tg).period


# ---------------------------------------------------------------- search methods


class _Search:
    """State shared by both methods: the space, the evaluator, the board and the clock."""

    def __init__(self, space: SearchSpace, ev: Evaluator, board: Leaderboard, deadline: float):
        self.space, self.ev, self.board, self.deadline = space, ev, board, deadline
        self.started = time.perf_counter()
        self.timed_out = False
        self._fitted: dict[tuple, tuple[int, ...] | None] = {}

    def late(self, half: bool = False) -> bool:
        """True (and remembered) once the time budget is spent; `half`: half of what is left
        at the start (enumeration then leaves the rest to the local search)."""
        now = time.perf_counter()
        if half:
            return now > (self.started + self.deadline) / 2
        if now > self.deadline:
            self.timed_out = True
        return self.timed_out

    def try_candidate(self, cand: Candidate, cutoff: float) -> RankedPlan | None:
        """Evaluate exactly (simulating only if the bound beats cutoff); rank if feasible."""
        ev = self.ev.evaluate(cand, cutoff)
        if not ev.feasible:
            return None
        plan = _plan_of(ev, self.space)
        self.board.offer(plan)
        return plan

    def refine_mini_batches(self) -> None:
        """Streaming's mini-batches per version, tried on each ranked plan that streams
        (the search ran with the graph's; costs do not depend on it)."""
        for plan in self.board.ranked():
            if plan.candidate is None or plan.mini_batches is None:
                continue
            for k in self.space.stream_choices:
                self.try_candidate(replace(plan.candidate, mini_batches=k), self.board.cutoff())

    def refine_inflight(self) -> None:
        """In-flight updates off and on, tried on each ranked plan that can hold them (the
        search ran with the user's setting, which is on)."""
        if not self.space.inflight:
            return
        for plan in self.board.ranked():
            if plan.candidate is not None and plan.max_lag >= 1 and (
                    plan.partial_rollout or plan.mini_batches is not None):
                self.try_candidate(replace(plan.candidate, inflight=not plan.inflight),
                                   self.board.cutoff())

    @staticmethod
    def _entry(out: list, cand: Candidate, load: float, path: float, cutoff: float) -> None:
        lower = max(load, path / (cand.max_lag + 1))
        if lower <= cutoff:
            out.append((lower, cand.max_lag, len(out), cand))

    def seeds(self) -> list[tuple[float, int, int, Candidate]]:
        """Phase 1: one water-filled size vector per partition, tp and partial setting."""
        out: list = []
        cutoff = self.board.cutoff() * (1 + PRUNE_TOLERANCE)
        for blocks in self.space.partitions():
            for tp in self.space.tps:
                for partial in self.space.partials:
                    sizes = self.fit_sizes(blocks, partial, tp)
                    if sizes is None:
                        continue
                    load, path = self.ev.lower_bound(blocks, sizes, partial, tp)
                    for lag in self.space.lags_for(partial):
                        self._entry(out, Candidate(blocks, sizes, lag, partial, tp), load, path,
                                    cutoff)
        return sorted(out, key=lambda e: e[:3])

    def entries(self) -> list[tuple[float, int, int, Candidate]] | None:
        """Phase 2: every candidate whose lower bound can still enter the top K (block sizes
        whose own load exceeds the cutoff are never combined); None past the limit or past
        half of the time left."""
        out: list = []
        cutoff = self.board.cutoff() * (1 + PRUNE_TOLERANCE)
        visited = 0
        for blocks in self.space.partitions():
            for tp in self.space.tps:
                valid = [self.ev.valid_sizes(b, tp) for b in blocks]
                for partial in self.space.partials:
                    choices = [[s for s in v if self.ev.block_load(b, s, partial, tp) <= cutoff]
                               for b, v in zip(blocks, valid)]
                    for sizes in self.space.size_vectors(choices, valid):
                        load, path = self.ev.lower_bound(blocks, sizes, partial, tp)
                        for lag in self.space.lags_for(partial):
                            self._entry(out, Candidate(blocks, sizes, lag, partial, tp), load,
                                        path, cutoff)
                        visited += 1
                        if len(out) > ENUMERATION_LIMIT or (
                                visited % 64 == 0 and self.late(half=True)):
                            return None
        return sorted(out, key=lambda e: e[:3])

    def best_first(self, entries: list[tuple[float, int, int, Candidate]]) -> None:
        """Best lower bound first; stop when no remaining candidate can enter the top K."""
        for lower, _, _, cand in entries:
            cutoff = self.board.cutoff()
            if lower > cutoff * (1 + PRUNE_TOLERANCE) or self.late():
                break
            self.try_candidate(cand, cutoff)

    # ------------------------------------------------------------ local search

    def fit_sizes(self, blocks: tuple, partial: bool, tp: int | None) -> tuple[int, ...] | None:
        """Water-filling: smallest accepted sizes, then grow the most loaded group that can
        (None when no sizes fit, or a group would run logp without the policy's weights)."""
        if not all(self.space.holds_policy(b) for b in blocks):
            return None
        key = (blocks, partial, tp)
        if key not in self._fitted:
            self._fitted[key] = self._water_fill(blocks, partial, tp)
        return self._fitted[key]

    def _water_fill(self, blocks: tuple, partial: bool, tp: int | None
                    ) -> tuple[int, ...] | None:
        valid = [self.ev.valid_sizes(b, tp) for b in blocks]
        if any(not v for v in valid):
            return None
        sizes = [v[0] for v in valid]
        if not self.space.packs(sizes):
            return None
        loads = [self.ev.block_load(b, s, partial, tp) for b, s in zip(blocks, sizes)]
        while True:
            for i in sorted(range(len(blocks)), key=lambda i: -loads[i]):
                bigger = next((v for v in valid[i] if v > sizes[i]), None)
                if bigger is not None and self.space.packs([*sizes[:i], bigger,
                                                            *sizes[i + 1:]]):
                    sizes[i] = bigger
                    loads[i] = self.ev.block_load(blocks[i], bigger, partial, tp)
                    break
            else:
                return tuple(sizes)

    def neighbours(self, cand: Candidate, rng: random.Random) -> Iterator[Candidate]:
        """Moves, in seeded random order: lag, partial rollout, tp, GPUs from one group to
        another, one task to another (or a new) group; sizes are water-filled after a move
        that changes the groups or tp."""
        space = self.space
        moves: list[tuple] = [("lag", lag) for lag in space.lags_for(cand.partial_rollout)
                              if lag != cand.max_lag]
        moves += [("partial", p) for p in space.partials if p != cand.partial_rollout]
        moves += [("tp", tp) for tp in space.tps if tp != cand.tp]
        k = len(cand.blocks)
        moves += [("gpus", i, j) for i in range(k) for j in range(k) if i != j]
        moves += [("task", t, j) for t in space.tasks for j in range(k + 1)]
        rng.shuffle(moves)
        for move in moves:
            nxt = self._apply(cand, move)
            if nxt is not None and nxt != cand:
                yield nxt

    def _apply(self, cand: Candidate, move: tuple) -> Candidate | None:
        kind = move[0]
        if kind == "lag":
            return replace(cand, max_lag=move[1])
        if kind == "partial":
            return replace(cand, partial_rollout=move[1],
                           max_lag=max(cand.max_lag, 1) if move[1] else cand.max_lag)
        if kind == "tp":
            sizes = self.fit_sizes(cand.blocks, cand.partial_rollout, move[1])
            return replace(cand, tp=move[1], sizes=sizes) if sizes else None
        if kind == "gpus":  # block i takes its next size, block j gives what packing needs
            i, j = move[1], move[2]
            valid_i = self.ev.valid_sizes(cand.blocks[i], cand.tp)
            bigger = next((v for v in valid_i if v > cand.sizes[i]), None)
            if bigger is None:
                return None
            for smaller in reversed(self.ev.valid_sizes(cand.blocks[j], cand.tp)):
                if smaller >= cand.sizes[j]:
                    continue
                sizes = list(cand.sizes)
                sizes[i], sizes[j] = bigger, smaller
                if self.space.packs(sizes):
                    return replace(cand, sizes=tuple(sizes))
            return None
        task, j = move[1], move[2]
        moved = [[t for t in b if t != task] for b in cand.blocks] + [[]]
        moved[j].append(task)
        blocks = self.space.canonical([b for b in moved if b])
        sizes = self.fit_sizes(blocks, cand.partial_rollout, cand.tp)
        return replace(cand, blocks=blocks, sizes=sizes) if sizes else None

    def climb(self, start: Candidate, rng: random.Random) -> None:
        """First-improvement hill climbing; neighbours whose bound cannot win are skipped."""
        current = self.try_candidate(start, math.inf)
        if current is None:
            return
        improved = True
        while improved and not self.late():
            improved = False
            for nxt in self.neighbours(current.candidate, rng):  # type: ignore[arg-type]
                if self.late():
                    return
                load, path = self.ev.lower_bound(nxt.blocks, nxt.sizes, nxt.partial_rollout,
                                                 nxt.tp)
                if max(load, path / (nxt.max_lag + 1)) > current.period_s * (
                        1 + PRUNE_TOLERANCE):
                    continue
                plan = self.try_candidate(nxt, current.period_s)
                if plan is not None and plan.key() < current.key():
                    current, improved = plan, True
                    break

    def local_search(self, starts: list[Candidate], seed: int) -> None:
        """Climb from each start, then from seeded random partitions."""
        rng = random.Random(seed)
        for start in starts:
            self.climb(start, rng)
        tasks = list(self.space.tasks)
        for _ in range(RESTARTS):
            if self.late():
                return
            labels = [rng.randrange(len(tasks)) for _ in tasks]
            part = self.space.canonical([[t for t, lab in zip(tasks, labels) if lab == k]
                                         for k in sorted(set(labels))])
            partial = rng.choice(self.space.partials)
            tp = rng.choice(self.space.tps)
            sizes = self.fit_sizes(part, partial, tp)
            if sizes:
                lags = self.space.lags_for(partial)
                self.climb(Candidate(part, sizes, rng.choice(lags), partial, tp), rng)


# ---------------------------------------------------------------- tune


def tune(spec: Spec, *, top: int = 5, seed: int = 0, calibration: Any = None,
         time_budget_s: float | None = None, tp_choices: list[int] | None = None,
         method: str = "auto") -> TuneResult:
    """Search the plan space of `spec` (see the module docstring) and rank the best plans.

    `calibration`: as for `compile_plan` (seconds per node, measured events or a trace path);
    measured/modelled ratios at the user's placement carry over to every candidate.
    `method`: "auto" (enumerate when small), "enumeration" or "local search".
    `time_budget_s`: wall seconds before the search returns the best plan found so far (None:
    the module's `TIME_BUDGET_S` at call time)."""
    started = time.perf_counter()
    if time_budget_s is None:
        time_budget_s = TIME_BUDGET_S
    graph = build_graph(spec)  # structural errors are the user's to fix, not a search result
    prove_lag(graph, spec.schedule.partial_rollout)
    if not spec.groups:
        raise SpecError("the graph has no groups to tune", ("groups",),
                        hint="add groups: {name: {share: 1, tasks: [...]}}")
    measured = as_calibration(calibration)
    scale: dict[str, float] = {}
    if measured:
        costs, _ = node_costs(spec, graph, place(spec, strict=False), measured)
        scale = calibration_scale(costs)
    space = SearchSpace(spec, tp_choices)
    evaluator = Evaluator(space, scale)
    board = Leaderboard(top)
    mine, input_error, input_plan = _input_plan(spec, measured)
    if mine is not None:
        board.offer(mine)
    sync = input_plan.schedule.sync_period_s if input_plan else _sync_period(spec, scale)
    search = _Search(space, evaluator, board, started + time_budget_s)
    layouts = bell(len(space.tasks)) * len(space.tps) * len(space.partials)
    if method == "auto":
        method = "enumeration" if layouts <= PARTITION_LIMIT else "local search"
    used = method
    if method == "enumeration":
        search.best_first(search.seeds())
        entries = search.entries()
        if entries is None:  # too many to enumerate: improve the seeds locally instead
            used = "local search"
        else:
            search.best_first(entries)
    if used == "local search":
        starts = [c for c in (_as_candidate(space, mine), _colocated(search, spec)) if c]
        starts += [p.candidate for p in board.ranked() if p.candidate]
        search.local_search(starts, seed)
    search.refine_mini_batches()
    search.refine_inflight()
    ranked = board.ranked()
    if not ranked:
        raise SpecError("no plan fits this cluster: every grouping is refused by the placement "
                        "checks", ("cluster",), hint=input_error or "add GPUs or a smaller model")
    best = ranked[0]
    plan = input_plan if best.origin == "input" and input_plan else compile_plan(
        best.spec, _carried(best.spec, scale) if scale else None)
    stats = dict(evaluator.stats)
    return TuneResult(best, ranked[:top], mine, input_error, sync, plan, used,
                      used == "enumeration" and not search.timed_out,
                      time.perf_counter() - started, seed, stats,
                      beyond_bound(best.spec, best.period_s,
                                   (lambda spec: _carried(spec, scale)) if scale else None))


def _as_candidate(space: SearchSpace, plan: RankedPlan | None) -> Candidate | None:
    if plan is None:
        return None
    blocks = space.canonical([g["tasks"] for g in plan.groups])
    sizes = {tuple(sorted(g["tasks"])): g["gpus"] for g in plan.groups}
    return Candidate(blocks, tuple(sizes[tuple(sorted(b))] for b in blocks), plan.max_lag,
                     plan.partial_rollout and plan.max_lag >= 1, None, plan.mini_batches)


def _colocated(search: _Search, spec: Spec) -> Candidate | None:
    blocks = (search.space.tasks,)
    sizes = search.fit_sizes(blocks, False, search.space.tps[0])
    return Candidate(blocks, sizes, 0, False, search.space.tps[0]) if sizes else None


def _carried(spec: Spec, scale: dict[str, float]) -> dict[str, float]:
    """Calibrated seconds of the tuned plan's nodes (measured/modelled ratios applied), in the
    form compile_plan takes, so its plan.json agrees with the search."""
    costs, _ = node_costs(spec, build_graph(spec), place(spec), scale=scale)
    return {n: c.seconds for n, c in costs.items() if c.source == "calibrated"}
