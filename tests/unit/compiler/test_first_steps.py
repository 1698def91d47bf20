"""compiler.first_steps: the costs of a run's first steps, before its rounds settle."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlgraph.compiler import compile_plan, first_steps_period
from rlgraph.compiler.costs import node_costs
from rlgraph.compiler.first_steps import startup_lags, window_costs
from rlgraph.compiler.placement import place
from rlgraph.config.load import load_spec
from rlgraph.graph import build_graph

GRAPH = Path(__file__).resolve().parents[3] / "bench" / "graphs_gpu" / "longtail-1gpu.yaml"
PARTIAL = ["schedule.partial_rollout=true", "schedule.max_lag=2",
           "data.response_len.sigma=1.5"]


def lags_of(overrides: list[str], rounds: int = 5) -> dict:
    spec = load_spec(GRAPH, overrides)
    graph, placement = build_graph(spec), place(spec)
    costs, _ = node_costs(spec, graph, placement)
    return startup_lags(spec, graph, costs, placement, rounds)


def test_the_skipped_first_forward_lets_the_second_generate_run_before_train_0() -> None:
    """Batch 0 is on-policy, so the runtime skips its old-log-prob forward; train 0 then
    waits on the reward's actor and the group runs generate 1 first, on version 0's
    weights (bench/results/gpu-longtail-1gpu.json's events); from step 2 logp runs while
    the reward lands, and generate follows train. Generate 1's lag is that of any round after
    an on-policy batch. Without a logp node there is no skip to follow."""
    assert lags_of(PARTIAL) == {"generate": ((0, 1, 0, 0, 0), 1)}
    no_logp = ['nodes={"generate": {"kind": "generate", "forced_lengths": true, '
               '"oversample": 1.5, "stale": "finish"}, "reward": {"kind": "reward"}, '
               '"train": {"kind": "train", "micro_tokens": 16384, "old_logp": "rollout"}, '
               '"param_update": '
               '{"kind": "param_update", "src": "train", "dst": "generate"}}',
               'groups={"all": {"share": 1.0, "tasks": ["generate", "train"]}}']
    lags, after = lags_of(PARTIAL + no_logp)["generate"]
    assert after is None and lags[0] == 0


def test_a_window_prices_the_rounds_a_short_run_decodes_not_the_steady_ones() -> None:
    """The max_lag 2 run's steps 2-3 hold its long must-finish round (5680 of 7232 decode
    steps): the window costs more than the steady period; a synchronous plan has no rounds
    to settle, so its window is its period."""
    spec = load_spec(GRAPH, PARTIAL)
    steady = compile_plan(spec)["schedule"]["period_s"]
    assert first_steps_period(spec, (2, 4)) > 1.15 * steady
    sync = load_spec(GRAPH, ["data.response_len.sigma=1.5"])
    assert first_steps_period(sync, (1, 4)) == pytest.approx(
        compile_plan(sync)["schedule"]["period_s"])
    with pytest.raises(ValueError, match="first < last"):
        window_costs(spec, build_graph(spec), place(spec), (3, 3))
