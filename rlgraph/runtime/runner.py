"""Runs a compiled plan on Ray: actors per group, the pipeline loop, trace, metrics, checkpoints.

The loop is the whole runtime in four lines: start every task the pipeline allows, wait for
any to finish (`ray.wait`), hand the completion back to the pipeline, record it. Data moves
actor to actor as object references; the driver reads only each task's small info dict.

A stop (Ctrl-C, SIGTERM, or `request_stop`) starts nothing new, lets running tasks finish,
and writes a checkpoint at the last trained step with the rollout buffer, so `--resume` loses
nothing. Checkpoints are also written every `checkpoint_every` steps (each after the ledger
rows it covers) and, where the trainer's state is intact, when the run fails (runtime.rescue);
what a checkpoint holds and when one is due: `runtime.runner_checkpoint`.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlgraph.compiler.plan import Plan
from rlgraph.engines.sglang_engine import refuse_unrunnable
from rlgraph.errors import RLGraphError, SpecError
from rlgraph.nodes import KINDS
from rlgraph.runtime import checkpoint as ckpt
from rlgraph.runtime import cluster, rescue
from rlgraph.runtime.executor import DriverKnown, RayExecutor, WorkerError
from rlgraph.runtime.loggers import check_loggers
from rlgraph.runtime.metrics import MetricsWriter, settle_idle
from rlgraph.runtime.pipeline import Pipeline, drive
from rlgraph.runtime.runner_checkpoint import RunCheckpoints
from rlgraph.runtime.step_report import RunResult, StepReport
from rlgraph.runtime.tasks import Completion
from rlgraph.runtime.tracing import Tracer, load_events
from rlgraph.runtime.weight_sync import Route, backend_for, connect_route
from rlgraph.weights import resolve_transport

__all__ = ["CHECKPOINT_EVERY_S", "RunOptions", "RunResult", "Runner"]

WAIT_S = 0.25  # longest the loop blocks in ray.wait before it looks at a stop request
# default time between periodic checkpoints: writing one of the quickstart's policy took
# 259 ms median (71-371) on the loaded 2-core dev machine (bench/results/checkpoint_cost.json,
# `python bench/checkpoint_cost.py`), so one a minute costs under 1% and a crash loses at
# most a minute of training
CHECKPOINT_EVERY_S = 60.0
# a stop waits this long for the tasks in flight, then abandons those that are not a train
# step (a hung reward function, a generate that does not return) and checkpoints what was
# trained; a train step in flight is waited for up to STOP_MAX_S (the trainer's state is
# what the checkpoint holds), then the last checkpoint written stays the one to resume from
STOP_GRACE_S = 5.0
STOP_MAX_S = 60.0
STOP_FETCH_S = 10.0  # longest wait for the trainer's state when a stop abandoned tasks
OUTPUT_LOG = "reward.log"  # what user reward functions printed (rlgraph.process.isolated)
OUTPUT_LOG_MAX = 32 << 20  # bytes; a run that prints more keeps the first 32 MiB


@dataclass
class RunOptions:
    """How to run: where, how long, from which checkpoint, what to call after each step."""

    out_dir: Path
    steps: int
    address: str | None = None
    resume: bool = False
    checkpoint_every: int = 0  # steps between periodic checkpoints (0: by time, below)
    checkpoint_every_s: float = CHECKPOINT_EVERY_S  # used when checkpoint_every is 0; 0: off
    verify_weights: bool = False  # compare sender and receiver digests at every sync
    on_step: Callable[[dict[str, Any]], None] | None = None
    on_ready: Callable[[Runner], None] | None = None
    tensorboard: bool = True
    fuse: bool = True  # chained tasks on one actor share one call (runtime.executor)
    final_checkpoint: bool = True  # False: a run that ends normally writes none (benchmarks)


class Runner(RunCheckpoints):
    """One run of a plan (see the module docstring)."""

    def __init__(self, plan: Plan, options: RunOptions) -> None:
        self.plan, self.options = plan, options
        self.spec = plan.spec  # the validated spec the plan was compiled from
        self.graph = plan.graph
        self.kinds: dict[str, str] = dict(self.graph.nodes(data="kind"))
        self.roles = {node: KINDS[kind] for node, kind in self.kinds.items()}
        self.groups = plan.placement.names
        self.max_lag = plan.lag.max_lag  # the version gate (lag pass)
        self.lag_bound = plan.lag.max_policy_lag
        self.local = plan.placement.local
        self._stop_requested = False
        self.actors: dict[str, Any] = {}  # node -> actor
        self.group_actors: dict[str, Any] = {}  # group (or CPU node) -> its leader
        self.replicas: dict[str, list[Any]] = {}  # group (or CPU node) -> every replica
        self._builds: list[Any] = []  # replicas' build calls, awaited with `ready`
        self.reservations: cluster.Reservations | None = None
        self.first_step = 0
        self.spec_data: dict[str, Any] = plan.spec.to_yaml_dict()  # what resume compares with
        self._policy_files: dict[str, bytes] | None = None  # config + tokenizer, made once
        self._last_checkpoint = time.time()
        self._refuse_unsupported()
        self.notes = self._model_parallel_notes()

    def _refuse_unsupported(self) -> None:
        """What this runtime cannot do yet is an error naming the key, before Ray starts."""
        check_loggers(self.spec.logging)
        refuse_unrunnable(self.spec)  # every engine the plan names runs, or none starts
        for node in self.kinds:
            spec = self.spec.nodes[node]
            if getattr(spec, "backend", "torch") == "megatron" and spec.pp > 1:
                err = SpecError(f"backend megatron runs pp 1 only here (got pp {spec.pp}): "
                                "rlgraph calls the GPTModel as one module, and pipeline stages "
                                "need megatron-core's forward_backward schedule",
                                ("nodes", node, "pp"), hint="use tp, or backend: torch with "
                                "sharding: fsdp, for a model too large for one GPU")
                err.source = self.spec.source
                raise err
            if getattr(spec, "cp", 1) > 1:
                err = SpecError(f"context parallelism runs in the cost model only here (got cp "
                                f"{spec.cp}): rlgraph's megatron backend calls the GPTModel "
                                "without a context-parallel group", ("nodes", node, "cp"),
                                hint="write cp: 1 to run the plan")
                err.source = self.spec.source
                raise err
            if (getattr(spec, "backend", "torch") == "megatron" and max(spec.tp, spec.pp) > 1
                    and self.local):
                err = SpecError("megatron-core's tensor-parallel layers run on CUDA GPUs only, "
                                "and this plan runs on local CPU slots", ("nodes", node, "tp"),
                                hint="write tp: 1 (or run on GPUs)")
                err.source = self.spec.source
                raise err

    def _model_parallel_notes(self) -> list[str]:
        """Model parallelism the plan's cost model counts but this runtime does not run:
        tp / pp of `backend: torch` nodes and of the native generate engine (their groups run
        one full model per GPU, as data-parallel replicas)."""
        replicas = {t: g.replicas for g in self.plan.placement.groups for t in g.tasks}
        notes = []
        for node in self.kinds:
            spec = self.spec.nodes[node]
            size = getattr(spec, "tp", 1) * getattr(spec, "pp", 1)
            if size > 1 and getattr(spec, "backend", "torch") != "megatron" and (
                    getattr(spec, "engine", "native") == "native"):
                notes.append(f"nodes.{node}: tp x pp = {size} counts in the predicted plan, but "
                             f"{node} runs as {replicas.get(node, 1)} data-parallel replica(s) "
                             f"with a whole model each (tensor and pipeline parallelism need "
                             f"backend: megatron)")
        return notes

    def _transport(self, node: str) -> str:
        """The param_update's transport with `auto` resolved (see runtime.weight_sync)."""
        return resolve_transport(self.plan.weight_sync[node].transport,
                                 "cpu" if self.local else "cuda")

    def _weight_bytes(self) -> float:
        """Bytes of the policy: fp32 on a local CPU cluster, bf16 on GPUs."""
        from rlgraph.compiler.shapes import shape_of

        return (4.0 if self.local else 2.0) * shape_of(self.spec).params

    def request_stop(self) -> None:
        """Stop after the running tasks (safe to call from a signal handler)."""
        self._stop_requested = True

    # ------------------------------------------------------------ set-up

    def _start_actors(self) -> None:
        """One actor per replica of every plan group (rank 0 leads and stands for the group),
        one per CPU node outside the groups."""
        from rlgraph.runtime.actors import start_actor, start_replicas

        seed = self.spec.data.seed
        device = "cpu" if self.local else "cuda"
        assert self.reservations is not None
        for group in self.plan.placement.groups:
            name, res = group.name, self.reservations.groups[group.name]
            replicas, builds = start_replicas(
                self.spec, list(group.tasks), seed=seed,
                threads=res.slots if self.local else 1, device=device, world=res.replicas,
                options_of=lambda rank, name=name: self.reservations.actor_options(name, rank))
            self._builds += builds
            self.replicas[name] = replicas
            self.group_actors[name] = replicas[0]
            for task in group.tasks:
                self.actors[task] = replicas[0]
        for node, role in self.roles.items():
            if node not in self.actors and role.worker is not None:
                actor = start_actor(self.spec, [node], seed=seed, threads=1, device="cpu",
                                    options={"num_cpus": 0})
                self.group_actors[node] = actor
                self.replicas[node] = [actor]
                self.actors[node] = actor

    def _lead(self) -> None:
        """Each group's rank 0 learns its followers."""
        import ray

        ray.get([r[0].lead.remote(r[1:]) for r in self.replicas.values() if len(r) > 1])

    def _routes(self) -> dict[str, Route]:
        """Every param_update's route; an nccl route's group is built here, once."""
        routes = {}
        for node, planned in self.plan.weight_sync.items():
            dst = self.actors[planned.dst]
            receivers = next(len(r) for r in self.replicas.values() if r[0] is dst)
            route = Route(node, self.actors[planned.src], dst, planned.bucket_mb,
                          self._transport(node), receivers, self.options.verify_weights)
            if route.transport == "nccl" and route.src_actor is not route.dst_actor:
                connect_route(route, backend_for("cpu" if self.local else "cuda"))
            routes[node] = route
        return routes

    def _kept_outputs(self) -> dict[str, int]:
        """Nodes whose every consumer runs on their own actor: their outputs stay there.
        generate's never do (the rollout buffer of a checkpoint needs them)."""
        keep = {}
        for node, role in self.roles.items():
            users = [v for _, v, d in self.graph.out_edges(node, data="distance") if d == 0]
            if (not (role.samples or role.carries_weights) and users
                    and all(self.actors.get(v) is self.actors[node] for v in users)):
                keep[node] = len(users)
        return keep

    def _train_actor(self) -> Any:
        train = next(n for n, role in self.roles.items() if role.advances_policy)
        return self.actors[train]

    def _wait_ready(self) -> None:
        import ray

        refs = {name: group[0].ready.remote() for name, group in self.replicas.items()}
        rest = [actor.ready.remote() for group in self.replicas.values() for actor in group[1:]]
        try:
            infos = ray.get(self._builds + list(refs.values()) + rest)[len(self._builds):]
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, BaseException) else None
            if isinstance(cause, RLGraphError):
                raise cause from None
            raise WorkerError(f"an actor failed to build its workspace: {cause or exc}") from exc
        for name, info in zip(refs, infos):  # rlgraph.runtime.threads: measured at start-up
            if info.get("thread_seconds"):
                timing = ", ".join(f"{n} thread(s) {s * 1e3:.1f} ms" for n, s in
                                   info["thread_seconds"].items())
                self.notes.append(f"groups.{name}: runs on {info['threads']} torch thread(s) "
                                  f"per process (a step's forward + backward took {timing})")

    # ------------------------------------------------------------ the run

    def run(self) -> RunResult:
        """Start Ray and the actors, run the pipeline to the last step or a stop, clean up."""
        import ray

        out = self.options.out_dir
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(self.plan.to_json())
        began = time.time()
        owned = cluster.connect(self.plan, self.options.address,
                                cluster.object_store_mb(self._weight_bytes()))
        try:
            self.reservations = cluster.reserve(self.plan)
            self._start_actors()
            self._wait_ready()
            self._lead()
            resume = ckpt.load_checkpoint(out) if self.options.resume else None
            preloaded: dict[tuple[str, int], Any] = {}
            first = 0
            if resume is not None:
                first = resume.step
                state_ref = ray.put(resume.state)
                ray.get([a.load_checkpoint.remote(state_ref)
                         for name, a in self.group_actors.items() if name in self.groups])
                preloaded = {k: ray.put(b) for k, b in resume.rollout.items()
                             if first <= k[1] < self.calls()}
                ray.get([self.actors[node].load_rollout_cache.remote(node, state)
                         for node, state in resume.caches.items() if node in self.actors])
            self.first_step = first
            if self.options.on_ready:
                self.options.on_ready(self)
            return self._loop(first, preloaded, startup_s=time.time() - began)
        finally:
            for actor in (a for group in self.replicas.values() for a in group):
                with contextlib.suppress(Exception):  # the actor may already be gone
                    ray.kill(actor)
            if self.reservations is not None:
                self.reservations.release()
            cluster.shutdown(owned)

    def _loop(self, first: int, preloaded: dict[tuple[str, int], Any],
              startup_s: float) -> RunResult:
        out, opts = self.options.out_dir, self.options
        previous = load_events(out / "trace.json") if opts.resume else []
        # keep the spans whose work survives: steps before k, and the buffered generates
        previous = [e for e in previous
                    if e["step"] < first or (e["node"], e["step"]) in preloaded]
        offset = max((e["end"] for e in previous), default=0.0)
        result = RunResult(out, first, first, stopped=False, startup_s=startup_s)
        pipeline = Pipeline.of(self.plan, steps=opts.steps, start_step=first,
                               preloaded=preloaded)
        routes = self._routes()
        executor = RayExecutor(self.actors, routes, self._kept_outputs(),
                               DriverKnown(self.spec, routes), fuse=opts.fuse)
        t0 = time.time()
        tracer = Tracer(t0, offset=offset + (1.0 if previous else 0.0))
        tracer.events.extend(previous)
        metrics = MetricsWriter(out, first, opts.tensorboard, self.spec.logging, self.spec.name,
                                self.spec_data)
        report = StepReport(result, metrics,
                            ckpt.Ledger(out, first_step=first), tracer, nodes=list(self.kinds),
                            groups=self.groups, max_lag=self.max_lag, lag_bound=self.lag_bound,
                            on_step=opts.on_step)

        def on_done(done: Completion) -> None:
            self._keep_output(done.info["summary"].get("output"))
            event = self._record(done, tracer)
            report.latest[done.task.node] = event
            if not self.roles[done.task.node].advances_policy:
                report.node_metrics.setdefault(done.task.step, {}).update(
                    done.info["summary"].get("metrics", {}))
                return
            report.pending.append((done, event))
            if self._checkpoint_due(done.task.step):
                report.flush()  # the ledger rows first: the checkpoint covers them
                with contextlib.suppress(rescue.StateMismatch):  # a train step chained
                    # behind this one already ran: the next one will do
                    self._checkpoint(pipeline, tracer)

        stopped_at: list[float] = []
        abandoned: list[bool] = []

        def stop_requested() -> bool:
            if self._stop_requested and not stopped_at:
                stopped_at.append(time.time())
            return self._stop_requested

        def give_up() -> bool:
            waited = time.time() - stopped_at[0] if stopped_at else 0.0
            training = any(KINDS[t.kind].advances_policy for t in executor.in_flight())
            late = waited > STOP_MAX_S or (waited > STOP_GRACE_S and not training)
            if late:
                abandoned.append(True)
            return late

        try:
            result.stopped = drive(pipeline, executor, on_done, wait_s=WAIT_S,
                                   stop_requested=stop_requested, after_wait=report.flush,
                                   give_up=give_up)
            if pipeline.finished and not result.stopped:
                self._validate_final(result)
        except Exception as err:
            if getattr(err, "output", None) and isinstance(err, RLGraphError) and len(
                    err.args) == 1:
                self._keep_output(err.output)
                err.args = (f"{err.args[0]} (its output: {out / OUTPUT_LOG})",)
            if isinstance(err, WorkerError):
                (out / "error.log").write_text(
                    "".join(traceback.format_exception(err.__cause__))
                    if err.__cause__ else str(err))
                err.args = (f"{err.args[0]} (details in {out / 'error.log'})",)
            if not isinstance(err, ckpt.CheckpointError):  # a full disk: the last one stays
                rescue.annotate(err, rescue.emergency_checkpoint(
                    out, pipeline, executor, report, lambda done: self._record(done, tracer),
                    lambda timeout: self._checkpoint(pipeline, tracer, timeout=timeout)))
            raise
        finally:
            settle_idle(result.rows, report.windows, tracer.events, self.groups)
            report.metrics.rewrite(result.rows)
            report.metrics.close()
            result.events = tracer.events
            result.env_events = tracer.env_events
            result.wall_s = time.time() - t0
            self._write_trace(tracer)
        result.next_step = pipeline.trained_steps()
        if not opts.final_checkpoint:
            return result
        if not abandoned:
            self._checkpoint(pipeline, tracer)
            return result
        try:  # tasks that never returned were left behind: their actors may not answer
            self._checkpoint(pipeline, tracer, timeout=STOP_FETCH_S)
        except Exception as exc:  # any failure: the last checkpoint stays
            kept = ckpt.kept_step(out)
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            result.notes.append(f"the stop could not write a checkpoint ({why}); "
                                + (f"the one at step {kept} stays" if kept is not None
                                   else "no checkpoint exists"))
            result.next_step = kept if kept is not None else first
        return result

    def _keep_output(self, text: str | None) -> None:
        """Append what a user's function printed to DIR/reward.log (up to OUTPUT_LOG_MAX)."""
        if not text:
            return
        path = self.options.out_dir / OUTPUT_LOG
        with contextlib.suppress(OSError):
            size = path.stat().st_size if path.exists() else 0
            if size >= OUTPUT_LOG_MAX:
                return
            data = text.encode("utf-8", "replace")
            if size + len(data) > OUTPUT_LOG_MAX:
                data = data[:OUTPUT_LOG_MAX - size] + (
                    f"\n... {OUTPUT_LOG} stops here ({OUTPUT_LOG_MAX} bytes)\n").encode()
            with path.open("ab") as f:
                f.write(data if data.endswith(b"\n") else data + b"\n")

    def calls(self) -> int:
        """Train calls of the whole run: steps, times the mini-batches of a streaming run
        (train's steps are then optimizer steps, each on one mini-batch)."""
        return self.options.steps * self.spec.schedule.mini_batches

    def _validate_final(self, result: RunResult) -> None:
        """The last validation, on the trainer (the final weights), after the last step: its
        `val/*` figures go into the last row (`val/policy_version` says which version)."""
        import ray

        nodes = [n for n, role in self.roles.items() if role.validates]
        if not nodes or not result.rows:
            return
        figures = ray.get(self._train_actor().validate_final.remote(nodes[0], self.options.steps))
        result.rows[-1].update(figures)

    def _record(self, done: Completion, tracer: Tracer) -> dict[str, Any]:
        task, info = done.task, done.info
        extra: dict[str, Any] = {"submitted": round(tracer.now(done.submitted), 6)}
        if task.node in self.plan.weight_sync:
            extra.update(version=info.get("version"), bytes=info.get("bytes", 0))
        if info.get("fused"):  # ran in one actor call with the other tasks of its chain
            extra["fused"] = info["fused"]
        env_spans = info.get("summary", {}).get("env_spans")
        if env_spans:  # a multi-turn generate's env calls: the timeline's env lane
            tracer.record_env(task.node, task.step, env_spans)
        return tracer.record(task.node, task.kind, task.step, info["start"], info["end"],
                             task.occupies, **extra)

    def _write_trace(self, tracer: Tracer) -> None:
        tracer.write(self.options.out_dir / "trace.json", f"{self.spec.name} (measured)",
                     self.groups, self.kinds,
                     {"source": "rlgraph run", "max_lag": self.max_lag,
                      "max_policy_lag": self.lag_bound})
