"""Prompts and rewards: built-in tasks, verl-format files, user reward functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rl_support import make_spec

from rlgraph.bench_mode import forced_length
from rlgraph.errors import SpecError
from rlgraph.model.tokenizer import CharTokenizer
from rlgraph.rl.data import DataError, DataSource, task_example, write_task_file
from rlgraph.rl.rewards import (
    RewardFnError,
    exact_match,
    last_number_match,
    load_reward_fn,
    score_samples,
)


def test_batches_are_a_function_of_seed_and_step() -> None:
    spec = make_spec(data={"prompts_per_step": 8, "seed": 7})
    a, b = DataSource(spec.data), DataSource(spec.data)
    assert [e.uid for e in a.batch(5)] == [f"arithmetic:train:{40 + i}" for i in range(8)]
    assert [(e.prompt, e.ground_truth) for e in a.batch(5)] == \
        [(e.prompt, e.ground_truth) for e in b.batch(5)]  # a resumed run reads the same
    other = DataSource(make_spec(data={"prompts_per_step": 8, "seed": 8}).data)
    assert [e.prompt for e in a.batch(5)] != [e.prompt for e in other.batch(5)]
    for ex in a.batch(0):  # exact answers
        x, y = ex.prompt.rstrip("=").split("+")
        assert ex.ground_truth == str(int(x) + int(y))


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_verl_files_train_and_val(tmp_path: Path, suffix: str) -> None:
    train = write_task_file(tmp_path / f"train{suffix}", "reverse", 10, seed=1, chat=True)
    val = write_task_file(tmp_path / f"val{suffix}", "copy", 3, seed=1, split="val")
    spec = make_spec(data={"train_files": [str(train)], "val_files": [str(val)],
                           "prompts_per_step": 4})
    source = DataSource(spec.data)
    assert len(source) == 10
    first = source.example(0)
    assert first.data_source == "reverse" and isinstance(first.prompt, list)
    assert first.prompt[0]["role"] == "user"
    # an epoch visits every row once, in a seeded order, with stable row ids
    epoch = [source.example(i).uid for i in range(10)]
    assert sorted(epoch) == sorted(f"train{suffix}:{i}" for i in range(10))
    assert epoch == [DataSource(spec.data).example(i).uid for i in range(10)]
    assert [e.uid for e in source.batch(2)] == [source.example(8 + i).uid for i in range(4)]
    val_rows = DataSource(spec.data, "val").validation()
    assert [e.ground_truth for e in val_rows] == \
        [task_example("copy", 1, "val", i).ground_truth for i in range(3)]


def test_chat_prompt_through_char_tokenizer() -> None:
    tok = CharTokenizer()
    ids = tok.encode_prompt([{"role": "user", "content": "1+2="}])
    assert ids[0] == tok.bos_id and tok.decode(ids) == "1+2="


def test_bad_rows_name_file_and_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "x", "reward_model": {"ground_truth": "1"}}) + "\n"
                    + json.dumps({"prompt": "y"}) + "\n")
    spec = make_spec(data={"train_files": [str(path)]})
    with pytest.raises(DataError, match=r"bad.jsonl:line 2: .*reward_model.ground_truth"):
        DataSource(spec.data)
    path.write_text("{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: not valid JSON"):
        DataSource(spec.data)
    missing = make_spec(data={"train_files": ["nowhere.jsonl"]})
    with pytest.raises(SpecError) as err:
        DataSource(missing.data)
    assert err.value.key == ("data", "train_files", 0)


def test_unknown_task_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="unknown task 'arithmetik'") as err:
        DataSource(make_spec(data={"task": "arithmetik"}).data)
    assert "did you mean 'arithmetic'" in str(err.value)


def test_builtin_verifiers() -> None:
    assert exact_match("t", " 12 ", "12") == 1.0 and exact_match("t", "123", "12") == 0.0
    assert last_number_match("gsm8k", "so 3 + 4 = 1,007", "1007") == 1.0


def test_user_reward_fn_from_file_and_module(tmp_path: Path) -> None:
    (tmp_path / "score.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str == ground_truth[::-1]), 'extra': 1}\n")
    fn = load_reward_fn("score.py:compute_score", base_dir=tmp_path)
    scores = score_samples(fn, "score.py:compute_score", ["d", "d"], ["ba", "ab"],
                           ["ab", "ab"], [{}, {}], ["u0", "u1"])
    assert scores == [1.0, 0.0]
    assert load_reward_fn("rlgraph.rl.rewards:exact_match") is exact_match
    with pytest.raises(SpecError, match="has no function 'nope'"):
        load_reward_fn("rlgraph.rl.rewards:nope", key=("nodes", "reward", "fn"))
    with pytest.raises(SpecError, match="does not exist"):
        load_reward_fn("missing.py:f", base_dir=tmp_path)
    with pytest.raises(SpecError, match="not 'module:function'"):
        load_reward_fn("rlgraph.rl.rewards.exact_match")


def test_failing_reward_fn_names_fn_and_sample(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if solution_str == 'boom':\n"
        "        raise KeyError('answer')\n"
        "    return 1.0 if solution_str == 'ok' else 'yes'\n")
    fn = load_reward_fn(f"{tmp_path}/bad.py:compute_score")
    with pytest.raises(RewardFnError) as err:
        score_samples(fn, "bad.py:compute_score", ["t", "t"], ["ok", "boom"], ["1", "2"],
                      [{}, {}], ["p:0", "p:1"])
    text = str(err.value)
    assert "bad.py:compute_score" in text and "sample 1" in text and "prompt p:1" in text
    assert "'boom'" in text and "KeyError" in text
    with pytest.raises(RewardFnError, match=r"returned 'yes', not a number"):
        score_samples(fn, "bad.py:compute_score", ["t"], ["maybe"], ["1"], [{}], ["p:0"])


def test_forced_lengths_are_seeded_per_sample_and_clipped_at_max() -> None:
    from rlgraph.config.schema import ResponseLength

    lengths = ResponseLength(mean=512, max=8192, dist="lognormal", sigma=1.0)
    draws = [forced_length(0, p, k, lengths) for p in range(400) for k in range(4)]
    assert draws == [forced_length(0, p, k, lengths) for p in range(400) for k in range(4)]
    assert draws != [forced_length(1, p, k, lengths) for p in range(400) for k in range(4)]
    assert min(draws) >= 1 and max(draws) <= 8192 and max(draws) > 269  # not the task's cap
    assert 400 < sum(draws) / len(draws) < 640  # mean 512 (clipping lowers it a little)
