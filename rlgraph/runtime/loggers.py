"""Metric sinks beside metrics.jsonl: TensorBoard, Weights & Biases, MLflow, and the samples
table every sink and DIR/samples.jsonl receive (`logging:` of graph.yaml).

Each sink takes a step's row of scalars (`log`), a table of sample generations (`samples`:
prompt, response, reward, version, lag) and `close`s at the end of the run. wandb and mlflow
are optional: `check_loggers` refuses, before anything starts, a graph that names one whose
package is not installed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

from rlgraph.errors import MissingDependencyError

SAMPLE_COLUMNS = ("step", "prompt", "response", "reward", "version", "lag")
EXTRAS = {"wandb": "wandb", "mlflow": "mlflow"}  # logging key -> the module it needs


def check_loggers(logging: Any) -> None:
    """Refuse a `logging:` section naming a sink whose package is missing."""
    for key, module in EXTRAS.items():
        if getattr(logging, key, None) is not None and importlib.util.find_spec(module) is None:
            raise MissingDependencyError(f"logging.{key} needs the {module} package: pip "
                                         f"install 'rlgraph[{key}]' (or remove logging.{key})")


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a row, `step` left out."""
    return {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, int | float)
            and not isinstance(v, bool) and math.isfinite(float(v))}


class Sink(Protocol):
    """Where rows and sample tables go."""

    def log(self, row: dict[str, Any]) -> None: ...

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The samples as a Markdown table (TensorBoard's text plugin renders it)."""
    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    head = "| " + " | ".join(SAMPLE_COLUMNS) + " |\n|" + "---|" * len(SAMPLE_COLUMNS) + "\n"
    return head + "".join("| " + " | ".join(cell(r.get(c, "")) for c in SAMPLE_COLUMNS)
                          + " |\n" for r in rows)


class TensorBoardSink:
    """DIR/tensorboard/: a scalar per key, the samples as a text table."""

    def __init__(self, out_dir: Path, first_step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out_dir / "tensorboard"),
                                    purge_step=first_step if first_step else None)

    def log(self, row: dict[str, Any]) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, row["step"])

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        self.writer.add_text("samples", markdown_table(rows), step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbSink:
    """A wandb run in DIR/wandb/ (`mode: offline` never touches the network); the samples as a
    `wandb.Table`."""

    def __init__(self, spec: Any, out_dir: Path, name: str, config: dict[str, Any]) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=spec.project or name, entity=spec.entity,
                              name=spec.name or out_dir.name, group=spec.group,
                              tags=list(spec.tags) or None, mode=spec.mode, dir=str(out_dir),
                              config=config, reinit="finish_previous")

    def log(self, row: dict[str, Any]) -> None:
        self.run.log(scalars(row), step=int(row["step"]))

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        table = self.wandb.Table(columns=list(SAMPLE_COLUMNS),
                                 data=[[r.get(c) for c in SAMPLE_COLUMNS] for r in rows])
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    """An MLflow run (a tracking server or database URI, or the local file store DIR/mlruns,
    which MLflow 3 opens with MLFLOW_ALLOW_FILE_STORE=true); the samples as a table artifact
    per logged step (`samples/step_000010.json`)."""

    def __init__(self, spec: Any, out_dir: Path, name: str, config: dict[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        uri = spec.tracking_uri or (out_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3.x keeps the file store behind this documented opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        experiment = spec.experiment or name
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=spec.run_name or out_dir.name
                                             ).info.run_id
        self.client.log_dict(self.run_id, config, "graph.json")

    def log(self, row: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now, step = int(time.time() * 1000), int(row["step"])
        metrics = [Metric(k, v, now, step) for k, v in scalars(row).items()]
        for lo in range(0, len(metrics), 500):  # MLflow's batch limit is 1000 metrics
            self.client.log_batch(self.run_id, metrics=metrics[lo:lo + 500])

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        # the layout `log_table` writes (pandas' split orient), without needing pandas
        table = {"columns": list(SAMPLE_COLUMNS),
                 "data": [[r.get(c) for c in SAMPLE_COLUMNS] for r in rows]}
        self.client.log_dict(self.run_id, table, f"samples/step_{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class SamplesFile:
    """DIR/samples.jsonl: every sample of every table, one JSON line each."""

    def __init__(self, out_dir: Path, first_step: int) -> None:
        self.path = out_dir / "samples.jsonl"
        keep = []
        if self.path.exists():
            keep = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) < first_step]
        self.path.write_text("".join(line + "\n" for line in keep))

    def log(self, row: dict[str, Any]) -> None:
        """Rows of scalars go to metrics.jsonl, not here."""

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        with self.path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)

    def close(self) -> None:
        """Each table is appended and closed at once."""


def open_sinks(logging: Any, out_dir: Path, first_step: int, name: str,
               config: dict[str, Any], tensorboard: bool = True) -> list[Sink]:
    """The sinks `logging` asks for (TensorBoard only when its package imports)."""
    sinks: list[Sink] = [SamplesFile(out_dir, first_step)]
    if tensorboard and (logging is None or logging.tensorboard):
        with contextlib.suppress(ImportError):  # missing: metrics.jsonl has everything
            sinks.append(TensorBoardSink(out_dir, first_step))
    if logging is not None and logging.wandb is not None:
        sinks.append(WandbSink(logging.wandb, out_dir, name, config))
    if logging is not None and logging.mlflow is not None:
        sinks.append(MlflowSink(logging.mlflow, out_dir, name, config))
    return sinks
