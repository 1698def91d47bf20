"""Helpers shared by tests: small specs and a micro model (no Ray), the cost tests' 7B graph,
and the schedule invariant every timeline keeps."""

from __future__ import annotations

import itertools
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


COST_NODES = {"generate": {}, "reward": {}, "logp": {}, "train": {}, "param_update": {}}


def cost_spec(groups: dict[str, Any] | None = None, nodes: dict[str, Any] | None = None,
              **top: Any) -> Spec:
    """A qwen2.5-7b graph on 8 H100s (trainer and rollout halves) with these parts changed."""
    data = {
        "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "H100"},
        "model": {"preset": "qwen2.5-7b"},
        "data": {"prompts_per_step": 32, "samples_per_prompt": 4, "prompt_len": 256,
                 "response_len": {"mean": 512, "max": 512}},
        "groups": groups or {"trainer": {"share": 0.5, "tasks": ["logp", "train"]},
                             "rollout": {"share": 0.5, "tasks": ["generate"]}},
        "nodes": nodes or dict(COST_NODES),
        **top,
    }
    return validate_spec(data, SourceMap())


def costs_of(spec: Spec) -> dict[str, Any]:
    """The compiler's node costs of a spec."""
    from rlgraph.compiler.costs import node_costs
    from rlgraph.compiler.placement import place
    from rlgraph.graph import build_graph

    return node_costs(spec, build_graph(spec), place(spec))[0]


def assert_groups_never_overlap(events: list[dict[str, Any]]) -> None:
    """No two timeline events that occupy one group overlap in time."""
    lanes: dict[str, list] = {}
    for e in events:
        for g in e["occupies"]:
            lanes.setdefault(g, []).append((e["start"], e["end"]))
    for spans in lanes.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end - 1e-9, "two tasks of one group overlap"
