"""`rlgraph tune`: search groups, GPUs per group, max_lag, partial rollout and generate tp
for the shortest steady-state period the compiler predicts.

Objective: least `period_s` among plans the placement pass accepts (memory fit, divisibility)
with max_lag at most the user's; ties (equal to 9 significant digits) go to the smaller lag,
then to fewer idle GPUs, then partial rollout off, then the user's own plan, then fewer
groups. The user's plan is always a candidate, so the result is never worse than it.

Method (the space is `search_space.SearchSpace`):

- enumeration, when the space has at most `ENUMERATION_LIMIT` candidates: every candidate
  gets a cheap lower bound from per-group cost tables; candidates are taken best bound first
  and evaluated exactly (placement, costs, the exact bound, then the simulation only if the
  bound can still beat the K-th best plan); the search stops when the next lower bound
  exceeds the K-th best period. This is exact: every skipped plan is provably no better.
- local search, for larger spaces: hill climbing from the user's plan, the colocated plan and
  seeded random partitions (GPUs water-filled to the most loaded group), over moves of one
  task between groups, GPUs between two groups, lag, partial rollout and tp; neighbours whose
  lower bound cannot beat the current plan are never simulated. Deterministic for a seed.

Both stop at `time_budget_s` (the result then says it is not exact).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import Any

from rlgraph.compiler import compile_plan, describe_bottleneck, sync_spec
from rlgraph.compiler.calibrate import as_calibration
from rlgraph.compiler.cost import calibration_scale, node_costs
from rlgraph.compiler.lag import prove_lag
from rlgraph.compiler.placement import place
from rlgraph.compiler.schedule import steady_state, utilization
from rlgraph.compiler.search_space import (
    PRUNE_TOLERANCE,
    Candidate,
    Evaluation,
    Evaluator,
    SearchSpace,
)
from rlgraph.compiler.timed import timed_graph
from rlgraph.errors import SpecError
from rlgraph.graph import build_graph
from rlgraph.spec import Spec

ENUMERATION_LIMIT = 400_000  # candidates (layouts x lags) enumerated exactly
TIME_BUDGET_S = 60.0
RESTARTS = 24  # local search: random restarts after the input and the colocated plan


@dataclass
class Plan:
    """One ranked plan: its groups, lag, period and what bounds it."""

    groups: list[dict[str, Any]]  # [{name, tasks, gpus}]
    max_lag: int
    partial_rollout: bool
    tp: int | None
    period_s: float
    bound_s: float
    idle_gpus: float
    bottleneck: str
    spec: Spec
    origin: str = "search"  # "input" for the user's own plan
    candidate: Candidate | None = None

    def key(self) -> tuple:
        """Rank: period, then lag, idle GPUs, partial off, the user's plan, fewer groups."""
        return (float(f"{self.period_s:.9g}"), self.max_lag, round(self.idle_gpus, 6),
                self.partial_rollout, self.origin != "input", len(self.groups),
                [(g["name"], g["gpus"]) for g in self.groups])

    def layout(self) -> tuple:
        """Plans with equal layout differ in lag only; the ranking keeps the best of them."""
        return (tuple((*sorted(g["tasks"]), g["gpus"]) for g in self.groups),
                self.partial_rollout, self.tp)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (for --json consumers and the benchmark)."""
        return {"groups": self.groups, "max_lag": self.max_lag,
                "partial_rollout": self.partial_rollout, "tp": self.tp,
                "period_s": self.period_s, "bound_s": self.bound_s,
                "idle_gpus": self.idle_gpus, "bottleneck": self.bottleneck,
                "origin": self.origin}


@dataclass
class TuneResult:
    """The best plan (and its compile_plan dict), the top plans, and how the search went."""

    best: Plan
    top: list[Plan]
    input: Plan | None
    input_error: str | None
    sync_period_s: float
    plan: dict[str, Any]
    method: str  # "enumeration" | "local search"
    exact: bool
    seconds: float
    seed: int
    stats: dict[str, int] = field(default_factory=dict)

    def speedup_vs_input(self, plan: Plan) -> float | None:
        """The user's period over this plan's (None when the user's plan is refused)."""
        return self.input.period_s / plan.period_s if self.input and plan.period_s > 0 \
            else None

    def speedup_vs_sync(self, plan: Plan) -> float:
        """The colocated synchronous period over this plan's."""
        return self.sync_period_s / plan.period_s if plan.period_s > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        """Summary without the plan dict."""
        return {"best": self.best.to_dict(), "top": [p.to_dict() for p in self.top],
                "input": self.input.to_dict() if self.input else None,
                "input_error": self.input_error, "sync_period_s": self.sync_period_s,
                "method": self.method, "exact": self.exact, "seconds": self.seconds,
                "seed": self.seed, "stats": self.stats}


class Leaderboard:
    """The best plan of each layout, and the K best layouts' cutoff period."""

    def __init__(self, size: int):
        self.size = max(1, size)
        self.by_layout: dict[tuple, Plan] = {}

    def offer(self, plan: Plan) -> None:
        """Keep the plan if it is the best of its layout."""
        old = self.by_layout.get(plan.layout())
        if old is None or plan.key() < old.key():
            self.by_layout[plan.layout()] = plan

    def ranked(self) -> list[Plan]:
        """All kept plans, best first."""
        return sorted(self.by_layout.values(), key=Plan.key)

    def cutoff(self) -> float:
        """Period of the K-th best layout (infinite while fewer are known)."""
        ranked = self.ranked()
        return ranked[self.size - 1].period_s if len(ranked) >= self.size else math.inf

    def best_period(self) -> float:
        """The best period known."""
        ranked = self.ranked()
        return ranked[0].period_s if ranked else math.inf


def _plan_of(ev: Evaluation, space: SearchSpace) -> Plan:
    cand, tg, bound = ev.candidate, ev.tg, ev.bound
    assert tg is not None and bound is not None and ev.period_s is not None and ev.spec
    groups = [{"name": n, "tasks": list(b), "gpus": s}
              for n, b, s in zip(space.names(cand.blocks), cand.blocks, cand.sizes)]
    util = utilization(tg, ev.period_s)
    return Plan(groups, cand.max_lag, cand.partial_rollout, cand.tp, ev.period_s, ev.bound_s,
                ev.idle_gpus, describe_bottleneck(tg, bound, ev.period_s, util), ev.spec,
                candidate=cand)


def _input_plan(spec: Spec, measured: dict[str, float] | None
                ) -> tuple[Plan | None, str | None, dict[str, Any] | None]:
    """The user's own plan as compile_plan sees it, or why the placement pass refuses it."""
    try:
        plan = compile_plan(spec, measured)
    except SpecError as err:
        err.source = err.source or spec.source
        return None, err.render(), None
    sched = plan["schedule"]
    groups = [{"name": g["name"], "tasks": list(g["tasks"]), "gpus": g["gpus"]}
              for g in plan["placement"]["groups"]]
    busy = sum(g["gpus"] * sched["utilization"].get(g["name"], 0.0) for g in groups)
    return Plan(groups, spec.schedule.max_lag, spec.schedule.partial_rollout, None,
                sched["period_s"], sched["bound_s"],
                max(0.0, plan["placement"]["slots"] - busy), sched["bottleneck"], spec,
                origin="input"), None, plan


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
        self.enumerated = 0
        self.timed_out = False

    def late(self) -> bool:
        """True (and remembered) once the time budget is spent."""
        if time.perf_counter() > self.deadline:
            self.timed_out = True
        return self.timed_out

    def try_candidate(self, cand: Candidate, cutoff: float) -> Plan | None:
        """Evaluate exactly (simulating only if the bound beats cutoff); rank if feasible."""
        ev = self.ev.evaluate(cand, cutoff)
        if not ev.feasible:
            return None
        plan = _plan_of(ev, self.space)
        self.board.offer(plan)
        return plan

    def entries(self) -> list[tuple[float, int, int, Candidate]] | None:
        """(lower bound, lag, order, candidate) of the whole space; None past the limit."""
        out = []
        for blocks in self.space.partitions():
            for tp in self.space.tps:
                valid = [self.ev.valid_sizes(b, tp) for b in blocks]
                for sizes in self.space.size_vectors(valid):
                    for partial in self.space.partials:
                        load, path = self.ev.lower_bound(blocks, sizes, partial, tp)
                        for lag in self.space.lags_for(partial):
                            cand = Candidate(blocks, sizes, lag, partial, tp)
                            out.append((max(load, path / (lag + 1)), lag, len(out), cand))
                    if len(out) > ENUMERATION_LIMIT or self.late():
                        return None
        self.enumerated = len(out)
        return sorted(out, key=lambda e: e[:3])

    def enumerate(self, entries: list[tuple[float, int, int, Candidate]]) -> None:
        """Best lower bound first; stop when no remaining candidate can enter the top K."""
        for lower, _, _, cand in entries:
            cutoff = self.board.cutoff()
            if lower > cutoff * (1 + PRUNE_TOLERANCE) or self.late():
                break
            self.try_candidate(cand, cutoff)

    # ------------------------------------------------------------ local search

    def fit_sizes(self, blocks: tuple, partial: bool, tp: int | None) -> tuple[int, ...] | None:
        """Water-filling: smallest accepted sizes, then grow the most loaded group that can."""
        valid = [self.ev.valid_sizes(b, tp) for b in blocks]
        if any(not v for v in valid):
            return None
        sizes = [v[0] for v in valid]
        if not self.space.packs(sizes):
            return None
        while True:
            loads = [sum(self.ev.table(b, s, partial, tp).get(t, 0.0) for t in b)
                     for b, s in zip(blocks, sizes)]
            for i in sorted(range(len(blocks)), key=lambda i: -loads[i]):
                bigger = next((v for v in valid[i] if v > sizes[i]), None)
                if bigger is not None and self.space.packs([*sizes[:i], bigger,
                                                            *sizes[i + 1:]]):
                    sizes[i] = bigger
                    break
            else:
                return tuple(sizes)

    def neighbours(self, cand: Candidate, rng: random.Random) -> list[Candidate]:
        """Moves: lag, partial, tp, GPUs between two groups, a task to another group."""
        space, out = self.space, []
        for lag in space.lags_for(cand.partial_rollout):
            out.append(replace(cand, max_lag=lag))
        for partial in space.partials:
            if partial != cand.partial_rollout:
                lag = max(cand.max_lag, 1) if partial else cand.max_lag
                out.append(replace(cand, partial_rollout=partial, max_lag=lag))
        for tp in space.tps:
            sizes = self.fit_sizes(cand.blocks, cand.partial_rollout, tp)
            if tp != cand.tp and sizes:
                out.append(replace(cand, tp=tp, sizes=sizes))
        valid = [self.ev.valid_sizes(b, cand.tp) for b in cand.blocks]
        for i in range(len(cand.blocks)):
            for j in range(len(cand.blocks)):
                bigger = next((v for v in valid[i] if v > cand.sizes[i]), None)
                if i == j or bigger is None:
                    continue
                for smaller in sorted((v for v in valid[j] if v < cand.sizes[j]), reverse=True):
                    sizes = list(cand.sizes)
                    sizes[i], sizes[j] = bigger, smaller
                    if space.packs(sizes):
                        out.append(replace(cand, sizes=tuple(sizes)))
                        break
        blocks = [list(b) for b in cand.blocks]
        for i, block in enumerate(blocks):
            for task in block:
                for j in [*range(len(blocks)), len(blocks)]:
                    if j == i:
                        continue
                    moved = [[t for t in b if t != task] for b in blocks] + [[]]
                    moved[j].append(task)
                    part = space.canonical([b for b in moved if b])
                    sizes = self.fit_sizes(part, cand.partial_rollout, cand.tp)
                    if sizes:
                        out.append(replace(cand, blocks=part, sizes=sizes))
        rng.shuffle(out)
        return out

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
         time_budget_s: float = TIME_BUDGET_S, tp_choices: list[int] | None = None,
         method: str = "auto") -> TuneResult:
    """Search the plan space of `spec` (see the module docstring) and rank the best plans.

    `calibration`: as for `compile_plan` (seconds per node, measured events or a trace path);
    measured/modelled ratios at the user's placement carry over to every candidate.
    `method`: "auto" (enumerate when small), "enumeration" or "local search"."""
    started = time.perf_counter()
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
    mine, input_error, input_dict = _input_plan(spec, measured)
    if mine is not None:
        board.offer(mine)
    sync = input_dict["schedule"]["sync_period_s"] if input_dict else _sync_period(spec, scale)
    search = _Search(space, evaluator, board, started + time_budget_s)
    entries = search.entries() if method != "local search" else None
    if entries is not None:
        used = "enumeration"
        search.enumerate(entries)
    elif method == "enumeration":
        raise ValueError(f"the space has more than {ENUMERATION_LIMIT} candidates")
    else:
        used = "local search"
        starts = [c for c in (_as_candidate(space, mine), _colocated(search, spec)) if c]
        search.local_search(starts, seed)
    ranked = board.ranked()
    if not ranked:
        raise SpecError("no plan fits this cluster: every grouping is refused by the placement "
                        "checks", ("cluster",), hint=input_error or "add GPUs or a smaller model")
    best = ranked[0]
    plan = input_dict if best.origin == "input" and input_dict else compile_plan(
        best.spec, _carried(best.spec, scale) if scale else None)
    stats = {"enumerated": search.enumerated, **evaluator.stats}
    return TuneResult(best, ranked[:top], mine, input_error, sync, plan, used,
                      used == "enumeration" and not search.timed_out,
                      time.perf_counter() - started, seed, stats)


