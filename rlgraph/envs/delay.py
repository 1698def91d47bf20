"""The built-in latency-injecting environment for benchmarks: every step sleeps `sleep_s`
and answers a fixed observation; a trajectory lasts a forced number of turns, drawn per
trajectory (seeded by its uid) from a long-tailed distribution with mean `rounds` and at most
`rounds_max`, as agentic workloads' turn counts are."""

from __future__ import annotations

import random
import time
from typing import Any

from rlgraph.lengths import LengthModel


class DelayEnv:
    """Sleeps `sleep_s` a step, observes `observation`, ends after the trajectory's forced
    number of turns (lognormal, mean `rounds`, sigma `sigma`, clipped to 1..`rounds_max`)."""

    def __init__(self, sleep_s: float = 0.05, rounds: float = 2.0, rounds_max: int = 8,
                 sigma: float = 1.0, observation: str = "ok\n", **config: Any):
        if config:
            raise TypeError(f"delay takes sleep_s, rounds, rounds_max, sigma, observation; "
                            f"got {sorted(config)}")
        if not 0 <= float(sleep_s) <= 3600 or not 1 <= float(rounds) <= int(rounds_max):
            raise TypeError("delay needs 0 <= sleep_s <= 3600 and 1 <= rounds <= rounds_max")
        self.sleep_s, self.rounds, self.rounds_max = float(sleep_s), float(rounds), int(rounds_max)
        self.sigma, self.observation = float(sigma), str(observation)
        self.left = 1

    def reset(self, prompt: str, sample: dict) -> str:
        """Draw this trajectory's number of turns."""
        rng = random.Random(f"delay:{sample.get('uid', prompt)}")
        turns = LengthModel(mean=self.rounds, max=self.rounds_max, sigma=self.sigma)
        self.left = turns.draw(rng)
        return ""

    def step(self, action: str) -> tuple[str, float, bool]:
        """Sleep, then observe; done after the forced turns."""
        time.sleep(self.sleep_s)
        self.left -= 1
        return self.observation, 0.0, self.left <= 0
