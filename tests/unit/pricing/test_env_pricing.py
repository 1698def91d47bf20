"""The turn engine's pricing (rlgraph.pricing.env): invariants over env blocks and plans."""

from __future__ import annotations

import json
import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rl_support import cost_spec, costs_of

from rlgraph.lengths import LengthModel
from rlgraph.pricing.env import draw_trajectory


def generate_seconds(env: dict, **schedule: object) -> float:
    spec = cost_spec(nodes={"generate": {"env": env}, "reward": {}, "logp": {},
                            "train": {"activation_checkpointing": True}, "param_update": {}},
                     schedule={"max_lag": 1, **schedule})
    return costs_of(spec)["generate"].seconds


@settings(max_examples=12, deadline=None, derandomize=True)
@given(turns=st.floats(1.0, 6.0), latency=st.floats(0.0, 2.0), extra=st.floats(0.01, 2.0),
       partial=st.booleans())
def test_more_env_latency_never_shortens_the_step(turns: float, latency: float, extra: float,
                                                  partial: bool) -> None:
    env = {"fn": "delay", "max_turns": 8, "turns": turns}
    fast = generate_seconds({**env, "latency_s": latency}, partial_rollout=partial)
    slow = generate_seconds({**env, "latency_s": latency + extra}, partial_rollout=partial)
    assert slow >= fast
    if not partial:  # the batch waits at least for one trajectory's env steps
        assert slow - fast >= extra * 0.99


@settings(max_examples=25, deadline=None, derandomize=True)
@given(turns=st.floats(1.0, 8.0), per_turn=st.floats(1.0, 200.0), budget=st.integers(1, 2048),
       observation=st.floats(0.0, 64.0), seed=st.integers(0, 2 ** 16))
def test_drawn_trajectories_keep_the_budget_and_max_turns(turns: float, per_turn: float,
                                                          budget: int, observation: float,
                                                          seed: int) -> None:
    tokens = draw_trajectory(random.Random(seed), LengthModel(turns, 8.0),
                             LengthModel(per_turn, 512.0), budget, observation)
    assert 1 <= len(tokens) <= 8 and all(n >= 1 for n in tokens)
    # every turn but a lone first one starts with tokens to spare
    assert sum(tokens) + observation * (len(tokens) - 1) <= max(budget, tokens[0])


def test_a_run_measures_the_env_step_the_compiler_prices(tmp_path: Path) -> None:
    from rlgraph.compiler.calibrate import measured_env_latency, with_env_latency

    rows = [{"step": i, "env/seconds": s, "env/trajectories": 32.0, "env/turns_mean": 2.0}
            for i, s in enumerate([9.0, 3.2, 3.2, 3.3])]  # the first step is warm-up
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\nnot json\n")
    assert measured_env_latency(tmp_path) == 3.2 / 64
    assert measured_env_latency(tmp_path / "trace.json") == 3.2 / 64  # beside the trace
    spec = cost_spec(nodes={"generate": {"env": {"fn": "delay", "turns": 2}}, "reward": {},
                            "logp": {}, "train": {"activation_checkpointing": True},
                            "param_update": {}})
    measured = with_env_latency(spec, tmp_path)
    assert measured.nodes["generate"].env.latency_s == 3.2 / 64
    assert spec.nodes["generate"].env.latency_s == 0  # the graph's spec is left alone
    assert costs_of(measured)["generate"].seconds > costs_of(spec)["generate"].seconds
    given_latency = with_env_latency(measured.model_copy(update={}), tmp_path)
    assert given_latency.nodes["generate"].env.latency_s == 3.2 / 64
    stated = cost_spec(nodes={"generate": {"env": {"fn": "delay", "latency_s": 1.0}},
                              "reward": {}, "logp": {}, "param_update": {},
                              "train": {"activation_checkpointing": True}})
    assert with_env_latency(stated, tmp_path) is stated  # the env block's figure wins
    (tmp_path / "single_turn").mkdir()  # a run without metrics.jsonl: nothing measured
    assert with_env_latency(spec, tmp_path / "single_turn") is spec
