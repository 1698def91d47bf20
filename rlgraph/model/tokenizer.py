"""Tokenizers: a character tokenizer for the built-in tasks, or a local Hugging Face one.

Both expose the same small surface the workers use: `encode_prompt` (a string, or a chat
message list rendered through the tokenizer's chat template when it has one), `decode`,
`vocab_size` and the `pad_id` / `bos_id` / `eos_id` specials. `save_tokenizer` writes either
as Hugging Face tokenizer files (the character tokenizer as a `tokenizers` JSON that
`AutoTokenizer.from_pretrained` loads with the same ids), so a checkpoint is a model folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from rlgraph.errors import RLGraphError, SpecError
from rlgraph.presets.char_vocab import ALPHABET, SPECIALS

Prompt = str | list[dict[str, Any]]


class Tokenizer(Protocol):
    """What samplers, workers and rewards need of a tokenizer."""

    vocab_size: int
    pad_id: int
    bos_id: int | None
    eos_id: int

    def encode_prompt(self, prompt: Prompt) -> list[int]: ...

    def encode_text(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class CharTokenizer:
    """One token per character of a fixed alphabet; unknown characters map to `<unk>`."""

    def __init__(self, alphabet: str = ALPHABET):
        self.itos = list(SPECIALS) + list(alphabet)
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.vocab_size = len(self.itos)
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3

    def encode_text(self, text: str) -> list[int]:
        """Characters -> ids, no specials (lower-cased: the alphabet has no capitals)."""
        return [self.stoi.get(ch, self.unk_id) for ch in text.lower()]

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """`<bos>` + the prompt; a message list is its contents joined by newlines."""
        if not isinstance(prompt, str):
            prompt = "\n".join(str(m.get("content", "")) for m in prompt)
        return [self.bos_id, *self.encode_text(prompt)]

    def decode(self, ids: list[int]) -> str:
        """Ids -> text, stopping at `<eos>` and dropping other specials."""
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            if i >= len(SPECIALS):
                out.append(self.itos[i])
        return "".join(out)

    def to_transformers(self) -> Any:
        """The same tokenizer as a `PreTrainedTokenizerFast` (same ids, `<bos>` prepended,
        lower-cased, one token per character, decoded without separators)."""
        from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, processors
        from tokenizers import Tokenizer as RustTokenizer
        from transformers import PreTrainedTokenizerFast

        tok = RustTokenizer(models.WordLevel(dict(self.stoi), unk_token="<unk>"))
        tok.normalizer = normalizers.Lowercase()
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", self.bos_id)])
        tok.add_special_tokens(list(SPECIALS))
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>",
                                       eos_token="<eos>", pad_token="<pad>", unk_token="<unk>")


class HFTokenizer:
    """A local Hugging Face tokenizer (`model.path`), chat template applied to message lists."""

    def __init__(self, path: str):
        from transformers import AutoTokenizer

        try:
            self.tok = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise SpecError(f"cannot load a tokenizer from '{path}': {exc}", ("model", "path"),
                            hint="give a local folder with the model's tokenizer files") from None
        eos = self.tok.eos_token_id
        if eos is None:
            raise RLGraphError(f"the tokenizer at {path} has no eos token; sampling cannot stop")
        self.eos_id = int(eos)
        self.pad_id = int(self.tok.pad_token_id if self.tok.pad_token_id is not None else eos)
        self.bos_id = self.tok.bos_token_id
        self.vocab_size = len(self.tok)

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """A string as is; messages through the chat template (generation prompt added)."""
        if not isinstance(prompt, str):
            if getattr(self.tok, "chat_template", None):
                prompt = self.tok.apply_chat_template(
                    prompt, add_generation_prompt=True, tokenize=False
                )
                return list(self.tok.encode(prompt, add_special_tokens=False))
            prompt = "\n".join(str(m.get("content", "")) for m in prompt)
        return list(self.tok.encode(prompt))

    def encode_text(self, text: str) -> list[int]:
        """Text -> ids, no special tokens."""
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Ids -> text up to the first eos, special tokens dropped."""
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id)]
        return self.tok.decode(ids, skip_special_tokens=True)


def save_tokenizer(tokenizer: Tokenizer, folder: Path) -> list[str]:
    """Write `tokenizer` as Hugging Face tokenizer files into `folder`; their names."""
    hf = tokenizer.tok if isinstance(tokenizer, HFTokenizer) else tokenizer.to_transformers()
    return [Path(f).name for f in hf.save_pretrained(str(folder))]


def build_tokenizer(model_path: str | None = None) -> Tokenizer:
    """The tokenizer of a local model path, else the character tokenizer."""
    return HFTokenizer(model_path) if model_path else CharTokenizer()
