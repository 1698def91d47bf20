"""`logging:` of graph.yaml: where a run's metrics and sample tables go besides metrics.jsonl.

    logging:
      tensorboard: true                 # DIR/tensorboard/ (default on)
      wandb: {project: my-project, mode: offline}
      mlflow: {tracking_uri: file:./mlruns, experiment: my-exp}
      samples_every: 10                 # a table of samples every N steps (0: never)
      samples: 4                        # rows per table

wandb and mlflow are optional extras (`pip install 'rlgraph[wandb]'` / `'rlgraph[mlflow]'`);
a run that names one without its package installed is refused before anything starts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlgraph.limits import MAX_COUNT, MAX_STEPS
from rlgraph.nodes.base import StrictModel


class WandbSpec(StrictModel):
    """Weights & Biases (wandb.init's arguments); `mode: offline` writes DIR/wandb/ only."""

    project: str | None = Field(default=None, description="default: the graph's name")
    entity: str | None = None
    name: str | None = Field(default=None, description="run name; default: the run folder's")
    group: str | None = None
    tags: list[str] = Field(default_factory=list)
    mode: Literal["online", "offline", "disabled"] = "online"


class MlflowSpec(StrictModel):
    """MLflow tracking: a server URI or a local file store (default DIR/mlruns)."""

    tracking_uri: str | None = Field(default=None, description="default: file:DIR/mlruns")
    experiment: str | None = Field(default=None, description="default: the graph's name")
    run_name: str | None = None


class LoggingSpec(StrictModel):
    """Metric sinks and the samples table (verl: trainer.logger, log_val_generations)."""

    tensorboard: bool = True
    wandb: WandbSpec | None = None
    mlflow: MlflowSpec | None = None
    samples_every: int = Field(default=10, ge=0, le=MAX_STEPS,
                               description="a table of samples (prompt, response, reward, "
                               "version, lag) every N train steps; 0: never")
    samples: int = Field(default=4, ge=1, le=MAX_COUNT, description="rows per samples table")
