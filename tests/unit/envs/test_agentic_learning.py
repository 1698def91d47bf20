"""The calculator pays: the same small model, trained on the same task (two-digit times
one-digit multiplication) with the same budget (60 supervised warm-start steps, then 8 GRPO
steps), answers held-out problems far better when it can call the calculator than when it
must multiply in its head. Both levels are pinned.

The tool run's warm start trains on the calculator's demonstrations (`<37*8>`, then the
answer), played through the tool so its observations are masked out of the loss; the
no-tool run's on the answers. RL then runs multi-turn: each trajectory calls the tool, reads
its observation and answers. Without the tool the model's exact match stays near 0 (at this
size it cannot learn the products in this budget); with it, the model learns to copy the
expression into a call and the observation into the answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rl_support import make_spec

from rlgraph.engines.cpu_decode import sample
from rlgraph.envs.rollout import AgentRollout, Row, sample_dict
from rlgraph.envs.trajectory import Trajectory
from rlgraph.rl.data import task_example
from rlgraph.rl.rewards import default_compute_score
from rlgraph.runtime.serial import run_serial

SMALL = dict(model_type="llama", vocab_size=64, hidden_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, intermediate_size=256,
             max_position_embeddings=64, tie_word_embeddings=True)
HELD_OUT = [task_example("calc", 0, "test", i) for i in range(100)]


def train(tool: bool) -> tuple[float, list[str], list[dict]]:
    """Warm start + GRPO on `calc`, with or without the calculator: held-out exact match, the
    held-out texts (greedy), the train steps' metrics."""
    spec = make_spec(
        model={"hf_config": dict(SMALL),
               "warm_start": {"steps": 60, "lr": 3e-3, "batch_size": 64}},
        data={"task": "calc", "prompts_per_step": 8, "samples_per_prompt": 4, "prompt_len": 8,
              "response_len": {"mean": 12, "max": 20} if tool else {"mean": 3, "max": 4}},
        algorithm={"name": "grpo", "kl_coef": 0.0}, train={"lr": 1e-4, "warmup_steps": 5},
        generate={"env": {"fn": "calculator", "max_turns": 2}} if tool else {}, max_lag=1)
    run = run_serial(spec, steps=8)
    ws = run.workspaces["train"]
    policy, tok = ws.policy, ws.tokenizer
    with torch.no_grad():
        if tool:
            agent = AgentRollout(spec.nodes["generate"].env, tok, 20)
            rows = [Row(tok.encode_prompt(ex.prompt), Trajectory(key=f"{ex.uid}#0"), ex.prompt,
                        sample_dict(ex, 0, f"{ex.uid}#0")) for ex in HELD_OUT]
            agent.run_round(rows, policy, 0, 0, lambda: None, None, eos_id=tok.eos_id,
                            pad_id=tok.pad_id, greedy=True)
            texts = [r.trajectory.text(tok) for r in rows]
        else:
            rollout = sample(policy, [tok.encode_prompt(ex.prompt) for ex in HELD_OUT],
                             max_new_tokens=4, eos_id=tok.eos_id, pad_id=tok.pad_id,
                             greedy=True)
            texts = [tok.decode(r) for r in rollout.responses.tolist()]
    accuracy = sum(default_compute_score("calc", text, ex.ground_truth)
                   for text, ex in zip(texts, HELD_OUT)) / len(HELD_OUT)
    return accuracy, texts, [m["metrics"] for m in run.metrics]


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The warm starts are computed here, not read from the user's cache."""
    monkeypatch.setenv("RLGRAPH_CACHE", str(tmp_path))
    return tmp_path


def test_calculator_beats_mental_arithmetic(private_cache: Path) -> None:
    torch.set_num_threads(1)
    with_tool, texts, metrics = train(tool=True)
    without, _, _ = train(tool=False)
    called = sum("=" in t and "=error" not in t for t in texts) / len(texts)
    rewards = [round(m["reward/mean"], 2) for m in metrics]
    print(f"held-out exact match: with the calculator {with_tool:.2f}, without {without:.2f}; "
          f"successful calls {called:.2f}; RL reward {rewards}")
    assert with_tool >= 0.3, with_tool  # measured 0.55 (0.50 after the warm start)
    assert without <= 0.1, without  # measured 0.00
    assert called >= 0.8, texts[:5]  # the policy calls the tool and reads its observation
    assert all(m["lag/max"] <= 1 for m in metrics)  # the lag bound held over trajectories
