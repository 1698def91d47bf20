"""Hub ids in `model.path` resolve through huggingface_hub's cache, offline: a pre-seeded cache
folder in the hub's layout (models--owner--name/refs/main, snapshots/<commit>/) holds a tiny
model whose config, tokenizer and weights rlgraph then loads like any local folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlgraph.config.load import load_spec
from rlgraph.errors import SpecError
from rlgraph.model.hub import looks_like_hub_id

COMMIT = "0123456789abcdef0123456789abcdef01234567"
GRAPH = """name: hub
cluster: {local: true, cpus: 2}
model:
  path: acme/tiny-char
groups:
  all: {share: 1.0, tasks: [generate, train]}
nodes:
  generate: {}
  reward: {}
  train: {}
schedule: {max_lag: 0, steps: 2}
"""


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline hub cache holding acme/tiny-char: config, char tokenizer, random weights."""
    from huggingface_hub import constants
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlgraph.model.tokenizer import CharTokenizer
    from rlgraph.presets.models import MODEL_PRESETS

    repo = tmp_path / "hub" / "models--acme--tiny-char"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    tok = CharTokenizer()
    raw = {**MODEL_PRESETS["tiny"], "vocab_size": tok.vocab_size, "num_hidden_layers": 1,
           "hidden_size": 32, "intermediate_size": 64, "pad_token_id": tok.pad_id,
           "eos_token_id": tok.eos_id, "bos_token_id": tok.bos_id}
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    AutoModelForCausalLM.from_config(config).save_pretrained(snapshot)
    tok.to_transformers().save_pretrained(snapshot)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    return snapshot


def test_hub_ids_are_told_from_paths() -> None:
    assert looks_like_hub_id("Qwen/Qwen2.5-0.5B-Instruct")
    for path in ("./models/x", "/abs/x", "a/b/c", "x", "../a/b", "~/a"):
        assert not looks_like_hub_id(path), path


def test_a_cached_hub_id_resolves_offline_and_loads(hub_cache: Path) -> None:
    from rlgraph.model.build import build_model
    from rlgraph.model.tokenizer import HFTokenizer

    (hub_cache.parent.parent.parent.parent / "graph.yaml").write_text(GRAPH)
    spec = load_spec(hub_cache.parent.parent.parent.parent / "graph.yaml")
    assert Path(spec.model.path) == hub_cache.resolve()
    tokenizer = HFTokenizer(spec.model.path)
    assert tokenizer.decode(tokenizer.encode_text("12+3")) == "12+3"
    model = build_model(spec.model, tokenizer)
    assert model.config.num_hidden_layers == 1  # the cached weights, not a preset
    from rlgraph.compiler.shapes import shape_of

    assert shape_of(spec).layers == 1  # the compiler prices the cached config


def test_an_uncached_hub_id_offline_is_one_line(hub_cache: Path, tmp_path: Path) -> None:
    graph = tmp_path / "graph.yaml"
    graph.write_text(GRAPH.replace("acme/tiny-char", "acme/absent"))
    with pytest.raises(SpecError) as err:
        load_spec(graph)
    text = str(err.value)
    assert "HF_HUB_OFFLINE" in text and "hf download acme/absent" in text
    assert text.startswith(f"{graph}:4:") and "\n" not in text


def test_a_local_folder_of_that_name_wins(hub_cache: Path, tmp_path: Path) -> None:
    local = tmp_path / "acme" / "tiny-char"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "graph.yaml").write_text(GRAPH)
    assert Path(load_spec(tmp_path / "graph.yaml").model.path) == local.resolve()
