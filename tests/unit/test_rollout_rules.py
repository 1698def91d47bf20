"""Partial rollout's rules (rlgraph/rollout_rules.py), the ones the rollout cache and the cost
model's simulation of its rounds both follow."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rlgraph.rollout_rules import RolloutRules


def test_admission_holds_in_flight_only_where_the_version_can_be_carried() -> None:
    rules = RolloutRules.of(prompts=4, oversample=1.5, max_lag=1)
    assert rules.in_flight == 6
    assert rules.target(step=5, version=5) == 6  # fresh weights: spares carried later
    assert rules.target(step=5, version=4) == 4  # as old as the bound: only this batch
    assert rules.target(step=5, version=4, taken=2) == 0  # no refill for a later batch
    # a refill inside the round: no more than batches step..version+max_lag take
    assert rules.target(step=5, version=5, taken=4) == min(6 + 4, (5 + 1 + 1 - 5) * 4)


def test_a_refill_inside_the_round_by_free_slots_stays_within_the_versions_window() -> None:
    rules = RolloutRules.of(prompts=4, oversample=1.5, max_lag=2)
    assert rules.window(step=5, version=4) == (4 + 2 + 1 - 5) * 4 == 8
    # free slots for 3 groups, 5 held: 8 (the window), not 5 + 3 + anything held complete
    assert rules.target(step=5, version=4, held=5, room=3) == 8
    assert rules.target(step=5, version=4, held=5, room=9) == 8  # the window caps the slots
    assert rules.target(step=5, version=4, held=5, room=1) == 6
    assert rules.target(step=5, version=4, held=9, room=4) == 9  # never below what is held
    assert rules.target(step=5, version=3, held=2, room=4) == 2  # as old as the bound: none
    assert rules.last_call(4) == 6 and not rules.is_stale(4, 6) and rules.is_stale(4, 7)
    streamed = RolloutRules.of(prompts=2, oversample=4.0, max_lag=1, stride=4)
    # version 1's samples may be trained through mini-batch (1 + 1) * 4 + 3 = 11
    assert streamed.window(step=9, version=1) == 3 * 2
    assert streamed.target(step=9, version=1, held=3, room=2) == 5
    assert streamed.target(step=11, version=1, held=3, room=2) == 3  # only batch 11 left


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


def test_must_finish_looks_ahead_so_no_group_due_later_is_dropped() -> None:
    rules = RolloutRules.of(prompts=2, oversample=2.0, max_lag=1, stale="finish")
    # three groups due by call 3 (oldest 2), none by call 2: call 3 takes two of them, so
    # call 2 must take one now (the oldest first)
    assert rules.must_finish([2, 2, 2, 4, 4, 4], step=2) == {0}
    assert rules.must_finish([2, 2, 4, 4, 4, 4], step=2) == set()  # calls 3..5 take them
    # due now comes first; then as many as the batch holds
    assert rules.must_finish([2, 1, 2, 2, 2, 2], step=2) == {1, 0}
    streamed = RolloutRules.of(prompts=1, oversample=4.0, max_lag=0, stale="finish", stride=2)
    assert streamed.last_call(1) == 3  # version 1's mini-batches are calls 2 and 3
    assert streamed.must_finish([1, 1, 2], step=2) == {0}  # two due, call 3 takes one


def test_without_mixing_a_sample_restarts_under_a_new_version() -> None:
    assert RolloutRules(2, 4, 1, mix_versions=False).restarts_unmixed(3, 4)
    assert not RolloutRules(2, 4, 1, mix_versions=False).restarts_unmixed(4, 4)
    assert not RolloutRules(2, 4, 1).restarts_unmixed(3, 4)


def test_a_generate_sharing_trains_gpu_keeps_the_oversample_slack_of_the_window() -> None:
    """One GPU (generate time-shares it with train): in-flight refills stop the oversample's
    groups short of the version's window, so a later call can take the groups that complete
    first; on a split plan they fill the window."""
    split = RolloutRules.of(prompts=8, oversample=6.0, max_lag=3, stride=4)
    shared = RolloutRules.of(prompts=8, oversample=6.0, max_lag=3, stride=4, shares_device=True)
    assert (split.reserve, shared.reserve) == (0, 48 - 32)
    assert split.target(0, 0, held=40, room=200) == split.window(0, 0) == 128
    assert shared.target(0, 0, held=40, room=200) == 128 - 16
    assert shared.target(0, 0, held=120, room=200) == 120  # never below what it holds


@settings(max_examples=200, deadline=None, derandomize=True)
@given(prompts=st.integers(1, 16), oversample=st.floats(1.0, 8.0), max_lag=st.integers(1, 8),
       stride=st.sampled_from([1, 2, 4]), step=st.integers(0, 64), behind=st.integers(0, 8),
       held=st.integers(0, 200), room=st.integers(0, 200))
def test_the_one_gpu_slack_only_ever_admits_less_and_never_evicts(
        prompts: int, oversample: float, max_lag: int, stride: int, step: int, behind: int,
        held: int, room: int) -> None:
    """With `shares_device` a refill admits at most what the split plan's does, never drops
    below the groups held, and never fills past the window less the reserve."""
    version = max(0, step // stride - behind)
    split, shared = (RolloutRules.of(prompts=prompts, oversample=oversample, max_lag=max_lag,
                                     stride=stride, shares_device=s) for s in (False, True))
    ours, theirs = (r.target(step, version, held=held, room=room) for r in (shared, split))
    assert held <= ours <= theirs
    assert ours == held or ours <= shared.window(step, version) - shared.reserve
