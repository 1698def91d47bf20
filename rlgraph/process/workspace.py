"""The per-actor state of one group: tokenizer, policy, reference, optimizer, policy version.

Colocated tasks (e.g. logp and train in the trainer group) share one Workspace and so one
copy of the policy. Every Workspace builds its models from the same seed (and the same
warm start), so all groups start from identical version-0 weights.

What a workspace builds, its tasks' kinds say (`spec.kind_of(task)`: `models`, `optimizer`);
it never compares kind names and never imports `rlgraph.nodes`.

Weight transfer (param_update, dual buffer): the sender's `export_weights` cuts the policy
into buckets of `bucket_mb.produce` MiB; the receiver stages them beside the live weights
(`receive_bucket`, `bucket_mb.consume` MiB at a time, or a transport's own buffer) and
`stage_weights(version)` marks the version staged whole. Nothing the policy's users see
changes until `swap_if_staged()` swaps the staged version in under `lock`: generate calls
it at the start of a call and between decode steps, the Ray actor at the start of every task
it runs (so a task that starts when no generation is running sees the newest weights).
Workers hold `lock` for a whole call that uses the policy (generate: all its decode steps),
so a swap never lands inside one except through their own `swap_if_staged`. A receive
that would overwrite a staged version nobody swapped in yet swaps it in first (under
the lock, so it waits for a generate call in flight). `commit_weights` stages and swaps at
once (the serial loop and tests).
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlgraph.model.build import build_model
from rlgraph.model.tokenizer import build_tokenizer
from rlgraph.process import sharding
from rlgraph.process.replicas import Replicas
from rlgraph.process.warm_start import warm_start
from rlgraph.weights import BucketMiB
from rlgraph.weights.buckets import WeightSyncError, bucket_names, digest, export_buckets
from rlgraph.weights.dual_buffer import DualBuffer

if TYPE_CHECKING:
    from rlgraph.config.schema import Spec


class Workspace:
    """Per-actor state shared by the colocated tasks of one group: models, optimizer, version."""

    def __init__(self, spec: Spec, tasks: list[str], seed: int = 0, device: str = "cpu",
                 replicas: Replicas | None = None):
        self.spec, self.tasks, self.seed, self.device = spec, list(tasks), seed, device
        self.replicas = replicas or Replicas()  # joined already (rlgraph.process.replicas)
        kinds = [spec.kind_of(t) for t in tasks]
        models = frozenset().union(*(kind.models for kind in kinds))
        source = Path(spec.source.path)
        self.base_dir = source.parent if source.exists() else None
        self.policy_version = 0
        self.lock = threading.RLock()
        # the second buffer: a bucket is never written while a swap copies out of it (the
        # receiver's thread would otherwise see `staged` already taken and stage into a
        # buffer the swap then resets)
        self._staging = threading.Lock()
        self.staged: tuple[int, Callable[[], object]] | None = None  # whole, not swapped in
        self.pause_s = 0.0  # time policy users waited for swaps (taken by `take_pause_s`)
        self._buffer: DualBuffer | None = None
        self.tokenizer = build_tokenizer(spec.model.path)
        self.policy: torch.nn.Module | None = None
        self.reference: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        # bf16 on GPUs, fp32 on the host: what the policy's whole weights travel as
        self.weight_dtype = torch.float32 if device == "cpu" else torch.bfloat16
        self.sharded = {"policy": False, "reference": False}
        if models:
            self.sharded = sharding.check_group(spec, self.tasks)
            # the warm start (and its cache) is CPU fp32 everywhere, so every group of every
            # device starts from the same weights; a GPU workspace then casts them to bf16
            # (a sharded model then takes fp32 masters of them: `_placed`)
            warm = spec.model.warm_start.steps > 0 and device != "cpu"
            initial = build_model(spec.model, self.tokenizer, seed, "cpu" if warm else device)
            warm_start(initial, self.tokenizer, spec, seed, self.base_dir)
            if warm:
                initial = initial.to(device=device, dtype=torch.bfloat16)
            initial.eval()
            self.replicas.copy_from_first(initial)  # replicas built apart start identical
            from rlgraph.backends.megatron import for_group

            initial = for_group(initial, spec, self.tasks, device)  # backend: torch -> as is
            if "reference" in models:
                self.reference = copy.deepcopy(initial) if "policy" in models else initial
                self.reference.requires_grad_(False)
                self.reference = self._placed(self.reference, "reference")
            if "policy" in models:
                self.policy = self._placed(initial, "policy")
        stepping = [(t, kind.optimizer) for t, kind in zip(tasks, kinds) if kind.optimizer]
        if stepping:
            task, make_optimizer = stepping[0]
            self.optimizer = make_optimizer(spec.nodes[task], self.policy)
        self._workers: dict[str, Any] = {}

    def _placed(self, model: torch.nn.Module, role: str) -> torch.nn.Module:
        """`model` as this workspace runs it: sharded (rlgraph.process.sharding) where its
        tasks say `sharding: fsdp`, else as built; the policy's decoder layers recompute
        their activations in the backward where a task asks for activation checkpointing."""
        checkpointing = sharding.checkpointing_of(self.spec, self.tasks) and role == "policy"
        if not self.sharded[role]:
            if checkpointing and hasattr(model, "model"):  # megatron: its own layers
                sharding.checkpoint_layers(model)
            return model
        # fp32 masters of the weights every group holds, on the host until sharded
        model = model.to(device="cpu", dtype=torch.float32)
        return sharding.shard(model, self.device, checkpointing)

    def worker(self, node_name: str) -> Any:
        """The node's worker bound to this workspace (built once, imported lazily)."""
        if node_name not in self._workers:
            node = self.spec.nodes[node_name]
            module, _, attr = self.spec.kind_of(node_name).worker.partition(":")
            cls = getattr(importlib.import_module(module), attr)
            self._workers[node_name] = cls(node_name, node, self)
        return self._workers[node_name]

    def generator(self, *parts: object) -> torch.Generator:
        """A torch RNG seeded by (workspace seed, parts): e.g. per (node, step) sampling."""
        text = ":".join(str(p) for p in (self.seed, *parts))
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little"))
        return gen

    # ------------------------------------------------------------ weight transfer

    def export_weights(self, bucket_mb: BucketMiB | float) -> list[dict]:
        """The policy's weights at the current version, cut into buckets of
        `bucket_mb.produce` MiB."""
        with self.lock:
            if self.sharded["policy"]:
                buckets = list(self.weight_buckets(BucketMiB.of(bucket_mb).produce_bytes))
                return [{"version": self.policy_version, "index": i, "total": len(buckets),
                         "tensors": {n: t.to("cpu") for n, t in bucket.items()}}
                        for i, bucket in enumerate(buckets)]
            return export_buckets(self.policy.state_dict(), self.policy_version, bucket_mb)

    def weight_buckets(self, produce_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
        """The policy's whole weights, a bucket of at most `produce_bytes` at a time (state-dict
        order; a larger tensor alone). A sharded policy gathers each bucket on the device as
        it is reached (every rank of the group iterates in step); a whole one yields its
        own tensors."""
        if self.sharded["policy"]:
            yield from sharding.gathered_buckets(self.policy, produce_bytes, self.weight_dtype)
            return
        state = self.policy.state_dict()
        for names in bucket_names(state, produce_bytes / float(1 << 20)):
            yield {n: state[n] for n in names}

    def weight_specs(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        """(name, shape, dtype) of every tensor `weight_buckets` yields, in its order."""
        if self.sharded["policy"]:
            return sharding.weight_specs(self.policy, self.weight_dtype)
        return [(n, tuple(t.shape), t.dtype) for n, t in self.policy.state_dict().items()]

    def host_weights(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The policy's whole weights as host tensors (a sharded policy gathers them one
        tensor at a time, every rank in step); `dtype` None keeps the masters' own."""
        if self.sharded["policy"]:
            return sharding.host_state(self.policy, dtype)
        return {k: v.detach().to("cpu", dtype or v.dtype, copy=True)
                for k, v in self.policy.state_dict().items()}

    def gather_in_step(self, passes: int) -> None:
        """A rank of a sharded policy joins `passes` whole-weight reads of its leader (every
        tensor all-gathered once per pass, in state-dict order); megatron tp: one read."""
        with self.lock:
            if not self.sharded["policy"]:
                self.policy.state_dict()
                return
            for _ in range(passes):
                for tensor in self.policy.state_dict().values():
                    sharding.full_tensor(tensor)

    def receive_bucket(self, bucket: dict, bucket_mb: BucketMiB | None = None) -> None:
        """Stage a bucket in the second buffer, `bucket_mb.consume` MiB at a time; the live
        policy is untouched. A staged version nobody swapped in yet goes in first (staging is
        reused)."""
        self.swap_if_staged()
        with self._staging:
            if self._buffer is None:
                self._buffer = DualBuffer(self.policy)
            self._buffer.receive(bucket, bucket_mb)

    def stage_weights(self, version: int, swap: Callable[[], object] | None = None) -> None:
        """Mark `version` staged whole: the buckets received (default), or a transport's own
        buffer whose `swap()` copies it into the live policy. Swapped in at the next
        `swap_if_staged`."""
        if swap is None:
            if self._buffer is None:
                raise WeightSyncError(f"cannot commit version {version}: staged no bucket")
            self._buffer.check(version)
            swap = self._buffer.swap
        self.staged = (version, swap)

    def swap_if_staged(self) -> int | None:
        """Swap a version staged whole into the policy (under the lock) and return it; None,
        cheaply, when nothing new is staged. The time it takes is added to `pause_s`."""
        if self.staged is None:
            return None
        with self.lock, self._staging:  # taken and copied out before a bucket may land
            staged, self.staged = self.staged, None
            if staged is None:
                return None
            start = time.perf_counter()
            version, swap = staged
            swap()
            self.policy_version = version
            self.pause_s += time.perf_counter() - start
            return version

    def take_pause_s(self) -> float:
        """Swap time accumulated since the last call (the `generate/pause_s` metric)."""
        with self.lock:
            pause, self.pause_s = self.pause_s, 0.0
        return pause

    def staging_pieces(self) -> tuple[int, int]:
        """(bucket_mb.consume-sized copies, bytes of the largest) of the last version received
        in buckets."""
        if self._buffer is None:
            return 0, 0
        return self._buffer.pieces, self._buffer.largest_piece

    def commit_weights(self, version: int) -> None:
        """Stage the received buckets as `version` and swap them in at once."""
        self.stage_weights(version)
        self.swap_if_staged()

    def weights_digest(self) -> str:
        """SHA-256 of the policy weights: equal on sender and receiver after a sync."""
        with self.lock:
            if self.sharded["policy"]:
                return digest(self.host_weights(self.weight_dtype))
            return digest(self.policy.state_dict())

    def staged_digest(self) -> str:
        """SHA-256 of the weights received into the second buffer (before the swap)."""
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
                state["weights"] = self.host_weights()
            if self.optimizer is not None:
                state["optimizer"] = self.optimizer_state()
            workers = self.worker_states()
            if workers:
                state["workers"] = workers
            return state

    def worker_states(self) -> dict[str, Any]:
        """The states of this workspace's workers that keep a model of their own (the
        critic's value model and optimizer), by node."""
        with self.lock:
            return {name: worker.state_dict() for name, worker in self._workers.items()
                    if hasattr(worker, "state_dict")}

    def optimizer_state(self) -> Any:
        """The optimizer's state (a sharded policy's: this rank's shards, on the host)."""
        if self.sharded["policy"]:
            return sharding.optimizer_shard(self.optimizer)
        return copy.deepcopy(self.optimizer.state_dict())

    def load_checkpoint(self, state: dict) -> None:
        """Restore what `state_for_checkpoint` returned."""
        with self.lock:
            sharded = self.sharded["policy"]
            if self.policy is not None and "weights" in state:
                if sharded:
                    sharding.load_whole(self.policy, state["weights"])
                else:
                    self.policy.load_state_dict(state["weights"])
            optimizer = state.get("optimizer")
            if state.get("optimizer_shards"):  # megatron tp / fsdp: one state per shard
                rank = self.replicas.rank if sharded else self.replicas.model_rank
                optimizer = state["optimizer_shards"][rank]
            if self.optimizer is not None and optimizer is not None:
                if sharded:
                    sharding.load_optimizer_shard(self.optimizer, optimizer)
                else:
                    self.optimizer.load_state_dict(optimizer)
            for name, saved in (state.get("workers") or {}).items():
                worker = self.worker(name) if name in self.tasks else None
                if worker is None or (getattr(worker, "DATA_PARALLEL", "") == "leader"
                                      and self.replicas.rank):
                    continue  # a leader-only worker's model lives on rank 0 alone
                worker.load_state_dict(saved)
            self.policy_version = int(state["policy_version"])
            self.staged = None  # a version staged before the restore is not newer than it
