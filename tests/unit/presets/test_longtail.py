"""The long-tail task: countdown answers, long-tailed target lengths, partial-credit reward."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from rl_support import make_spec

from rlgraph.config.load import load_spec
from rlgraph.errors import SpecError
from rlgraph.presets.tasks import (
    DECADES,
    LONGTAIL_MAX,
    WARM_START_MAX,
    longtail_answer,
    longtail_code,
)
from rlgraph.rl.data import DataSource, task_example
from rlgraph.rl.rewards import default_compute_score, length_credit

GRAPHS = Path(__file__).resolve().parents[3] / "graphs"


def remaining(ch: str) -> int:
    """How many characters a countdown character says remain (itself included), mod 10."""
    return 10 * (DECADES.index(ch) + 1) if ch in DECADES else int(ch)


@pytest.mark.parametrize("n", [1, 9, 10, 11, 23, 100, 137, LONGTAIL_MAX])
def test_every_countdown_character_says_how_many_remain(n: int) -> None:
    answer = longtail_answer(n)
    assert len(answer) == n
    for i, ch in enumerate(answer):
        assert remaining(ch) % 10 == (n - i) % 10 and (ch in DECADES) == ((n - i) % 10 == 0)
    code = longtail_code(n)
    assert (DECADES.index(code[0]) + 1) * 10 + int(code[1:]) == n if n >= 10 else code == str(n)


def lengths(dist: str, **extra: float) -> list[int]:
    spec = make_spec(data={"task": "longtail", "prompts_per_step": 500, "response_len":
                           {"mean": 16, "max": 128, "dist": dist, **extra}})
    return [len(ex.ground_truth) for ex in DataSource(spec.data).batch(0)]


@pytest.mark.parametrize("dist", ["lognormal", "pareto"])
def test_target_lengths_follow_a_long_tail_with_the_configured_mean(dist: str) -> None:
    n = lengths(dist)
    assert min(n) >= 1 and max(n) <= 128
    assert 0.7 * 16 <= statistics.mean(n) <= 1.1 * 16  # clipping at max trims the mean
    assert tail(n) >= 4  # a long tail: the slowest 1% are 4x the typical answer
    heavier = lengths(dist, sigma=1.5) if dist == "lognormal" else lengths(dist, alpha=1.1)
    assert tail(heavier) > 1.5 * tail(n)


def tail(n: list[int]) -> float:
    """99th percentile over median."""
    return statistics.quantiles(n, n=100)[98] / statistics.median(n)


def test_prompts_encode_the_answer_and_streams_are_seeded() -> None:
    spec = make_spec(data={"task": "longtail", "prompts_per_step": 8,
                           "response_len": {"mean": 16, "max": 64}})
    batch = DataSource(spec.data).batch(3)
    assert [e.prompt for e in batch] == [e.prompt for e in DataSource(spec.data).batch(3)]
    for ex in batch:
        assert ex.prompt == f"len {longtail_code(len(ex.ground_truth))}:"
        assert ex.ground_truth == longtail_answer(len(ex.ground_truth))
    warm = [len(task_example("longtail", 0, "warm_start", i).ground_truth) for i in range(400)]
    assert max(warm) > 100 and max(warm) <= WARM_START_MAX  # the warm start covers the tail


def test_length_credit_rewards_length_then_exactness() -> None:
    truth = longtail_answer(20)
    assert length_credit("longtail", truth, truth) == 1.0
    assert length_credit("longtail", "x" * 20, truth) == 0.5  # right length, wrong answer
    assert length_credit("longtail", truth[:10], truth) == 0.25
    assert length_credit("longtail", "", truth) == 0.0
    assert length_credit("longtail", truth * 3, truth) == 0.0
    assert default_compute_score("longtail", truth[:15], truth) == pytest.approx(0.375)
    assert default_compute_score("arithmetic", "12", "12") == 1.0  # other tasks: exact match
    assert default_compute_score("arithmetic", "1", "12") == 0.0


def test_bad_length_distribution_is_a_spec_error() -> None:
    with pytest.raises(SpecError) as info:
        load_spec(GRAPHS / "longtail.yaml", ["data.response_len.dist=zipf"])
    assert info.value.key == ("data", "response_len", "dist")
    with pytest.raises(SpecError) as info:
        load_spec(GRAPHS / "longtail.yaml", ["data.response_len.alpha=1"])
    assert info.value.key == ("data", "response_len", "alpha")
