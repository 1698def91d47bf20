"""The policy of a checkpoint as a Hugging Face model folder.

A checkpoint's policy is `config.json`, `generation_config.json`, `model.safetensors` and the
tokenizer's files side by side, so `AutoModelForCausalLM.from_pretrained(DIR/checkpoint)` and
`AutoTokenizer.from_pretrained(DIR/checkpoint)` load it as it is (no copying or renaming).
The config and tokenizer files do not change during a run: `policy_files` renders them once.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rlgraph.config.schema import Spec

MODEL_WEIGHTS = "model.safetensors"


def policy_files(spec: Spec) -> dict[str, bytes]:
    """{file name: bytes} of the policy's config, generation config and tokenizer files."""
    from transformers import AutoConfig, GenerationConfig

    from rlgraph.model.build import model_config
    from rlgraph.model.tokenizer import build_tokenizer, save_tokenizer

    tokenizer = build_tokenizer(spec.model.path)
    if spec.model.path:
        config = AutoConfig.from_pretrained(spec.model.path)
    else:
        config = model_config(spec.model, tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        GenerationConfig.from_model_config(config).save_pretrained(tmp)
        save_tokenizer(tokenizer, Path(tmp))
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
