"""The `env:` block of a generate node: which environment, how many turns, how long a step
may take, how many env actors, and what the compiler assumes when it prices the turns.

Keys this module does not know are the environment's own configuration: they are passed to
the environment's constructor (`Env(**config)`), as the Env contract says. No torch, no ray.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlgraph.limits import MAX_COUNT, MAX_PARALLEL, MAX_SECONDS, MAX_TOKENS

MAX_TURNS = 10_000


class EnvSpec(BaseModel):
    """`env: {fn, max_turns, timeout_s, workers, ...}` of a generate node (multi-turn rollout)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)

    fn: str = Field(description="a built-in environment (calculator, guess_number, delay) or "
                    "a user class, module:Class or file.py:Class (files need --trust-code)")
    max_turns: int = Field(default=4, ge=1, le=MAX_TURNS,
                           description="model turns a trajectory may take at most")
    timeout_s: float = Field(default=30.0, gt=0, le=MAX_SECONDS,
                             description="seconds one reset or step may take; a slower call "
                             "ends its trajectory (reason 'timeout')")
    workers: int = Field(default=1, ge=1, le=MAX_PARALLEL,
                         description="env actors (each steps many trajectories on threads)")
    max_observation_tokens: int = Field(
        default=256, ge=1, le=MAX_TOKENS, description="a longer observation ends its "
        "trajectory (reason 'observation too long')")
    turns: float | None = Field(default=None, ge=1, le=MAX_TURNS,
                                description="pricing: mean model turns per trajectory "
                                "(default max_turns)")
    observation_len: float = Field(default=8.0, ge=0, le=MAX_TOKENS,
                                   description="pricing: mean tokens of one observation")
    latency_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS,
                             description="pricing: mean seconds of one env step (0: "
                             "`rlgraph compile --calibrate RUN_DIR` takes the run's measured "
                             "one)")
    threads: int = Field(default=32, ge=1, le=MAX_COUNT,
                         description="trajectories one env actor steps at a time")

    @field_validator("fn")
    @classmethod
    def _named(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("name a built-in environment or module:Class / file.py:Class")
        return value

    def config(self) -> dict[str, Any]:
        """The environment's own keys: everything in the block this spec does not know."""
        return dict(self.model_extra or {})

    def mean_turns(self) -> float:
        """Model turns per trajectory the compiler prices (`turns`, else `max_turns`)."""
        return float(min(self.turns or self.max_turns, self.max_turns))
