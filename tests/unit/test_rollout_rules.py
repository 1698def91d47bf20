"""Partial rollout's rules (rlgraph/rollout_rules.py), the ones the rollout cache and the cost
model's simulation of its rounds both follow."""

from __future__ import annotations

from rlgraph.rollout_rules import RolloutRules


def test_admission_holds_in_flight_only_where_the_version_can_be_carried() -> None:
    rules = RolloutRules.of(prompts=4, oversample=1.5, max_lag=1)
    assert rules.in_flight == 6
    assert rules.target(step=5, version=5) == 6  # fresh weights: spares carried later
    assert rules.target(step=5, version=4) == 4  # as old as the bound: only this batch
    assert rules.target(step=5, version=4, taken=2) == 0  # no refill for a later batch
    # a refill inside the round: no more than batches step..version+max_lag take
    assert rules.target(step=5, version=5, taken=4) == min(6 + 4, (5 + 1 + 1 - 5) * 4)


def test_streaming_admits_only_while_the_versions_window_has_room() -> None:
    rules = RolloutRules.of(prompts=2, oversample=4.0, max_lag=0, stride=4)
    assert rules.in_flight == 8
    assert rules.target(step=0, version=0) == 8  # mini-batches 0..3 of version 0
    assert rules.target(step=3, version=0) == 2  # the last mini-batch of version 0
    assert rules.floor(7) == 1 and rules.is_stale(0, 7) and not rules.is_stale(1, 7)


def test_must_finish_takes_the_oldest_groups_in_admission_order_under_finish_only() -> None:
    oldest = [3, None, 1, 1, 2, 1]
    finish = RolloutRules.of(prompts=2, oversample=2.0, max_lag=1, stale="finish")
    assert finish.must_finish(oldest, step=2) == {2, 3}  # next call's floor is 2
    assert RolloutRules.of(prompts=2, oversample=2.0, max_lag=1).must_finish(oldest, 2) == set()
    assert finish.drops_stale and not RolloutRules(2, 4, 1, "restart").drops_stale


def test_without_mixing_a_sample_restarts_under_a_new_version() -> None:
    assert RolloutRules(2, 4, 1, mix_versions=False).restarts_unmixed(3, 4)
    assert not RolloutRules(2, 4, 1, mix_versions=False).restarts_unmixed(4, 4)
    assert not RolloutRules(2, 4, 1).restarts_unmixed(3, 4)
