"""The response-length distribution (`data.response_len`), one type for every reader: the
built-in tasks and the benchmarks draw lengths from it, the cost models read its statistics
(the clipped mean, E[L^2] for KV reads, the survival curve, the expected longest of n samples).

`LengthModel` is lognormal (mean `mean`, std of log length `sigma`) or pareto (tail index
`alpha`), clipped at `max`, whose mass above max sits on max as max_response_length truncates
it. It is sampled two ways, each written once:

- `LengthModel.draw(rng)`: one random length from a `random.Random` (the longtail task's
  targets, generate's forced lengths, the delay environment's turns, the benchmarks);
- `LengthModel.length_at(u)`: the length at quantile `u` (the cost model's rollout
  simulation draws `u` itself; `quantile` is the same curve unrounded, which the moments
  integrate).

Pure math (no numpy), cached.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from functools import lru_cache
from statistics import NormalDist

GRID = 400  # quantile points of the moments and survival integrals
_STANDARD_NORMAL = NormalDist()


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

    def per_turn(self, turns: float) -> LengthModel:
        """The length of one turn of a multi-turn trajectory whose whole response follows
        this model over `turns` turns on average: mean and max divided by them (at least 1)."""
        return replace(self, mean=max(1.0, self.mean / turns), max=max(1.0, self.max / turns))

    def quantile(self, u: float) -> float:
        """The x with P(L <= x) = u, unrounded, clipped at max (u is kept inside (0, 1))."""
        if self.dist == "pareto":
            low = self.mean * (self.alpha - 1) / self.alpha
            x = low / max(1e-12, 1.0 - u) ** (1 / self.alpha)
        else:
            mu = math.log(self.mean) - self.sigma ** 2 / 2
            x = math.exp(mu + self.sigma * _STANDARD_NORMAL.inv_cdf(min(max(u, 1e-12),
                                                                         1 - 1e-12)))
        return min(self.max, x)

    def length_at(self, u: float) -> int:
        """The whole length at quantile u: `quantile(u)` rounded, at least 1 (max where the
        mean is max: a fixed length)."""
        if self.mean >= self.max:
            return int(self.max)
        return int(min(self.max, max(1, round(self.quantile(u)))))

    def draw(self, rng: random.Random, limit: float = math.inf) -> int:
        """One random length drawn with `rng`, rounded and clipped to [1, max] and to `limit`
        (the longtail task's notation spells at most `presets.tasks.LONGTAIL_MAX`)."""
        if self.dist == "pareto":
            low = self.mean * (self.alpha - 1) / self.alpha
            value = low / (1.0 - rng.random()) ** (1 / self.alpha)
        else:
            mu = math.log(self.mean) - self.sigma ** 2 / 2
            value = rng.lognormvariate(mu, self.sigma)
        return int(max(1, min(round(value), self.max, limit)))


def of(response_len: object) -> LengthModel:
    """The LengthModel of a spec's `data.response_len` (`config.schema.ResponseLength`)."""
    r = response_len
    return LengthModel(float(r.mean), float(r.max), str(getattr(r, "dist", "lognormal")),
                       float(getattr(r, "sigma", 1.0)), float(getattr(r, "alpha", 1.5)))


@lru_cache(maxsize=4096)
def moments(m: LengthModel) -> tuple[float, float]:
    """(E[L], E[L^2]) of the clipped distribution."""
    if m.mean >= m.max:  # a fixed length
        return m.max, m.max ** 2
    values = [max(1.0, m.quantile((i + 0.5) / GRID)) for i in range(GRID)]
    return sum(values) / GRID, sum(v * v for v in values) / GRID


def mean_before_cap(clipped_mean: float, m: LengthModel) -> float | None:
    """The mean before the cap whose distribution, clipped at `m.max` with `m`'s shape, has
    mean `clipped_mean` (the mean a run reports), by bisection; None where none reaches it
    (at a pre-cap mean of max, the clipped mean is the largest this shape gives)."""
    if clipped_mean >= m.max:
        return m.max
    low, high = max(1.0, clipped_mean), m.max
    if moments(replace(m, mean=high * (1 - 1e-9)))[0] < clipped_mean:
        return None
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if moments(replace(m, mean=mid))[0] < clipped_mean else (low, mid)
    return (low + high) / 2


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
    xs = sorted((m.max if m.mean >= m.max else max(1.0, m.quantile((i + 0.5) / points))
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
