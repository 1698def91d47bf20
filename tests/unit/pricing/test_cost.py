"""Cost models: the properties that make async pay, overrides, the switch, calibration."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_support import COST_NODES as NODES
from rl_support import cost_spec as spec_of
from rl_support import costs_of

from rlgraph.compiler import compile_plan, sync_spec
from rlgraph.compiler.calibrate import (
    CalibrationError,
    calibration_from_events,
    load_calibration,
)
from rlgraph.compiler.costs import switch_seconds
from rlgraph.compiler.placement import place
from rlgraph.compiler.shapes import shape_of
from rlgraph.compiler.trust import SPLIT_TRAINER_CAVEAT
from rlgraph.lengths import LengthModel, expected_max, moments
from rlgraph.presets.gpus import GPU_PRESETS
from rlgraph.presets.models import MODEL_PRESETS, model_shape
from rlgraph.pricing.constant_sources import COST_SOURCES
from rlgraph.pricing.constants import COSTS, CostConstants, pass_efficiency
from rlgraph.pricing.param_update import switch_cost
from rlgraph.pricing.system import SYSTEMS

VERL = {"system": "verl"}  # priced as verl's hybrid engine

pytestmark = pytest.mark.usefixtures("memory_unchecked")  # costs, not memory


def seconds(spec: Any, node: str) -> float:
    return costs_of(spec)[node].seconds


def test_every_cost_constant_has_a_source() -> None:
    names = {f.name for f in dataclasses.fields(CostConstants)}
    assert names == set(COST_SOURCES)
    assert all(len(COST_SOURCES[n]) > 20 for n in names)


def test_decode_is_nearly_flat_in_batch() -> None:
    small = seconds(spec_of(data={"prompts_per_step": 16, "samples_per_prompt": 4,
                                  "prompt_len": 64, "response_len": 512}), "generate")
    large = seconds(spec_of(data={"prompts_per_step": 32, "samples_per_prompt": 4,
                                  "prompt_len": 64, "response_len": 512}), "generate")
    assert small < large < 1.25 * small  # twice the batch, far less than twice the time


def round_steps(m: LengthModel, k: int, oversample: float) -> float:
    """Decode steps of one partial-rollout round in steady state, when a round admits new
    groups only at its start and ends once a batch of groups is complete: a group of k
    samples needs M = max of its k lengths steps, i.e. ceil(M / T) rounds of T steps, and
    with `oversample` batches' worth of groups in flight and one batch leaving per round,
    E[ceil(M / T)] = oversample (Little's law); T solves it (max for oversample <= 1)."""
    if oversample <= 1:
        return m.max

    def rounds(t: float) -> float:  # E[ceil(M / t)] = sum over j >= 0 of P(M > j t)
        total, j = 0.0, 0
        while j * t < m.max:
            total += 1.0 - m.cdf(j * t) ** k
            j += 1
        return total

    lo, hi = 1e-3 * m.max, m.max
    for _ in range(50):
        mid = (lo + hi) / 2
        if rounds(mid) > oversample:
            lo = mid
        else:
            hi = mid
    return hi


def test_partial_rollout_is_cheaper_than_sync_for_long_tails() -> None:
    data = {"prompts_per_step": 32, "samples_per_prompt": 4, "prompt_len": 256,
            "response_len": {"mean": 1024, "max": 8192}}
    sync = seconds(spec_of(data=data), "generate")
    # max_lag 2: the split plan's generate runs a version behind its step (`generate_lag`),
    # so a group it starts can still be carried one round
    lagged = {"partial_rollout": True, "max_lag": 2}
    cost = costs_of(spec_of(data=data, schedule=lagged))["generate"]
    partial = cost.seconds
    # rounds admit only at their start: the simulated rounds (`rollout_rounds`) agree with
    # Little's law, T with E[ceil(max of 4 / T)] = 2 (~1.4k steps) instead of the expected
    # longest of a replica's 32 (~5.1k of 8192)
    rounds = round_steps(LengthModel(1024, 8192), 4, 2.0)
    assert 1200 < rounds < 1600
    steps = float(cost.detail.split("decode ")[1].split(" steps")[0])
    assert 0.85 * rounds < steps < 1.15 * math.ceil(rounds / 8) * 8
    assert partial < 0.4 * sync
    flat = dict(data, response_len={"mean": 1024, "max": 1024})
    one = dict(NODES, generate={"oversample": 1})
    same = [seconds(spec_of(data=flat, nodes=one, schedule=dict(lagged, partial_rollout=p)),
                    "generate") for p in (False, True)]
    # no tail, no spare rows: nothing to gain (the sync model's lognormal survival curve
    # lets a few rows of a fixed length finish early; the simulated rounds keep all)
    assert same[0] <= same[1] < 1.05 * same[0]
    # no tail but twice the rows in flight: half the decode steps (decode is flat in batch)
    spare = seconds(spec_of(data=flat, schedule=lagged), "generate")
    assert 0.45 * same[0] < spare < 0.75 * same[0]


def floor(spec: Any, passes: int) -> float:
    """The eager host floor verl-priced plans add to a pass over the step's batch (one
    micro-batch)."""
    return passes * shape_of(spec).layers * COSTS.native_decode_overhead_per_layer_s


def pass_seconds(spec: Any, flops_per_param: int, gpus: int) -> float:
    """The device time of a pass over a fixed-length batch (rlgraph's runtime: padded rows)
    on H100s: flops_per_param x matmul params per token plus flops_per_param / 2 forwards of
    causal attention over each row at the GEMM efficiency, the eager activation traffic and
    the fp32 log-prob head at HBM speed."""
    data, shape = spec.data, shape_of(spec)
    width = data.prompt_len + data.response_len.max
    rows = data.samples_per_step()
    h100 = GPU_PRESETS["H100"]
    flops = (flops_per_param * shape.matmul_active * rows * width
             + flops_per_param / 2 * shape.attention_flops(width) * rows)
    activations = (rows * width * shape.layers * shape.hidden
                   * COSTS.eager_activation_bytes_per_hidden * flops_per_param / 2
                   / (h100.hbm_bytes_per_s * COSTS.decode_hbm_efficiency * gpus))
    return (flops / (h100.bf16_flops * COSTS.gemm_efficiency * gpus) + activations
            + head(spec, flops_per_param, gpus))


def replicas(spec: Any, backward: bool, gpus: int) -> float:
    """What data-parallel replicas add to a call: the dispatch, and after a backward the
    ring all-reduce of the bf16 gradients over NVLink."""
    gradient = 2 * shape_of(spec).params * 2 * (gpus - 1) / gpus
    return COSTS.replica_dispatch_s + backward * gradient / GPU_PRESETS[
        "H100"].nvlink_bytes_per_s


def head(spec: Any, flops_per_param: int, gpus: int) -> float:
    """rlgraph's fp32 log-prob head over the padded batch on H100s: the bytes per logit of
    the forward (and of the backward for a training pass) at HBM speed."""
    data, shape = spec.data, shape_of(spec)
    tokens = data.samples_per_step() * (data.prompt_len + data.response_len.max)
    per_logit = COSTS.logits_bytes_forward + (COSTS.logits_bytes_backward
                                              if flops_per_param > 2 else 0)
    h100 = GPU_PRESETS["H100"]
    return (tokens * shape.vocab * per_logit
            / (h100.hbm_bytes_per_s * COSTS.decode_hbm_efficiency * gpus))


def test_forward_and_train_are_compute_bound_and_scale_with_gpus() -> None:
    # rlgraph's runtime: the device's work scales with GPUs, the replicas' dispatch does not;
    # a 7B pass is device-bound (the host's launches take far less)
    four = costs_of(spec_of())
    eight = costs_of(spec_of(cluster={"nodes": 2, "gpus_per_node": 8, "gpu": "H100"}))
    dispatch = COSTS.replica_dispatch_s
    assert four["logp"].seconds - dispatch == pytest.approx(
        2 * (eight["logp"].seconds - dispatch))
    assert four["logp"].seconds == pytest.approx(pass_seconds(spec_of(), 2, 4) + dispatch)
    assert four["train"].seconds == pytest.approx(pass_seconds(spec_of(), 6, 4)
                                                  + replicas(spec_of(), True, 4))
    ratio = ((pass_seconds(spec_of(), 6, 4) - head(spec_of(), 6, 4))
             / (pass_seconds(spec_of(), 2, 4) - head(spec_of(), 2, 4)))
    assert ratio == pytest.approx(3)  # 6N vs 2N (and 3 vs 1 attention forwards)
    assert head(spec_of(), 6, 4) / head(spec_of(), 2, 4) == pytest.approx(62 / 28)
    assert floor(spec_of(), 3) < pass_seconds(spec_of(), 6, 4)


def test_flops_leave_out_the_input_embedding_and_count_attention() -> None:
    # an untied input table is a lookup (no FLOPs, not read by decode); a tied one is the
    # output head and stays; attention grows with the square of the sequence
    qwen7, qwen05 = shape_of(spec_of()), shape_of(spec_of(model={"preset": "qwen2.5-0.5b"}))
    assert qwen7.params - qwen7.matmul_params == qwen7.vocab * qwen7.hidden
    assert qwen05.matmul_params == qwen05.params  # tie_word_embeddings
    assert qwen7.attention_flops(2048) == pytest.approx(4 * qwen7.attention_flops(1024))
    assert qwen7.attention_flops(1024) == 2 * 28 * 28 * 128 * 1024 ** 2
    short = spec_of()
    long = spec_of(data={"prompts_per_step": 32, "samples_per_prompt": 2, "prompt_len": 256,
                         "response_len": {"mean": 1280, "max": 1280}})  # same tokens
    assert seconds(long, "logp") > seconds(short, "logp")
    assert seconds(long, "logp") - COSTS.replica_dispatch_s == pytest.approx(
        pass_seconds(long, 2, 4))


def test_moe_counts_active_parameters_and_pays_the_expert_all_to_all() -> None:
    moe = spec_of(model={"preset": "red-moe-16b"})
    shape = shape_of(moe)
    assert shape.active_params < 0.3 * shape.params and shape.moe_layers == 27
    assert seconds(moe, "train") == pytest.approx(pass_seconds(moe, 6, 4)
                                                  + replicas(moe, True, 4))
    ep4 = spec_of(model={"preset": "red-moe-16b"}, nodes=dict(NODES, train={"ep": 4}))
    data = ep4.data
    tokens = data.samples_per_step() * (data.prompt_len + data.response_len.max)
    # 3 forward-equivalents x 27 layers x top 6 x there and back x 3/4 off the GPU, bf16
    exchange = tokens * 27 * 6 * 2 * 0.75 * shape.hidden * 2 * 3 / 4 / GPU_PRESETS[
        "H100"].nvlink_bytes_per_s
    assert seconds(ep4, "train") - seconds(moe, "train") == pytest.approx(exchange)


def test_moe_passes_run_below_the_dense_roofline_figure(monkeypatch: Any) -> None:
    verl = {**NODES, "generate": {"engine": "sglang"}}  # verl-priced: the roofline figure
    moe = spec_of(model={"preset": "red-moe-16b"}, nodes=verl, pricing=VERL)
    dense = spec_of(nodes=verl, pricing=VERL)
    h100 = GPU_PRESETS["H100"]
    figure = pass_efficiency(h100.bf16_flops, h100.hbm_bytes_per_s) * COSTS.moe_pass_factor
    priced = {name: costs_of(spec)["train"] for name, spec in (("moe", moe), ("dense", dense))}
    assert f"at {figure:.0%} of" in priced["moe"].detail
    assert 0.5 < COSTS.moe_pass_factor < 1.0
    monkeypatch.setattr("rlgraph.pricing.passes.COSTS",
                        dataclasses.replace(COSTS, moe_pass_factor=1.0))
    assert seconds(moe, "train") < priced["moe"].seconds  # the factor slows MoE passes
    assert seconds(dense, "train") == pytest.approx(priced["dense"].seconds)  # dense untouched
    monkeypatch.setattr("rlgraph.pricing.passes.COSTS", COSTS)  # (not undo: memory_unchecked)
    said = [a for a in compile_plan(moe).trust.assumptions if "passes run at" in a]
    assert said and f"{figure:.0%} of H100" in said[0] and "routed experts" in said[0]


def test_qwen3_moe_preset_reads_num_experts() -> None:
    shape = model_shape(MODEL_PRESETS["qwen3-30b-a3b"])  # the released model's vocabulary
    # Qwen/Qwen3-30B-A3B's model card: 30.5B parameters, 3.3B activated, 48 layers
    assert shape.params == pytest.approx(30.5e9, rel=0.01)
    assert shape.active_params == pytest.approx(3.3e9, rel=0.03)
    assert (shape.moe_layers, shape.top_k, shape.kv_heads, shape.head_dim) == (48, 8, 4, 128)


@pytest.mark.parametrize("preset, billions", [
    ("qwen3-8b", 8.2), ("qwen3-14b", 14.8), ("qwen3-32b", 32.8), ("llama-3.1-8b", 8.03)])
def test_dense_presets_hold_their_model_cards_parameters(preset: str, billions: float) -> None:
    """Each preset's shape adds up to the parameter count its model card states."""
    assert model_shape(MODEL_PRESETS[preset]).params == pytest.approx(billions * 1e9, rel=0.01)


def test_cost_overrides() -> None:
    nodes = dict(NODES, train={"cost": {"gpu_seconds": 8.0}}, logp={"cost": {"seconds": 1.5}})
    costs = costs_of(spec_of(nodes=nodes))
    assert costs["train"].seconds == pytest.approx(2.0)  # 8 GPU-seconds over 4 GPUs
    assert costs["train"].source == "override" and "/ 4 GPUs" in costs["train"].detail
    assert costs["logp"].seconds == 1.5 and costs["logp"].source == "override"
    assert costs["generate"].source == "model"


def test_param_update_link_and_buckets() -> None:
    def pu(**kw: Any) -> float:
        nodes = dict(NODES, param_update=kw)
        return seconds(spec_of(nodes=nodes, model={"preset": "qwen2.5-7b"}), "param_update")

    nvlink = pu()
    store = pu(transport="object_store")
    assert store > 50 * nvlink  # 0.76 GB/s against 340 GB/s
    weights = 2 * shape_of(spec_of()).params
    assert nvlink > weights / GPU_PRESETS["H100"].nvlink_bytes_per_s
    tiny_buckets = pu(bucket_mb={"produce": 16, "consume": 16})
    assert tiny_buckets > nvlink  # a fixed overhead per bucket
    across = seconds(spec_of(cluster={"nodes": 2, "gpus_per_node": 4, "gpu": "H100"}),
                     "param_update")
    h100 = GPU_PRESETS["H100"]
    slower = weights / h100.network_bytes_per_s - weights / h100.nvlink_bytes_per_s
    assert across == pytest.approx(nvlink + slower)  # the network, not NVLink
    on_h800 = {"nodes": 1, "gpus_per_node": 8, "gpu": "H800"}
    h800 = spec_of(cluster=on_h800)
    verl = dict(NODES, generate={"engine": "sglang"})  # passes without rlgraph's all-reduce
    assert seconds(spec_of(nodes=verl, pricing=VERL, cluster=on_h800), "train") == pytest.approx(
        seconds(spec_of(nodes=verl, pricing=VERL), "train"))  # the same GH100 compute, HBM
    cut = weights / GPU_PRESETS["H800"].nvlink_bytes_per_s - weights / h100.nvlink_bytes_per_s
    assert seconds(h800, "param_update") == pytest.approx(nvlink + cut)  # NVLink at 400 GB/s
    b200 = spec_of(nodes=verl, pricing=VERL,
                   cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "B200"})
    dense = seconds(spec_of(nodes=verl, pricing=VERL), "train")
    assert seconds(b200, "train") < dense / 2  # 2.3x the peak


