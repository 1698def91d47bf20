"""The policy and reference models: transformers causal LMs from a preset, a config or a path.

`model: {preset: tiny}` (or any preset of rlgraph.presets.models) and `model: {hf_config: {...}}`
build a randomly initialised model, seeded, so every group that builds it holds identical
version-0 weights; `model: {path: /models/x}` loads weights and tokenizer from a local folder.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import TYPE_CHECKING, Any

import torch

from rlgraph.errors import SpecError
from rlgraph.presets.models import MODEL_PRESETS

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from rlgraph.config.schema import ModelSpec
    from rlgraph.model.tokenizer import Tokenizer


def model_config(spec: ModelSpec, tokenizer: Tokenizer) -> PretrainedConfig:
    """The transformers config of a preset or an inline `hf_config`, with the tokenizer's ids."""
    from transformers import AutoConfig

    if spec.hf_config is not None:
        raw: dict[str, Any] = dict(spec.hf_config)
        key: tuple[str, ...] = ("model", "hf_config")
    else:
        raw, key = dict(MODEL_PRESETS[spec.preset or "tiny"]), ("model", "preset")
    model_type = raw.pop("model_type", None)
    if model_type is None:
        raise SpecError("the config has no 'model_type'", key, hint="e.g. model_type: llama")
    try:
        config = AutoConfig.for_model(model_type, **raw)
    except ValueError as exc:
        raise SpecError(f"transformers cannot build model_type '{model_type}': {exc}", key,
                        hint="use a model_type transformers knows (llama, qwen2, qwen3, ...)"
                        ) from None
    # Without a model path the tokenizer is the character tokenizer: the embedding gets
    # exactly its vocabulary, so the policy can never sample an id the tokenizer lacks.
    config.vocab_size = tokenizer.vocab_size
    config.pad_token_id, config.eos_token_id = tokenizer.pad_id, tokenizer.eos_id
    config.bos_token_id = tokenizer.bos_id
    return config


def build_model(spec: ModelSpec, tokenizer: Tokenizer, seed: int = 0,
                device: str = "cpu") -> PreTrainedModel:
    """A causal LM in fp32 (CPU) or bf16 (GPU); random init is seeded by `seed`."""
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    if spec.path is not None:
        try:
            model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=dtype)
        except OSError as exc:
            raise SpecError(f"cannot load a model from '{spec.path}': {exc}", ("model", "path"),
                            hint="give a local folder with config.json and weights") from None
    else:
        config = model_config(spec, tokenizer)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(device)


@cache
def _cache_keyword(forward_owner: type) -> str:
    params = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def with_cache(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """The keyword that hands `cache` to `model`'s forward: `cache` from transformers 5.2x on
    (where `past_key_values` is deprecated), `past_key_values` before."""
    return {_cache_keyword(type(model)): cache}
