"""The Plan: plan.json round trip, its keys, and the runtime reading lag and channels from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlgraph.compiler import compile_plan
from rlgraph.compiler.plan import PLAN_VERSION, Plan, PlanError
from rlgraph.config.load import load_spec
from rlgraph.runtime.pipeline import Pipeline, drive
from rlgraph.runtime.tasks import InlineExecutor

GRAPHS = Path(__file__).resolve().parents[3] / "graphs"


def quickstart(*overrides: str) -> Plan:
    """The quickstart graph compiled with `overrides`."""
    return compile_plan(load_spec(GRAPHS / "quickstart.yaml", list(overrides)))


def test_plan_json_round_trip_keeps_the_contract_keys() -> None:
    plan = quickstart()
    text = plan.to_json()
    data = json.loads(text)
    assert data["version"] == PLAN_VERSION
    for group in data["placement"]["groups"]:
        assert {"name", "tasks", "share", "gpus", "devices"} <= set(group)
    assert {"max_policy_lag", "per_edge"} <= set(data["lag"])
    assert {"period_s", "bound_s", "sync_period_s", "speedup_vs_sync", "utilization",
            "events"} <= set(data["schedule"])
    assert data["spec"] == plan.spec.to_yaml_dict()
    back = Plan.from_json(text)
    assert back.to_json() == text
    assert back.lag == plan.lag and back.channels == plan.channels
    assert back.weight_sync == plan.weight_sync
    assert list(back.graph.edges(data="distance")) == list(plan.graph.edges(data="distance"))


def test_weight_sync_routes_carry_the_users_bucket_sizes() -> None:
    plan = quickstart("nodes.param_update.bucket_mb.produce=64",
                      "nodes.param_update.bucket_mb.consume=16")
    route = plan.weight_sync["param_update"]
    assert (route.src, route.dst) == ("train", "generate")
    assert (route.bucket_mb.produce, route.bucket_mb.consume) == (64, 16)
    assert plan["weight_sync"]["param_update"]["bucket_mb"] == {"produce": 64.0,
                                                                "consume": 16.0}


@settings(max_examples=6, deadline=None)
@given(st.integers(min_value=0, max_value=4))
def test_the_runtime_reads_gate_and_capacities_from_the_plan(max_lag: int) -> None:
    plan = Plan.from_json(quickstart(f"schedule.max_lag={max_lag}").to_json())
    assert plan.lag.max_lag == max_lag == plan.lag.max_policy_lag
    assert set(plan.channels.values()) == {max_lag + 1}
    pipeline = Pipeline.of(plan, steps=4)
    assert pipeline.max_lag == max_lag
    assert {ch.name: ch.capacity for ch in pipeline.channels.values()} == plan.channels
    narrow = plan.model_copy(update={"channels": dict.fromkeys(plan.channels, 1)})
    assert {ch.capacity for ch in Pipeline.of(narrow, steps=4).channels.values()} == {1}


def test_inline_executor_drives_the_pipeline_within_the_gate() -> None:
    plan = quickstart("schedule.max_lag=1")
    order: list[tuple[str, int]] = []
    executor = InlineExecutor(lambda task: (task.step, {"summary": {}}))
    stopped = drive(Pipeline.of(plan, steps=4, chaining=False), executor,
                    lambda done: order.append((done.task.node, done.task.step)))
    assert not stopped
    for node in plan.graph:
        steps = [s for n, s in order if n == node]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert [s for n, s in order if n == "train"] == [0, 1, 2, 3]
    for t in range(2, 4):  # generate(t) waits for param_update(t - 2)
        assert order.index(("param_update", t - 2)) < order.index(("generate", t))


def test_a_broken_plan_file_is_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text('{"name": "x",\n "spec": }')
    with pytest.raises(PlanError, match=r"plan.json:2:\d+: not JSON"):
        Plan.read(path)
    with pytest.raises(PlanError, match="not a plan"):
        Plan.from_dict({"name": "x"})
    newer = json.loads(quickstart().to_json()) | {"version": PLAN_VERSION + 1}
    with pytest.raises(PlanError, match="newer than this rlgraph reads"):
        Plan.from_dict(newer)
    broken = json.loads(quickstart().to_json())
    broken["schedule"]["period_s"] = "fast"
    with pytest.raises(PlanError, match=r"schedule\.period_s"):
        Plan.from_dict(broken)


def test_a_version_1_plan_json_gets_its_routes_and_gate_from_its_spec() -> None:
    plan = quickstart("schedule.max_lag=2")
    old = json.loads(plan.to_json())
    del old["version"], old["weight_sync"], old["lag"]["max_lag"]
    read = Plan.from_dict(old)
    assert read.version == PLAN_VERSION and read.lag.max_lag == 2
    assert read.weight_sync == plan.weight_sync
