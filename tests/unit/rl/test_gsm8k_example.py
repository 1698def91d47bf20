"""The shipped GSM8K-style example: its data is what the generator writes, in verl's layout,
every prompt fits the graph's prompt_len, verl's GSM8K rule scores it, the graph compiles,
and its pipeline (parquet rows -> generate -> the GSM8K scorer -> train -> validate) runs.

Its learning claim (held-out accuracy rising over the shipped 60 steps) needs the shipped
300-step warm start, about 5.5 CPU-minutes, then ~3.5 more for the steps: not in CI. It runs
with RLGRAPH_SLOW=1 (`test_the_shipped_graph_learns`), and is reported as skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlgraph.compiler import compile_plan
from rlgraph.config.load import load_spec
from rlgraph.model.tokenizer import CharTokenizer
from rlgraph.rl.data import DataSource
from rlgraph.rl.rewards import gsm8k_score
from rlgraph.runtime.serial import run_serial

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


def test_the_shipped_pipeline_runs_two_small_steps(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # the shipped graph as written, shrunk to two steps of 2 x 2 samples from the initial
    # weights: the rows, the scorer and validation on the shipped test split all run
    monkeypatch.setenv("RLGRAPH_CACHE", str(tmp_path))
    spec = load_spec(GRAPH, ["model.warm_start.steps=0", "schedule.steps=2",
                             "data.prompts_per_step=2", "data.samples_per_prompt=2",
                             "nodes.validate.prompts=4", "nodes.validate.every=1"])
    run = run_serial(spec, 2)
    rows = [m["metrics"] for m in run.metrics]
    assert [r["samples"] for r in rows] == [4.0, 4.0]
    assert all(0.0 <= r["reward/mean"] <= 1.0 and r["actor/lr"] > 0 for r in rows)
    val = run.node_metrics["validate"]
    assert [v["val/samples"] for v in val] == [4.0, 4.0]
    assert [v["val/policy_version"] for v in val] == [0.0, 1.0]


@pytest.mark.skipif(not os.environ.get("RLGRAPH_SLOW"),
                    reason="the shipped example's learning: ~9 CPU-minutes (RLGRAPH_SLOW=1)")
def test_the_shipped_graph_learns() -> None:
    # measured: held-out greedy accuracy 0.665 -> 0.83 on the 200 test prompts, sampled reward
    # 0.543 (first 10 steps) -> 0.589 (last 10); asked: +0.05 held-out, sampled not falling
    spec = load_spec(GRAPH)
    steps = spec.schedule.steps
    run = run_serial(spec, steps)
    val = run.workspaces["validate"].worker("validate").validate(steps)["metrics"]
    first = run.node_metrics["validate"][0]["val/accuracy"]
    rewards = [m["metrics"]["reward/mean"] for m in run.metrics]
    assert val["val/accuracy"] - first >= 0.05, (first, val)
    assert sum(rewards[-10:]) >= sum(rewards[:10]), rewards
