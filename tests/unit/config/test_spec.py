"""graph.yaml loading: example graphs, overrides, line numbers, defaults, round trip.

Refusals (one file per mistake) live in tests/bad_inputs/ and test_bad_inputs.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlgraph.config.load import SEED_WORDS, load_spec, validate_spec
from rlgraph.config.safe_yaml import parse_yaml
from rlgraph.config.schema import json_schema
from rlgraph.errors import SourceMap, SpecError
from rlgraph.graph import build_graph

ROOT = Path(__file__).resolve().parents[3]
GRAPHS = sorted((ROOT / "graphs").glob("*.yaml"))

MINIMAL = """\
name: minimal
groups:
  rollout: {share: 0.5, tasks: [generate]}
  trainer: {share: 0.5, tasks: [train]}
nodes:
  generate: {}
  train: {}
  param_update: {kind: param_update}
"""


@pytest.fixture
def minimal(tmp_path: Path) -> Path:
    path = tmp_path / "graph.yaml"
    path.write_text(MINIMAL)
    return path


NOT_SEEDS = {"quickstart", "agentic-calculator", "gsm8k-style"}  # feature examples, not seeds


@pytest.mark.parametrize("graph", GRAPHS, ids=[g.stem for g in GRAPHS])
def test_example_graph_loads_and_builds(graph: Path) -> None:
    if graph.stem not in NOT_SEEDS:
        assert graph.read_text().startswith("# Seed: "), "each seed graph names its seed first"
    spec = load_spec(graph)
    assert spec.name == graph.stem
    built = build_graph(spec)
    assert "train" in built and "generate" in built
    every_gpu_task = {n for n in spec.nodes if built.nodes[n]["uses_gpu"]}
    assert every_gpu_task == {t for g in spec.groups.values() for t in g.tasks}


def test_seed_examples_keep_the_seeds_settings() -> None:
    by_name = {g.stem: load_spec(g) for g in GRAPHS}
    hybrid = by_name["verl-hybrid-engine"]
    assert len(hybrid.groups) == 1 and hybrid.schedule.max_lag == 0
    assert next(iter(hybrid.groups.values())).share == 1
    off = by_name["verl-one-step-off"]
    assert off.groups["rollout"].share * off.cluster.slots() == 4
    assert (off.data.prompts_per_step, off.data.samples_per_prompt) == (1024, 5)
    assert off.nodes["generate"].tp == 2 and off.schedule.max_lag == 1
    sep = by_name["dots-complete-separation"]
    assert sorted(g.share for g in sep.groups.values()) == [0.25] * 4
    ex2 = by_name["dots-hybrid-logp-train"]
    assert {g: (s.share, sorted(s.tasks)) for g, s in ex2.groups.items()} == {
        "trainer": (0.5, ["logp", "train"]), "ref": (0.25, ["ref_logp"]),
        "rollout": (0.25, ["generate"])}
    ex3 = by_name["dots-hybrid-logp-train-ref"]
    assert sorted(ex3.groups["trainer"].tasks) == ["logp", "ref_logp", "train"]
    moe = by_name["dots-red-moe"]
    assert (moe.nodes["train"].ep, moe.nodes["generate"].tp, moe.schedule.max_lag) == (8, 1, 1)
    assert (moe.nodes["param_update"].bucket_mb.produce,
            moe.nodes["param_update"].bucket_mb.consume) == (256, 128)
    apr = by_name["verl-async-partial-rollout"]
    assert apr.schedule.partial_rollout and apr.cluster.gpu == "H20"
    assert apr.data.response_len.max >= 4 * apr.data.response_len.mean


def test_overrides_parse_values_as_yaml_and_remember_where_they_came_from(
        minimal: Path) -> None:
    spec = load_spec(minimal, ["schedule.max_lag=3", "groups.rollout.share=0.25",
                               "+data.response_len={mean: 64, max: 128}",
                               "nodes.generate.engine=native"])
    assert spec.schedule.max_lag == 3 and spec.groups["rollout"].share == 0.25
    assert (spec.data.response_len.mean, spec.data.response_len.max) == (64, 128)
    assert spec.source.locate(("schedule", "max_lag")) == "<override schedule.max_lag=3>"
    assert spec.source.locate(("groups", "trainer", "share")).endswith("graph.yaml:4:13")


def test_source_positions_point_at_keys(minimal: Path) -> None:
    spec = load_spec(minimal)
    locate = spec.source.locate
    assert locate(("nodes", "train")).endswith(":7:3")
    assert locate(("groups", "rollout", "tasks", 0)).endswith(":3:33")
    assert locate(("nodes", "train", "tp")).endswith(":7:3"), "unknown keys fall back to parents"
    assert SourceMap(path="g.yaml").locate(("x",)) == "g.yaml:1:1"


def test_defaults_and_shorthands(minimal: Path) -> None:
    spec = load_spec(minimal, ["data.response_len=100"])
    assert spec.nodes["generate"].kind == "generate", "a node named like a kind gets that kind"
    assert spec.model.preset == "tiny"
    assert (spec.data.response_len.mean, spec.data.response_len.max) == (100, 100)


def test_resolved_spec_round_trips(minimal: Path) -> None:
    spec = load_spec(minimal)
    text = yaml.safe_dump(spec.to_yaml_dict())
    data, source = parse_yaml(text)
    again = validate_spec(data, source)
    assert again.to_yaml_dict() == spec.to_yaml_dict()


def test_a_reported_mean_length_is_the_mean_after_the_cap(minimal: Path) -> None:
    from rlgraph.lengths import moments
    from rlgraph.lengths import of as lengths_of

    spec = load_spec(minimal, ["data.response_len={clipped_mean: 3201, max: 4096, sigma: 0.35}"])
    length = spec.data.response_len
    assert length.mean > 3201, "the cap lowers the mean: the one before it is larger"
    assert moments(lengths_of(length))[0] == pytest.approx(3201, rel=1e-6)
    text = yaml.safe_dump(spec.to_yaml_dict())  # a dumped spec (run dirs, tune) reloads
    again = validate_spec(*parse_yaml(text))
    assert again.data.response_len.mean == pytest.approx(length.mean)
    with pytest.raises(SpecError, match="averages at most 2528 tokens") as info:
        load_spec(minimal, ["data.response_len={clipped_mean: 3201, max: 4096}"])
    assert "lower sigma" in str(info.value)
    with pytest.raises(SpecError, match="not both"):
        load_spec(minimal, ["data.response_len={mean: 100, clipped_mean: 90, max: 300}"])


def test_a_written_kl_coef_needs_a_ref_logp_node(minimal: Path) -> None:
    build_graph(load_spec(minimal))  # grpo's default kl_coef applies only with a reference
    build_graph(load_spec(minimal, ["algorithm.kl_coef=0"]))
    for overrides in (["algorithm.kl_coef=0.01"], ["algorithm={name: rloo, kl_coef: 0.01}"]):
        spec = load_spec(minimal, overrides)
        with pytest.raises(SpecError) as info:
            build_graph(spec)
        text = info.value.render(spec.source)
        assert text.startswith(f"<override {overrides[0]}>: algorithm.kl_coef: "), text
        assert "no ref_logp node" in text
    minimal.write_text(MINIMAL + "algorithm: {kl_coef: 0.01}\n")
    spec = load_spec(minimal)
    with pytest.raises(SpecError, match="no ref_logp node") as info:
        build_graph(spec)
    assert info.value.render(spec.source).startswith(f"{minimal}:9:13: algorithm.kl_coef: ")
    spec = load_spec(minimal, ["+nodes.ref_logp={kind: ref_logp}",
                               "groups.trainer.tasks=[train, ref_logp]"])
    assert build_graph(spec).nodes["ref_logp"]["kind"] == "ref_logp"


def test_seed_vocabulary_hints(minimal: Path) -> None:
    for word, key in [("generate_ahead_steps", "schedule.max_lag"),
                      ("sperated_node_tasks", "groups.<name>.tasks")]:
        with pytest.raises(SpecError) as info:
            load_spec(minimal, [f"schedule.{word}=1"])
        assert f"in rlgraph, {word} is {key}" in info.value.render()
        assert word in SEED_WORDS


def test_other_frameworks_words_name_the_rlgraph_key(minimal: Path) -> None:
    for override, said in [
        ("data.num_generations_per_prompt=16", "num_generations_per_prompt is "
         "data.samples_per_prompt"),  # NeMo-RL
        ("data.n_samples_per_prompt=8", "n_samples_per_prompt is data.samples_per_prompt"),
        ("schedule.max_staleness_steps=2", "max_staleness_steps is schedule.max_lag"),
        ("+nodes.generate.rollout_num_gpus_per_engine=4", "is tp of the generate node"),
        # a section pasted whole: each word it holds, by its dotted path
        ("actor_rollout_ref={rollout: {n: 16}, actor: {ppo_mini_batch_size: 32}}",
         "actor_rollout_ref.rollout.n is data.samples_per_prompt; "
         "actor_rollout_ref.actor.ppo_mini_batch_size is mini_batches of the train node"),
        ("grpo={num_prompts_per_step: 32}", "grpo.num_prompts_per_step is "
         "data.prompts_per_step"),
    ]:
        with pytest.raises(SpecError) as info:
            load_spec(minimal, [override])
        assert said in info.value.render(), override


def test_first_reported_error_is_the_unknown_key(minimal: Path) -> None:
    text = MINIMAL.replace("rollout: {share: 0.5", "rollout: {shares: 0.5")
    minimal.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(minimal)
    assert info.value.key == ("groups", "rollout", "shares")
    assert "did you mean 'share'?" in info.value.render()


def test_json_schema_covers_every_node_kind() -> None:
    from rlgraph.nodes import KINDS

    schema = json_schema()
    assert schema["title"] == "rlgraph graph.yaml"
    kinds = {d["properties"]["kind"].get("const") for d in schema["$defs"].values()
             if "kind" in d.get("properties", {})}
    assert set(KINDS) <= kinds
