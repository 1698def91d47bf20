"""The built-in guessing game: find a hidden number from `higher` / `lower` replies.

The hidden number is drawn from the trajectory's sample (seeded by its uid, so a resumed or
replayed trajectory sees the same game). Each turn the policy writes a number; the reply is
`higher`, `lower` or `correct`. A correct guess earns 1 and ends the game; a turn that is not
a number is answered `number?` and counts as a failed tool call.
"""

from __future__ import annotations

import random
import re
from typing import Any

_NUMBER = re.compile(r"-?\d+")


class GuessNumberEnv:
    """Guess a number in [low, high] (`low`, `high` keys of the env block; default 1..100)."""

    stop = ("\n",)

    def __init__(self, low: int = 1, high: int = 100, **config: Any):
        if config:
            raise TypeError(f"guess_number takes low and high, got {sorted(config)}")
        if not isinstance(low, int) or not isinstance(high, int) or low > high:
            raise TypeError(f"guess_number needs integers low <= high, got {low!r}, {high!r}")
        self.low, self.high, self.target = low, high, low

    def reset(self, prompt: str, sample: dict) -> str:
        """Draw the hidden number (seeded by the sample's uid) and state the range."""
        self.target = random.Random(f"guess:{sample.get('uid', prompt)}").randint(
            self.low, self.high)
        return f" guess {self.low}..{self.high}:\n"

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Compare the guess with the hidden number."""
        found = _NUMBER.findall(action)
        if not found:
            return "number?\n", 0.0, False, {"tool_call": False}
        guess = int(found[-1])
        if guess == self.target:
            return "correct\n", 1.0, True, {"tool_call": True}
        return ("higher\n" if guess < self.target else "lower\n"), 0.0, False, {"tool_call": True}

    def demonstration(self, prompt: str, sample: dict) -> list[str] | None:
        """Binary search: the turns an optimal player writes."""
        low, high, turns = self.low, self.high, []
        while low <= high:
            guess = (low + high) // 2
            turns.append(f"{guess}\n")
            if guess == self.target:
                break
            low, high = (guess + 1, high) if guess < self.target else (low, guess - 1)
        return turns
