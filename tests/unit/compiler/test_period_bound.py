"""The period's lower bound on hand-built timed graphs: Howard's maximum cycle ratio against
enumeration, and which of cycle or group load binds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlgraph.compiler.period_bound import enumerated_cycle_ratio, max_cycle_ratio, schedule_bound
from rlgraph.compiler.timed_graph import TimedGraph


def chain(durations: tuple[float, ...], max_lag: int, groups: int) -> TimedGraph:
    """n nodes in a line, the last feeding the first max_lag + 1 steps later; node i on group
    i % groups."""
    n = len(durations)
    return TimedGraph(names=tuple(f"n{i}" for i in range(n)), duration=durations,
                      groups=tuple(f"g{g}" for g in range(groups)),
                      occupies=tuple((i % groups,) for i in range(n)),
                      data_edges=tuple((i, i + 1) for i in range(n - 1)),
                      back_edges=((n - 1, 0, max_lag + 1),), capacity=max_lag + 1,
                      max_lag=max_lag)


@settings(max_examples=60)
@given(st.lists(st.floats(min_value=0.01, max_value=10), min_size=2, max_size=5),
       st.integers(min_value=0, max_value=3), st.integers(min_value=1, max_value=3))
def test_howard_equals_enumeration(durations: list[float], max_lag: int, groups: int) -> None:
    tg = chain(tuple(durations), max_lag, groups)
    ratio, cycle, distance = max_cycle_ratio(tg.n, tg.constraint_edges())
    assert ratio == pytest.approx(enumerated_cycle_ratio(tg.n, tg.constraint_edges()))
    assert cycle[0] == cycle[-1] and distance >= 1


def test_synchronous_chain_is_bound_by_its_whole_step() -> None:
    bound = schedule_bound(chain((3.0, 2.0), max_lag=0, groups=2))
    assert bound.seconds == pytest.approx(5.0) and bound.binding == "cycle"


def test_one_step_off_is_bound_by_the_slowest_stage() -> None:
    bound = schedule_bound(chain((3.0, 2.0), max_lag=1, groups=2))
    assert bound.seconds == pytest.approx(3.0)  # max(3 + 2) / 2 = 2.5 < the 3 s node


def test_shared_group_binds_when_it_holds_the_most_work() -> None:
    bound = schedule_bound(chain((3.0, 2.0), max_lag=4, groups=1))
    assert bound.seconds == pytest.approx(5.0) and bound.binding == "group"
