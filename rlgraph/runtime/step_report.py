"""What a finished train step writes: its metrics row, its ledger line and the `on_step` call.

The runner hands it each train completion; so does `runtime.rescue` when it drains the train
steps still running as a run fails (the checkpoint must cover exactly the ledger).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlgraph.runtime import checkpoint as ckpt
from rlgraph.runtime.metrics import MetricsWriter, step_row
from rlgraph.runtime.tasks import Completion
from rlgraph.runtime.tracing import Tracer


@dataclass
class RunResult:
    """What a run did: its rows, spans, where it stopped, how long it took."""

    out_dir: Path
    first_step: int
    next_step: int
    stopped: bool
    rows: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    env_events: list[dict[str, Any]] = field(default_factory=list)  # the timeline's env lane
    startup_s: float = 0.0
    wall_s: float = 0.0
    lag_violations: int = 0
    notes: list[str] = field(default_factory=list)  # what the closing lines should say


class StepReport:
    """Rows, ledger lines and progress of the train steps, in step order."""

    def __init__(self, result: RunResult, metrics: MetricsWriter, ledger: ckpt.Ledger,
                 tracer: Tracer, *, nodes: list[str], groups: list[str], max_lag: int,
                 lag_bound: int, on_step: Callable[[dict[str, Any]], None] | None = None
                 ) -> None:
        self.result, self.metrics, self.ledger, self.tracer = result, metrics, ledger, tracer
        self.nodes, self.groups, self.max_lag, self.lag_bound = nodes, groups, max_lag, lag_bound
        self.on_step = on_step
        self.latest: dict[str, dict[str, Any] | None] = dict.fromkeys(nodes)
        self.last_train_end: float | None = None
        self.pending: list[tuple[Completion, dict[str, Any]]] = []  # trained, not yet written
        self.windows: dict[int, tuple[float, float]] = {}  # step -> its row's time window
        # other nodes' metrics by step, until the row of that step (or a later one) takes them
        self.node_metrics: dict[int, dict[str, float]] = {}

    def flush(self) -> None:
        """Write the rows and ledger lines of the train steps finished so far."""
        pending, self.pending = self.pending, []
        for done, event in pending:
            self.train_step(done, event)

    def train_step(self, done: Completion, event: dict[str, Any]) -> None:
        """Row, ledger and progress of the train step that just finished."""
        result, tracer = self.result, self.tracer
        step, summary = done.task.step, done.info["summary"]
        if self.last_train_end is None:
            self.last_train_end = min(e["start"] for e in tracer.events
                                      if e["step"] >= result.first_step)
        recent = tracer.events[-len(self.nodes) * (self.max_lag + 4):]
        self.windows[step] = (self.last_train_end, event["end"])
        row = step_row(step, summary, self.windows[step], self.latest, recent, self.groups)
        row["lag/bound"] = self.lag_bound
        for done_step in sorted(s for s in self.node_metrics if s <= step):
            row.update(self.node_metrics.pop(done_step))
        if row["lag/max"] > self.lag_bound:
            result.lag_violations += 1
        self.last_train_end = event["end"]
        self.metrics.write(row)
        if summary.get("sample_table"):
            self.metrics.write_samples(step, summary["sample_table"])
        self.ledger.append(step, summary.get("trained_uids", []),
                           int(summary.get("policy_version", step + 1)),
                           stale_tokens=int(summary.get("stale_tokens", 0)))
        result.rows.append(row)
        result.next_step = step + 1
        if self.on_step:
            self.on_step(row)
