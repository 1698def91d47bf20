"""Cost model terms measured on our own runs: decode floors and sampling, generate's host
time in rlgraph's runtime, a local process's threads."""

from __future__ import annotations

from typing import Any

import pytest
from rl_support import COST_NODES as NODES
from rl_support import cost_spec as spec_of
from rl_support import costs_of

from rlgraph.compiler.shapes import shape_of
from rlgraph.presets.gpus import GPU_PRESETS
from rlgraph.pricing.constants import COSTS
from rlgraph.pricing.context import CostContext
from rlgraph.pricing.decode_step import decode_step_seconds, per_layer_floor

pytestmark = pytest.mark.usefixtures("memory_unchecked")  # costs, not memory
VERL = {"system": "verl"}  # priced as verl's hybrid engine


def context(spec: Any, gpus: int = 4) -> CostContext:
    return CostContext(spec=spec, name="generate", shape=shape_of(spec),
                       gpu=GPU_PRESETS[spec.cluster.gpu], gpus=gpus, colocated=frozenset(),
                       extra={"local": spec.cluster.local})


def test_decode_floor_follows_the_engine_build() -> None:
    # compiled CUDA graphs (and SGLang) 47 us a layer; graphs without compile 133 us; the
    # dynamic cache pays the host per layer
    floors = {}
    for build in ("compiled", "graphs", "dynamic"):
        spec = spec_of(nodes=dict(NODES, generate={"cuda_decode": build}))
        floors[build] = per_layer_floor(spec.nodes["generate"], context(spec))[0]
    sglang = spec_of(nodes=dict(NODES, generate={"engine": "sglang"}))
    assert per_layer_floor(sglang.nodes["generate"], context(sglang))[0] == floors["compiled"]
    assert floors == {"compiled": COSTS.graph_decode_floor_per_layer_s,
                      "graphs": COSTS.graphs_only_decode_floor_per_layer_s,
                      "dynamic": COSTS.native_decode_overhead_per_layer_s}
    assert floors["compiled"] < floors["graphs"] < floors["dynamic"]


def test_every_decode_step_samples_its_rows_over_the_vocabulary() -> None:
    # memory-bound regime (few rows on an H100, sglang's split-KV attention): one more row
    # adds its KV and its fp32 logits
    spec = spec_of(nodes=dict(NODES, generate={"engine": "sglang"}))
    ctx = context(spec)
    node, shape, h100 = spec.nodes["generate"], ctx.shape, GPU_PRESETS["H100"]
    context_len = 1000
    one_more = decode_step_seconds(9, context_len, node, ctx) - decode_step_seconds(
        8, context_len, node, ctx)
    hbm = h100.hbm_bytes_per_s * COSTS.decode_hbm_efficiency
    kv = context_len * shape.kv_bytes_per_token() / hbm
    logits = shape.vocab * 4 * COSTS.sampling_logit_passes / hbm
    assert one_more == pytest.approx(kv + logits)


def test_native_attention_streams_kv_on_as_many_sms_as_it_has_blocks() -> None:
    # the dynamic decode's SDPA runs one block per (row, KV head): below the SM count, more
    # rows read their KV in the same time; above it, each row adds its KV at the lower of
    # HBM's bandwidth and the SMs' streaming rate
    spec = spec_of(nodes=dict(NODES, generate={"cuda_decode": "dynamic"}))
    ctx = context(spec)
    node, shape, h100 = spec.nodes["generate"], ctx.shape, GPU_PRESETS["H100"]
    full = h100.sms // shape.kv_heads  # rows that fill every SM

    def attention(rows: int, length: int) -> float:
        return (decode_step_seconds(rows, length, node, ctx)
                - decode_step_seconds(rows, 0, node, ctx))

    assert attention(4, 4000) == pytest.approx(attention(8, 4000), rel=0.02)
    hbm = h100.hbm_bytes_per_s * COSTS.decode_hbm_efficiency  # every SM streaming: HBM, or
    rate = min(hbm, h100.sms * COSTS.sdpa_decode_bytes_per_s_per_sm)  # the SMs where lower
    one_row = 4000 * shape.kv_bytes_per_token() / rate
    assert attention(full, 4000) == pytest.approx(full * one_row, rel=0.02)
    assert attention(2 * full, 4000) == pytest.approx(2 * attention(full, 4000), rel=0.02)
    assert attention(4, 4000) == pytest.approx(attention(full, 4000), rel=0.02)
    # the static engine's split-KV varlen kernel streams every row's KV at full bandwidth,
    # beyond the attention kernel's own time that the per-layer floor already holds
    static = spec_of()
    sctx = context(static)
    held = shape.layers * COSTS.decode_floor_attention_seconds_per_layer
    one_row = 4000 * shape.kv_bytes_per_token() / hbm
    for rows in (1, 4, full, 4 * full):
        assert (decode_step_seconds(rows, 4000, static.nodes["generate"], sctx)
                - decode_step_seconds(rows, 0, static.nodes["generate"], sctx)
                ) == pytest.approx(max(0.0, rows * one_row - held), rel=0.02, abs=1e-12)
    assert 4 * full * one_row > held  # (the last one pays)


