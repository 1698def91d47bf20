"""Helpers shared by the RL-core tests: small specs and a micro model (no Ray)."""

from __future__ import annotations

from typing import Any

from rlgraph.config.load import validate_spec
from rlgraph.config.schema import Spec
from rlgraph.errors import SourceMap

# A micro Llama: fast enough for unit tests, real enough to exercise cache and masks.
MICRO = dict(model_type="llama", vocab_size=64, hidden_size=32, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
             max_position_embeddings=64, tie_word_embeddings=True)


def make_spec(model: dict[str, Any] | None = None, data: dict[str, Any] | None = None,
              algorithm: dict[str, Any] | None = None, train: dict[str, Any] | None = None,
              generate: dict[str, Any] | None = None, reward: dict[str, Any] | None = None,
              extra_nodes: dict[str, Any] | None = None, max_lag: int = 1,
              steps: int = 10) -> Spec:
    """A two-group graph (generate | train) with overridable sections."""
    nodes = {"generate": generate or {}, "reward": reward or {}, "train": train or {},
             "param_update": {}, **(extra_nodes or {})}
    raw = {
        "name": "rl-test",
        "cluster": {"local": True, "cpus": 2},
        "model": model or {"hf_config": dict(MICRO)},
        "data": {"task": "arithmetic", "prompts_per_step": 4, "samples_per_prompt": 4,
                 "prompt_len": 16, "response_len": {"mean": 3, "max": 4}, **(data or {})},
        "algorithm": algorithm or {},
        "groups": {"trainer": {"share": 0.5, "tasks": [n for n in nodes
                                                       if n not in ("generate", "reward",
                                                                    "param_update")]},
                   "rollout": {"share": 0.5, "tasks": ["generate"]}},
        "nodes": nodes,
        "schedule": {"max_lag": max_lag, "steps": steps},
    }
    return validate_spec(raw, SourceMap())