def test_colocating_train_with_generate_pays_the_switch() -> None:
    sglang = dict(NODES, generate={"engine": "sglang"})
    apart = spec_of(groups={"trainer": {"share": 0.5, "tasks": ["logp", "train"]},
                            "rollout": {"share": 0.5, "tasks": ["generate"]}},
                    nodes=sglang, pricing=VERL)
    hybrid = {"hybrid": {"share": 0.5, "tasks": ["generate", "logp", "train"]}}
    together = spec_of(groups=hybrid, nodes=sglang, pricing=VERL)
    shape = shape_of(together)
    switch = switch_seconds(together, place(together), "hybrid", shape)
    # verl's hybrid engine: offload + sleep/wake over PCIe, and the refit at the stated path's
    # measured rate (bucketed by default; per_tensor 10x slower)
    verl = SYSTEMS["verl"]
    assert switch > 2 * shape.params / verl.refit["bucketed"]
    per_tensor = spec_of(groups=hybrid, nodes=sglang, pricing={**VERL, "refit": "per_tensor"})
    slower = switch_seconds(per_tensor, place(per_tensor), "hybrid", shape) - switch
    assert slower == pytest.approx(2 * shape.params * (1 / verl.refit["per_tensor"]
                                                       - 1 / verl.refit["bucketed"]))
    generate = costs_of(together)["generate"]
    # apart, generate pays only the dual-buffer switch (the receive overlaps generation)
    gpu = GPU_PRESETS[apart.cluster.gpu]
    dual = switch_cost(apart.nodes["generate"], shape, gpu, local=False)
    assert 0 < dual < switch / 10 and "dual-buffer switch" in costs_of(apart)["generate"].detail
    assert dual == pytest.approx(4 * shape.params / gpu.hbm_bytes_per_s)  # bf16 read + write
    assert generate.seconds == pytest.approx(costs_of(apart)["generate"].seconds - dual + switch)
    assert "colocation switch" in generate.detail
    # rlgraph's own runtime decodes with the training weights: no switch, whatever the engine
    for native in (spec_of(groups=hybrid), spec_of(groups=hybrid, nodes=sglang)):
        assert switch_seconds(native, place(native), "hybrid", shape) == 0.0
        assert "switch" not in costs_of(native)["generate"].detail
    local = spec_of(groups={"hybrid": {"share": 1.0, "tasks": ["generate", "logp", "train"]}},
                    cluster={"local": True, "cpus": 2}, model={"preset": "tiny"})
    assert switch_seconds(local, place(local), "hybrid", shape_of(local)) == 0.0


