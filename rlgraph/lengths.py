"""Statistics of the response-length distribution (`data.response_len`) the cost models read:
the clipped mean, E[L^2] (KV reads), the survival curve and the expected longest of n samples.

The distribution is the one `rlgraph.rl.data.draw_length` samples: lognormal (mean `mean`, std
of log length `sigma`) or pareto (tail index `alpha`), clipped at `max`, whose mass above
max sits on max as max_response_length truncates it. Pure math (no numpy), cached.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

GRID = 400  # quantile points of the moments and survival integrals


@dataclass(frozen=True)
class LengthModel:
    """One response-length distribution, as the spec states it."""

    mean: float  # before clipping at max
    max: float
    dist: str = "lognormal"
    sigma: float = 1.0
    alpha: float = 1.5

    def cdf(self, x: float) -> float:
        """P(L <= x) of the clipped distribution (1 at max and beyond)."""
        if x >= self.max:
            return 1.0
        if x <= 0:
            return 0.0
        if self.dist == "pareto":
            low = self.mean * (self.alpha - 1) / self.alpha
            return 0.0 if x < low else 1.0 - (low / x) ** self.alpha
        mu = math.log(self.mean) - self.sigma ** 2 / 2
        return 0.5 * (1.0 + math.erf((math.log(x) - mu) / (self.sigma * math.sqrt(2))))

    def survival(self, x: float) -> float:
        """P(L > x): the fraction of a batch's rows still decoding after x tokens."""
        return 1.0 - self.cdf(x)


def of(response_len: object) -> LengthModel:
    """The LengthModel of a spec's `data.response_len`."""
    r = response_len
    return LengthModel(float(r.mean), float(r.max), str(getattr(r, "dist", "lognormal")),
                       float(getattr(r, "sigma", 1.0)), float(getattr(r, "alpha", 1.5)))


def _quantile(m: LengthModel, u: float) -> float:
    lo, hi = 0.0, m.max
    if m.cdf(hi - 1e-9) < u:
        return m.max
    for _ in range(60):
        mid = (lo + hi) / 2
        if m.cdf(mid) < u:
            lo = mid
        else:
            hi = mid
    return hi


@lru_cache(maxsize=4096)
def moments(m: LengthModel) -> tuple[float, float]:
    """(E[L], E[L^2]) of the clipped distribution."""
    if m.mean >= m.max:  # a fixed length
        return m.max, m.max ** 2
    values = [max(1.0, _quantile(m, (i + 0.5) / GRID)) for i in range(GRID)]
    return sum(values) / GRID, sum(v * v for v in values) / GRID


@lru_cache(maxsize=4096)
def expected_max(m: LengthModel, n: int) -> float:
    """E[max of n lengths] = integral over [0, max] of 1 - F(x)^n (clipped at max)."""
    if n <= 0:
        return 0.0
    if m.mean >= m.max:
        return m.max
    steps = GRID
    width = m.max / steps
    return sum((1.0 - m.cdf((i + 0.5) * width) ** n) * width for i in range(steps))


@lru_cache(maxsize=4096)
def sorted_pass_tokens(m: LengthModel, rows: int, prompt: int, budget: int, block: int
                       ) -> tuple[float, float]:
    """(tokens, sum of squared sequence lengths) of `rows` responses run as the runtime's
    length-sorted passes (`engines.cpu_decode.length_batches`): longest first, each pass
    padded to its longest response rounded up to `block` (at most the longest, `max`), as
    many rows as fit `budget` tokens. The rows are the distribution's quantiles (at most
    GRID points, each standing for rows / points of them)."""
    points = min(rows, GRID)
    weight = rows / points
    xs = sorted((m.max if m.mean >= m.max else max(1.0, _quantile(m, (i + 0.5) / points))
                 for i in range(points)), reverse=True)
    tokens = square = 0.0
    i = 0
    while i < points:
        width = prompt + min(m.max, math.ceil(xs[i] / block) * block)
        taken = min(points - i, max(1, int(budget // width / weight)))
        tokens += taken * weight * width
        square += taken * weight * width * width
        i += taken
    return tokens, square


def expected_max_normal(n: int) -> float:
    """E[max of n standard normals] (Blom's approximation; 0 for n = 1)."""
    if n <= 1:
        return 0.0
    u = (n - 0.375) / (n + 0.25)
    lo, hi = -10.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 0.5 * (1.0 + math.erf(mid / math.sqrt(2))) < u:
            lo = mid
        else:
            hi = mid
    return lo
