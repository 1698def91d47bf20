"""Where a train step of long sequences goes on one GPU: the runtime's own train step
(`TrainWorker.run`) on a batch of the long-tail graph's lengths, first with pass shapes it has
not seen (as a run's early steps), then warm, then on a fresh draw of lengths (the new shapes
a later step of a run meets); beside it, the same length-sorted passes' forward + backward
alone (no host reads), the same with the device synchronised after every pass, and the
gradient clip + AdamW step: each timed with the device synchronised around it, the passes'
device time also by CUDA events.

    python bench/train_split.py [--cpu] [key=value ...]

Writes gpu-train-split.json under --out (bench/results by default; `--cpu`: a rehearsal on
tiny shapes).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, device_info, machine

GRAPH = ROOT / "bench" / "graphs_gpu" / "longtail-1gpu.yaml"
CPU_OVERRIDES = ["model={preset: tiny}", "data.prompts_per_step=4",
                 "data.response_len={mean: 16, max: 64, dist: lognormal, sigma: 1.5}",
                 "nodes.train.micro_tokens=256"]


def draw_lengths(spec: Any, rows: int, seed: int) -> list[int]:
    """Each row's response length, drawn from the graph's distribution (as forced lengths)."""
    from rlgraph import lengths

    model, rng = lengths.of(spec.data.response_len), random.Random(seed)
    return [max(1, int(model.length_at(rng.random()))) for _ in range(rows)]


def make_batch(spec: Any, vocab: int, lens: list[int], version: int) -> dict[str, Any]:
    """A scored batch as generate + reward hand it to train: `lens` responses after prompts
    of `data.prompt_len` tokens, sampled by policy `version` (so train takes its own forward's
    log-probs as the old ones: on-policy, one update, as the synchronous runs)."""
    import torch

    rows, P, width = len(lens), spec.data.prompt_len, max(lens)
    k = spec.data.samples_per_prompt
    g = torch.Generator().manual_seed(version)
    response = (torch.arange(width)[None, :] < torch.tensor(lens)[:, None]).long()
    attention = torch.cat([torch.ones(rows, P, dtype=torch.long), response], dim=1)
    uids = [f"train:{i // k}" for i in range(rows)]
    return {
        "step": version, "policy_version": version, "temperature": 1.0,
        "prompt_uid": uids, "data_position": [i // k for i in range(rows)],
        "group": torch.arange(rows) // k, "prompt": ["p"] * rows,
        "data_source": ["bench"] * rows, "ground_truth": ["0"] * rows,
        "extra_info": [{"index": i // k, "split": "train"} for i in range(rows)],
        "response_text": ["r"] * rows,
        "sequences": torch.randint(3, vocab, (rows, P + width), generator=g) * attention,
        "attention_mask": attention, "prompt_len": P, "response_mask": response,
        "behavior_logp": -3 * torch.rand(rows, width, generator=g) * response,
        "token_version": torch.where(response.bool(), version, -1),
        "rewards": (torch.arange(rows) % 2).float(),
    }


def train_workspace(description: str) -> tuple[argparse.Namespace, list[str], Any, str, Any]:
    """The long-tail benchmarks' command line (`--cpu`, `--out`, overrides) parsed, and the
    train workspace of GRAPH built on the GPU (the CPU with `--cpu`, tiny shapes): (args,
    the overrides applied, the spec, the device, the workspace)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--cpu", action="store_true", help="rehearse on the CPU, tiny shapes")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("overrides", nargs="*", default=["data.response_len.sigma=1.5"])
    args = parser.parse_args()
    from rlgraph.config.load import load_spec
    from rlgraph.process.workspace import Workspace

    overrides = [*args.overrides, *(CPU_OVERRIDES if args.cpu else [])]
    spec = load_spec(GRAPH, overrides)
    device = "cpu" if args.cpu else "cuda"
    return args, overrides, spec, device, Workspace(spec, ["train"], seed=0, device=device)


