"""Checkpoints and the ledger of trained prompts: what `--resume DIR` needs to go on at step k.

`DIR/checkpoint/` (the latest one; replaced atomically) holds
- `weights.safetensors`: the policy after train step k-1 (version k);
- `trainer.pt`: the rest of the train workspace's state (optimizer, seed);
- `rollout.pt`: the rollout buffer, batches generated but not yet trained (steps >= k),
  with every token's behaviour log-prob and version, so nothing sampled is lost or redone;
- `rollout_cache.pt` (partial rollout only): per generate node, its rollout cache (the prompt
  groups in flight with their unfinished samples' tokens, log-probs and versions, and the
  next data position) as it stood after the last buffered step;
- `meta.json`: step k, policy version, data position (the next step generate samples),
  the buffered steps and where the trace's clock stood.

`DIR/ledger.jsonl` has one line per trained step with the prompt ids it trained on; a resumed
run cuts it at k and appends, so it equals the ledger of an uninterrupted run.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlgraph.errors import RLGraphError

CHECKPOINT = "checkpoint"


class CheckpointError(RLGraphError):
    """A run dir without a usable checkpoint."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: meta, the train workspace's state, the rollout buffer and the
    partial-rollout caches (generate node -> cache state)."""

    meta: dict[str, Any]
    state: dict[str, Any]
    rollout: dict[tuple[str, int], dict[str, Any]]
    caches: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def step(self) -> int:
        """The next train step."""
        return int(self.meta["step"])


def save_checkpoint(run_dir: Path, meta: dict[str, Any], state: dict[str, Any],
                    rollout: dict[tuple[str, int], dict[str, Any]],
                    caches: dict[str, dict[str, Any]] | None = None) -> Path:
    """Write DIR/checkpoint atomically (a crash mid-write leaves the previous one)."""
    import torch
    from safetensors.torch import save_file

    final = run_dir / CHECKPOINT
    tmp = run_dir / f"{CHECKPOINT}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {k: v.detach().to("cpu").contiguous().clone()
               for k, v in state.get("weights", {}).items()}
    save_file(weights, str(tmp / "weights.safetensors"))
    torch.save({k: v for k, v in state.items() if k != "weights"}, tmp / "trainer.pt")
    torch.save([{"node": n, "step": s, "batch": b} for (n, s), b in sorted(rollout.items())],
               tmp / "rollout.pt")
    if caches:
        torch.save(caches, tmp / "rollout_cache.pt")
    meta = {**meta, "rollout_steps": sorted({s for _, s in rollout}), "written": time.time()}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    old = run_dir / f"{CHECKPOINT}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    tmp.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(run_dir: Path) -> Checkpoint:
    """Read DIR/checkpoint; a clear error when there is none."""
    import torch
    from safetensors.torch import load_file

    folder = run_dir / CHECKPOINT
    if not (folder / "meta.json").exists():
        old = run_dir / f"{CHECKPOINT}.old"
        if (old / "meta.json").exists():
            folder = old
        else:
            raise CheckpointError(f"{run_dir}: no checkpoint to resume from (a run writes "
                                  f"{CHECKPOINT}/ at its end and when stopped with Ctrl-C)")
    meta = json.loads((folder / "meta.json").read_text())
    state = torch.load(folder / "trainer.pt", weights_only=False)
    state["weights"] = load_file(str(folder / "weights.safetensors"))
    state["policy_version"] = int(meta["policy_version"])
    rows = torch.load(folder / "rollout.pt", weights_only=False)
    rollout = {(r["node"], int(r["step"])): r["batch"] for r in rows}
    cache_file = folder / "rollout_cache.pt"
    caches = torch.load(cache_file, weights_only=False) if cache_file.exists() else {}
    return Checkpoint(meta, state, rollout, caches)


class Ledger:
    """DIR/ledger.jsonl: the prompt ids trained at each step (resume cuts it at step k)."""

    def __init__(self, run_dir: Path, first_step: int = 0) -> None:
        self.path = run_dir / "ledger.jsonl"
        keep = [r for r in read_ledger(self.path) if r["step"] < first_step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))

    def append(self, step: int, uids: list[str], policy_version: int) -> None:
        """Record what train step `step` trained on."""
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "policy_version": policy_version,
                                "prompt_uids": uids}) + "\n")


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Rows of a ledger.jsonl, in step order."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(rows, key=lambda r: r["step"])
