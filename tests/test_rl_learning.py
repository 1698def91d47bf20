"""The quickstart learns, without Ray: a serial driver of the one-step-off schedule.

The driver plays the runtime's part by hand: generate runs `max_lag` steps ahead of train
on its own workspace, with weights `max_lag` versions old, and every train step is followed
by a bucketed weight sync train -> generate. It checks the lag bound on every token and the
ledger of trained prompts, and pins a reward gain (the regression test of the RL core).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from rl_support import make_spec

from rlgraph.spec import Spec
from rlgraph.workspace import Workspace

# The quickstart's RL settings (graphs/quickstart.yaml), on the tiny preset.
QUICKSTART = dict(
    model={"preset": "tiny", "warm_start": {"steps": 80, "lr": 1e-3, "batch_size": 64}},
    data={"task": "arithmetic", "prompts_per_step": 16, "samples_per_prompt": 8,
          "prompt_len": 8, "response_len": {"mean": 3, "max": 6}},
    algorithm={"name": "grpo", "kl_coef": 0.0},
    train={"lr": 3e-4, "warmup_steps": 10},
)


def run_serial(spec: Spec, steps: int, max_lag: int = 1) -> tuple[list[dict], dict[str, float]]:
    """generate / reward / train / param_update in the order of a `max_lag`-off schedule;
    returns the train metrics of every step and the mean seconds of each worker."""
    rollout = Workspace(spec, ["generate"])
    trainer = Workspace(spec, ["train"])
    scorer = Workspace(spec, ["reward"])
    assert rollout.weights_digest() == trainer.weights_digest()  # identical version 0
    generate, reward, train = (rollout.worker("generate"), scorer.worker("reward"),
                               trainer.worker("train"))
    seconds = dict.fromkeys(["generate", "reward", "train", "param_update"], 0.0)
    batches: dict[int, dict] = {}
    history = []
    for t in range(steps):
        for ahead in range(t, min(t + max_lag, steps - 1) + 1):
            if ahead not in batches:  # generate(t + max_lag) may start: version >= t
                assert rollout.policy_version >= ahead - max_lag
                start = time.perf_counter()
                batches[ahead] = generate.run(ahead, {})
                seconds["generate"] += time.perf_counter() - start
        start = time.perf_counter()
        scored = reward.run(t, {"generate": batches.pop(t)})
        seconds["reward"] += time.perf_counter() - start
        start = time.perf_counter()
        out = train.run(t, {"reward": scored})
        seconds["train"] += time.perf_counter() - start
        start = time.perf_counter()
        for bucket in trainer.export_weights(bucket_mb=1.0):
            rollout.receive_bucket(bucket)
        rollout.commit_weights(out["policy_version"])
        seconds["param_update"] += time.perf_counter() - start
        history.append({**out["metrics"], "uids": out["trained_uids"]})
    assert rollout.weights_digest() == trainer.weights_digest()
    return history, {k: v / steps for k, v in seconds.items()}


def mean(values: list[float]) -> float:
    """Arithmetic mean."""
    return sum(values) / len(values)


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The warm start is computed here, not read from the user's cache."""
    monkeypatch.setenv("RLGRAPH_CACHE", str(tmp_path))
    return tmp_path


def test_quickstart_learns_with_lag_one(private_cache: Path) -> None:
    torch.set_num_threads(1)
    steps = 120
    history, seconds = run_serial(make_spec(**QUICKSTART), steps, max_lag=1)
    assert list(private_cache.glob("warm_start/*.pt"))  # computed once, shared by 2 groups
    rewards = [h["reward/mean"] for h in history]
    first, last = mean(rewards[:10]), mean(rewards[-10:])
    print(f"reward first10 {first:.3f} last10 {last:.3f}; seconds per step {seconds}")
    assert last - first >= 0.2, (first, last)  # the full 250-step quickstart gains >= 0.3
    # the lag bound holds on every token, and lag 1 really happens
    assert history[0]["lag/max"] == 0
    assert all(h["lag/max"] <= 1 for h in history)
    assert all(h["lag/max"] == 1 for h in history[1:])
    # the ledger: every prompt of the stream trained exactly once, in order
    uids = [u for h in history for u in h["uids"]]
    assert uids == [f"arithmetic:train:{i}" for i in range(steps * 16)]
    assert history[-1]["policy/version"] == steps
