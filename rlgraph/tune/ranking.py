"""What `rlgraph tune` ranks: one ranked plan (`RankedPlan`), the leaderboard that keeps the best
plan of each layout, and the search's result (`TuneResult`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rlgraph.compiler.plan import Plan as CompiledPlan
from rlgraph.config.schema import Spec
from rlgraph.tune.space import Candidate


@dataclass
class RankedPlan:
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
    mini_batches: int | None = None  # streaming's mini-batches per version (None: none)
    inflight: bool = False  # generate's in-flight weight updates

    def key(self) -> tuple:
        """Rank: period, then lag, idle GPUs, partial off, the user's plan, fewer groups,
        fewer mini-batches, in-flight updates off."""
        return (float(f"{self.period_s:.9g}"), self.max_lag, round(self.idle_gpus, 6),
                self.partial_rollout, self.origin != "input", len(self.groups),
                self.mini_batches or 0, self.inflight,
                [(g["name"], g["gpus"]) for g in self.groups])

    def layout(self) -> tuple:
        """Plans with equal layout differ in lag only; the ranking keeps the best of them."""
        return (tuple((*sorted(g["tasks"]), g["gpus"]) for g in self.groups),
                self.partial_rollout, self.tp, self.inflight)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (for --json consumers and the benchmark)."""
        return {"groups": self.groups, "max_lag": self.max_lag,
                "partial_rollout": self.partial_rollout, "tp": self.tp,
                "mini_batches": self.mini_batches, "inflight": self.inflight,
                "period_s": self.period_s, "bound_s": self.bound_s,
                "idle_gpus": self.idle_gpus, "bottleneck": self.bottleneck,
                "origin": self.origin}


@dataclass
class TuneResult:
    """The best plan (and its compiled plan), the top plans, and how the search went."""

    best: RankedPlan
    top: list[RankedPlan]
    input: RankedPlan | None
    input_error: str | None
    sync_period_s: float
    plan: CompiledPlan
    method: str  # "enumeration" | "local search"
    exact: bool
    seconds: float
    seed: int
    stats: dict[str, int] = field(default_factory=dict)
    # the best plan with partial rollout at a max_lag beyond the user's bound (not adopted)
    beyond_bound: dict[str, Any] | None = None

    def speedup_vs_input(self, plan: RankedPlan) -> float | None:
        """The user's period over this plan's (None when the user's plan is refused)."""
        return self.input.period_s / plan.period_s if self.input and plan.period_s > 0 \
            else None

    def speedup_vs_sync(self, plan: RankedPlan) -> float:
        """The colocated synchronous period over this plan's."""
        return self.sync_period_s / plan.period_s if plan.period_s > 0 else 1.0

    def to_dict(self) -> dict[str, Any]:
        """Summary without the plan dict."""
        return {"best": self.best.to_dict(), "top": [p.to_dict() for p in self.top],
                "input": self.input.to_dict() if self.input else None,
                "input_error": self.input_error, "sync_period_s": self.sync_period_s,
                "method": self.method, "exact": self.exact, "seconds": self.seconds,
                "seed": self.seed, "stats": self.stats, "beyond_bound": self.beyond_bound}


class Leaderboard:
    """The best plan of each layout, and the K best layouts' cutoff period."""

    def __init__(self, size: int):
        self.size = max(1, size)
        self.by_layout: dict[tuple, RankedPlan] = {}

    def offer(self, plan: RankedPlan) -> None:
        """Keep the plan if it is the best of its layout."""
        old = self.by_layout.get(plan.layout())
        if old is None or plan.key() < old.key():
            self.by_layout[plan.layout()] = plan

    def ranked(self) -> list[RankedPlan]:
        """All kept plans, best first."""
        return sorted(self.by_layout.values(), key=RankedPlan.key)

    def cutoff(self) -> float:
        """Period of the K-th best layout (infinite while fewer are known)."""
        ranked = self.ranked()
        return ranked[self.size - 1].period_s if len(ranked) >= self.size else math.inf
