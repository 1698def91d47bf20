"""Ray actors: one per plan group (its tasks share one Workspace), one per CPU node (reward).

An actor runs one task at a time in its default concurrency group (max concurrency 1, tasks
in submission order), which is what "tasks of one group never overlap" means; the driver
submits a group's next task only when the group is free, in the plan's order. The receiving
half of a param_update runs in the `receive` concurrency group (one at a time too), beside
the running task, staging the new version in the workspace's second buffer; every task of
the default group first swaps in a version staged whole (`Workspace.swap_if_staged`).
Batches travel between actors as object references (the driver never touches them); each
call returns the output batch and, separately, a small `info` dict (span and scalar
summary) that is all the driver reads. A stop `recall`s the tasks queued here that have not
started: each returns `NotRun` (only the actor knows what has started; Ray 2.60's
`ray.cancel` of a started actor task drops its results).

Data parallelism (rlgraph.process.replicas): a group of W replicas is W actors; the driver talks to
rank 0, the leader, which hands each follower its share of a task (`DATA_PARALLEL` of the
task's worker: "rows", the default, cuts the input batch by sample, sizes within one, GRPO
group ids kept, so a step needs one sample per data-parallel rank; "whole" gives every
replica the whole batch and the worker takes its part; "leader" runs on rank 0 alone), runs
its own share meanwhile and joins the results (`combine` of the worker, or the rows
concatenated). param_update receives, checkpoint loads and rollout caches fan out the same way.

The class is plain Python and wrapped by `ray.remote` in `start_actor`, so a unit test can
also call it in-process.
"""

from __future__ import annotations

import os
import time
from typing import Any

from rlgraph.config.schema import Spec
from rlgraph.errors import RLGraphError, SpecError
from rlgraph.rl.batch import Batch, concat_rows, merge, sample_rows, take_rows
from rlgraph.runtime import weight_sync as ws_sync
from rlgraph.runtime.actor_weights import WeightEndpoints
from rlgraph.runtime.tasks import NotRun, TaskFailure

KEPT = "__kept_in_actor__"  # a stub batch: the real one stays in the actor that made it
CONTROL = "control"  # concurrency group of `recall`: reaches the actor while a task runs


def summarize(worker: Any, out: Batch) -> dict[str, Any]:
    """The few scalars the driver needs from a node's output: its `metrics`, and what the
    kind's worker adds through its `summary(out)` (ledger, versions; its metrics merged)."""
    summary: dict[str, Any] = {}
    if isinstance(out.get("metrics"), dict):  # e.g. rollout/* of generate, val/* of validate
        summary["metrics"] = dict(out["metrics"])
    hook = getattr(worker, "summary", None)
    if hook is not None:
        extra = dict(hook(out))
        metrics = {**summary.get("metrics", {}), **extra.pop("metrics", {})}
        summary.update(extra)
        if metrics or "metrics" in summary:
            summary["metrics"] = metrics
    return summary