def test_rlgraph_runtime_generate_pays_its_host_time_per_call_and_row() -> None:
    def generate(engine: str, prompts: int) -> tuple[float, str]:
        data = {"prompts_per_step": prompts, "samples_per_prompt": 4, "prompt_len": 256,
                "response_len": {"mean": 512, "max": 512}}
        cost = costs_of(spec_of(data=data, nodes=dict(NODES, generate={"engine": engine})))
        return cost["generate"].seconds, cost["generate"].detail

    (native, detail), (sglang, _) = generate("native", 32), generate("sglang", 32)
    assert "host" in detail
    # 4 GPUs, one replica each: 32 rows a replica; sglang is verl's engine, priced apart
    rows = 32 * 4 // 4
    host = COSTS.generate_call_overhead_s + COSTS.generate_host_seconds_per_row * rows
    twice, _ = generate("native", 64)
    assert twice - native > COSTS.generate_host_seconds_per_row * rows  # rows add host time
    assert native > host and sglang < native


def test_a_local_process_is_priced_as_the_runtime_runs_it() -> None:
    # a process of two slots runs two torch threads (runtime.threads, quiet host): its passes
    # run COSTS.local_multithread_pass_speedup faster, and every decode step pays the
    # threads' hand-off per layer; computing alone on that host it also runs uncontended
    # (COSTS.local_sole_process_speedup, measured in bench/results/vs_trl.json), which only
    # its passes' compute gains
    def step(cpus: int, replicas: int | None = None, split: bool = False,
             reward_apart: bool = False) -> dict[str, float]:
        tasks = ["generate", "logp", "train"] + ([] if reward_apart else ["reward"])
        group = {"share": 1.0, "tasks": tasks}
        if replicas:
            group["replicas"] = replicas
        groups = {"all": group} if not split else {
            "rollout": {"share": 0.5, "tasks": ["generate"]},
            "trainer": {"share": 0.5, "tasks": ["logp", "train"]}}
        spec = spec_of(groups=groups, cluster={"local": True, "cpus": cpus},
                       model={"preset": "tiny"},
                       data={"prompts_per_step": 8, "samples_per_prompt": 4, "prompt_len": 16,
                             "response_len": {"mean": 16, "max": 16}})
        return {n: c.seconds for n, c in costs_of(spec).items()}

    assert COSTS.local_multithread_pass_speedup > 1 and COSTS.local_sole_process_speedup > 1
    one, alone, replicas, split = step(1), step(2), step(2, replicas=2), step(2, split=True)
    threaded = step(2, reward_apart=True)  # two threads, but a reward actor computes beside
    speedup = COSTS.local_multithread_pass_speedup
    assert threaded["train"] < one["train"] < threaded["train"] * speedup * 1.01  # floors stay
    assert alone["train"] < threaded["train"]  # and alone on the host, uncontended as well
    assert split["train"] == pytest.approx(one["train"])  # one slot each: one thread
    assert replicas["train"] < one["train"]  # two one-thread processes share the work
    handoff = 16 * shape_of(spec_of(model={"preset": "tiny"})).layers  # 16 decode steps
    extra = threaded["generate"] - one["generate"]  # the hand-off outweighs faster compute
    assert extra == pytest.approx(handoff * COSTS.local_thread_handoff_seconds_per_layer,
                                  rel=0.25)
    assert split["generate"] == pytest.approx(one["generate"], rel=0.01)  # one thread


