"""Benchmark mode: every knob that exists for `bench/` and not for users, in one place.

Two kinds of knob live here, and product code reaches them only through this module:

- **forced lengths** (graph.yaml `nodes.<generate>.forced_lengths: true`): each sample's
  response length (`forced_length`), and each turn's of a multi-turn node
  (`forced_turn_length`), is drawn from `data.response_len` seeded by its data position and
  sample (or trajectory and turn), and eos is ignored until it, as serving benchmarks do: a
  random-init model stops anywhere, so without it two schedules would decode different work.
  The rollout cache, the environments' rollout and generate's engines take the length as a
  budget; `engine: sglang` refuses the mode.
- **engine probes** (`EngineKnobs`): the static decoder's settings that only its benchmarks
  choose (attention kernel, fused projections, CUDA graphs off, the smallest slot width, a
  per-call trace); the runtime builds every engine with the defaults.

Pure Python (no torch): the compiler's side may import it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from rlgraph.lengths import of


def forced_length(seed: int, position: int, sample: int, response_len: Any) -> int:
    """The response length forced on sample `sample` of the prompt at data position
    `position`: drawn from `response_len` (the spec's `data.response_len`), seeded by (seed,
    position, sample), so every schedule decodes the same work for a prompt."""
    return of(response_len).draw(random.Random(f"{seed}:forced:{position}:{sample}"))


def forced_turn_length(seed: int, key: str, turn: int, response_len: Any, turns: float) -> int:
    """The length forced on turn `turn` of trajectory `key`: drawn from `response_len` divided
    by the mean turns (seeded by seed, key and turn), so every schedule decodes the same work
    for a trajectory."""
    return of(response_len).per_turn(turns).draw(random.Random(f"{seed}:turn:{key}:{turn}"))


@dataclass(frozen=True)
class EngineKnobs:
    """The static decoder's benchmark-only settings (`engines.static_decode.StaticDecoder`'s
    `bench`); the defaults are what the runtime runs."""

    attention_kind: str = "auto"  # "auto" | "sdpa" | "matmul" | "varlen" (module docstring)
    fuse: bool = False  # fuse q/k/v and gate/up projections (engines.fusion)
    cuda_graphs: bool | None = None  # None: on for CUDA devices
    min_width: int = 16  # the narrowest attention width compaction may pick
    trace: bool = False  # keep one record per decode call (live rows, width, steps, ms)
