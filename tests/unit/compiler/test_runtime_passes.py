"""rlgraph's own passes on GPUs (own runs): the model the runtime builds, eager
passes as the longer of host launches and device work, and the data-parallel replicas."""

from __future__ import annotations

from pathlib import Path

import pytest
from rl_support import costs_of

from rlgraph.compiler import compile_plan
from rlgraph.compiler.shapes import shape_of
from rlgraph.config.load import load_spec
from rlgraph.presets.char_vocab import CHAR_VOCAB_SIZE
from rlgraph.presets.models import MODEL_PRESETS
from rlgraph.pricing.constants import COSTS

pytestmark = pytest.mark.usefixtures("memory_unchecked")  # costs, not memory

GRAPHS = Path(__file__).resolve().parents[3] / "bench" / "graphs_gpu"
COLOCATED = GRAPHS / "colocated-sync.yaml"  # qwen2.5-0.5b shape, 512 rows of 40 tokens

VERL = {"system": "verl"}  # priced as verl's hybrid engine


def node_seconds(overrides: list[str], graph: Path = COLOCATED) -> dict[str, float]:
    """Seconds of each node, the logp forward priced (max_lag 1: not provably redundant)."""
    plan = compile_plan(load_spec(graph, ["schedule.max_lag=1", *overrides]))
    return {name: cost["seconds"] for name, cost in plan["costs"].items()}


def test_the_priced_vocabulary_is_the_one_build_model_builds() -> None:
    # without model.path the runtime's policy has the character tokenizer's vocabulary, not
    # the preset's 151,936 (whose tied table would be 136M of the 494M parameters)
    from rlgraph.model.build import build_model
    from rlgraph.model.tokenizer import CharTokenizer

    small = {**MODEL_PRESETS["qwen2.5-0.5b"], "hidden_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}
    spec = load_spec(COLOCATED, [f"model={{hf_config: {small}}}".replace("'", "")])
    tokenizer = CharTokenizer()
    model = build_model(spec.model, tokenizer)
    assert tokenizer.vocab_size == CHAR_VOCAB_SIZE
    assert shape_of(spec).vocab == model.get_input_embeddings().weight.shape[0]
    assert shape_of(load_spec(COLOCATED)).vocab == CHAR_VOCAB_SIZE
    # a plan priced as verl (engine sglang) keeps the preset's: real verl runs use the
    # model's own tokenizer
    verl = load_spec(COLOCATED, ["nodes.generate.engine=sglang", "pricing.system=verl"])
    assert shape_of(verl).vocab == MODEL_PRESETS["qwen2.5-0.5b"]["vocab_size"]


def test_a_pass_lasts_the_longer_of_host_launches_and_device_work() -> None:
    # gpu-node-profile-h200x2.json: 128 and 256 rows take about the host's time, 512 rows
    # and more grow with the tokens
    one = ["cluster.gpus_per_node=1"]
    by_rows = {p * 8: node_seconds([*one, f"data.prompts_per_step={p}"])
               for p in (16, 32, 64, 128)}
    host = 24 * COSTS.eager_pass_host_seconds_per_layer
    assert by_rows[128]["logp"] == pytest.approx(host)
    assert by_rows[256]["logp"] == pytest.approx(host)
    assert by_rows[1024]["logp"] == pytest.approx(2 * by_rows[512]["logp"], rel=1e-6)
    assert by_rows[128]["train"] == pytest.approx(3 * host)
    assert by_rows[1024]["train"] == pytest.approx(2 * by_rows[512]["train"], rel=1e-6)
    # measured on one H200: logp 59 / 112 ms and train 175 / 319 ms at 512 / 1024 rows
    assert 0.045 < by_rows[512]["logp"] < 0.07 and 0.09 < by_rows[1024]["logp"] < 0.13
    assert 0.14 < by_rows[512]["train"] < 0.2 and 0.28 < by_rows[1024]["train"] < 0.36


def test_a_data_parallel_call_costs_at_least_one_gpu_floor_plus_the_dispatch() -> None:
    # two replicas of 256 rows each: never below what 256 rows take on one GPU (the host's
    # launches do not split), plus handing the follower its share (gpu-e2e-dp.json measured
    # 60 / 177 ms against 32 / 124 ms for 256 rows alone)
    two = node_seconds([])
    alone = node_seconds(["cluster.gpus_per_node=1", "data.prompts_per_step=32"])
    for node in ("logp", "ref_logp", "train"):
        assert two[node] >= alone[node] + COSTS.replica_dispatch_s
    assert two["logp"] >= 24 * COSTS.eager_pass_host_seconds_per_layer
    # train also sums the bf16 gradients over the replicas
    assert two["train"] > alone["train"] + COSTS.replica_dispatch_s


def test_verl_priced_passes_keep_their_roofline_model() -> None:
    # the eager activation traffic and the max with the host are rlgraph's runtime only: a
    # verl-priced plan's passes do not change with them
    spec_cost = costs_of  # rl_support's qwen2.5-7b graph
    from rl_support import COST_NODES, cost_spec

    verl = {**COST_NODES, "generate": {"engine": "sglang"}}
    before = spec_cost(cost_spec(nodes=verl, pricing=VERL))["logp"].detail
    assert "activations" not in before and "host launches" not in before
    native = spec_cost(cost_spec())["logp"].detail
    assert "activations" in native and "host launches" in native