def test_verl_baseline_computes_old_log_prob_and_names_what_it_prices() -> None:
    nodes = {"generate": {"engine": "sglang"}, "reward": {}, "train": {}, "param_update": {}}
    groups = {"trainer": {"share": 0.5, "tasks": ["train"]},
              "rollout": {"share": 0.5, "tasks": ["generate"]}}
    spec = spec_of(groups=groups, nodes=nodes, pricing=VERL)
    plan = compile_plan(spec)
    assert plan["pricing"]["runtime"] == "verl hybrid engine"
    base = sync_spec(spec)  # verl computes old_log_prob in its hybrid engine
    assert base.nodes["old_log_prob"].kind == "logp"
    assert "old_log_prob" in base.groups["colocated"].tasks
    assert "old_log_prob" not in sync_spec(spec_of(groups=groups, nodes=dict(
        nodes, generate={}))).nodes  # rlgraph's runtime: train recomputes them itself
    assert any("switch" in line for line in plan["trust"]["assumptions"])
    assert SPLIT_TRAINER_CAVEAT in plan["trust"]["assumptions"]  # verl's split trainers
    colocated = compile_plan(spec_of(groups={"all": {"share": 1.0, "tasks": [
        "generate", "train"]}}, nodes=nodes))
    assert SPLIT_TRAINER_CAVEAT not in colocated["trust"]["assumptions"]
    generate_bound = compile_plan(spec_of(groups=groups, nodes=nodes, data={
        "prompts_per_step": 4, "samples_per_prompt": 4, "prompt_len": 64,
        "response_len": {"mean": 2000, "max": 32768}}))  # train a sliver of the work
    assert SPLIT_TRAINER_CAVEAT not in generate_bound["trust"]["assumptions"]
    without = compile_plan(spec_of(groups=groups, nodes=dict(nodes, generate={})))
    assert SPLIT_TRAINER_CAVEAT not in without["trust"]["assumptions"]  # rlgraph's runtime
    assert without["pricing"]["runtime"] == "rlgraph runtime"
    assert not without["trust"]["calibrated"]
    assert not any("CPU costs" in line for line in plan["trust"]["assumptions"])
    local = compile_plan(spec_of(groups=groups, nodes=dict(nodes, generate={}),
                                 cluster={"local": True, "cpus": 2}, model={"preset": "tiny"}))
    said = [line for line in local["trust"]["assumptions"] if "CPU costs" in line]
    assert said and "--calibrate" in said[0]  # a local plan names the host it was priced on


