"""A hand-made pipeline's events and a plan around them, for the timeline and CLI tests."""

from __future__ import annotations

from rlgraph.compiler.plan import Plan

# A hand-made pipeline (a test double for the compiler's simulator): trainer and ref groups,
# a rollout group, reward on CPU, param_update holding trainer and rollout.
DURATION = {"generate": 1.0, "reward": 0.05, "logp": 0.25, "ref_logp": 0.2, "train": 0.5,
            "param_update": 0.1}
OCCUPIES = {"generate": ["rollout"], "reward": [], "logp": ["trainer"], "ref_logp": ["ref"],
            "train": ["trainer"], "param_update": ["trainer", "rollout"]}
INPUTS = {"generate": [], "reward": ["generate"], "logp": ["generate"],
          "ref_logp": ["generate"], "train": ["reward", "logp", "ref_logp"],
          "param_update": ["train"]}


def simulate(steps: int, max_lag: int, scale: float = 1.0) -> list[dict]:
    """Greedy list scheduling of the pipeline: always start the instance that can start first."""
    end: dict[tuple[str, int], float] = {}
    free: dict[str, float] = {}
    next_step = dict.fromkeys(DURATION, 0)
    events = []
    while any(t < steps for t in next_step.values()):
        ready = {}
        for node, t in next_step.items():
            deps = [(p, t) for p in INPUTS[node]] + [(node, t - 1)]
            if node == "generate":
                deps.append(("param_update", t - max_lag - 1))
            if t < steps and all(d in end or d[1] < 0 for d in deps):
                at = max([end.get(d, 0.0) for d in deps] +
                         [free.get(g, 0.0) for g in OCCUPIES[node]])
                ready[node] = at
        node = min(ready, key=lambda n: (ready[n], list(DURATION).index(n)))
        t, start = next_step[node], ready[node]
        end[(node, t)] = start + DURATION[node] * scale
        for g in OCCUPIES[node]:
            free[g] = end[(node, t)]
        next_step[node] += 1
        events.append({"node": node, "step": t, "start": start, "end": end[(node, t)],
                       "group": (OCCUPIES[node] or [None])[0], "occupies": OCCUPIES[node]})
    return events


def fake_plan(steps: int = 16, max_lag: int = 1) -> Plan:
    """A plan with the contract's keys around simulated events (read as plan.json is)."""
    groups = [("trainer", ["logp", "train"], 0.5, 4), ("ref", ["ref_logp"], 0.25, 2),
              ("rollout", ["generate"], 0.25, 2)]
    first = {"trainer": 0, "ref": 4, "rollout": 6}
    return Plan.from_dict({
        "name": "fake-pipeline",
        "spec": {"nodes": {n: {"kind": n} for n in DURATION},
                 "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "H200"}},
        "placement": {"local": False, "slots": 8, "gpu": "H200", "groups": [
            {"name": n, "tasks": t, "share": s, "gpus": g,
             "devices": [[0, first[n] + i] for i in range(g)]} for n, t, s, g in groups]},
        "costs": {n: {"seconds": d, "source": "override", "detail": "test"}
                  for n, d in DURATION.items()},
        "lag": {"max_policy_lag": max_lag, "per_edge": {}},
        "schedule": {"period_s": 1.1, "bound_s": 1.1, "sync_period_s": 2.1,
                     "speedup_vs_sync": 2.1 / 1.1, "utilization": {}, "idle": {},
                     "bottleneck": "generate on rollout bounds the period",
                     "steps_simulated": steps, "events": simulate(steps, max_lag)},
        "channels": {}, "messages": ["a test message"],
    })
