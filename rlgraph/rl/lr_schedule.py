"""Learning-rate schedules by optimizer version: warmup, then constant, cosine or linear decay.

`lr_at(lr, version, total, warmup, kind, min_ratio)` is a pure function, so a resumed run
takes exactly the rate the uninterrupted one would have. The shapes follow verl's
(`verl/utils/torch_functional.py`: `get_constant_schedule_with_warmup`,
`get_cosine_schedule_with_warmup` with half a cosine cycle and `min_lr_ratio`): a linear warmup
over `warmup` versions, then the decay over the rest of the run down to `min_ratio * lr`.
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine", "linear")


def lr_at(lr: float, version: int, total: int, warmup: int = 0, kind: str = "constant",
          min_ratio: float = 0.0) -> float:
    """The rate of the update that makes version `version + 1` of a `total`-version run."""
    if version < warmup:
        return lr * (version + 1) / (warmup + 1)
    if kind == "constant":
        return lr
    span = max(1, total - warmup)
    progress = min(1.0, (version - warmup) / span)
    if kind == "cosine":
        coef = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif kind == "linear":
        coef = 1.0 - progress
    else:
        raise ValueError(f"unknown lr schedule {kind!r} ({', '.join(SCHEDULES)})")
    return lr * (min_ratio + (1.0 - min_ratio) * coef)
