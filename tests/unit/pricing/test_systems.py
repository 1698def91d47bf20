"""The priced system is a stated fact of the plan: `pricing.system` / `pricing.refit`, the
table of systems, `--baseline`, and calibration carried across plans."""

from __future__ import annotations

import typing

import pytest
from rl_support import COST_NODES, cost_spec, costs_of

from rlgraph.cli.run import refuse_other_system
from rlgraph.compiler import compile_plan
from rlgraph.compiler.calibrate import carried_scale, carry
from rlgraph.config.schema import PricingSpec
from rlgraph.errors import SpecError
from rlgraph.nodes import KINDS
from rlgraph.pricing.system import (
    CURRENT_ENGINE,
    ENGINE_REVISIONS,
    ENGINE_SOURCES,
    SOURCES,
    SYSTEMS,
)

pytestmark = pytest.mark.usefixtures("memory_unchecked")  # costs, not memory

COLOCATED = {"all": {"share": 1.0, "tasks": ["generate", "logp", "train"]}}


def test_every_number_of_a_system_row_names_its_source() -> None:
    for name, system in SYSTEMS.items():
        assert name in SOURCES and system.name == name
        for path in system.refit:
            assert f"refit.{path}" in SOURCES[name]
        assert system.default_refit is None or system.default_refit in system.refit
    assert SYSTEMS["verl"].refit["bucketed"] > 5 * SYSTEMS["verl"].refit["per_tensor"]


def test_the_engine_prices_the_decode_and_the_system_prices_the_switch() -> None:
    sglang = {**COST_NODES, "generate": {"engine": "sglang"}}
    rlgraph = costs_of(cost_spec(groups=COLOCATED, nodes=sglang))
    verl = costs_of(cost_spec(groups=COLOCATED, nodes=sglang, pricing={"system": "verl"}))
    assert "switch" not in rlgraph["generate"].detail
    assert "colocation switch" in verl["generate"].detail
    plan = compile_plan(cost_spec(groups=COLOCATED, nodes=sglang))
    assert any("pricing.system: verl" in m for m in plan.messages)  # the old meaning, hinted


def test_baseline_names_the_system_and_every_system_is_kept() -> None:
    split = cost_spec()
    own, against_verl = compile_plan(split), compile_plan(split, baseline="verl")
    assert own.pricing.baseline == "rlgraph" and against_verl.pricing.baseline == "verl"
    assert set(own.pricing.baselines) == set(SYSTEMS)
    assert against_verl.schedule.sync_period_s == pytest.approx(own.pricing.baselines["verl"])
    assert own.schedule.sync_period_s == pytest.approx(own.pricing.baselines["rlgraph"])
    assert own.pricing.baselines["verl"] != own.pricing.baselines["rlgraph"]
    with pytest.raises(SpecError, match="unknown baseline"):
        compile_plan(split, baseline="nemo")


def test_a_calibration_carries_measured_over_modelled_to_another_plan() -> None:
    colocated, split = cost_spec(groups=COLOCATED), cost_spec()
    modelled = {n: c.modelled for n, c in costs_of(colocated).items()}
    measured = {"generate": 2 * modelled["generate"], "train": 0.5 * modelled["train"]}
    scale = carried_scale(measured, colocated)
    assert scale == pytest.approx({"generate": 2.0, "train": 0.5})
    # the pass nodes the run did not measure (logp, ref_logp) take train's passes' ratio
    passes = {n for n, node in colocated.nodes.items()
              if KINDS[node.kind].sequence_passes and n not in measured}
    assert passes
    own = carry(scale, colocated)
    assert {n: own[n] for n in measured} == pytest.approx(measured)  # its own plan
    assert {n: own[n] for n in passes} == pytest.approx({n: 0.5 * modelled[n] for n in passes})
    other = {n: c.modelled for n, c in costs_of(split).items()}
    assert carry(scale, split) == pytest.approx({"generate": 2 * other["generate"],
                                                 **{n: 0.5 * other[n] for n in passes},
                                                 "train": 0.5 * other["train"]})
    # an FSDP trainer is another program than the measured whole replicas: its model stays
    sharded = cost_spec(nodes={**dict(COST_NODES), "train": {"sharding": "fsdp"},
                               "logp": {"sharding": "fsdp"}})
    kept = carry(scale, sharded, colocated)
    assert "train" not in kept and kept["generate"] == pytest.approx(
        2 * costs_of(sharded)["generate"].modelled)
    assert "train" in carry(scale, sharded)  # (no measured plan given: every ratio carried)


def test_rlgraph_run_refuses_a_plan_priced_as_another_system() -> None:
    refuse_other_system(cost_spec())
    with pytest.raises(SpecError, match="priced as verl") as err:
        refuse_other_system(cost_spec(pricing={"system": "verl"}))
    assert err.value.key == ("pricing", "system")


def test_the_static_engine_is_priced_as_the_revision_that_ran() -> None:
    assert CURRENT_ENGINE in ENGINE_REVISIONS
    for name, revision in ENGINE_REVISIONS.items():
        assert revision.name == name
        assert set(ENGINE_SOURCES[name]) == {"host_seconds_per_step",
                                             "inflight_host_seconds_per_step"}
    literal = PricingSpec.model_fields["engine_revision"].annotation
    assert set(typing.get_args(typing.get_args(literal)[0])) == set(ENGINE_REVISIONS)
    steps = 512  # a fixed length: every replica decodes 512 steps
    today = costs_of(cost_spec())["generate"].modelled
    older = costs_of(cost_spec(pricing={"engine_revision": "per_slot"}))["generate"].modelled
    gap = (ENGINE_REVISIONS["per_slot"].host_seconds_per_step
           - ENGINE_REVISIONS[CURRENT_ENGINE].host_seconds_per_step)
    assert older - today == pytest.approx(steps * gap, rel=1e-6)
    assert today == pytest.approx(costs_of(cost_spec(pricing={
        "engine_revision": CURRENT_ENGINE}))["generate"].modelled)
    with pytest.raises(SpecError, match="revision") as err:  # rlgraph run runs today's
        refuse_other_system(cost_spec(pricing={"engine_revision": "per_slot"}))
    assert err.value.key == ("pricing", "engine_revision")