def main() -> int:
    """Time the parts, print them, write the result."""
    args, overrides, spec, device, ws = train_workspace(__doc__.splitlines()[0])
    import torch

    from rlgraph.engines.cpu_decode import length_batches, token_logp

    train, policy = ws.worker("train"), ws.policy
    vocab = policy.config.vocab_size
    rows = spec.data.prompts_per_step * spec.data.samples_per_prompt
    micro = spec.nodes["train"].micro_tokens

    def sync() -> None:
        if not args.cpu:
            torch.cuda.synchronize()

    def timed(fn: Any) -> tuple[float, Any]:
        sync()
        began = time.perf_counter()
        out = fn()
        sync()
        return time.perf_counter() - began, out

    out: dict[str, Any] = {"benchmark": "train_split", "machine": machine(),
                           "device": device_info(args.cpu), "graph": str(GRAPH.relative_to(ROOT)),
                           "overrides": overrides, "rows": rows, "micro_tokens": micro,
                           "command": "python bench/train_split.py " + " ".join(sys.argv[1:]),
                           "calls": []}
    version = 0

    def step(lens: list[int], label: str) -> None:
        nonlocal version
        batch = make_batch(spec, vocab, lens, ws.policy_version)
        seconds, res = timed(lambda: train.run(ws.policy_version, {"reward": batch}))
        m = res["metrics"]
        passes = length_batches(batch["response_mask"], spec.data.prompt_len, micro)
        padded = sum(len(i) * (spec.data.prompt_len + w) for i, w in passes)
        row = {"call": label, "train_s": round(seconds, 4), "passes": len(passes),
               "tokens": int(m["tokens"]), "padded_tokens": padded,
               "new_pass_shapes": m.get("train/new_pass_shapes"),
               "device_mallocs": m.get("train/device_mallocs"),
               "alloc_retries": m.get("train/alloc_retries"),
               "logp_skipped": m.get("logp/skipped")}
        out["calls"].append(row)
        print(json.dumps(row), flush=True)
        version += 1

    first = draw_lengths(spec, rows, 0)
    step(first, "first (new shapes)")
    step(first, "warm")
    step(first, "warm again")
    step(draw_lengths(spec, rows, 1), "fresh lengths")
    step(draw_lengths(spec, rows, 2), "fresh lengths again")

    # the warm passes of the first draw, alone
    batch = make_batch(spec, vocab, first, 0)
    seq, att = batch["sequences"].to(device), batch["attention_mask"].to(device)
    mask = batch["response_mask"].float().to(device)
    P = spec.data.prompt_len
    passes = length_batches(batch["response_mask"], P, micro)

    def run_passes(each_sync: bool) -> None:
        for index, w in passes:
            sl = index.to(device)
            logp = token_logp(policy, seq[sl, :P + w], att[sl, :P + w], P, 1.0)
            (logp * mask[sl, :w]).sum().backward()
            if each_sync:
                float(mask[sl, :w].sum())  # the host reads a figure, as train's loop does

    parts: dict[str, float] = {}
    policy.zero_grad(set_to_none=True)
    parts["passes_s"], _ = timed(lambda: run_passes(False))
    if not args.cpu:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run_passes(False)
        end.record()
        sync()
        parts["passes_device_s"] = start.elapsed_time(end) / 1e3
    parts["passes_each_read_s"], _ = timed(lambda: run_passes(True))
    parts["clip_s"], _ = timed(lambda: torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0))
    parts["optimizer_step_s"], _ = timed(lambda: ws.optimizer.step())
    parts["zero_grad_s"], _ = timed(lambda: ws.optimizer.zero_grad(set_to_none=True))
    out["parts_first_draw_warm"] = {k: round(v, 4) for k, v in parts.items()}
    out["passes_first_draw"] = len(passes)
    print(json.dumps(out["parts_first_draw_warm"]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-train-split.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
