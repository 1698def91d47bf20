"""The checkpoint half of a run (`runtime.runner.Runner`): when a periodic checkpoint is due,
and what one holds (the trainer's state at the last trained step, the rollout buffer and,
where generate keeps one, each generate node's rollout cache), written by
`runtime.checkpoint.save_checkpoint`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlgraph.runtime import checkpoint as ckpt
from rlgraph.runtime import rescue
from rlgraph.runtime.hf_folder import policy_files
from rlgraph.runtime.pipeline import Pipeline
from rlgraph.runtime.tracing import Tracer

if TYPE_CHECKING:
    from rlgraph.config.schema import Spec
    from rlgraph.nodes.base import NodeKind
    from rlgraph.runtime.runner import RunOptions


class RunCheckpoints:
    """The checkpoint methods of `Runner`: they use its `spec`, `spec_data`, `options`,
    `roles`, `actors`, `max_lag`, `calls` and `_train_actor`."""

    spec: Spec
    spec_data: dict[str, Any]
    options: RunOptions
    roles: dict[str, NodeKind]
    actors: dict[str, Any]
    max_lag: int
    calls: Callable[[], int]
    _train_actor: Callable[[], Any]
    _policy_files: dict[str, bytes] | None
    _last_checkpoint: float

    def _keeps_cache(self) -> bool:
        """Generate keeps a rollout cache across steps (partial rollout, or streaming's
        continuous refill): a checkpoint must save it."""
        return self.spec.schedule.partial_rollout or self.spec.schedule.stream is not None

    def _checkpoint_due(self, step: int) -> bool:
        """A periodic checkpoint after train step `step`: every `checkpoint_every` steps, or
        `checkpoint_every_s` after the last one (never after the last step: the final one
        follows)."""
        opts = self.options
        if step + 1 >= self.calls():
            return False
        if (step + 1) % self.spec.schedule.mini_batches:
            return False  # streaming: checkpoints fall between versions (Pipeline.stop)
        if opts.checkpoint_every:
            return (step + 1) % opts.checkpoint_every == 0
        return 0 < opts.checkpoint_every_s <= time.time() - self._last_checkpoint

    def _checkpoint(self, pipeline: Pipeline, tracer: Tracer, timeout: float | None = None
                    ) -> Path:
        """Trainer state at the last trained step plus the rollout buffer, into DIR/checkpoint
        (`timeout`: a failed run's rescue, which drops a rollout buffer it cannot fetch)."""
        import ray

        step = pipeline.trained_steps()
        train = self._train_actor()
        state = ray.get(train.state_for_checkpoint.remote(), timeout=timeout)
        apart = {id(a): a for n, a in self.actors.items()  # a critic in a group of its own
                 if self.roles[n].trains and not self.roles[n].advances_policy and a is not train}
        for actor in apart.values():
            state.setdefault("workers", {}).update(
                ray.get(actor.worker_states.remote(), timeout=timeout))
        rescue.check_version(state, step // self.spec.schedule.mini_batches)
        rollout = rescue.fetch_rollout(pipeline, timeout, self._keeps_cache())
        gens = [m.step + 1 for m in pipeline.machines.values() if self.roles[m.name].samples]
        caches = self._rollout_caches(rollout, step, timeout)
        if self._policy_files is None:
            self._policy_files = policy_files(self.spec)
        meta = {"graph": self.spec.name, "spec": self.spec_data, "step": step,
                "policy_version": int(state.get("policy_version", step)),
                "data_position": max([step, *(s + 1 for _, s in rollout)]),
                "generate_next_step": min(gens) if gens else step,
                "max_lag": self.max_lag, "steps": self.options.steps,
                "trace_end_s": max((e["end"] for e in tracer.events), default=0.0)}
        keep = ckpt.Keep(self.spec.checkpoint.keep_last, self.spec.checkpoint.keep_every)
        folder = ckpt.save_checkpoint(self.options.out_dir, meta, state, rollout, caches,
                                      self._policy_files, keep)
        self._last_checkpoint = time.time()
        return folder

    def _rollout_caches(self, rollout: dict[tuple[str, int], Any], trained: int,
                        timeout: float | None = None) -> dict[str, dict[str, Any]]:
        """Partial rollout: each generate node's rollout cache as it stood after the last
        step in the checkpoint's buffer (or the last trained step), so a resumed run carries
        the same unfinished samples on."""
        import ray

        if not self._keeps_cache():
            return {}
        refs = {}
        for node, role in self.roles.items():
            if role.samples:
                last = max((s for n, s in rollout if n == node), default=trained - 1)
                refs[node] = self.actors[node].rollout_cache.remote(node, last)
        states = dict(zip(refs, ray.get(list(refs.values()), timeout=timeout)))
        return {node: state for node, state in states.items() if state is not None}
