"""The per-actor state of one group: tokenizer, policy, reference, optimizer, policy version.

Colocated tasks (e.g. logp and train in the trainer group) share one Workspace and so one
copy of the policy. Every Workspace builds its models from the same seed (and the same
warm start), so all groups start from identical version-0 weights.

Weight sync (dual buffer): the sender's `export_weights` cuts the policy into buckets; the
receiver stages them beside the live weights (`receive_bucket`, or a transport's own buffer)
and `stage_weights(version)` marks the version staged whole. Nothing the policy's users see
changes until `switch_if_staged()` swaps the staged version in under `lock`: generate calls
it at the start of a call and between decode steps, the Ray actor at the start of every task
it runs (so a task that starts when no generation is running sees the newest weights).
Workers hold `lock` for a whole call that uses the policy (generate: all its decode steps),
so a switch never lands inside one except through their own `switch_if_staged`. A receive
that would overwrite a staged version nobody switched in yet switches it in first (under
the lock, so it waits for a generate call in flight). `commit_weights` stages and switches at
once (the serial loop and tests).
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlgraph.model.build import build_model
from rlgraph.model.tokenizer import build_tokenizer
from rlgraph.weights.buckets import WeightSyncError, digest, export_buckets
from rlgraph.weights.dual_buffer import DualBuffer
from rlgraph.worker.replicas import Replicas
from rlgraph.worker.warm_start import warm_start

if TYPE_CHECKING:
    from rlgraph.config.schema import Spec

POLICY_KINDS = {"generate", "logp", "train"}


class Workspace:
    """Per-actor state shared by the colocated tasks of one group: models, optimizer, version."""

    def __init__(self, spec: Spec, tasks: list[str], seed: int = 0, device: str = "cpu",
                 replicas: Replicas | None = None):
        self.spec, self.tasks, self.seed, self.device = spec, list(tasks), seed, device
        self.replicas = replicas or Replicas()  # joined already (rlgraph.worker.replicas)
        self.kinds = {spec.nodes[t].kind for t in tasks}
        source = Path(spec.source.path)
        self.base_dir = source.parent if source.exists() else None
        self.policy_version = 0
        self.lock = threading.RLock()
        # the second buffer: a bucket is never written while a switch copies out of it (the
        # receiver's thread would otherwise see `staged` already taken and stage into a
        # buffer the switch then resets)
        self._staging = threading.Lock()
        self.staged: tuple[int, Callable[[], object]] | None = None  # whole, not switched in
        self.pause_s = 0.0  # time policy users waited for switches (taken by `take_pause_s`)
        self._buffer: DualBuffer | None = None
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
            self.replicas.copy_from_first(initial)  # replicas built apart start identical
            from rlgraph.backends.megatron import for_group

            initial = for_group(initial, spec, self.tasks, device)  # backend: torch -> as is
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

    def receive_bucket(self, bucket: dict, consume_mb: float | None = None) -> None:
        """Stage a bucket in the second buffer, `consume_mb` at a time; the live policy is
        untouched. A staged version nobody switched in yet goes in first (staging is reused)."""
        self.switch_if_staged()
        consume = None if consume_mb is None else max(1, int(consume_mb * 2**20))
        with self._staging:
            if self._buffer is None:
                self._buffer = DualBuffer(self.policy)
            self._buffer.receive(bucket, consume)

    def stage_weights(self, version: int, switch: Callable[[], object] | None = None) -> None:
        """Mark `version` staged whole: the buckets received (default), or a transport's own
        buffer whose `switch()` copies it into the live policy. Switched in at the next
        `switch_if_staged`."""
        if switch is None:
            if self._buffer is None:
                raise WeightSyncError(f"cannot commit version {version}: staged no bucket")
            self._buffer.check(version)
            switch = self._buffer.switch
        self.staged = (version, switch)

    def switch_if_staged(self) -> int | None:
        """Swap a version staged whole into the policy (under the lock) and return it; None,
        cheaply, when nothing new is staged. The time it takes is added to `pause_s`."""
        if self.staged is None:
            return None
        with self.lock, self._staging:  # taken and copied out before a bucket may land
            staged, self.staged = self.staged, None
            if staged is None:
                return None
            start = time.perf_counter()
            version, switch = staged
            switch()
            self.policy_version = version
            self.pause_s += time.perf_counter() - start
            return version

    def take_pause_s(self) -> float:
        """Switch time accumulated since the last call (the `generate/pause_s` metric)."""
        with self.lock:
            pause, self.pause_s = self.pause_s, 0.0
        return pause

    def staging_pieces(self) -> tuple[int, int]:
        """(consume-sized copies, bytes of the largest) of the last version received in buckets."""
        if self._buffer is None:
            return 0, 0
        return self._buffer.pieces, self._buffer.largest_piece

    def commit_weights(self, version: int) -> None:
        """Stage the received buckets as `version` and switch them in at once."""
        self.stage_weights(version)
        self.switch_if_staged()

    def weights_digest(self) -> str:
        """SHA-256 of the policy weights: equal on sender and receiver after a sync."""
        with self.lock:
            return digest(self.policy.state_dict())

    def staged_digest(self) -> str:
        """SHA-256 of the weights received into the second buffer (before the switch)."""
        if self._buffer is None or not self._buffer.staging:
            raise WeightSyncError("no weights staged to check")
        if self._buffer._stream is not None:  # copies into staging run on a side stream
            self._buffer._stream.synchronize()
        return digest(self._buffer.staging)

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
            optimizer = state.get("optimizer")
            if state.get("optimizer_shards"):  # megatron tp: one state per shard
                optimizer = state["optimizer_shards"][self.replicas.model_rank]
            if self.optimizer is not None and optimizer is not None:
                self.optimizer.load_state_dict(optimizer)
            self.policy_version = int(state["policy_version"])
            self.staged = None  # a version staged before the restore is not newer than it
