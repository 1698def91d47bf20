"""Partial rollout beyond the user's lag bound: priced and reported by `rlgraph tune`, never
adopted (tokens of several versions in a sample and the lag bound are the user's choice)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlgraph.compiler import compile_plan
from rlgraph.config.schema import Spec

BEYOND_LAGS = (1, 2, 3)  # max_lag values tried beyond the user's bound (partial rollout)
BEYOND_GAIN = 1.1  # reported only when it beats the best plan by this much


def beyond_bound(spec: Spec, period_s: float,
                 calibrated: Callable[[Spec], dict[str, float]] | None = None
                 ) -> dict[str, Any] | None:
    """The best plan's layout (`spec`, `period_s`) priced with partial rollout at the lags of
    BEYOND_LAGS the user has not allowed; the fastest, when it beats the plan by BEYOND_GAIN
    (a long tail the synchronous batch waits for), else None. `calibrated`: the measured
    seconds to carry to a variant, as the search carries them."""
    schedule = spec.schedule
    if schedule.stream is not None:
        return None
    found: dict[str, Any] | None = None
    for lag in BEYOND_LAGS:
        if schedule.partial_rollout and lag <= schedule.max_lag:
            continue
        variant = spec.model_copy(update={"schedule": schedule.model_copy(
            update={"max_lag": lag, "partial_rollout": True})})
        plan = compile_plan(variant, calibrated(variant) if calibrated else None)
        period = plan.schedule.period_s
        if found is None or period < found["period_s"] * (1 - 1e-9):
            found = {"max_lag": lag, "partial_rollout": True, "period_s": period,
                     "speedup_vs_best": period_s / period if period > 0 else 1.0}
    return found if found and found["speedup_vs_best"] >= BEYOND_GAIN else None