def test_long_tails_and_many_ranks_slow_a_step() -> None:
    flat = {"prompts_per_step": 32, "samples_per_prompt": 4, "prompt_len": 256,
            "response_len": {"mean": 512, "max": 512}}
    tail = dict(flat, response_len={"mean": 512, "max": 8192, "sigma": 1.5})
    assert seconds(spec_of(data=tail), "generate") > 2 * seconds(spec_of(data=flat), "generate")
    # equal mean, but the slowest data-parallel rank carries more tokens
    assert seconds(spec_of(data=tail), "train") > 1.1 * seconds(spec_of(data=flat), "train")


def trace(spans: list[tuple[str, int, float, float, list[str]]]) -> dict[str, Any]:
    """A Chrome trace as the runtime writes it; a two-group node appears once per group."""
    events = []
    for node, step, start, dur, groups in spans:
        for pid, group in enumerate(groups or [None]):
            events.append({"name": node, "cat": node, "ph": "X", "ts": start * 1e6,
                           "dur": dur * 1e6, "pid": pid, "tid": 0,
                           "args": {"node": node, "step": step, "group": group,
                                    "occupies": groups}})
    events.append({"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "trainer"}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


SPANS = [("generate", s, 10.0 * s, d, ["rollout"]) for s, d in enumerate([9.0, 2.0, 3.0, 4.0])]
SPANS += [("param_update", s, 10.0 * s + 5, 0.5, ["trainer", "rollout"]) for s in range(4)]
SPANS += [("reward", 0, 2.0, 0.25, [])]


def test_load_calibration_takes_medians_without_warmup(tmp_path: Path) -> None:
    file = tmp_path / "trace.json"
    file.write_text(json.dumps(trace(SPANS)))
    for path in (file, tmp_path):
        calibration = load_calibration(path)
        assert calibration["generate"] == pytest.approx(3.0)  # median of 2, 3, 4 (9 dropped)
        assert calibration["param_update"] == pytest.approx(0.5)  # two lanes, counted once
        assert calibration["reward"] == pytest.approx(0.25)  # one step: nothing to drop
    events = [{"node": "x", "step": s, "start": 0.0, "end": d} for s, d in enumerate([5, 1])]
    assert calibration_from_events(events) == {"x": 3.0}  # two steps: keep both


def test_calibration_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match="no such file"):
        load_calibration(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  oops")
    with pytest.raises(CalibrationError, match=r"bad\.json:2:3: not valid JSON"):
        load_calibration(bad)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(CalibrationError, match="no node spans"):
        load_calibration(empty)


def test_compile_plan_uses_calibration_and_carries_it_to_the_baseline() -> None:
    spec = spec_of()
    plain = compile_plan(spec)
    measured = {"generate": 2 * plain["costs"]["generate"]["seconds"], "ghost": 1.0}
    plan = compile_plan(spec, measured)
    cost = plan["costs"]["generate"]
    assert cost["source"] == "calibrated" and cost["seconds"] == measured["generate"]
    assert plan["costs"]["train"]["source"] == "model"
    assert plan["trust"]["calibrated_nodes"] == ["generate"] and not plain["trust"]["calibrated"]
    assert any("ghost" in m for m in plan["messages"])
    assert plan["schedule"]["sync_period_s"] > plain["schedule"]["sync_period_s"]
    events = [{"node": "generate", "step": 0, "start": 0.0, "end": measured["generate"]}]
    assert compile_plan(spec, events)["costs"]["generate"]["seconds"] == measured["generate"]


@settings(max_examples=20, deadline=None, derandomize=True)
@given(mean=st.floats(1, 4000), spread=st.floats(1.0, 20.0), sigma=st.floats(0.1, 2.0),
       dist=st.sampled_from(["lognormal", "pareto"]), n=st.integers(1, 512))
def test_length_statistics_respect_the_clip(mean: float, spread: float, sigma: float,
                                            dist: str, n: int) -> None:
    model = LengthModel(mean, mean * spread, dist, sigma, 1.5)
    clipped_mean, second = moments(model)
    # clipping at max lowers the mean; lengths below 1 count as 1 (rlgraph.lengths.LengthModel.draw)
    assert clipped_mean <= mean + 1 and second >= clipped_mean ** 2 * (1 - 1e-6)
    longest = expected_max(model, n)
    assert longest <= model.max * (1 + 1e-9)
    assert expected_max(model, n + 1) >= longest - 1e-9  # more samples, a longer tail
    assert longest >= expected_max(model, 1) - 1e-9


def test_pass_efficiency_follows_the_roofline() -> None:
    # the reference GPU (A100) sustains the cited figure; a lower ridge point (H20) sustains
    # more of its peak, a higher one (H100) less; never above the GEMM efficiency
    a100, h100, h20 = (GPU_PRESETS[g] for g in ("A100", "H100", "H20"))
    assert pass_efficiency(a100.bf16_flops, a100.hbm_bytes_per_s) == pytest.approx(
        COSTS.reference_mfu, rel=1e-3)
    effs = [pass_efficiency(g.bf16_flops, g.hbm_bytes_per_s) for g in (h20, a100, h100)]
    assert effs == sorted(effs, reverse=True)
    assert all(0 < e < COSTS.gemm_efficiency for e in effs)


def test_half_the_gpus_never_trains_more_than_twice_as_slow() -> None:
    # long-tailed lengths: the slowest rank's share shrinks relative to the mean with fewer
    # ranks, so halving the GPUs costs at most 2x the compute (the host floor stays)
    for sigma in (0.3, 1.0, 2.0):
        data = {"prompts_per_step": 512, "samples_per_prompt": 16, "prompt_len": 256,
                "response_len": {"mean": 700, "max": 28672, "sigma": sigma}}
        verl = {**NODES, "generate": {"engine": "sglang"}}  # packed, slowest rank priced
        many = costs_of(spec_of(data=data, nodes=verl, pricing=VERL, cluster={
            "nodes": 4, "gpus_per_node": 8, "gpu": "H20"}))["train"].seconds
        half = costs_of(spec_of(data=data, nodes=verl, pricing=VERL, cluster={
            "nodes": 2, "gpus_per_node": 8, "gpu": "H20"}))["train"].seconds
        assert many < half <= 2 * many + 1e-9


def test_verl_priced_fsdp_train_pays_the_activation_recompute() -> None:
    # verl checkpoints activations by default: its train does 8N per token, rlgraph's 6N
    # (a logp node feeds both, so neither adds the proximal forward); megatron does not
    def train_over_logp(engine: str, backend: str = "torch") -> float:
        nodes = {**NODES, "generate": {"engine": engine}, "train": {"backend": backend},
                 "logp": {"backend": backend}}
        system = {"system": "verl" if engine == "sglang" else "rlgraph"}
        costs = costs_of(spec_of(nodes=nodes, pricing=system))

        def driver(node: str) -> float:  # verl's driver moving the batch: not FLOPs
            detail = costs[node].detail
            return float(detail.split("driver transfer ")[1].split(" s")[0]) if (
                "driver transfer" in detail) else 0.0

        return (costs["train"].seconds - driver("train") - floor(
            spec_of(), 4 if engine == "sglang" and backend == "torch" else 3)) / (
            costs["logp"].seconds - driver("logp") - floor(spec_of(), 1))

    assert train_over_logp("sglang") == pytest.approx(4, rel=1e-4)  # detail: 3 digits
    assert train_over_logp("sglang", "megatron") == pytest.approx(3, rel=1e-4)


def test_decode_attention_adds_to_compute_bound_gemms() -> None:
    # on H20 a large batch is compute-bound in its GEMMs; the KV reads of attention run
    # after them, so longer contexts still cost time (a max() would hide them)
    from rlgraph.pricing.context import CostContext
    from rlgraph.pricing.decode_step import decode_step_seconds

    spec = spec_of(cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "H20"})
    node = spec.nodes["generate"]
    ctx = CostContext(spec=spec, name="generate", shape=shape_of(spec),
                      gpu=GPU_PRESETS["H20"], gpus=4, colocated=frozenset(), extra={})
    rows = 1024
    gemm = 2 * ctx.shape.matmul_active * rows / (GPU_PRESETS["H20"].bf16_flops
                                                  * COSTS.gemm_efficiency)
    assert gemm > 2 * ctx.shape.matmul_params / GPU_PRESETS["H20"].hbm_bytes_per_s
    short, long = (decode_step_seconds(rows, c, node, ctx) for c in (256, 4096))
    kv = rows * (4096 - 256) * ctx.shape.kv_bytes_per_token() / (
        GPU_PRESETS["H20"].hbm_bytes_per_s * COSTS.decode_hbm_efficiency)
    assert long - short == pytest.approx(kv, rel=1e-6)
    assert short > gemm


def test_decode_grows_with_the_second_moment_at_a_fixed_mean() -> None:
    # same mean and max, wider spread: more KV read per step (E[L^2]) and a longer tail
    def gen(sigma: float) -> float:
        data = {"prompts_per_step": 32, "samples_per_prompt": 4, "prompt_len": 256,
                "response_len": {"mean": 1000, "max": 16384, "sigma": sigma}}
        return seconds(spec_of(data=data), "generate")

    narrow, mid, wide = gen(0.3), gen(1.0), gen(1.8)
    assert narrow < mid < wide


def test_length_sorted_passes_price_the_tokens_the_runtime_runs():
    """`micro_tokens` passes pad each pass to its own longest (rounded up to the block, at most
    the batch's width): a fixed length is not padded; a long tail costs between the packed
    tokens and the batch padded to its longest."""
    from rlgraph import lengths

    fixed = lengths.LengthModel(mean=300, max=300)
    tokens, square = lengths.sorted_pass_tokens(fixed, 64, 8, 16384, 256)
    assert tokens == 64 * (8 + 300) and square == 64 * (8 + 300) ** 2
    tail = lengths.LengthModel(mean=512, max=8192, sigma=1.5)
    tokens, _ = lengths.sorted_pass_tokens(tail, 512, 8, 16384, 256)
    mean, _ = lengths.moments(tail)
    assert 512 * (8 + mean) < tokens < 0.2 * 512 * (8 + lengths.expected_max(tail, 512))


def test_a_streamed_version_pads_and_sorts_each_mini_batch_among_its_own_rows():
    """With streaming, train and logp run once per mini-batch over its rows alone
    (`passes.streamed_calls`): a version of four streamed mini-batches costs four calls of a
    quarter of its rows, more than one call over the whole version, whose length-sorted
    passes pad less (bench/results/gpu-inflight-1gpu-long.json: 0.83 s a 64-row call)."""
    from rlgraph.config.load import load_spec

    graph = Path(__file__).resolve().parents[3] / "bench" / "graphs_gpu" / "longtail-1gpu.yaml"
    base = ["cluster.gpus_per_node=1", "cluster.gpu=H200", "schedule.partial_rollout=true",
            "schedule.max_lag=3"]
    streamed = costs_of(load_spec(graph, [*base, "data.prompts_per_step=32",
                                          "schedule.stream={mini_batches: 4}"]))
    whole = costs_of(load_spec(graph, [*base, "data.prompts_per_step=32"]))
    quarter = costs_of(load_spec(graph, [*base, "data.prompts_per_step=8"]))
    for node in ("train", "logp"):
        assert streamed[node].seconds == pytest.approx(4 * quarter[node].seconds, rel=0.02)
        assert streamed[node].seconds > 1.2 * whole[node].seconds


def test_a_synchronous_call_decodes_until_the_longest_sample_of_all_its_replicas() -> None:
    """A synchronous generate returns when its slowest replica does, and the longest of the
    replicas' longest samples is the longest of the whole batch: with 4 rollout GPUs of one
    replica each, the call decodes E[max of all 256 lengths] steps, not E[max] of one
    replica's 64; one replica of the same 64 rows decodes its own expected longest."""
    tail = {"mean": 500, "max": 8192, "sigma": 1.0}
    model = LengthModel(mean=500, max=8192, sigma=1.0)
    nodes = {**NODES, "generate": {"kind": "generate", "engine": "sglang"}}

    def steps(prompts: int, gpus: int) -> float:
        spec = spec_of(data={"prompts_per_step": prompts, "samples_per_prompt": 4,
                             "prompt_len": 64, "response_len": tail}, nodes=nodes,
                       cluster={"nodes": 1, "gpus_per_node": gpus, "gpu": "H100"})
        detail = costs_of(spec)["generate"].detail
        return float(detail.split("decode ")[1].split(" steps")[0])

    assert steps(64, 8) == pytest.approx(expected_max(model, 256), abs=1)
    assert steps(16, 2) == pytest.approx(expected_max(model, 64), abs=1)
    assert expected_max(model, 256) > expected_max(model, 64) + 100
