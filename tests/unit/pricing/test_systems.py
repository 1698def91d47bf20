"""The priced system is a stated fact of the plan: `pricing.system` / `pricing.refit`, the
table of systems, `--baseline`, and calibration carried across plans."""

from __future__ import annotations

import typing

import pytest
from rl_support import COST_NODES, cost_spec, costs_of

from rlgraph.cli.run import refuse_other_system
from rlgraph.compiler import compile_plan
from rlgraph.compiler.calibrate import carried_scale, carry
from rlgraph.config.load import validate_spec
from rlgraph.config.schema import PricingSpec
from rlgraph.errors import SourceMap, SpecError
from rlgraph.nodes import KINDS
from rlgraph.pricing.engine_revisions import CURRENT_ENGINE, ENGINE_REVISIONS, ENGINE_SOURCES
from rlgraph.pricing.system import SYSTEMS
from rlgraph.pricing.system_sources import SOURCES

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


# The rows of frameworks with published async-vs-sync numbers, each field sourced.
FRAMEWORK_ROWS = ("slime", "openrlhf", "roll", "skyrl", "prime-rl", "pipelinerl")


def test_every_framework_row_sources_each_fact_it_prices() -> None:
    for name in FRAMEWORK_ROWS:
        system, sources = SYSTEMS[name], SOURCES[name]
        assert not system.runs_here
        for fact in ("colocated_switch", "old_logp_always", "packs_sequences"):
            assert sources.get(fact), (name, fact)
        assert sources.get("driver_transfer") or sources.get("batch_transfer"), name
        if system.colocated_switch:
            assert system.colocates and system.default_refit in system.refit
            assert sources.get("offload"), name
        else:
            assert not system.refit and sources.get("refit"), name
        for path, rate in system.refit.items():  # a measured rate, or NVLink said in words
            assert rate is not None or "NVLink" in sources[f"refit.{path}"], (name, path)


def test_every_system_prices_a_split_plans_baseline() -> None:
    split = cost_spec()
    for name in SYSTEMS:
        plan = compile_plan(split, baseline=name)
        assert plan.pricing.baseline == name and plan.schedule.sync_period_s > 0
        assert plan.schedule.sync_period_s == pytest.approx(plan.pricing.baselines[name])


def test_an_unknown_system_or_refit_path_names_the_key_and_the_known_ones() -> None:
    with pytest.raises(SpecError) as err:
        cost_spec(pricing={"system": "slimee"})
    assert err.value.key == ("pricing", "system")
    assert "did you mean 'slime'?" in err.value.message and "prime-rl" in err.value.message
    with pytest.raises(SpecError, match="no refit path 'per_tensor'") as err:
        cost_spec(pricing={"system": "slime", "refit": "per_tensor"})
    assert err.value.key == ("pricing", "refit") and "flattened" in err.value.hint
    with pytest.raises(SpecError, match="has no refit path") as err:
        cost_spec(pricing={"system": "areal", "refit": "bucketed"})
    assert "param_update" in err.value.hint
    with pytest.raises(SpecError, match="unknown baseline") as err:
        compile_plan(cost_spec(), baseline="skyrll")
    assert "did you mean 'skyrl'?" in err.value.hint


def test_a_refit_path_without_a_measurement_runs_at_the_presets_nvlink() -> None:
    from rlgraph.compiler.shapes import shape_of
    from rlgraph.presets.gpus import GPU_PRESETS

    sglang = {**COST_NODES, "generate": {"engine": "sglang"}}
    spec = cost_spec(groups=COLOCATED, nodes=sglang, pricing={"system": "openrlhf"})
    detail = costs_of(spec)["generate"].detail
    params = shape_of(spec).params
    refit = 2 * params / GPU_PRESETS["H100"].nvlink_bytes_per_s
    assert f"cuda_ipc refit {refit:.3g} s" in detail
    slime = costs_of(cost_spec(groups=COLOCATED, nodes=sglang, pricing={"system": "slime"}))
    assert f"flattened refit {2 * params / SYSTEMS['slime'].refit['flattened']:.3g} s" \
        in slime["generate"].detail
    plan = compile_plan(spec, baseline="verl")  # a baseline without the path: its default
    assert plan.pricing.baseline == "verl" and plan.pricing.refit == "cuda_ipc"


def test_a_system_that_syncs_apart_keeps_the_split_and_one_that_never_colocates_refuses_it(
) -> None:
    with pytest.raises(SpecError, match="GPUs apart") as err:
        compile_plan(cost_spec(groups=COLOCATED, pricing={"system": "prime-rl"}))
    assert err.value.key == ("groups", "all")
    for system in ("prime-rl", "areal"):  # AReaL colocates, but syncs on its allocation
        split = cost_spec(pricing={"system": system}, schedule={"max_lag": 1})
        plan = compile_plan(split)
        same_split_at_zero = compile_plan(cost_spec(pricing={"system": system},
                                                    schedule={"max_lag": 0}))
        assert plan.schedule.sync_period_s == pytest.approx(
            same_split_at_zero.schedule.period_s)
    compile_plan(cost_spec(groups=COLOCATED, pricing={"system": "areal"}))  # not refused
    from rlgraph.tune.search import tune

    ranked = tune(cost_spec(pricing={"system": "pipelinerl"}), top=20).top
    assert ranked and not any(  # tune never proposes a group PipelineRL could not run
        {"generate", "train"} <= set(group["tasks"]) for plan in ranked for group in plan.groups)
    assert "prime-rl" not in compile_plan(cost_spec(groups=COLOCATED)).pricing.baselines


def test_the_summary_says_which_workload_keys_a_foreign_run_left_at_rlgraphs_defaults() -> None:
    data = {"prompts_per_step": 32, "samples_per_prompt": 4,
            "response_len": {"mean": 512, "max": 1024}}
    def said(system: str) -> list[str]:
        plan = compile_plan(cost_spec(data=data, pricing={"system": system}))
        return [line for line in plan.trust.assumptions if "rlgraph's defaults" in line]
    [slime] = said("slime")
    assert "data.prompt_len 16" in slime and "data.response_len.sigma 1" in slime
    assert "prompts_per_step" not in slime and "micro_tokens" not in slime  # slime packs
    data["response_len"] = {"clipped_mean": 500, "max": 1024}  # the mean a run reports
    assert "response_len.mean" not in said("slime")[0]
    [roll] = said("roll")  # ROLL pads: its passes' width is the graph's to state
    assert "micro_tokens of logp, train" in roll
    assert said("rlgraph") == []  # rlgraph's own tasks are what its defaults describe
    bare = compile_plan(validate_spec({"pricing": {"system": "verl"}, "nodes": COST_NODES,
                                       "groups": COLOCATED}, SourceMap()))
    [line] = [a for a in bare.trust.assumptions if "rlgraph's defaults" in a]
    assert "cluster.gpu H200" in line and "preset tiny" in line
