"""A simulated clock that drives a runtime `Pipeline` as the Ray executor would (tests of
the pipeline's order, stop and chaining without Ray)."""

from __future__ import annotations

import heapq

from rlgraph.nodes import KINDS
from rlgraph.runtime.pipeline import Pipeline
from rlgraph.runtime.tasks import Pending


def drive(pipeline: Pipeline, seconds: dict[str, float], stop_after_train: int | None = None):
    """Run the pipeline on a simulated clock; returns the event dicts of every task. A task
    chained behind another starts when that one ends (its actor runs them in order). A stop
    recalls the queued tasks that have not started (weight updates excepted), as the Ray
    executor does, and the pipeline withdraws them."""
    now, running, events, order, ends, stop = 0.0, [], [], 0, {}, False
    while True:
        for task in pipeline.startable():
            for src, payload in task.inputs.items():
                if isinstance(payload, Pending):  # a task queued before it on its group
                    key = (payload.node, payload.step)
                    assert key in ends and ends[key] <= ends[task.behind]
                else:
                    assert payload["step"] == task.step, (src, payload)
            start = now if task.behind is None else max(now, ends[task.behind])
            version = pipeline.versions.get(task.node)
            order += 1
            ends[(task.node, task.step)] = start + seconds[task.node]
            heapq.heappush(running, (start + seconds[task.node], order, task, start, version))
        if stop and not pipeline.stopping:
            pipeline.stop()
            queued = [item for item in running if item[3] > now + 1e-12
                      and not KINDS[item[2].kind].carries_weights]
            for item in queued:
                running.remove(item)
                pipeline.withdraw(item[2].node, item[2].step)
            heapq.heapify(running)
        if not running:
            break
        now = running[0][0]
        while running and running[0][0] <= now + 1e-12:
            end, _, task, start, version = heapq.heappop(running)
            events.append({"node": task.node, "step": task.step, "start": start, "end": end,
                           "occupies": list(task.occupies), "version": version,
                           "chained": task.behind is not None})
            payload = {"step": task.step, "node": task.node, "version": version}
            pipeline.complete(task.node, task.step, payload)
            if (stop_after_train is not None and task.kind == "train"
                    and task.step + 1 == stop_after_train):
                stop = True  # asked as the step's row is written: after the next starts
    return events
