"""The shipped GSM8K-style example: its data is what the generator writes, in verl's layout,
every prompt fits the graph's prompt_len, verl's GSM8K rule scores it, and the graph
compiles."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlgraph.compiler import compile_plan
from rlgraph.config.load import load_spec
from rlgraph.model.tokenizer import CharTokenizer
from rlgraph.rl.data import DataSource
from rlgraph.rl.rewards import gsm8k_score

ROOT = Path(__file__).resolve().parents[3]
GRAPH = ROOT / "graphs" / "gsm8k-style.yaml"
DATA = ROOT / "graphs" / "data" / "gsm8k-style"


def _generator():  # tools/ is not a package
    spec = importlib.util.spec_from_file_location("make_gsm8k_style",
                                                  ROOT / "tools" / "make_gsm8k_style.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_shipped_data_is_the_generators_in_verls_layout() -> None:
    make = _generator()
    for split, count in (("train", 2000), ("test", 200)):
        rows = pq.read_table(DATA / f"{split}.parquet").to_pylist()
        assert rows == make.rows(split, count, 0), split
    row = rows[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["prompt"][0]["role"] == "user" and row["reward_model"]["style"] == "rule"
    answer = row["extra_info"]["answer"]
    assert gsm8k_score(row["data_source"], answer, row["reward_model"]["ground_truth"]) == 1.0


@pytest.mark.parametrize(("response", "score"), [
    ("3+4=7. #### 7", 1.0), ("#### 1,234", 0.0), ("the answer is 7", 1.0), ("7", 1.0),
    ("#### 8 then 7", 0.0), ("", 0.0), ("seven", 0.0)])
def test_gsm8k_rule(response: str, score: float) -> None:
    assert gsm8k_score("openai/gsm8k", response, "7") == score


def test_the_graph_compiles_and_its_prompts_fit() -> None:
    spec = load_spec(GRAPH)
    plan = compile_plan(spec)
    assert plan.spec.algorithm.name == "grpo"
    source = DataSource(spec.data, "train", GRAPH.parent)
    tok = CharTokenizer()
    longest = max(len(tok.encode_prompt(source.example(i).prompt)) for i in range(2000))
    assert longest <= spec.data.prompt_len