def _as_candidate(space: SearchSpace, plan: Plan | None) -> Candidate | None:
    if plan is None:
        return None
    blocks = space.canonical([g["tasks"] for g in plan.groups])
    sizes = {tuple(sorted(g["tasks"])): g["gpus"] for g in plan.groups}
    return Candidate(blocks, tuple(sizes[tuple(sorted(b))] for b in blocks), plan.max_lag,
                     plan.partial_rollout and plan.max_lag >= 1, None)


def _colocated(search: _Search, spec: Spec) -> Candidate | None:
    blocks = (search.space.tasks,)
    sizes = search.fit_sizes(blocks, False, search.space.tps[0])
    return Candidate(blocks, sizes, 0, False, search.space.tps[0]) if sizes else None


def _carried(spec: Spec, scale: dict[str, float]) -> dict[str, float]:
    """Calibrated seconds of the tuned plan's nodes (measured/modelled ratios applied), in the
    form compile_plan takes, so its plan.json agrees with the search."""
    costs, _ = node_costs(spec, build_graph(spec), place(spec), scale=scale)
    return {n: c.seconds for n, c in costs.items() if c.source == "calibrated"}


def tune_main(args: argparse.Namespace) -> int:
    """`rlgraph tune graph.yaml [key=value ...] [-o tuned.yaml] [--json] [--top K] [--seed S]
    [--calibrate RUN_DIR] [--tp 1,2,4]` (the CLI and its output: `search_cli.py`)."""
    from rlgraph.compiler.search_cli import run_tune

    return run_tune(args)
