"""Supervised warm start on an environment's demonstrations: the turns a good policy would
take (`Env.demonstration(prompt, sample)`), played through the environment itself so the
observations are the environment's own, masked out of the loss as in RL."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlgraph.envs.host import check_step
from rlgraph.envs.load import build_env, load_env_class, stop_strings
from rlgraph.envs.rollout import prompt_text, sample_dict

if TYPE_CHECKING:
    import torch

    from rlgraph.envs.spec import EnvSpec
    from rlgraph.model.tokenizer import Tokenizer


def demonstrating_env(spec: Any) -> EnvSpec | None:
    """The env block of the graph's generate node when its environment demonstrates (has a
    `demonstration` method), else None."""
    from rlgraph.compiler.references import base_dir

    for node in spec.nodes.values():
        env = getattr(node, "env", None)
        if env is not None:
            cls = load_env_class(env.fn, ("env", "fn"), base_dir(spec))
            return env if callable(getattr(cls, "demonstration", None)) else None
    return None


def demonstration(env_spec: EnvSpec, tokenizer: Tokenizer, example: Any, limit: int,
                  base_dir: Path | None = None) -> tuple[list[int], list[int]]:
    """(response token ids, mask) of the example's demonstration: each turn's tokens (mask
    1, eos after a turn that no stop string ends), each observation's (mask 0), cut at
    `limit` tokens."""
    env = build_env(load_env_class(env_spec.fn, ("env", "fn"), base_dir), env_spec.config(),
                    env_spec.fn)
    stop = stop_strings(env)
    key = f"{example.uid}#0"
    context = env.reset(prompt_text(example.prompt), sample_dict(example, 0, key))
    ids = tokenizer.encode_text(context) if context else []
    mask = [0] * len(ids)
    for turn in env.demonstration(prompt_text(example.prompt), sample_dict(example, 0, key)):
        action = tokenizer.encode_text(turn)
        if not any(turn.endswith(s) for s in stop):
            action.append(tokenizer.eos_id)
        ids, mask = ids + action, mask + [1] * len(action)
        observation, _, done, _ = check_step(env.step(turn))
        if done:
            break
        seen = tokenizer.encode_text(observation)
        ids, mask = ids + seen, mask + [0] * len(seen)
    return ids[:limit], mask[:limit]


def demonstration_batch(env_spec: EnvSpec, tokenizer: Tokenizer, examples: list[Any],
                        limit: int, base_dir: Path | None = None
                        ) -> dict[str, torch.Tensor | int]:
    """A warm-start batch of demonstrations in the sampler's layout (`response_mask` 1 on
    the turns' tokens only)."""
    import torch

    from rlgraph.engines.cpu_decode import left_pad

    prompt_ids, prompt_mask = left_pad([tokenizer.encode_prompt(ex.prompt) for ex in examples],
                                       tokenizer.pad_id)
    rows = [demonstration(env_spec, tokenizer, ex, limit, base_dir) for ex in examples]
    width = max(len(ids) for ids, _ in rows)
    answer = torch.full((len(rows), width), tokenizer.pad_id, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.long)
    sampled = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (ids, mask) in enumerate(rows):
        answer[i, : len(ids)] = torch.tensor(ids)
        real[i, : len(ids)] = 1
        sampled[i, : len(ids)] = torch.tensor(mask)
    return {"sequences": torch.cat([prompt_ids, answer], 1),
            "attention_mask": torch.cat([prompt_mask, real], 1),
            "response_mask": sampled, "prompt_len": prompt_ids.shape[1]}
