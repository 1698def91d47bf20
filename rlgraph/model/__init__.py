"""Models and tokenizers built from a preset, a config or a local Hugging Face folder."""
