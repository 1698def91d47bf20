"""Per-step metrics: metrics.jsonl (one row per train step), and the same rows to the sinks of
`logging:` (TensorBoard events by default; rlgraph.runtime.loggers).

A row is written when train step t finishes. Its keys:
- `step`, `policy/version` (t + 1), `reward/mean`, `lag/max`, `lag/mean` (over every
  trained token: lag = t - the version that sampled it) and the train worker's other metrics;
- `time/step_s`: end of train(t) minus end of train(t-1) (the first step counts from the
  first span of the run, so start-up is not in it);
- `throughput/samples_per_s`, `throughput/tokens_per_s`: samples and tokens of the step
  over `time/step_s`;
- `time/<node>_s`: the duration of the node's latest finished step (param_update of step t
  runs after train(t), so its row shows param_update(t-1); 0 before its first step);
- `idle/<group>`: the fraction of the step's window in which the group ran nothing. When
  train(t) ends, tasks still running (generate(t+1) on another group) are not yet in the
  trace, so the streamed value overstates idle; at the end of the run `settle_idle`
  recomputes it from the whole trace and metrics.jsonl is rewritten (TensorBoard keeps the
  streamed value).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rlgraph.readback import ReadBackError, count, read_bytes

REQUIRED_KEYS = ("step", "policy/version", "reward/mean", "lag/max", "lag/mean", "time/step_s",
                 "throughput/samples_per_s", "throughput/tokens_per_s")


def busy_in(events: list[dict[str, Any]], group: str, lo: float, hi: float) -> float:
    """Seconds of [lo, hi] during which `group` ran a task (spans of a group never overlap)."""
    busy = 0.0
    for e in events:
        if group in (e.get("occupies") or []):
            busy += max(0.0, min(hi, e["end"]) - max(lo, e["start"]))
    return busy


def step_row(step: int, train_summary: dict[str, Any], window: tuple[float, float],
             latest: dict[str, dict[str, Any] | None], events: list[dict[str, Any]],
             groups: list[str]) -> dict[str, Any]:
    """The metrics row of train step `step` (see the module docstring for the keys)."""
    metrics = dict(train_summary.get("metrics", {}))
    lo, hi = window
    step_s = max(hi - lo, 1e-9)
    row: dict[str, Any] = {"step": step,
                           "policy/version": int(train_summary.get("policy_version", step + 1))}
    row.update({k: v for k, v in metrics.items() if k not in ("policy/version",)})
    row.setdefault("reward/mean", float("nan"))
    row.setdefault("lag/max", 0.0)
    row.setdefault("lag/mean", 0.0)
    row["time/step_s"] = step_s
    row["throughput/samples_per_s"] = float(metrics.get("samples", 0.0)) / step_s
    row["throughput/tokens_per_s"] = float(metrics.get("tokens", 0.0)) / step_s
    for node, event in latest.items():
        row[f"time/{node}_s"] = event["end"] - event["start"] if event else 0.0
    for group in groups:
        row[f"idle/{group}"] = max(0.0, 1.0 - busy_in(events, group, lo, hi) / step_s)
    return row


def settle_idle(rows: list[dict[str, Any]], windows: dict[int, tuple[float, float]],
                events: list[dict[str, Any]], groups: list[str]) -> None:
    """Recompute each row's `idle/<group>` from the finished trace (in place)."""
    for row in rows:
        lo, hi = windows[row["step"]]
        span = max(hi - lo, 1e-9)
        for group in groups:
            row[f"idle/{group}"] = max(0.0, 1.0 - busy_in(events, group, lo, hi) / span)


class MetricsWriter:
    """Appends rows to metrics.jsonl and hands them, and the samples tables, to the sinks of
    `logging:` (TensorBoard by default; wandb, mlflow; DIR/samples.jsonl)."""

    def __init__(self, out_dir: Path, first_step: int = 0, tensorboard: bool = True,
                 logging: Any = None, name: str = "rlgraph",
                 config: dict[str, Any] | None = None) -> None:
        from rlgraph.runtime.loggers import open_sinks

        self.path = out_dir / "metrics.jsonl"
        keep = [r for r in read_rows(self.path) if r["step"] < first_step]
        replace_text(self.path, "".join(json.dumps(r) + "\n" for r in keep))
        self.file = self.path.open("a")
        self.sinks = open_sinks(logging, out_dir, first_step, name, config or {}, tensorboard)

    def write(self, row: dict[str, Any]) -> None:
        """One row: a JSON line (flushed) and the row to every sink."""
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        for sink in self.sinks:
            sink.log(row)

    def write_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """A table of the step's sample generations to every sink."""
        for sink in self.sinks:
            sink.samples(step, rows)

    def rewrite(self, rows: list[dict[str, Any]]) -> None:
        """Replace this run's rows in metrics.jsonl (rows of earlier runs stay)."""
        first = min((r["step"] for r in rows), default=None)
        if first is None:
            return
        self.file.close()
        keep = [r for r in read_rows(self.path) if r["step"] < first]
        replace_text(self.path, "".join(json.dumps(r) + "\n" for r in keep + rows))
        self.file = self.path.open("a")

    def close(self) -> None:
        """Flush and close every output."""
        self.file.close()
        for sink in self.sinks:
            sink.close()


def replace_text(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temporary file beside it, fsync'd, then renamed
    over it (a crash or a full disk mid-write leaves the previous file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl (none when it does not exist). A last line cut short by a
    crash is dropped; any other line that is not a row with a whole `step` >= 0 (an edited
    or damaged file) is a one-line ReadBackError naming the file and line."""
    if not path.exists() and not path.is_symlink():
        return []
    what = "restore it from a copy of the run dir, or delete it to start the curves anew"
    try:
        text = read_bytes(path, what).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReadBackError(f"{path}: not UTF-8 text (byte {exc.start}); {what}") from None
    lines = text.split("\n")
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            if number == len(lines):  # no newline after it: a write the crash cut short
                continue
            raise ReadBackError(f"{path}:{number}: not a JSON row; {what}") from None
        if not isinstance(row, dict):
            raise ReadBackError(f"{path}:{number}: not a mapping; {what}")
        count(row.get("step"), f"{path}:{number}: step")
        rows.append(row)
    return rows
