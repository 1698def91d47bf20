"""Which system a plan prices: verl's hybrid engine (engine sglang keeps its own weights) or
rlgraph's own runtime (engine native decodes with the training weights). Cost models of
several kinds read it."""

from __future__ import annotations

from typing import Any


def hybrid_engine_priced(spec: Any) -> bool:
    """Whether the plan prices verl's hybrid engine rather than rlgraph's own runtime: a
    generate node on engine sglang (on GPUs) holds its own copy of the weights, so a group
    that also trains pays the switch every step (offload, reshard, engine sleep/wake) and
    the synchronous baseline computes old_log_prob. Engine native decodes with the training
    weights themselves: a colocated group pays no switch."""
    if spec.cluster.local:
        return False
    return any(n.kind == "generate" and n.engine == "sglang" for n in spec.nodes.values())


PRICING = {
    True: ("verl hybrid engine", "engine sglang keeps its own weights: a group that trains and "
           "generates pays verl's switch (offload, reshard, sleep/wake) every step; the "
           "synchronous baseline computes old_log_prob"),
    False: ("rlgraph runtime", "engine native decodes with the training weights: a colocated "
            "group pays no switch; train recomputes the proximal log-probs when no logp node "
            "feeds it"),
}
