"""What the algorithm adds to a step's sampling: DAPO's dynamic sampling draws more prompt
batches (`DynamicSamplingSpec.expected_draws`: 1 / the chance a group's rewards differ, at
most `max_draws`), and ReMax decodes a greedy response per prompt beside the batch. Both
scale generate's price here and reward's in `pricing.reward`."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rlgraph.pricing.context import CostContext
from rlgraph.pricing.generate import generate_cost

if TYPE_CHECKING:
    from rlgraph.nodes.base import NodeSpec


def expected_draws(spec: object) -> float:
    """Prompt batches generate is expected to draw per step under the graph's algorithm."""
    algo, data = spec.algorithm, spec.data  # type: ignore[attr-defined]
    return algo.dynamic_sampling.expected_draws(data.samples_per_prompt)


def algorithm_generate_cost(node: NodeSpec, ctx: CostContext) -> float:
    """`generate_cost` times the expected draws, plus ReMax's greedy baseline: a second
    decode of one sequence per prompt, priced by the same model."""
    seconds = generate_cost(node, ctx)
    draws = expected_draws(ctx.spec)
    detail = ctx.extra.get("detail", "")
    if draws != 1.0:
        seconds *= draws
        detail += f"; x {draws:.3g} expected draws (dynamic sampling)"
    if ctx.spec.algorithm.advantage == "greedy_baseline":
        data = ctx.spec.data
        one = ctx.spec.model_copy(update={"data": data.model_copy(  # type: ignore[attr-defined]
            update={"samples_per_prompt": 1})})
        greedy = generate_cost(node, dataclasses.replace(ctx, spec=one, extra=dict(ctx.extra)))
        seconds += greedy * draws
        detail += f"; + ReMax greedy baseline {greedy:.3g} s"
    ctx.extra["detail"] = detail
    return seconds
