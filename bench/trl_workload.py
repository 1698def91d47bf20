"""The TRL comparison's workload, built from nothing, as a TRL or verl user would bring it.

`build(folder)` writes:

- `model/`: a ~330K-parameter Llama (`LLAMA`) with a character tokenizer saved as a
  `tokenizers` / `PreTrainedTokenizerFast` folder, warm-started by `WARM_STEPS` steps of
  supervised cross-entropy on addition examples drawn apart from the train and held-out
  prompts (AdamW, lr `WARM_LR`, batch `WARM_BATCH`, seeded), then `save_pretrained`;
- `data/train.parquet`, `data/val.parquet`: addition prompts ("23+45=") in verl's format
  (`data_source`, `prompt`, `reward_model: {style, ground_truth}`, `extra_info`);
- `reward.py`: a verl-style `compute_score(data_source, solution_str, ground_truth,
  extra_info=None)`, 1.0 for the exact sum, else 0.0.

Both TRL and rlgraph read these same files. Everything is seeded, so a folder built twice
holds the same model and data.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

LLAMA = dict(model_type="llama", hidden_size=64, num_hidden_layers=5, num_attention_heads=4,
             num_key_value_heads=4, intermediate_size=256, max_position_embeddings=64,
             tie_word_embeddings=True, rms_norm_eps=1e-6)
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]
CHARS = list("0123456789+=")
OPERAND_MAX = 49  # a + b with a, b in 0..49
TRAIN_PROMPTS, VAL_PROMPTS = 5000, 1000
VERSION = 2  # bump when what `build` writes changes: a folder of another version is rebuilt
WARM_STEPS, WARM_LR, WARM_BATCH = 320, 3e-3, 64
REWARD = '''"""verl-style reward: 1.0 when the response is exactly the sum, else 0.0."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if str(solution_str).strip() == str(ground_truth).strip() else 0.0
'''


def examples(split: str, n: int, seed: int = 0) -> list[tuple[str, str]]:
    """`n` seeded (prompt, answer) pairs of a split: "23+45=" -> "68"."""
    rng = random.Random(f"{seed}:add:{split}")
    out = []
    for _ in range(n):
        a, b = rng.randint(0, OPERAND_MAX), rng.randint(0, OPERAND_MAX)
        out.append((f"{a}+{b}=", str(a + b)))
    return out


def write_parquet(path: Path, split: str, n: int) -> None:
    """verl's row layout, one addition per row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"data_source": "add", "prompt": prompt,
             "reward_model": {"style": "rule", "ground_truth": answer},
             "extra_info": {"split": split, "index": i}}
            for i, (prompt, answer) in enumerate(examples(split, n))]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def char_tokenizer():
    """One token per character, eos / pad / bos specials, no tokens added on encode."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>",
                                   bos_token="<bos>", unk_token="<unk>")


def warm_start(model, tokenizer, steps: int = WARM_STEPS, seed: int = 0) -> list[float]:
    """Supervised cross-entropy on the answers (prompt tokens masked), examples of their own
    split; returns the losses."""
    import torch

    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_LR)
    pool = examples("warm_start", steps * WARM_BATCH, seed)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    losses = []
    model.train()
    for s in range(steps):
        batch = pool[s * WARM_BATCH:(s + 1) * WARM_BATCH]
        seqs = [(tokenizer.encode(p), [*tokenizer.encode(a), eos]) for p, a in batch]
        width = max(len(p) + len(a) for p, a in seqs)
        ids = torch.full((len(seqs), width), pad)
        labels = torch.full((len(seqs), width), -100)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (p, a) in enumerate(seqs):
            ids[i, :len(p) + len(a)] = torch.tensor(p + a)
            labels[i, len(p):len(p) + len(a)] = torch.tensor(a)
            mask[i, :len(p) + len(a)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def greedy_accuracy(model, tokenizer, split: str = "val", n: int = VAL_PROMPTS,
                    max_new_tokens: int = 8) -> float:
    """Exact-match accuracy of greedy answers to the split's prompts (transformers
    `generate`, left padding), scored by the workload's `compute_score`."""
    import torch

    namespace: dict = {}
    exec(REWARD, namespace)
    pairs = examples(split, n)
    tokenizer.padding_side = "left"
    enc = tokenizer([p for p, _ in pairs], return_tensors="pt", padding=True,
                    add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(namespace["compute_score"]("add", t, a) for t, (_, a) in zip(texts, pairs)) / n


def build(folder: Path) -> dict:
    """Write the model folder, the data files and the reward file (see the module
    docstring); returns what was built. Skips the work when `folder/workload.json` exists."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    done = folder / "workload.json"
    if done.exists() and json.loads(done.read_text()).get("version") == VERSION:
        return json.loads(done.read_text())
    tokenizer = char_tokenizer()
    config = AutoConfig.for_model(**LLAMA, vocab_size=len(tokenizer),
                                  pad_token_id=tokenizer.pad_token_id,
                                  eos_token_id=tokenizer.eos_token_id,
                                  bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.set_num_threads(1)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        losses = warm_start(model, tokenizer)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    write_parquet(folder / "data" / "train.parquet", "train", TRAIN_PROMPTS)
    write_parquet(folder / "data" / "val.parquet", "val", VAL_PROMPTS)
    (folder / "reward.py").write_text(REWARD)
    params = {id(p): p for p in model.parameters()}.values()  # tied embeddings once
    info = {"version": VERSION, "params": sum(p.numel() for p in params),
            "llama": LLAMA, "vocab": len(tokenizer),
            "warm_start": {"steps": WARM_STEPS, "lr": WARM_LR, "batch": WARM_BATCH,
                           "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
                           "val_accuracy_greedy": greedy_accuracy(model, tokenizer)},
            "train_prompts": TRAIN_PROMPTS, "val_prompts": VAL_PROMPTS,
            "operands": [0, OPERAND_MAX]}
    done.write_text(json.dumps(info, indent=2) + "\n")
    return info


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Build the TRL-comparison workload folder.")
    parser.add_argument("out", nargs="?", default="/tmp/vs_trl", help="folder to build in")
    print(json.dumps(build(Path(parser.parse_args().out)), indent=2))
