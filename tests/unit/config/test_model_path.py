"""`model.path` resolves against the graph's folder, like data and reward files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlgraph.config.load import load_spec
from rlgraph.errors import SpecError

GRAPH = """name: mine
cluster: {{local: true, cpus: 2}}
model:
  path: {path}
groups:
  all: {{share: 1.0, tasks: [generate, train]}}
nodes:
  generate: {{kind: generate}}
  reward: {{kind: reward}}
  train: {{kind: train}}
schedule: {{max_lag: 0, steps: 2}}
"""


def _graph(root: Path, path: str) -> Path:
    folder = root / "exp"
    (folder / "models" / "tiny").mkdir(parents=True, exist_ok=True)
    (folder / "models" / "tiny" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    graph = folder / "graph.yaml"
    graph.write_text(GRAPH.format(path=path))
    return graph


def test_a_relative_model_path_resolves_against_the_graphs_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _graph(tmp_path, "models/tiny")
    monkeypatch.chdir(tmp_path)  # not the graph's folder
    expected = str((tmp_path / "exp" / "models" / "tiny").resolve())
    assert load_spec(graph).model.path == expected
    assert load_spec(_graph(tmp_path, expected)).model.path == expected  # absolute still works


def test_a_missing_model_folder_is_one_line_naming_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = _graph(tmp_path, "models/absent")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as err:
        load_spec(graph)
    text = str(err.value)
    assert text.startswith(f"{graph}:4:") and "model.path" in text and "\n" not in text
    assert str((tmp_path / "exp").resolve()) in text and "config.json" in text
