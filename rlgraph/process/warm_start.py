"""Supervised warm start: `model.warm_start.steps` of cross-entropy on the task's answers
(or, for a generate node whose environment demonstrates, on its demonstrations played
through the environment: `rlgraph.envs.demonstrate`).

RL from random weights cannot learn an exact-answer task: a random policy almost never
samples a correct answer, so every GRPO group has zero advantage. A short supervised warm
start teaches the answer format and part of the task; RL then raises the sampled reward.
The learning rate stays constant: a decayed warm start settles in a sharp minimum where a
fresh RL optimizer's first steps undo it (measured on the tiny preset), a constant one does
not. It runs single-threaded and seeded so every group that builds the model computes identical
version-0 weights, and the result is cached on disk (`$RLGRAPH_CACHE`, default
~/.cache/rlgraph) keyed by everything that decides it (the data files by their contents, not
their names), so repeated runs skip it. The cache holds data only: `<key>.safetensors` (the
weights) and `<key>.json` (the loss curve); a damaged entry is computed again.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from rlgraph.engines.cpu_decode import left_pad, token_logp
from rlgraph.rl.data import DataSource, Example, task_example
from rlgraph.rl.loss import masked_mean

if TYPE_CHECKING:
    from rlgraph.config.schema import Spec
    from rlgraph.model.tokenizer import Tokenizer

_VERSION = 3  # bump when the procedure changes, to invalidate cached results


def _examples(spec: Spec, source: DataSource, start: int, n: int) -> list[Example]:
    """Warm-start examples: a separate seeded stream of a built-in task, or shuffled rows."""
    if source.examples is None:
        return [task_example(spec.data.task, spec.data.seed, "warm_start", start + i)
                for i in range(n)]
    rng = random.Random(f"{spec.data.seed}:warm_start:{start}")
    return [rng.choice(source.examples) for _ in range(n)]


def sft_batch(tokenizer: Tokenizer, examples: list[Example]) -> dict[str, torch.Tensor | int]:
    """Prompt (left-padded) + answer + eos (right-padded), in the sampler's layout."""
    prompts = [tokenizer.encode_prompt(ex.prompt) for ex in examples]
    answers = [[*tokenizer.encode_text(str(ex.ground_truth)), tokenizer.eos_id]
               for ex in examples]
    prompt_ids, prompt_mask = left_pad(prompts, tokenizer.pad_id)
    width = max(len(a) for a in answers)
    answer_ids = torch.full((len(answers), width), tokenizer.pad_id, dtype=torch.long)
    answer_mask = torch.zeros((len(answers), width), dtype=torch.long)
    for i, a in enumerate(answers):
        answer_ids[i, : len(a)] = torch.tensor(a)
        answer_mask[i, : len(a)] = 1
    return {"sequences": torch.cat([prompt_ids, answer_ids], 1),
            "attention_mask": torch.cat([prompt_mask, answer_mask], 1),
            "response_mask": answer_mask, "prompt_len": prompt_ids.shape[1]}


def _data_digest(spec: Spec, base_dir: Path | None) -> list[str]:
    """SHA-256 of each training data file's bytes (edited data is a new cache entry)."""
    digests = []
    for name in spec.data.train_files or []:
        path = Path(name).expanduser()
        if not path.is_absolute() and not path.exists() and base_dir is not None:
            path = base_dir / path
        h = hashlib.sha256()
        try:
            with path.open("rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        except OSError:
            h.update(f"unreadable:{name}".encode())
        digests.append(h.hexdigest())
    return digests


def cache_path(spec: Spec, seed: int, tokenizer: Tokenizer, base_dir: Path | None = None
               ) -> Path:
    """Where the warm-started weights of this (model, data, warm start, seed) are kept
    (`.safetensors`; the losses beside it as `.json`)."""
    vocab = getattr(tokenizer, "itos", tokenizer.vocab_size)
    from rlgraph.envs.demonstrate import demonstrating_env

    env = demonstrating_env(spec)  # demonstrations through the env, when it gives them
    key = json.dumps({"model": spec.model.model_dump(mode="json"), "vocab": vocab,
                      **({"env": env.model_dump(mode="json")} if env is not None else {}),
                      "data": [spec.data.task, _data_digest(spec, base_dir), spec.data.seed],
                      "seed": seed, "torch": torch.__version__, "v": _VERSION},
                     sort_keys=True, default=str)
    root = Path(os.environ.get("RLGRAPH_CACHE", Path.home() / ".cache" / "rlgraph"))
    return root / "warm_start" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.safetensors"


def _load_cached(model: torch.nn.Module, path: Path) -> list[float] | None:
    """The cached weights loaded into `model` and their losses, or None (absent or damaged:
    the warm start runs again and replaces it)."""
    from safetensors.torch import load_file

    losses_file = path.with_suffix(".json")
    if not (path.is_file() and losses_file.is_file()):
        return None
    try:
        losses = json.loads(losses_file.read_text())
        weights = load_file(str(path))
        model.load_state_dict(weights)
    except Exception:  # a torn or foreign file: compute it again
        return None
    if not isinstance(losses, list) or not all(isinstance(x, float | int) for x in losses):
        return None
    return [float(x) for x in losses]


def _store(model: torch.nn.Module, losses: list[float], path: Path) -> None:
    """Write the cache entry (each file whole or not at all; a full disk skips caching)."""
    from safetensors.torch import save_file

    from rlgraph.runtime.state_files import owned

    weights: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        weights[name] = owned(tensor, weights)  # tied embeddings: the second name a copy
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for target, write in ((path.with_suffix(".json"),
                               lambda t: t.write_text(json.dumps(losses))),
                              (path, lambda t: save_file(weights, str(t)))):
            tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
            write(tmp)
            os.replace(tmp, target)
    except OSError:
        return


def warm_start(model: torch.nn.Module, tokenizer: Tokenizer, spec: Spec, seed: int,
               base_dir: Path | None = None) -> list[float]:
    """Run (or load from cache) the supervised warm start in place; returns the loss curve."""
    ws = spec.model.warm_start
    if ws.steps == 0:
        return []
    path = cache_path(spec, seed, tokenizer, base_dir)
    cached = _load_cached(model, path)
    if cached is not None:
        return cached
    from rlgraph.envs.demonstrate import demonstrating_env, demonstration_batch

    source = DataSource(spec.data, "train", base_dir)
    env = demonstrating_env(spec)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: bit-identical results in every process
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            optimizer = torch.optim.AdamW(model.parameters(), lr=ws.lr, weight_decay=0.0)
            losses = []
            for step in range(ws.steps):
                examples = _examples(spec, source, step * ws.batch_size, ws.batch_size)
                batch = (sft_batch(tokenizer, examples) if env is None else
                         demonstration_batch(env, tokenizer, examples,
                                             spec.data.response_len.max, base_dir))
                logp = token_logp(model, batch["sequences"], batch["attention_mask"],
                                  batch["prompt_len"])
                loss = -masked_mean(logp, batch["response_mask"])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
    finally:
        torch.set_num_threads(threads)
    _store(model, losses, path)
    return losses
