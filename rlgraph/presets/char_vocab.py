"""The character tokenizer's vocabulary, which the runtime's policy is built with when no
`model.path` gives a tokenizer (`rlgraph.model.build.model_config`), and which the compiler
prices for rlgraph's runtime (`rlgraph.compiler.shapes.shape_of`); no torch, no transformers."""

from __future__ import annotations

# Specials first so their ids never move when the alphabet grows.
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz +-*=?:,.()<>\n"
CHAR_VOCAB_SIZE = len(SPECIALS) + len(ALPHABET)
