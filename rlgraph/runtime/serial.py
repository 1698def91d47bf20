"""The runtime's loop in one process, no Ray: the pipeline driven by an inline executor.

`run_serial` drives the same `Pipeline` as the Ray runner (`runtime.pipeline.drive`), with
`InlineExecutor` in place of the actors (dask's `get_sync = get_async(apply_sync)`): each
task runs in the driver as soon as the pipeline starts it, on one Workspace per group
(colocated tasks share it) or per node outside any group. The lag gate, the channels and
the scheduling policy are the pipeline's, read from the plan, so generate runs up to
`max_lag` steps ahead exactly as in the overlapped run; a param_update moves the weights in
buckets (export -> staged receive -> commit). Tests and benchmarks use it to pin what the
RL core learns and how long each worker takes, apart from Ray's orchestration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlgraph.compiler import compile_plan
from rlgraph.compiler.plan import Plan, RoutePlan
from rlgraph.config.schema import Spec
from rlgraph.nodes import KINDS
from rlgraph.process.workspace import Workspace
from rlgraph.runtime.pipeline import Pipeline, drive
from rlgraph.runtime.tasks import Completion, InlineExecutor, Task
from rlgraph.weights import BucketMiB


@dataclass
class SerialRun:
    """What a serial run measured."""

    metrics: list[dict[str, Any]] = field(default_factory=list)  # train output per step
    # the other nodes' own figures per step (e.g. generate's rollout/*), by node
    node_metrics: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # mean seconds per step, per node
    setup_s: float = 0.0  # building the workspaces (models, warm start)
    wall_s: float = 0.0  # the steps
    workspaces: dict[str, Workspace] = field(default_factory=dict)  # node -> its workspace


def build_workspaces(plan: Plan, seed: int = 0, device: str = "cpu") -> dict[str, Workspace]:
    """node name -> the Workspace that runs it (shared within a group), on `device`."""
    spec = plan.spec
    out: dict[str, Workspace] = {}
    for group in plan.placement.groups:
        tasks = [t for t in group.tasks if KINDS[spec.nodes[t].kind].runs_on_batches]
        if tasks:
            ws = Workspace(spec, tasks, seed=seed, device=device)
            out.update(dict.fromkeys(tasks, ws))
    for name, node in spec.nodes.items():
        if name not in out and KINDS[node.kind].runs_on_batches:
            out[name] = Workspace(spec, [name], seed=seed, device=device)
    return out


def _move_weights(node: str, route: RoutePlan, sender: Workspace, receiver: Workspace
                  ) -> dict[str, Any]:
    """One param_update in process: bucketed export, staged receive, commit; within one
    workspace the worker's local transfer (a streaming engine's snapshot refreshed)."""
    if sender is receiver:
        return {"version": sender.worker(node).local()["version"], "summary": {}}
    bucket_mb = BucketMiB.of(route.bucket_mb)
    for bucket in sender.export_weights(bucket_mb):
        receiver.receive_bucket(bucket, bucket_mb)
    receiver.commit_weights(sender.policy_version)
    return {"version": sender.policy_version, "summary": {}}


def run_serial(plan: Plan | Spec, steps: int | None = None, seed: int = 0,
               on_step: Callable[[int, dict], None] | None = None,
               device: str = "cpu") -> SerialRun:
    """Run `steps` (default: schedule.steps) train steps of a plan (or of a spec, compiled
    here) in one process, every workspace on `device` (a benchmark's one GPU: "cuda")."""
    plan = plan if isinstance(plan, Plan) else compile_plan(plan)
    steps = steps or plan.spec.schedule.steps
    start = time.perf_counter()
    ws_of = build_workspaces(plan, seed, device)
    run = SerialRun(setup_s=time.perf_counter() - start, workspaces=ws_of)
    busy = {node: 0.0 for node in plan.graph if node in ws_of or node in plan.weight_sync}

    def execute(task: Task) -> tuple[Any, dict[str, Any]]:
        route = plan.weight_sync.get(task.node)
        if route is not None:
            return None, _move_weights(task.node, route, ws_of[route.src], ws_of[route.dst])
        output = ws_of[task.node].worker(task.node).run(task.step, dict(task.inputs))
        return output, {"summary": {}}

    def on_done(done: Completion) -> None:
        task = done.task
        busy[task.node] += done.info["end"] - done.info["start"]
        if KINDS[task.kind].advances_policy:
            run.metrics.append(done.output)
            if on_step:
                on_step(task.step, done.output)
        elif isinstance(done.output, dict) and isinstance(done.output.get("metrics"), dict):
            run.node_metrics.setdefault(task.node, []).append(dict(done.output["metrics"]))

    start = time.perf_counter()
    drive(Pipeline.of(plan, steps=steps, chaining=False), InlineExecutor(execute), on_done)
    run.wall_s = time.perf_counter() - start
    run.seconds = {node: seconds / steps for node, seconds in busy.items()}
    return run
