"""Each algorithm family learns the add_small task on CPU, without Ray: one short serial run
per family (one-step-off schedule, the tiny preset warm-started once for all of them).

GRPO is the quickstart's own check (test_rl_learning.py). Here: PPO with its critic node and
GAE, RLOO, REINFORCE++, DAPO (clip-higher and dynamic sampling) and GSPO (sequence ratios).
Dr. GRPO differs from GRPO only in the loss aggregation and the std, and ReMax only in the
baseline: both are pinned by hand-computed figures (nodes/test_algorithms.py). Seeded, so each
run is deterministic; the gain asked for (+0.05 mean reward, last quarter over the first)
is about half of what each family measured over its 30 steps (0.09 to 0.22), and a loss
with the wrong sign or no gradient loses reward or stays within noise of where it began.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rl_support import make_spec

from rlgraph.runtime.serial import run_serial

STEPS = 30


@pytest.mark.parametrize("name", ["ppo", "rloo", "reinforce_pp", "dapo", "gspo"])
def test_family_learns(name: str, warm_cache: Path) -> None:
    torch.set_num_threads(1)
    extra = {"critic": {"lr": 1e-3}} if name == "ppo" else {}
    spec = make_spec(
        model={"preset": "tiny", "warm_start": {"steps": 30, "lr": 1e-3, "batch_size": 64}},
        data={"task": "add_small", "prompts_per_step": 16, "samples_per_prompt": 4,
              "prompt_len": 8, "response_len": {"mean": 2, "max": 4}},
        algorithm={"name": name, "kl_coef": 0.0}, train={"lr": 6e-4, "warmup_steps": 5},
        extra_nodes=extra, max_lag=1, steps=STEPS)
    run = run_serial(spec, STEPS)
    rewards = [m["metrics"]["reward/mean"] for m in run.metrics]
    quarter = STEPS // 4
    first, last = sum(rewards[:quarter]) / quarter, sum(rewards[-quarter:]) / quarter
    print(f"{name}: reward first {quarter} steps {first:.3f}, last {quarter} {last:.3f}")
    assert last - first >= 0.05, (name, first, last)
    assert all(m["metrics"]["lag/max"] <= 1 for m in run.metrics)