def to_host(batch: Batch) -> Batch:
    """The batch with every GPU tensor moved to CPU: it travels through the object store to
    actors that may hold no GPU (reward), where unpickling a CUDA tensor would fail."""
    import torch

    def host(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.device.type != "cpu":
            return value.detach().cpu()
        if isinstance(value, dict):
            return {k: host(v) for k, v in value.items()}
        return value

    return host(batch)


class GroupActor(WeightEndpoints):
    """Holds the Workspace of a group's tasks (or of one CPU node) and runs them on request;
    its param_update halves are `actor_weights.WeightEndpoints`'s."""

    def __init__(self, spec: Spec, tasks: list[str], seed: int, threads: int, device: str,
                 cwd: str | None = None, rank: int = 0, world: int = 1) -> None:
        import torch

        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)  # relative data / reward paths resolve as they did for the driver
        torch.set_num_threads(max(1, threads))
        self.threads, self.thread_seconds = max(1, threads), {}
        from rlgraph.process.replicas import Replicas, model_parallel_of

        self.spec, self.device, self.tasks, self.seed = spec, device, list(tasks), seed
        self.followers: list[Any] = []  # the other replicas of the group (on the leader)
        self.replicas = Replicas(rank, world, model_parallel_of(spec, tasks))
        self.build_error: RLGraphError | None = None  # raised by ready(), where Ray keeps it
        self.workspace: Any = None
        self.workers: dict[str, Any] = {}
        self.kept: dict[tuple[str, int], list[Any]] = {}  # (node, step) -> [batch, consumers]
        self.recalled: set[tuple[str, int]] = set()  # tasks a stop took back (not to start)
        self.outbox = ws_sync.Outbox()  # object-store param_update: buckets not yet pulled
        if world == 1:
            self._build()

    def build(self, rank_zero: tuple[str, int], backend: str) -> None:
        """A replica of several: join the group's process group (every replica at once;
        rank 0 hosts on `rank_zero`), then build the workspace."""
        try:
            self.replicas.join(*rank_zero, backend)
        except Exception as exc:
            self.build_error = RLGraphError(f"replica {self.replicas.rank} of "
                                            f"{self.replicas.world} could not join its group "
                                            f"({rank_zero[0]}:{rank_zero[1]}, {backend}): {exc}")
            return
        self._build()

    def _build(self) -> None:
        from rlgraph.process.workspace import Workspace

        try:
            self.workspace = Workspace(self.spec, self.tasks, seed=self.seed, device=self.device,
                                       replicas=self.replicas)
            self.workers = {t: self.workspace.worker(t) for t in self.tasks}
        except RLGraphError as err:
            if isinstance(err, SpecError):
                err.source = err.source or self.spec.source  # the user's file, not graph.yaml
            self.build_error = err
            return
        if self.device == "cpu" and self.threads > 1 and self.workspace.policy is not None:
            self._choose_threads()

    def _choose_threads(self) -> None:
        """One torch thread or one per slot, whichever runs this model's step faster
        (rlgraph.runtime.threads)."""
        from rlgraph.runtime.threads import choose_threads

        data = self.spec.data
        rows = data.prompts_per_step * data.samples_per_prompt // self.replicas.world
        try:
            self.threads, self.thread_seconds = choose_threads(
                self.workspace.policy, self.threads, rows,
                data.prompt_len + data.response_len.max, self.seed)
        except Exception:  # a backend whose forward takes other arguments: keep every slot
            return

    def ready(self) -> dict[str, Any]:
        """Returns once the workspace is built: the version it holds and the process id (or
        raises the user-facing error that stopped the build, e.g. a missing package)."""
        if self.build_error is not None:
            raise self.build_error
        return {"policy_version": self.workspace.policy_version, "pid": os.getpid(),
                "threads": self.threads, "thread_seconds": self.thread_seconds}

    def run(self, node: str, step: int, names: list[str], *batches: Batch,
            after: Any = None, keep: int = 0) -> tuple[Batch, dict]:
        """Run `node` on step `step` with its inputs (resolved by Ray from references, or
        kept here by an earlier task); `after` is a dependency only (the task this one was
        queued behind). With `keep=n` the output stays in this actor for its n consumers,
        all on this actor, and only a stub travels: no batch is pickled twice in one place.
        A task recalled by a stop before it started returns `(None, NotRun)`."""
        if (node, step) in self.recalled:
            return None, NotRun("recalled by a stop before it started")
        inputs = {name: self._resolve(batch) for name, batch in zip(names, batches)}
        start = time.time()
        shared: dict[str, float] = {}
        out = self._run_shared(node, step, inputs, shared) if self.followers else (
            self.run_replica(node, step, inputs))
        end = time.time()
        info = {"start": start, "end": end, "summary": summarize(self.workers[node], out)}
        if shared:
            info["summary"].setdefault("metrics", {}).update(
                {f"replicas/{key}/{node}": value for key, value in shared.items()})
        if keep:
            self.kept[(node, step)] = [out, keep]
            return {KEPT: (node, step)}, info
        return out, info

    def run_chain(self, chain: list[tuple[str, int, list[str], list[int], int]],
                  *batches: Batch) -> tuple[Any, ...]:
        """Run several tasks in order in one call (`RayExecutor`'s fusion): each is `(node,
        step, input names, sources, keep)`, a source `i >= 0` naming `batches[i]` and `-1 - j`
        the output of the chain's task j (handed over in memory). Returns every task's output
        and info, `(out0, info0, out1, info1, ...)`, as separate calls would: a task that
        raises returns a `TaskFailure` as its info, the tasks before it their results, and the
        ones after it (or after a task a stop recalled) `NotRun`."""
        results: list[tuple[Any, Any]] = []
        ended = False  # a task failed or was recalled: the rest do not run
        for node, step, names, sources, keep in chain:
            if ended:
                results.append((None, NotRun("a task before it in its fused call did not finish")))
                continue
            inputs = [batches[s] if s >= 0 else results[-1 - s][0] for s in sources]
            try:
                results.append(self.run(node, step, names, *inputs, keep=keep))
            except Exception as exc:
                results.append((None, TaskFailure.of(node, step, exc)))
            ended = not isinstance(results[-1][1], dict)
        for _, info in results:
            if isinstance(info, dict):
                info["fused"] = len(chain)  # recorded on the task's span
        return tuple(item for pair in results for item in pair)

    def recall(self, tasks: list[tuple[str, int]]) -> None:
        """A stop: these tasks, queued here, do not start (`run` returns `NotRun` for each);
        one that has started already finishes. Runs in the `control` group."""
        self.recalled |= {(node, step) for node, step in tasks}  # one step under the GIL

    def validate_final(self, node: str, step: int) -> dict[str, float]:
        """Validate node `node`'s figures for the policy this workspace holds now: the run's
        last validation, on the trainer after its final step."""
        return self.workspace.worker(node).validate(step)["metrics"]

    def run_replica(self, node: str, step: int, inputs: dict[str, Batch]) -> Batch:
        """This replica's share of `node` at `step` (all of it when the group has one)."""
        import torch

        self.workspace.swap_if_staged()  # no task of this group runs now: a free switch
        try:
            out = self.workers[node].run(step, inputs)
        except torch.OutOfMemoryError as exc:
            raise self._out_of_memory(node, step, exc) from None
        except SpecError as err:
            err.source = err.source or self.spec.source  # the user's file:line, not graph.yaml
            raise
        if self.device != "cpu":
            import torch

            torch.cuda.synchronize()  # the span ends when the GPU work does
            out = to_host(out)
        return out

    def _out_of_memory(self, node: str, step: int, exc: BaseException) -> SpecError:
        """A GPU out of memory as the user's error: which node, which key to change."""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "out of memory"
        if "micro_batch" in type(self.spec.nodes[node]).model_fields:  # the node can split
            key, hint = ("nodes", node, "micro_batch"), ("set micro_batch (sequences per "
                                                         "forward/backward), or give the group "
                                                         "more GPUs (share)")
        else:
            key, hint = ("data", "prompts_per_step"), ("fewer prompts per step, or more GPUs "
                                                       "for the group (share)")
        err = SpecError(f"'{node}' ran out of GPU memory at step {step} on replica "
                        f"{self.replicas.rank} of {self.replicas.world}: {first}", key, hint=hint)
        err.source = self.spec.source
        return err

    def _run_shared(self, node: str, step: int, inputs: dict[str, Batch],
                    timing: dict[str, float]) -> Batch:
        """Leader: every replica runs its share of `node` (see the module docstring).
        `timing` gets the leader's own share's seconds and how long it then waited for the
        slowest follower (`own_s`, `wait_s`: replicas out of balance, or transfer costs)."""
        import ray

        worker = self.workers[node]
        mode = getattr(worker, "DATA_PARALLEL", "rows")
        if mode == "leader":
            return self.run_replica(node, step, inputs)
        world, model = len(self.followers) + 1, self.replicas.model_parallel
        if mode == "whole":
            shares = [inputs] + [ray.put(inputs)] * (world - 1)
        else:  # the ranks of one model (megatron tp) see the same rows
            batch = merge(inputs)
            parts = [{"batch": take_rows(batch, sample_rows(batch, dp, world // model),
                                         regroup=False)}
                     for dp in range(world // model)]
            stored = {dp: ray.put(parts[dp]) for dp in {r // model for r in range(1, world)}}
            shares = [parts[0]] + [stored[rank // model] for rank in range(1, world)]
        refs = [f.run_replica.remote(node, step, share)
                for f, share in zip(self.followers, shares[1:])]
        began = time.time()
        # the leader's own failure leaves at once: followers may wait in a collective for it,
        # and the driver stops them
        outs = [self.run_replica(node, step, shares[0])]
        timing["own_s"] = time.time() - began
        try:
            outs += ray.get(refs)
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.cause, RLGraphError):
                raise exc.cause from None  # the user's error, as a lone replica raises it
            raise
        timing["wait_s"] = time.time() - began - timing["own_s"]
        combine = getattr(worker, "combine", None)
        if combine is None:  # "rows": shares cut by sample, group ids as they were
            return concat_rows(outs[::model], regroup=mode != "rows")
        return combine(outs[::model])  # one output per model copy

    def _resolve(self, batch: Batch) -> Batch:
        """A batch, or the kept batch a stub points to (freed after its last consumer)."""
        if not (isinstance(batch, dict) and KEPT in batch):
            return batch
        key = tuple(batch[KEPT])
        entry = self.kept[key]
        entry[1] -= 1
        if entry[1] == 0:
            del self.kept[key]
        return entry[0]

    # ------------------------------------------------------------ replicas

    def lead(self, followers: list[Any]) -> None:
        """Make this actor (rank 0) its group's leader over `followers` (ranks 1..)."""
        self.followers = list(followers)

    def gather_with_peers(self, passes: int = 1) -> None:
        """Take part in reading the policy's weights: a megatron tp shard's holder gathers the
        shards with its peers, an FSDP rank all-gathers every tensor with them `passes` times
        (`_with_model_peers`); the copy stays here."""
        self.workspace.gather_in_step(passes)

    def _with_model_peers(self, fn: Any, passes: int = 1) -> Any:
        """`fn()` on the leader while the other ranks of its model (megatron tp; every rank
        of a sharded policy) join the collectives that reading its weights takes (`passes`
        whole reads for a sharded one)."""
        import ray

        sharded = self.workspace.sharded["policy"]
        peers = self.followers if sharded else self.followers[:self.replicas.model_parallel - 1]
        refs = [p.gather_with_peers.remote(passes) for p in peers]
        try:
            return fn()
        finally:
            ray.get(refs)

    def _fan_out(self, method: str, *args: Any, group: str | None = None,
                 per_rank: Any = None) -> list[Any]:
        """Call `method` on every follower (args, or `per_rank(rank)` for rank 1..)."""
        refs = []
        for rank, follower in enumerate(self.followers, start=1):
            call = getattr(follower, method)
            if group:
                call = call.options(concurrency_group=group)
            refs.append(call.remote(*(per_rank(rank) if per_rank else args)))
        return refs

    def replica_digests(self) -> list[str]:
        """Weights digest of every replica, rank order (equal while they are in step)."""
        import ray

        refs = self._fan_out("weights_digest", False)  # all at once: a tp model gathers
        return [self.weights_digest(False), *ray.get(refs)]

    # ------------------------------------------------------------ checkpoints and checks

    def rollout_cache(self, node: str, step: int) -> dict[str, Any] | None:
        """A generate worker's rollout cache as it stood after `step` (partial rollout); a
        leader's holds every replica's, as `{"replicas": [...]}`."""
        import ray

        own = self.workers[node].cache_state(step)
        if not self.followers or own is None:
            return own
        return {"replicas": [own, *ray.get(self._fan_out("rollout_cache", node, step))]}

    def load_rollout_cache(self, node: str, state: dict[str, Any]) -> None:
        """Restore a generate worker's rollout cache from a checkpoint."""
        import ray

        states = state.get("replicas") if state else None
        if bool(states) != bool(self.followers) or (
                states and len(states) != len(self.followers) + 1):
            raise RLGraphError(f"{node}: the checkpoint's rollout cache was saved by "
                               f"{len(states or [0])} replicas, this run has "
                               f"{len(self.followers) + 1}; resume with the same groups")
        if states:
            ray.get([f.load_rollout_cache.remote(node, s)
                     for f, s in zip(self.followers, states[1:])])
            state = states[0]
        self.workers[node].load_cache_state(state)

    def policy_version(self) -> int:
        """The version of the policy this actor holds (a staged one is switched in first)."""
        self.workspace.swap_if_staged()
        return self.workspace.policy_version

    def weights_digest(self, with_peers: bool = True) -> str:
        """Hash of the policy weights (sender and receiver agree after a sync); without
        peers when the other ranks of its model call it at the same time."""
        self.workspace.swap_if_staged()
        if not with_peers:
            return self.workspace.weights_digest()
        return self._with_model_peers(self.workspace.weights_digest)

    def state_for_checkpoint(self) -> dict:
        """Weights, optimizer and version of this workspace (CPU tensors: the driver may
        hold no GPU)."""
        import ray

        self.workspace.swap_if_staged()
        state = self._with_model_peers(self.workspace.state_for_checkpoint)
        sharded = self.workspace.sharded["policy"]
        if (self.replicas.model_parallel > 1 or sharded) and "optimizer" in state:
            # each tp shard (every rank of a sharded policy) has its own optimizer state
            peers = (self.followers if sharded else
                     self.followers[:self.replicas.model_parallel - 1])
            state["optimizer_shards"] = [state.pop("optimizer", None), *ray.get(
                [p.optimizer_state.remote() for p in peers])]
        return state if self.device == "cpu" else to_host(state)

    def worker_states(self) -> dict:
        """The states of this workspace's workers with a model of their own (a critic placed
        apart from train), for the checkpoint (CPU tensors)."""
        states = self.workspace.worker_states()
        return states if self.device == "cpu" else to_host(states)

    def optimizer_state(self) -> Any:
        """This replica's optimizer state (a megatron tp shard's or an FSDP rank's, for the
        checkpoint)."""
        with self.workspace.lock:
            state = self.workspace.optimizer_state()
        return state if self.device == "cpu" else to_host(state)

    def load_checkpoint(self, state: dict) -> int:
        """Restore a checkpoint's weights (and optimizer where this workspace has one), on
        every replica."""
        import ray

        refs = self._fan_out("load_checkpoint", state)
        self.workspace.load_checkpoint(state)
        for worker in self.workers.values():  # colocated streaming: the engine's snapshot
            if hasattr(worker, "refresh_snapshot"):
                worker.refresh_snapshot()  # without a snapshot: only reads the version
        ray.get(refs)
        return self.workspace.policy_version


def start_actor(spec: Spec, tasks: list[str], *, seed: int, threads: int, device: str,
                options: dict[str, Any], rank: int = 0, world: int = 1) -> Any:
    """A `GroupActor` (replica `rank` of `world`) as a Ray actor with the given resources."""
    import ray

    groups = {ws_sync.RECEIVE: 1, ws_sync.SERVE: ws_sync.SERVE_THREADS, CONTROL: 1}
    cls = ray.remote(concurrency_groups=groups)(GroupActor)
    return cls.options(max_restarts=0, **options).remote(
        spec, tasks, seed, threads, device, os.getcwd(), rank, world)


def start_replicas(spec: Spec, tasks: list[str], *, seed: int, threads: int, device: str,
                   world: int, options_of: Any) -> tuple[list[Any], list[Any]]:
    """The `world` replica actors of a group (`options_of(rank)` places each) and their build
    calls: several replicas join their process group and build all at once (rank 0 hosts the
    rendezvous), so await the calls (or `ready`) before using them."""
    import ray

    actors = [start_actor(spec, tasks, seed=seed, threads=threads, device=device,
                          options=options_of(rank), rank=rank, world=world)
              for rank in range(world)]
    if world == 1:
        return actors, []
    rank_zero = ray.get(actors[0].free_address.remote())
    backend = ws_sync.backend_for(device.split(":")[0])
    return actors, [a.build.remote(rank_zero, backend) for a in actors]
