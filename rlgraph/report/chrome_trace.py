"""Event dicts <-> Chrome trace JSON (Perfetto, chrome://tracing).

An event dict is `{node, step, start, end, group, occupies}` in seconds from the start: the
format of the compiler's simulated `plan.schedule.events` and of the runtime's measured
`trace.json`. In the trace each group is a process, each node a thread, and flow arrows run
from generate(t) to train(t) to show the off-policy lag.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlgraph.nodes import KINDS, NodeKind, NodeSpec
from rlgraph.readback import ReadBackError, trace_spans

NO_GROUP = "cpu"  # lane of nodes that hold no GPU group (reward on CPU)

KIND_COLORS: dict[str, str] = {name: kind.colour for name, kind in KINDS.items()}
OTHER_COLOR = NodeKind.colour  # an event whose kind is unknown (an older trace)
_UNKNOWN = NodeKind("", NodeSpec, lambda node, ctx: 0.0, False, lambda *_: [])


def role_of(kind: str) -> NodeKind:
    """The `NodeKind` record of a kind's name (a record that does nothing, if unknown)."""
    return KINDS.get(kind, _UNKNOWN)


def kind_of(event: Mapping[str, Any], kinds: Mapping[str, str] | None) -> str:
    """An event's node kind: its own `kind`, the plan's, or the node name's known kind."""
    if event.get("kind"):
        return str(event["kind"])
    node = str(event["node"])
    if kinds and node in kinds:
        return kinds[node]
    known = sorted(KIND_COLORS, key=len, reverse=True)
    return next((k for k in known if node == k or node.startswith(k)), node)


def occupied_groups(event: Mapping[str, Any]) -> list[str | None]:
    """The groups an event is drawn on: every occupied group, or its group (None: no group)."""
    occupies = list(event.get("occupies") or [])
    return occupies if occupies else [event.get("group")]


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def chrome_trace(
    events: list[dict],
    title: str,
    groups: list[str] | None = None,
    kinds: Mapping[str, str] | None = None,
) -> dict:
    """Event dicts -> Chrome trace: a process per group, a thread per node, flow arrows.

    A node that occupies several groups (param_update) appears once in each. `groups` fixes
    the process order (pid 1, 2, ...); `kinds` maps node names to kinds for the `cat` field.
    """
    order: list[str | None] = list(groups or [])
    for event in events:
        for group in occupied_groups(event):
            if group not in order:
                order.append(group)
    if None in order:  # nodes in no group go last
        order.remove(None)
        order.append(None)
    pids = {group: i + 1 for i, group in enumerate(order)}
    tids: dict[tuple[int, str], int] = {}
    spans: list[dict] = []
    for event in sorted(events, key=lambda e: (e["start"], str(e["node"]))):
        kind = kind_of(event, kinds)
        args = {k: v for k, v in event.items() if k not in ("start", "end")}
        args.setdefault("kind", kind)
        for group in occupied_groups(event):
            pid = pids[group]
            tid = tids.setdefault((pid, str(event["node"])), 1 + sum(p == pid for p, _ in tids))
            spans.append({
                "name": str(event["node"]), "cat": kind, "ph": "X",
                "ts": _us(event["start"]), "dur": _us(event["end"] - event["start"]),
                "pid": pid, "tid": tid, "args": args,
            })
    meta: list[dict] = []
    for group, pid in pids.items():
        label = NO_GROUP if group is None else str(group)
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"name": label}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                     "args": {"sort_index": pid}})
    for (pid, node), tid in tids.items():
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"name": node}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                     "args": {"sort_index": tid}})
    return {
        "traceEvents": meta + spans + _flows(spans),
        "displayTimeUnit": "ms",
        "otherData": {"title": title, "groups": [NO_GROUP if g is None else g for g in order]},
    }


def _flows(spans: list[dict]) -> list[dict]:
    """Flow arrows from the end of generate(t) to the start of train(t), for every t."""
    first: dict[tuple[str, str, int], dict] = {}
    for span in spans:  # a node on two groups starts its arrow on the first one
        key = (span["cat"], span["name"], span["args"].get("step"))
        first.setdefault(key, span)
    trains = [s for (cat, _, _), s in first.items() if role_of(cat).advances_policy]
    flows: list[dict] = []
    for (cat, _, step), gen in first.items():
        if not role_of(cat).samples:
            continue
        for train in trains:
            if train["args"].get("step") != step:
                continue
            flow_id = len(flows) // 2 + 1
            end = gen["ts"] + gen["dur"]
            flows.append({"name": f"batch {step}", "cat": "batch", "ph": "s", "id": flow_id,
                          "ts": round(max(gen["ts"], end - 1), 3),
                          "pid": gen["pid"], "tid": gen["tid"]})
            flows.append({"name": f"batch {step}", "cat": "batch", "ph": "f", "bp": "e",
                          "id": flow_id, "ts": train["ts"], "pid": train["pid"],
                          "tid": train["tid"]})
    return flows


def events_from_trace(trace: dict | list, where: str = "trace.json") -> list[dict]:
    """Chrome trace -> event dicts (the inverse of `chrome_trace`; duplicates merged). A
    trace of the wrong shape (a span without a name, a time that is not a finite number >= 0,
    ...) is a one-line ReadBackError naming `where`."""
    if not isinstance(trace, dict | list):
        raise ReadBackError(f"{where}: not a Chrome trace (a mapping with traceEvents)")
    spans = trace_spans(trace, where)
    raw = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    names = {e.get("pid"): e["args"]["name"] for e in raw
             if e.get("ph") == "M" and e.get("name") == "process_name"
             and isinstance(e.get("args"), dict) and isinstance(e["args"].get("name"), str)
             and isinstance(e.get("pid"), int | str)}
    events: dict[tuple[str, Any, float], dict] = {}
    for span in spans:
        args = dict(span.get("args") or {})
        start = span.get("ts", 0) / 1e6
        node = str(args.pop("node", span.get("name")))
        step = args.pop("step", -1)
        key = (node, step, round(start, 6))
        if key in events:
            continue
        pid = span.get("pid")
        group = args.pop("group", names.get(pid) if isinstance(pid, int | str) else None)
        if group is not None and not isinstance(group, str):
            raise ReadBackError(f"{where}: span {node} step {step}: args.group is not a name")
        group = None if group == NO_GROUP else group
        occupies = list(args.pop("occupies", None) or ([group] if group else []))
        event = {"node": node, "step": step, "start": start,
                 "end": start + span.get("dur", 0) / 1e6, "group": group, "occupies": occupies}
        event.update(args)
        event["kind"] = str(event.get("kind", span.get("cat", node)))
        events[key] = event
    return sorted(events.values(), key=lambda e: (e["start"], e["node"]))
