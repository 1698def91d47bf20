"""The policy's shape as the compiler sees it: a preset, an inline config or `path/config.json`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlgraph.errors import SpecError
from rlgraph.presets import MODEL_PRESETS, ModelShape, model_shape
from rlgraph.spec import Spec


def model_config(spec: Spec) -> dict[str, Any]:
    """The policy's Hugging Face config dict: preset, inline, or `path/config.json`."""
    model = spec.model
    if model.hf_config is not None:
        return model.hf_config
    if model.path is not None:
        file = Path(model.path) / "config.json"
        try:
            return json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SpecError(f"cannot read the model's config {file}: {exc}", ("model", "path"),
                            hint="point model.path at a Hugging Face model folder") from None
    return MODEL_PRESETS[model.preset or "tiny"]


def shape_of(spec: Spec) -> ModelShape:
    """The policy's shape, or a SpecError naming the config key it lacks."""
    try:
        return model_shape(model_config(spec))
    except (KeyError, TypeError, ValueError) as exc:
        key = ("model", "hf_config") if spec.model.hf_config is not None else ("model",)
        raise SpecError(f"the model config is unusable: missing or bad {exc}", key,
                        hint="give hidden_size, num_hidden_layers, num_attention_heads, "
                        "intermediate_size and vocab_size") from None
