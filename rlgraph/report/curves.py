"""curves.png of a run: reward and lag by train step, drawn from its metrics rows at the end.

The top panel shows `reward/mean` per step with a running mean (and `val/accuracy` where a
validate node measured it); the bottom one `lag/mean` and `lag/max` with the compiler's
proven bound, so a reader sees at a glance whether the policy learned and how stale its
samples were.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def running_mean(values: Sequence[float], window: int) -> list[float]:
    """Mean of the last `window` values at each position (fewer at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def write_curves(path: Path, rows: Sequence[dict[str, Any]], title: str,
                 lag_bound: int | None = None) -> Path | None:
    """Draw the reward and lag curves of `rows` into `path` (PNG); None when no rows."""
    rows = [r for r in rows if "reward/mean" in r]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    reward = [float(r["reward/mean"]) for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1]})
    top.plot(steps, reward, color="#4e79a7", alpha=0.35, lw=1, label="reward/mean")
    top.plot(steps, running_mean(reward, max(1, len(reward) // 10)), color="#4e79a7", lw=2,
             label="running mean")
    val = [(r["step"], r["val/accuracy"]) for r in rows if "val/accuracy" in r]
    if val:
        top.plot(*zip(*val), "o-", color="#59a14f", lw=1.5, ms=4, label="val/accuracy")
    top.set_ylabel("reward")
    top.set_title(title)
    top.grid(alpha=0.3)
    top.legend(loc="best", fontsize=8)
    bottom.plot(steps, [float(r.get("lag/mean", 0.0)) for r in rows], color="#f28e2b",
                label="lag/mean")
    bottom.plot(steps, [float(r.get("lag/max", 0.0)) for r in rows], color="#e15759", lw=1,
                label="lag/max")
    if lag_bound is not None:
        bottom.axhline(lag_bound, color="#9c9c9c", ls="--", lw=1, label=f"bound {lag_bound}")
    bottom.set_xlabel("train step")
    bottom.set_ylabel("policy versions")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
