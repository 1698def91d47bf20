"""What durability costs on the quickstart's policy: a checkpoint write, a checked load, a
weights digest.

The figures behind the runtime's default checkpoint interval (`CHECKPOINT_EVERY_S`) and the
`--verify-weights` note in the README. One checkpoint as the runner writes it (the policy as
a Hugging Face folder, AdamW state, one rollout batch of the quickstart's size, the
manifest, every file fsync'd), then loaded with every SHA-256 checked; the digest is one
`rlgraph.weights.buckets.digest` of the policy (a sync with `--verify-weights` takes two). Repeats
interleave the three, and the medians and ranges go to bench/results/checkpoint_cost.json.

    python bench/checkpoint_cost.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from common import ROOT, machine, write_result

from rlgraph.config.load import load_spec
from rlgraph.model.build import build_model
from rlgraph.model.tokenizer import CharTokenizer
from rlgraph.runtime import checkpoint as ckpt
from rlgraph.runtime.hf_folder import policy_files
from rlgraph.weights.buckets import digest


def figures(values: list[float]) -> dict[str, float]:
    """Median and range in milliseconds."""
    return {"median_ms": round(statistics.median(values) * 1e3, 2),
            "min_ms": round(min(values) * 1e3, 2), "max_ms": round(max(values) * 1e3, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    spec = load_spec(ROOT / "graphs" / "quickstart.yaml", [])
    policy = build_model(spec.model, CharTokenizer(), seed=0)
    optimizer = torch.optim.AdamW(policy.parameters())
    policy(torch.tensor([[1, 5, 6]])).logits.sum().backward()
    optimizer.step()
    state = {"weights": policy.state_dict(), "optimizer": optimizer.state_dict(),
             "policy_version": 1, "seed": 0}
    rows = spec.data.prompts_per_step * spec.data.samples_per_prompt
    width = spec.data.prompt_len + spec.data.response_len.max
    batch = {"sequences": torch.zeros(rows, width, dtype=torch.long),
             "behavior_logp": torch.zeros(rows, spec.data.response_len.max),
             "token_version": torch.zeros(rows, spec.data.response_len.max, dtype=torch.long),
             "prompt_uid": [f"add_small:train:{i}" for i in range(rows)]}
    files = policy_files(spec)
    times: dict[str, list[float]] = {"write": [], "load": [], "digest": []}
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        for i in range(args.repeats):
            start = time.perf_counter()
            ckpt.save_checkpoint(run, {"step": i, "policy_version": i}, state,
                                 {("generate", i): batch}, None, files)
            times["write"].append(time.perf_counter() - start)
            start = time.perf_counter()
            ckpt.load_checkpoint(run)
            times["load"].append(time.perf_counter() - start)
            start = time.perf_counter()
            digest(policy.state_dict())
            times["digest"].append(time.perf_counter() - start)
        size = sum(f.stat().st_size for f in (run / ckpt.CHECKPOINT).iterdir())
    result = {"what": "checkpoint write / checked load / weights digest of the quickstart policy",
              "params": sum(p.numel() for p in policy.parameters()), "checkpoint_bytes": size,
              "repeats": args.repeats, **{k: figures(v) for k, v in times.items()},
              "machine": machine(), "command": "python bench/checkpoint_cost.py"}
    write_result("checkpoint_cost.json", result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
