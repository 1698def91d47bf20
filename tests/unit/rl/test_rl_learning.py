"""The quickstart learns, without Ray: the serial driver of the one-step-off schedule.

`rlgraph.runtime.serial.run_serial` plays the runtime's part in one process: generate runs
`max_lag` steps ahead of train on its own workspace, with weights `max_lag` versions old,
and every train step is followed by a bucketed weight sync train -> generate. The test pins
a reward gain (the regression test of the RL core), the lag bound and the prompt ledger.
"""

from __future__ import annotations

from pathlib import Path

import torch
from rl_support import make_spec

from rlgraph.runtime.serial import run_serial

# The quickstart's RL settings (graphs/quickstart.yaml), on the tiny preset.
QUICKSTART = dict(
    model={"preset": "tiny", "warm_start": {"steps": 30, "lr": 1e-3, "batch_size": 64}},
    data={"task": "add_small", "prompts_per_step": 16, "samples_per_prompt": 8,
          "prompt_len": 8, "response_len": {"mean": 2, "max": 4}},
    algorithm={"name": "grpo", "kl_coef": 0.0},
    train={"lr": 3e-4, "warmup_steps": 10},
)


def mean(values: list[float]) -> float:
    """Arithmetic mean."""
    return sum(values) / len(values)


def test_quickstart_learns_with_lag_one(warm_cache: Path) -> None:
    torch.set_num_threads(1)
    steps = 50  # measured gain (last 10 over first 10): 0.263 at 50 steps, 0.423 at 70
    run = run_serial(make_spec(**QUICKSTART, max_lag=1), steps)
    # computed once, shared by the groups (and by test_algorithm_learning.py's runs)
    assert len(list(warm_cache.glob("warm_start/*.safetensors"))) == 1
    rewards = [m["metrics"]["reward/mean"] for m in run.metrics]
    first, last = mean(rewards[:10]), mean(rewards[-10:])
    print(f"reward first10 {first:.3f} last10 {last:.3f}; seconds per step {run.seconds}")
    assert last - first >= 0.15, (first, last)  # the 100-step quickstart gains about 0.5
    lags = [m["metrics"]["lag/max"] for m in run.metrics]
    assert lags[0] == 0 and all(lag == 1 for lag in lags[1:])  # lag 1 happens, never more
    uids = [u for m in run.metrics for u in m["trained_uids"]]
    assert uids == [f"add_small:train:{i}" for i in range(steps * 16)]  # each prompt once
    assert run.metrics[-1]["policy_version"] == steps


def test_lag_two_and_colocated_logp_ref(warm_cache: Path) -> None:
    """max_lag 2 with logp / ref_logp beside train: the lag bound holds, weights stay in sync."""
    spec = make_spec(data={"prompts_per_step": 2, "samples_per_prompt": 2},
                     extra_nodes={"logp": {}, "ref_logp": {}}, algorithm={"kl_coef": 0.01},
                     train={"lr": 1e-3}, max_lag=2)
    run = run_serial(spec, steps=6)
    lags = [m["metrics"]["lag/max"] for m in run.metrics]
    assert lags == [0, 1, 2, 2, 2, 2]
    assert set(run.seconds) == {"generate", "reward", "logp", "ref_logp", "train",
                                "param_update"}
