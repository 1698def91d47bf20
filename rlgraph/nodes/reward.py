"""`reward`: score responses with a verifier or a user function (verl's compute_score)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlgraph.nodes.base import CostContext, NodeKind, NodeSpec, inputs_from_kinds


class RewardSpec(NodeSpec):
    """`fn: module:function` or `path/to/file.py:function`; default: the task's verifier."""

    kind: Literal["reward"] = "reward"
    fn: str | None = Field(default=None, description="module:function or file.py:function")
    workers: int = Field(default=1, ge=1, description="CPU processes scoring in parallel")


def reward_cost(node: NodeSpec, ctx: CostContext) -> float:
    """A rule-based verifier: about 50 microseconds per sample on one CPU core."""
    data = ctx.spec.data
    return 50e-6 * data.prompts_per_step * data.samples_per_prompt / node.workers


KIND = NodeKind(
    name="reward",
    spec=RewardSpec,
    cost=reward_cost,
    uses_gpu=False,
    default_edges=inputs_from_kinds("generate"),
    doc="score responses",
)
