"""A serial, in-process executor of a graph's node workers: the reference schedule, no Ray.

One Workspace per group (colocated tasks share it), one per node outside any group. Step t
runs in the graph's topological order, except that generate runs `max_lag` steps ahead:
batch t + max_lag is sampled before train(t), with the weights of version t, so tokens are
trained with lag max_lag exactly as in the overlapped schedule. After each train step every
param_update moves the weights in buckets (export -> staged receive -> commit). Tests and
benchmarks use it to pin what the RL core learns and how long each worker takes, apart from
the Ray runtime's orchestration.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlgraph.config.schema import Spec
from rlgraph.graph import build_graph, data_edges, step_order
from rlgraph.nodes import KINDS
from rlgraph.worker.workspace import Workspace


@dataclass
class SerialRun:
    """What a serial run measured."""

    metrics: list[dict[str, Any]] = field(default_factory=list)  # train output per step
    seconds: dict[str, float] = field(default_factory=dict)  # mean seconds per step, per node
    setup_s: float = 0.0  # building the workspaces (models, warm start)
    wall_s: float = 0.0  # the steps


def build_workspaces(spec: Spec, seed: int = 0) -> dict[str, Workspace]:
    """node name -> the Workspace that runs it (shared within a group)."""
    out: dict[str, Workspace] = {}
    for group in spec.groups.values():
        tasks = [t for t in group.tasks if KINDS[spec.nodes[t].kind].runs_on_batches]
        if tasks:
            ws = Workspace(spec, tasks, seed=seed)
            out.update(dict.fromkeys(tasks, ws))
    for name, node in spec.nodes.items():
        if name not in out and KINDS[node.kind].runs_on_batches:
            out[name] = Workspace(spec, [name], seed=seed)
    return out


def run_serial(spec: Spec, steps: int | None = None, seed: int = 0,
               on_step: Callable[[int, dict], None] | None = None) -> SerialRun:
    """Run `steps` (default: schedule.steps) train steps of the graph in one process."""
    steps = steps or spec.schedule.steps
    max_lag = spec.schedule.max_lag
    graph = build_graph(spec)
    preds: dict[str, list[str]] = {n: [] for n in graph}
    for src, dst in data_edges(graph):
        preds[dst].append(src)
    order = [n for n in step_order(graph) if KINDS[spec.nodes[n].kind].runs_on_batches]
    generators = [n for n in order if spec.nodes[n].kind == "generate"]
    syncs = [node for node in spec.nodes.values() if node.kind == "param_update"]
    start = time.perf_counter()
    ws_of = build_workspaces(spec, seed)
    run = SerialRun(setup_s=time.perf_counter() - start)
    busy = dict.fromkeys([*order, *(f"param_update:{s.src}->{s.dst}" for s in syncs)], 0.0)
    outputs: dict[tuple[str, int], dict] = {}

    def execute(node: str, step: int) -> None:
        began = time.perf_counter()
        inputs = {p: outputs[(p, step)] for p in preds[node]}
        outputs[(node, step)] = ws_of[node].worker(node).run(step, inputs)
        busy[node] += time.perf_counter() - began

    start = time.perf_counter()
    for t in range(steps):
        for ahead in range(t, min(t + max_lag, steps - 1) + 1):
            for gen in generators:
                if (gen, ahead) not in outputs:
                    assert ws_of[gen].policy_version >= ahead - max_lag
                    execute(gen, ahead)
        for node in order:
            if node not in generators:
                execute(node, t)
        for sync in syncs:
            began = time.perf_counter()
            sender, receiver = ws_of[sync.src], ws_of[sync.dst]
            if sender is not receiver:
                for bucket in sender.export_weights(sync.bucket_mb.produce):
                    receiver.receive_bucket(bucket)
                receiver.commit_weights(sender.policy_version)
            busy[f"param_update:{sync.src}->{sync.dst}"] += time.perf_counter() - began
        for node in order:
            if spec.nodes[node].kind == "train":
                run.metrics.append(outputs[(node, t)])
                if on_step:
                    on_step(t, outputs[(node, t)])
        outputs = {key: value for key, value in outputs.items() if key[1] > t}
    run.wall_s = time.perf_counter() - start
    run.seconds = {node: seconds / steps for node, seconds in busy.items()}
    return run
