"""The per-actor state of one group: tokenizer, policy, reference, optimizer, policy version.

Colocated tasks (e.g. logp and train in the trainer group) share one Workspace and so one
copy of the policy. Every Workspace builds its models from the same seed (and the same
warm start), so all groups start from identical version-0 weights. Weight sync goes through
`export_weights` on the sender and `receive_bucket` / `commit_weights` on the receiver; the
commit takes the workspace lock, which workers hold while they use the policy, so a worker
never sees a half-updated model even if buckets arrive on another thread.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlgraph.models import build_model
from rlgraph.tokenizer import build_tokenizer
from rlgraph.warm_start import warm_start
from rlgraph.weights import WeightReceiver, digest, export_buckets

if TYPE_CHECKING:
    from rlgraph.spec import Spec

POLICY_KINDS = {"generate", "logp", "train"}


class Workspace:
    """Per-actor state shared by the colocated tasks of one group: models, optimizer, version."""

    def __init__(self, spec: Spec, tasks: list[str], seed: int = 0, device: str = "cpu"):
        self.spec, self.tasks, self.seed, self.device = spec, list(tasks), seed, device
        self.kinds = {spec.nodes[t].kind for t in tasks}
        source = Path(spec.source.path)
        self.base_dir = source.parent if source.exists() else None
        self.policy_version = 0
        self.lock = threading.RLock()
        self.receiver = WeightReceiver()
        self.tokenizer = build_tokenizer(spec.model.path)
        self.policy: torch.nn.Module | None = None
        self.reference: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.warm_start_losses: list[float] = []
        if self.kinds & (POLICY_KINDS | {"ref_logp"}):
            # the warm start (and its cache) is CPU fp32 everywhere, so every group of every
            # device starts from the same weights; a GPU workspace then casts them to bf16
            warm = spec.model.warm_start.steps > 0 and device != "cpu"
            initial = build_model(spec.model, self.tokenizer, seed, "cpu" if warm else device)
            self.warm_start_losses = warm_start(initial, self.tokenizer, spec, seed,
                                                self.base_dir)
            if warm:
                initial = initial.to(device=device, dtype=torch.bfloat16)
            initial.eval()
            if "ref_logp" in self.kinds:
                self.reference = copy.deepcopy(initial) if self.kinds & POLICY_KINDS else initial
                self.reference.requires_grad_(False)
            if self.kinds & POLICY_KINDS:
                self.policy = initial
        if "train" in self.kinds:
            train = next(spec.nodes[t] for t in tasks if spec.nodes[t].kind == "train")
            self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=train.lr,
                                               weight_decay=train.weight_decay)
        self._workers: dict[str, Any] = {}

    def worker(self, node_name: str) -> Any:
        """The node's worker bound to this workspace (built once, imported lazily)."""
        if node_name not in self._workers:
            from rlgraph.nodes import KINDS

            node = self.spec.nodes[node_name]
            module, _, attr = KINDS[node.kind].worker.partition(":")
            cls = getattr(importlib.import_module(module), attr)
            self._workers[node_name] = cls(node_name, node, self)
        return self._workers[node_name]

    def generator(self, *parts: object) -> torch.Generator:
        """A torch RNG seeded by (workspace seed, parts): e.g. per (node, step) sampling."""
        text = ":".join(str(p) for p in (self.seed, *parts))
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little"))
        return gen

    # ------------------------------------------------------------ weight sync

    def export_weights(self, bucket_mb: float) -> list[dict]:
        """The policy's weights at the current version, cut into buckets of `bucket_mb`."""
        with self.lock:
            return export_buckets(self.policy.state_dict(), self.policy_version, bucket_mb)

    def receive_bucket(self, bucket: dict) -> None:
        """Stage a bucket in the second buffer; the live policy is untouched."""
        self.receiver.receive(bucket)

    def commit_weights(self, version: int) -> None:
        """Swap the staged version in atomically (under the lock) and adopt its version."""
        with self.lock:
            self.receiver.commit(self.policy, version)
            self.policy_version = version

    def weights_digest(self) -> str:
        """SHA-256 of the policy weights: equal on sender and receiver after a sync."""
        with self.lock:
            return digest(self.policy.state_dict())

    # ------------------------------------------------------------ checkpoints

    def state_for_checkpoint(self) -> dict:
        """Weights, optimizer state and policy version (CPU tensors, safe to pickle)."""
        with self.lock:
            state: dict[str, Any] = {"policy_version": self.policy_version, "seed": self.seed}
            if self.policy is not None:
                state["weights"] = {k: v.detach().to("cpu", copy=True)
                                    for k, v in self.policy.state_dict().items()}
            if self.optimizer is not None:
                state["optimizer"] = copy.deepcopy(self.optimizer.state_dict())
            return state

    def load_checkpoint(self, state: dict) -> None:
        """Restore what `state_for_checkpoint` returned."""
        with self.lock:
            if self.policy is not None and "weights" in state:
                self.policy.load_state_dict(state["weights"])
            if self.optimizer is not None and state.get("optimizer") is not None:
                self.optimizer.load_state_dict(state["optimizer"])
            self.policy_version = int(state["policy_version"])