def test_verl_driver_moves_the_padded_batch_however_many_gpus() -> None:
    # verl's single controller ships every row padded to prompt + max response through Ray:
    # the same seconds on 8 or 16 GPUs, more for a longer max; rlgraph's runtime pays none
    def logp(nodes: int, max_len: int, engine: str = "sglang") -> tuple[float, str]:
        spec = spec_of(cluster={"nodes": nodes, "gpus_per_node": 8, "gpu": "H20"},
                       nodes=dict(NODES, generate={"engine": engine}),
                       pricing={"system": "verl" if engine == "sglang" else "rlgraph"},
                       data={"prompts_per_step": 32, "samples_per_prompt": 4,
                             "prompt_len": 256, "response_len": {"mean": 512, "max": max_len}})
        cost = costs_of(spec)["logp"]
        return cost.seconds, cost.detail

    def driver(detail: str) -> float:
        return float(detail.split("driver transfer ")[1].split(" s")[0])

    one, two, longer = logp(1, 4096), logp(2, 4096), logp(1, 8192)
    per_row = 24 * (256 + 4096) + 16 * 4096  # input_ids, mask, positions; responses, out
    assert driver(one[1]) == pytest.approx(128 * per_row / COSTS.object_store_bytes_per_s,
                                           rel=1e-2)
    assert driver(two[1]) == driver(one[1]) < driver(longer[1])
    assert "driver" not in logp(1, 4096, "native")[1]


def test_verl_balances_a_one_mini_batch_pass_across_ranks() -> None:
    # verl's trainer.balance_batch gives every rank about the same tokens for a pass over the
    # whole batch: only the longest sequence bounds the slowest rank; split into mini-batches,
    # each is a random draw again and the slowest of 16 ranks carries more
    from rlgraph.pricing.passes import data_parallel_imbalance

    spec = spec_of(cluster={"nodes": 4, "gpus_per_node": 8, "gpu": "H20"},
                   nodes=dict(NODES, generate={"engine": "sglang"}), pricing=VERL,
                   groups={"trainer": {"share": 0.5, "tasks": ["logp", "train"]},
                           "rollout": {"share": 0.5, "tasks": ["generate"]}},
                   data={"prompts_per_step": 512, "samples_per_prompt": 16, "prompt_len": 256,
                         "response_len": {"mean": 1000, "max": 4096, "sigma": 1.0}})
    ctx = context(spec, gpus=16)
    node = spec.nodes["train"]
    whole, split = (data_parallel_imbalance(node, ctx, m) for m in (1, 16))
    assert whole == pytest.approx(1.0, abs=0.01)  # 512 rows a rank: the longest is a sliver
    assert split > whole + 0.05


def test_varlen_attention_lasts_the_longest_rows_blocks_over_its_kv_splits() -> None:
    # flex decoding: splits = SMs // (width x KV heads) x 2 (at least 1), width the power of
    # two >= rows (16 at least); one block streams its share of the longest row's K/V
    from rlgraph.pricing.decode_step import split_kv_seconds

    spec = spec_of()
    ctx = context(spec)
    node, shape, h100 = spec.nodes["generate"], ctx.shape, GPU_PRESETS["H100"]
    per_head = 8000 * shape.kv_bytes_per_token() / shape.kv_heads
    one = per_head / COSTS.split_kv_block_bytes_per_s
    wide = h100.sms // shape.kv_heads + 1  # one split per (slot, KV head)
    assert split_kv_seconds(wide, 8000, node, ctx) == pytest.approx(one)
    assert split_kv_seconds(wide, 16000, node, ctx) == pytest.approx(2 * one)
    splits = h100.sms // (16 * shape.kv_heads) * 2
    assert split_kv_seconds(3, 8000, node, ctx) == pytest.approx(one / splits)
    # the engine before the varlen kernel: SDPA reads every slot of the compacted width to
    # the longest row (the CUDA graph's padded batch), at its occupancy; no split-KV term
    sdpa = spec_of(pricing={"engine_revision": "sdpa"})
    snode, sctx = sdpa.nodes["generate"], context(sdpa)
    assert split_kv_seconds(3, 8000, snode, sctx) == 0
    hbm = h100.hbm_bytes_per_s * COSTS.decode_hbm_efficiency
    rate = min(hbm / h100.sms, COSTS.sdpa_decode_bytes_per_s_per_sm) * 16 * shape.kv_heads
    padded = 16 * 8000 * shape.kv_bytes_per_token() / rate
    short = decode_step_seconds(3, 500, snode, sctx, longest=500)
    assert decode_step_seconds(3, 500, snode, sctx, longest=8000) == pytest.approx(
        short + padded - 16 * 500 * shape.kv_bytes_per_token() / rate)
    # a long row among many short ones: the step is at least its blocks, not the mean KV
    # (beyond the attention kernel's own time that the per-layer floor holds)
    many = decode_step_seconds(wide, 500, node, ctx, longest=8000)
    held = shape.layers * COSTS.decode_floor_attention_seconds_per_layer
    assert many >= decode_step_seconds(wide, 500, node, ctx) + one - held - wide * 500 * (
        shape.kv_bytes_per_token() / (h100.hbm_bytes_per_s * COSTS.decode_hbm_efficiency))
    # the dynamic decode (transformers' SDPA) has no such term
    dynamic = spec_of(nodes=dict(NODES, generate={"cuda_decode": "dynamic"}))
    assert split_kv_seconds(wide, 8000, dynamic.nodes["generate"], context(dynamic)) == 0


