"""Metric sinks offline: wandb's offline mode, MLflow's local file store, TensorBoard's text
table, samples.jsonl and curves.png. The test extra installs wandb and MLflow, so CI runs
every sink; outside it, a sink's test skips when its package is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlgraph.config.loggers import LoggingSpec
from rlgraph.errors import MissingDependencyError
from rlgraph.report.curves import running_mean, write_curves
from rlgraph.rl.batch import sample_table
from rlgraph.runtime import loggers
from rlgraph.runtime.metrics import MetricsWriter

ROWS = [{"step": s, "reward/mean": 0.1 * s, "lag/mean": 0.5, "lag/max": 1.0, "ok": True}
        for s in range(3)]
TABLE = [{"step": 2, "prompt": "1+2=", "response": "3", "reward": 1.0, "version": 1,
          "lag": 1}]


def _write(tmp_path: Path, logging: LoggingSpec, before_close: object = None) -> None:
    writer = MetricsWriter(tmp_path, logging=logging, name="unit", config={"name": "unit"})
    for row in ROWS:
        writer.write(row)
    writer.write_samples(2, TABLE)
    if callable(before_close):
        before_close(writer)
    writer.close()


def test_samples_file_and_metrics(tmp_path: Path) -> None:
    _write(tmp_path, LoggingSpec(tensorboard=False))
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == TABLE
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    # a resumed run at step 2 drops the tables of steps >= 2
    MetricsWriter(tmp_path, first_step=2, tensorboard=False).close()
    assert (tmp_path / "samples.jsonl").read_text() == ""


def test_tensorboard_gets_the_samples_as_text(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    _write(tmp_path, LoggingSpec())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tensorboard"),
                              size_guidance={"tensors": 0, "scalars": 0}).Reload()
    assert "samples/text_summary" in events.Tags()["tensors"]
    text = events.Tensors("samples/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| 1+2= | 3 | 1.0 | 1 | 1 |" in text
    assert [e.value for e in events.Scalars("reward/mean")] == pytest.approx([0.0, 0.1, 0.2])


def test_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    def summary(writer: MetricsWriter) -> None:
        run = next(s for s in writer.sinks if isinstance(s, loggers.WandbSink)).run
        # wandb commits a step when the next one starts: steps 0 and 1 are in
        assert run.summary["reward/mean"] == pytest.approx(0.1)
        assert run.offline and run.project == "p"

    _write(tmp_path, LoggingSpec(tensorboard=False, wandb={"project": "p", "mode": "offline"}),
           summary)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb"))  # the record log, synced later
    tables = list((runs[0] / "files" / "media" / "table").glob("samples_2_*.table.json"))
    table = json.loads(tables[0].read_text())
    assert table["columns"] == list(loggers.SAMPLE_COLUMNS)
    assert table["data"] == [[2, "1+2=", "3", 1.0, 1, 1]]


def test_mlflow_file_store(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    _write(tmp_path, LoggingSpec(tensorboard=False, mlflow={"experiment": "e"}))
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run = client.search_runs([client.get_experiment_by_name("e").experiment_id])[0]
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(
        [0.0, 0.1, 0.2])
    assert run.info.status == "FINISHED"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "samples")}
    assert artifacts == {"samples/step_000002.json"}


def test_missing_package_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loggers.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingDependencyError, match=r"rlgraph\[wandb\]"):
        loggers.check_loggers(LoggingSpec(wandb={"mode": "offline"}))
    loggers.check_loggers(LoggingSpec())  # nothing optional asked: nothing to refuse


def test_sample_table_spreads_over_prompts() -> None:
    batch = {"step": 5, "prompt": ["a", "a", "b", "b"], "response_text": ["1", "2", "3", "4"],
             "rewards": torch.tensor([0.0, 1.0, 0.5, 0.0]),
             "response_mask": torch.tensor([[1, 1], [1, 0], [1, 1], [0, 0]]),
             "token_version": torch.tensor([[3, 4], [4, -1], [4, 4], [-1, -1]]),
             "group": torch.tensor([0, 0, 1, 1])}
    table = sample_table(batch, 5, 2)
    assert [(r["prompt"], r["response"], r["reward"], r["version"], r["lag"]) for r in table] \
        == [("a", "1", 0.0, 3, 2), ("b", "3", 0.5, 4, 1)]


def test_curves_png(tmp_path: Path) -> None:
    assert running_mean([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]
    path = write_curves(tmp_path / "curves.png", ROWS, "unit", lag_bound=1)
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert write_curves(tmp_path / "none.png", [], "unit") is None
