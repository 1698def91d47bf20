"""`model: {path: ...}`: a local Hugging Face model and tokenizer, chat prompts templated."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rl_support import make_spec

from rlgraph.errors import SpecError
from rlgraph.process.workspace import Workspace
from rlgraph.rl.data import write_task_file

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A micro Llama and a character-level fast tokenizer with a chat template, on disk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("hf-model")
    chars = "0123456789+=abcdefghijklmnopqrstuvwxyz <>|:\n"
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3,
             **{c: i + 4 for i, c in enumerate(chars)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>",
                                  eos_token="</s>", unk_token="<unk>")
    tok.chat_template = TEMPLATE
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                         max_position_embeddings=128, eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_local_model_and_chat_template(model_dir: Path, tmp_path: Path) -> None:
    train = write_task_file(tmp_path / "train.jsonl", "arithmetic", 8, chat=True)
    spec = make_spec(model={"path": str(model_dir)},
                     data={"train_files": [str(train)], "prompt_len": 40},
                     train={"lr": 1e-3})
    ws = Workspace(spec, ["generate", "reward", "train"])
    assert ws.tokenizer.eos_id == 2 and ws.tokenizer.pad_id == 0
    examples, ids = ws.worker("generate").prompts(0)
    text = ws.tokenizer.tok.decode(ids[0])
    assert text == f"<|user|>{examples[0].prompt[0]['content']}\n<|assistant|>"
    gen = ws.worker("generate").run(0, {})
    assert ws.tokenizer.decode([*ws.tokenizer.encode_text("12"), 2, 5]) == "12"
    out = ws.worker("train").run(0, {"reward": ws.worker("reward").run(0, {"g": gen})})
    assert out["policy_version"] == 1 and out["trained_uids"][0].startswith("train.jsonl:")
    # every group loads the same version-0 weights from the path
    assert Workspace(spec, ["generate"]).weights_digest() == \
        Workspace(spec, ["train"]).weights_digest()


def test_missing_model_path_is_a_spec_error(tmp_path: Path) -> None:
    spec = make_spec(model={"path": str(tmp_path / "nothing")})
    with pytest.raises(SpecError, match="cannot load a tokenizer") as err:
        Workspace(spec, ["generate"])
    assert err.value.key == ("model", "path")