def test_padded_passes_run_attention_at_the_bias_kernels_measured_rate() -> None:
    # variable lengths: transformers' SDPA runs the memory-efficient kernel with the mask's
    # bias over the whole square, at its measured rates (forward; backward two forwards'
    # FLOPs); fixed lengths: no mask; verl packs: none either
    from rlgraph import lengths
    from rlgraph.pricing.passes import bias_attention_seconds, padding_mask

    varied = spec_of(data={"prompts_per_step": 32, "samples_per_prompt": 4, "prompt_len": 256,
                           "response_len": {"mean": 512, "max": 4096}})
    ctx = context(varied)
    model = lengths.of(varied.data.response_len)
    shape, h100 = ctx.shape, GPU_PRESETS["H100"]
    whole = 2 * shape.attention_flops(1.0) * 1e9
    forward = whole / (h100.bf16_flops * 4 * COSTS.bias_attention_forward_efficiency)
    backward = 2 * whole / (h100.bf16_flops * 4 * COSTS.bias_attention_backward_efficiency)
    assert bias_attention_seconds(ctx, 1e9, backward=False) == pytest.approx(forward)
    assert bias_attention_seconds(ctx, 1e9, backward=True) == pytest.approx(forward + backward)
    assert padding_mask(ctx, model)
    fixed = spec_of()
    assert not padding_mask(context(fixed), lengths.of(fixed.data.response_len))
    verl = spec_of(data=varied.data.model_dump(), nodes=dict(NODES, generate={"engine": "sglang"}),
                   pricing=VERL)
    assert not padding_mask(context(verl), model)
    costs = costs_of(varied)
    assert "padding mask's bias" in costs["train"].detail
    assert "fp32 logits" in costs["train"].detail
    # a fixed-length batch's attention stays in the GEMM-rate FLOPs
    assert "bias" not in costs_of(fixed)["train"].detail


def test_carried_rows_are_re_encoded_by_an_eager_forward_of_the_static_engine() -> None:
    # the matmuls at the GEMM efficiency, the square under the mask's bias at the bias
    # kernel's rate, the activation traffic; the host's launches of every chunk past the first
    from rlgraph.pricing.generate import eager_prefill_seconds
    from rlgraph.pricing.passes import bias_attention_seconds

    varied = spec_of(data={"prompts_per_step": 32, "samples_per_prompt": 4, "prompt_len": 256,
                           "response_len": {"mean": 512, "max": 4096}})
    node, ctx = varied.nodes["generate"], context(varied)
    shape, h100 = ctx.shape, GPU_PRESETS["H100"]
    tokens, square = 1e5, 1e9
    gemm = 2 * shape.matmul_active * tokens / (h100.bf16_flops * COSTS.gemm_efficiency * 4)
    attention = bias_attention_seconds(ctx, square, backward=False)
    device = eager_prefill_seconds(tokens, square, 0, node, ctx)
    assert device > gemm + attention
    many = 10_000  # host-bound: the launches of many chunks
    assert eager_prefill_seconds(tokens, square, many, node, ctx) == pytest.approx(
        many * shape.layers * COSTS.eager_pass_host_seconds_per_layer)
    sglang = spec_of(data=varied.data.model_dump(),
                     nodes=dict(NODES, generate={"engine": "sglang"}))
    assert eager_prefill_seconds(tokens, square, 1, sglang.nodes["generate"],
                                 context(sglang)) is None
