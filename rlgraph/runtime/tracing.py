"""Measured spans of a run, in the plan's event format, and what they say about overhead.

Each finished task becomes `{node, step, start, end, group, occupies, kind}` in seconds from
the run's start: the same dicts as `Plan.schedule.events`, so `rlgraph.report.timeline` draws
predicted and measured side by side and `rlgraph compile --calibrate` reads node costs
from them. Spans are taken inside the actors around the worker's own work, so whatever the
runtime adds (dispatch, moving batches, waiting on the driver) shows up as gaps.

`critical_path` walks back from the last train span through the dependency that released
each span last (data inputs of its step, its own previous step, the previous occupant of
its groups, the param_update that gave generate its version): the run's wall time minus
the busy time on that path is the orchestration overhead.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from rlgraph.nodes import KINDS

ENV_KIND = "env"  # the timeline lane of environment calls (multi-turn generate)


@dataclass
class Tracer:
    """Collects measured spans; times are stored relative to `t0` (wall-clock seconds)."""

    t0: float
    offset: float = 0.0  # a resumed run continues after the earlier spans
    events: list[dict[str, Any]] = field(default_factory=list)
    env_events: list[dict[str, Any]] = field(default_factory=list)  # the env lane

    def record_env(self, node: str, step: int, spans: Iterable[tuple[float, float]]) -> None:
        """Env calls of a multi-turn generate (wall-clock intervals) on the timeline's own
        `env` lane, apart from the task spans (no task waits on them)."""
        for start, end in spans:
            self.env_events.append({
                "node": f"{node} env", "kind": ENV_KIND, "step": step,
                "start": round(start - self.t0 + self.offset, 6),
                "end": round(max(end, start) - self.t0 + self.offset, 6),
                "group": ENV_KIND, "occupies": [ENV_KIND]})

    def record(self, node: str, kind: str, step: int, start: float, end: float,
               occupies: Iterable[str], **extra: Any) -> dict[str, Any]:
        """Add a span measured in wall-clock seconds; returns the event dict."""
        occupies = list(occupies)
        event = {"node": node, "kind": kind, "step": step,
                 "start": round(start - self.t0 + self.offset, 6),
                 "end": round(max(end, start) - self.t0 + self.offset, 6),
                 "group": occupies[0] if occupies else None, "occupies": occupies, **extra}
        self.events.append(event)
        return event

    def now(self, wall: float) -> float:
        """A wall-clock time in the trace's seconds."""
        return wall - self.t0 + self.offset

    def write(self, path: Path, title: str, groups: list[str], kinds: dict[str, str],
              other: dict[str, Any] | None = None) -> Path:
        """trace.json: the spans as a Chrome trace (Perfetto / chrome://tracing)."""
        from rlgraph.report.chrome_trace import chrome_trace

        events = self.events + self.env_events
        trace = chrome_trace(sorted(events, key=lambda e: (e["start"], e["node"])),
                             title, groups=groups, kinds=kinds)
        trace.setdefault("otherData", {}).update(other or {})
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(trace))
        tmp.replace(path)
        return path


def load_events(path: Path) -> list[dict[str, Any]]:
    """The task event dicts of an earlier trace.json (a resumed run keeps them; its env lane
    is left out)."""
    from rlgraph.readback import read_json
    from rlgraph.report.chrome_trace import events_from_trace

    if not path.exists() and not path.is_symlink():
        return []
    what = "restore it from a copy of the run dir, or delete it (the timeline then starts anew)"
    return [e for e in events_from_trace(read_json(path, what), f"{path}")
            if e.get("kind") != ENV_KIND]


# ---------------------------------------------------------------- overhead


@dataclass
class CriticalPath:
    """The chain of spans that decided the run's length, and what lies between them."""

    spans: list[dict[str, Any]]
    wall_s: float  # from the first span's start to the last train's end
    busy_s: float  # sum of the chain's span durations
    steps: int

    @property
    def overhead_s(self) -> float:
        """Time on the critical path when no task on it was running."""
        return max(0.0, self.wall_s - self.busy_s)

    @property
    def overhead_fraction(self) -> float:
        """overhead / wall: the runtime's share of the step."""
        return self.overhead_s / self.wall_s if self.wall_s > 0 else 0.0


def _predecessors(event: dict, index: dict[tuple[str, int], dict], graph: nx.DiGraph,
                  group_prev: dict[int, list[dict]]) -> list[dict]:
    node, step = event["node"], event["step"]
    found: list[dict | None] = [index.get((node, step - 1))]
    for src, _, distance in graph.in_edges(node, data="distance"):
        found.append(index.get((src, step - distance)))  # a back edge spans `distance` steps
    found.extend(group_prev.get(id(event), []))
    return [e for e in found if e is not None and e["end"] <= event["start"] + 1e-6]


def critical_path(events: list[dict[str, Any]], graph: nx.DiGraph,
                  first_step: int = 0) -> CriticalPath:
    """The binding chain of spans ending at the last train span, back to step `first_step`
    (back edges span their `distance` in steps, as the plan's graph says)."""
    index = {(e["node"], e["step"]): e for e in events}
    group_prev: dict[int, list[dict]] = {}
    by_group: dict[str, list[dict]] = {}
    for e in events:
        for g in e.get("occupies") or []:
            by_group.setdefault(g, []).append(e)
    for lane in by_group.values():
        lane.sort(key=lambda e: e["start"])
        for before, after in itertools.pairwise(lane):
            group_prev.setdefault(id(after), []).append(before)
    trains = [e for e in events
              if KINDS[graph.nodes[e["node"]]["kind"]].advances_policy and e["step"] >= first_step]
    if not trains:
        return CriticalPath([], 0.0, 0.0, 0)
    current = max(trains, key=lambda e: e["end"])
    chain = [current]
    while True:
        preds = _predecessors(current, index, graph, group_prev)
        if not preds:
            break
        current = max(preds, key=lambda e: e["end"])
        if current["step"] < first_step:
            break
        chain.append(current)
    chain.reverse()
    wall = chain[-1]["end"] - chain[0]["start"]
    busy = sum(e["end"] - e["start"] for e in chain)
    steps = len({e["step"] for e in trains})
    return CriticalPath(chain, wall, busy, steps)
