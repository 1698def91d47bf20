"""Hypothesis over random graphs streamed at mini-batch granularity (`schedule.stream`).

The random graphs of test_schedule_properties whose generates have groups of their own, with
K mini-batches per version: pieces of a node run in order (piece 0 after the last piece of
the step before), data edges join piece j to piece j, every generate piece of version t
holds weights of version >= t - max_lag, the fast simulator equals the naive one that asks
the policy at every decision, and the period is at least the bound.
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st
from test_schedule_properties import SETTINGS, random_graphs, reference_simulation, timed

from rlgraph.compiler.period_bound import schedule_bound
from rlgraph.compiler.schedule import LowestStepFirst, simulate, steady_state
from rlgraph.config.schema import ScheduleSpec, StreamSpec

STEPS = 8


@SETTINGS
@given(spec=random_graphs(), k=st.sampled_from([2, 3, 4]))
def test_streamed_simulation_keeps_every_constraint(spec: Any, k: int) -> None:
    trains = {spec.group_of(n) for n, node in spec.nodes.items() if node.kind == "train"}
    assume(all(spec.group_of(n) not in trains for n, node in spec.nodes.items()
               if node.kind == "generate"))
    schedule = ScheduleSpec(max_lag=spec.schedule.max_lag, steps=spec.schedule.steps,
                            stream=StreamSpec(mini_batches=k))
    spec = spec.model_copy(update={"schedule": schedule})
    tg = timed(spec)
    sim = simulate(tg, STEPS)
    n, s, e = tg.n, sim.start, sim.end
    index = {name: i for i, name in enumerate(tg.names)}
    for t in range(STEPS):
        for u, v in tg.data_edges:
            assert s[t * n + v] >= e[t * n + u] - 1e-9
        for u, v in tg.wraps:
            if t:
                assert s[t * n + v] >= e[(t - 1) * n + u] - 1e-9
        for name, node in spec.nodes.items():
            if node.kind != "generate":
                continue
            syncs = [u for u, v, _ in tg.back_edges if v == index[f"{name}[0]"]]
            for j in range(k):
                start = s[t * n + index[f"{name}[{j}]"]]
                held = max([step + 1 for step in range(STEPS) for pu in syncs
                            if e[step * n + pu] <= start + 1e-9], default=0)
                assert t - held <= spec.schedule.max_lag
    assert reference_simulation(tg, STEPS, LowestStepFirst.of(tg.names)) == s
    assert steady_state(tg).period >= schedule_bound(tg).seconds * (1 - 1e-9) - 1e-12
