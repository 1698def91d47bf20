"""The policy's shape as the compiler sees it: a preset, an inline config or `path/config.json`,
with the vocabulary of the model the priced runtime builds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlgraph.config.schema import Spec
from rlgraph.errors import SpecError
from rlgraph.presets.char_vocab import CHAR_VOCAB_SIZE
from rlgraph.presets.models import MODEL_PRESETS, ModelShape, model_shape
from rlgraph.pricing.system import system_of


def model_config(spec: Spec) -> dict[str, Any]:
    """The policy's Hugging Face config dict: preset, inline, or `path/config.json`."""
    model = spec.model
    if model.hf_config is not None:
        return model.hf_config
    if model.path is not None:
        file = Path(model.path) / "config.json"
        if file.exists() and not file.is_file():  # a FIFO or device would block or never end
            raise SpecError(f"{file} is not a regular file", ("model", "path"),
                            hint="point model.path at a Hugging Face model folder")
        try:
            return json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpecError(f"cannot read the model's config {file}: {exc}", ("model", "path"),
                            hint="point model.path at a Hugging Face model folder") from None
    return MODEL_PRESETS[model.preset or "tiny"]


# The shape keys of a Hugging Face config the compiler reads, with the range it accepts
# (the largest released models stay well inside: hidden 16384+, 128 layers, 256 experts).
CONFIG_BOUNDS: dict[str, tuple[int, int]] = {
    "hidden_size": (1, 1 << 20),
    "num_hidden_layers": (1, 10_000),
    "num_attention_heads": (1, 1 << 14),
    "num_key_value_heads": (1, 1 << 14),
    "head_dim": (1, 1 << 16),
    "vocab_size": (1, 1 << 24),
    "intermediate_size": (1, 1 << 22),
    "moe_intermediate_size": (1, 1 << 22),
    "n_routed_experts": (0, 1 << 14),
    "num_experts": (0, 1 << 14),
    "n_shared_experts": (0, 1 << 10),
    "first_k_dense_replace": (0, 10_000),
    "num_experts_per_tok": (1, 1 << 10),
}


def check_config(config: Any, key: tuple[str, ...]) -> None:
    """Each shape key present is a whole number within CONFIG_BOUNDS (named if not)."""
    if not isinstance(config, dict):
        raise SpecError("the model config is not a mapping", key)
    for name, (low, high) in CONFIG_BOUNDS.items():
        value = config.get(name)
        if value is None:
            continue
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not whole or not low <= value <= high:
            shown = repr(value) if len(repr(value)) < 40 else f"{repr(value)[:37]}..."
            raise SpecError(f"{name} must be a whole number from {low} to {high}, not {shown}",
                            (*key, name) if key[-1] == "hf_config" else key)


def priced_vocab(spec: Spec, config: dict[str, Any]) -> int:
    """The vocabulary the plan prices: without `model.path` rlgraph's runtime builds the
    policy with the character tokenizer's vocabulary (`rlgraph.model.build.model_config`), so
    a preset's or inline config's 151k-entry table is not what it runs; a plan priced as
    verl's hybrid engine (real runs use the model's own tokenizer) keeps the config's."""
    if spec.model.path is None and system_of(spec).runs_here:
        return CHAR_VOCAB_SIZE
    return int(config["vocab_size"])


def shape_of(spec: Spec) -> ModelShape:
    """The policy's shape as the priced runtime builds it (`priced_vocab`), or a SpecError
    naming the config key it lacks."""
    key = ("model", "hf_config") if spec.model.hf_config is not None else (
        ("model", "path") if spec.model.path is not None else ("model",))
    config = model_config(spec)
    check_config(config, key)
    if "vocab_size" in config:
        config = {**config, "vocab_size": priced_vocab(spec, config)}
    try:
        return model_shape(config)
    except (KeyError, TypeError, ValueError, ArithmeticError) as exc:
        raise SpecError(f"the model config is unusable: missing or bad {exc}", key,
                        hint="give hidden_size, num_hidden_layers, num_attention_heads, "
                        "intermediate_size and vocab_size") from None
