"""graph.yaml as pydantic models: the sections, their bounds, and the whole `Spec`.

Node sections are validated by their kind's own model from `rlgraph.nodes.KINDS`; reading a
file, overrides and error text live in `rlgraph.config.load`.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal, Union

from pydantic import (
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)

from rlgraph.config.algorithm import AlgorithmSpec
from rlgraph.config.loggers import LoggingSpec
from rlgraph.errors import SourceMap, SpecError, did_you_mean
from rlgraph.limits import MAX_COUNT, MAX_PARALLEL, MAX_SEED, MAX_STEPS, MAX_TOKENS
from rlgraph.nodes import KINDS, NodeKind
from rlgraph.nodes.base import StrictModel
from rlgraph.presets.gpus import GPU_PRESETS
from rlgraph.presets.models import MODEL_PRESETS
from rlgraph.pricing.system import SYSTEMS, unknown_system_hint

MAX_LAG = 256  # policy versions; the seeds use 1 to 8
MIN_SHARE = 1e-6  # of the cluster (one GPU of the largest cluster the schema takes is
# 1 / 262144); a sliver below it is a typo, not a plan


class ClusterSpec(StrictModel):
    """`{nodes, gpus_per_node, gpu}` for GPUs, or `{local: true}` for CPU cores as slots."""

    local: bool = False
    nodes: int = Field(default=1, ge=1, le=4096)
    gpus_per_node: int = Field(default=8, ge=1, le=64)
    gpu: str = "H200"
    cpus: int | None = Field(default=None, ge=1, le=4096,
                             description="local slots; default: all cores")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, gpu: str) -> str:
        if gpu not in GPU_PRESETS:
            hint = did_you_mean(gpu, GPU_PRESETS) or f"known: {', '.join(GPU_PRESETS)}"
            raise ValueError(f"unknown GPU '{gpu}' ({hint})")
        return gpu

    def slots(self) -> int:
        """GPUs of the cluster, or CPU slots of a local one."""
        if self.local:
            return self.cpus or os.cpu_count() or 1
        return self.nodes * self.gpus_per_node


class WarmStartSpec(StrictModel):
    """Supervised steps on the training prompts' answers before RL; the result is version 0."""

    steps: int = Field(default=0, ge=0, le=MAX_STEPS, description="0: RL from the initial "
                       "weights")
    lr: float = Field(default=1e-3, ge=1e-12, le=10, description="constant AdamW learning rate")
    batch_size: int = Field(default=64, ge=1, le=MAX_COUNT)


class ModelSpec(StrictModel):
    """The policy: a named preset, an inline Hugging Face config, or a local path."""

    preset: str | None = None
    hf_config: dict[str, Any] | None = None
    path: str | None = None
    warm_start: WarmStartSpec = Field(default_factory=WarmStartSpec)

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        given = [k for k in ("preset", "hf_config", "path") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of preset, hf_config or path, not {' and '.join(given)}")
        if not given:
            self.preset = "tiny"
        if self.preset is not None and self.preset not in MODEL_PRESETS:
            hint = did_you_mean(self.preset, MODEL_PRESETS) or f"known: {', '.join(MODEL_PRESETS)}"
            raise ValueError(f"unknown model preset '{self.preset}' ({hint})")
        return self


class ResponseLength(StrictModel):
    """Response length in tokens: the mean decides throughput, the max a synchronous batch."""

    mean: float = Field(default=256, ge=1, le=MAX_TOKENS)
    max: int = Field(default=512, ge=1, le=MAX_TOKENS)
    dist: Literal["lognormal", "pareto"] = Field(
        default="lognormal", description="length distribution of the longtail task's targets: "
        "mean as above, clipped at max (which lowers the realized mean, a pareto's most)")
    sigma: float = Field(default=1.0, ge=1e-3, le=10, description="lognormal: std of log length")
    alpha: float = Field(default=1.5, gt=1, le=100, description="pareto: tail index (smaller: "
                         "heavier tail)")

    clipped_mean: float | None = Field(
        default=None, ge=1, le=MAX_TOKENS, description="the mean of the lengths as trained, "
        "after the cap (the mean response length a run reports); give it instead of mean, "
        "and the mean before the cap is solved from it with this max and shape")

    @model_validator(mode="after")
    def _mean_below_max(self) -> ResponseLength:
        if self.clipped_mean is not None:
            self._solve_mean()
        if self.mean > self.max:
            raise ValueError(f"mean ({self.mean}) is larger than max ({self.max})")
        return self

    def _solve_mean(self) -> None:
        """Set `mean` (before the cap) from `clipped_mean` (after it)."""
        from rlgraph.lengths import LengthModel, mean_before_cap, moments

        if self.clipped_mean > self.max:
            raise ValueError(f"clipped_mean ({self.clipped_mean:g}) is larger than max "
                             f"({self.max})")
        shape = LengthModel(float(self.max), float(self.max), self.dist, self.sigma, self.alpha)
        solved = mean_before_cap(float(self.clipped_mean), shape)
        if solved is None:
            top = moments(LengthModel(self.max * (1 - 1e-9), float(self.max), self.dist,
                                      self.sigma, self.alpha))[0]
            what = f"sigma {self.sigma:g}" if self.dist == "lognormal" else f"alpha {self.alpha:g}"
            raise ValueError(f"a {self.dist} of {what} capped at {self.max} averages at most "
                             f"{top:.0f} tokens, below clipped_mean {self.clipped_mean:g}: "
                             f"{'lower sigma' if self.dist == 'lognormal' else 'raise alpha'}"
                             f" (a narrower distribution) or raise max")
        if "mean" in self.model_fields_set and abs(self.mean - solved) > 1e-6 * solved:
            raise ValueError("give mean (before the cap) or clipped_mean (after it, as a run "
                             "reports it), not both")
        self.__dict__["mean"] = solved  # no re-validation (a dumped spec reloads as it was)


class DataSpec(StrictModel):
    """Batch shape per train step and where prompts come from."""

    prompts_per_step: int = Field(default=8, ge=1, le=MAX_COUNT)
    samples_per_prompt: int = Field(default=4, ge=1, le=4096)
    prompt_len: int = Field(default=16, ge=1, le=MAX_TOKENS)
    response_len: ResponseLength = Field(default_factory=ResponseLength)
    task: str = Field(default="arithmetic", description="built-in task when no files are given")
    train_files: list[str] | None = None
    val_files: list[str] | None = None
    seed: int = Field(default=0, ge=0, le=MAX_SEED)

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        from rlgraph.presets.tasks import TASKS

        if task not in TASKS:
            hint = did_you_mean(task, TASKS) or (f"tasks: {', '.join(TASKS)}; or give "
                                                 "data.train_files")
            raise ValueError(f"unknown task '{task}' ({hint})")
        return task

    @field_validator("response_len", mode="before")
    @classmethod
    def _scalar_length(cls, value: Any) -> Any:
        return {"mean": value, "max": value} if isinstance(value, int | float) else value

    def samples_per_step(self) -> int:
        """Sequences trained on per step."""
        return self.prompts_per_step * self.samples_per_prompt


class GroupSpec(StrictModel):
    """Tasks that share the group's GPUs in time, and the group's share of the cluster."""

    share: float = Field(gt=0, le=1)  # and at least MIN_SHARE (_not_a_sliver)
    tasks: list[str] = Field(min_length=1)
    replicas: int | None = Field(default=None, ge=1, le=MAX_PARALLEL,
                                 description="data-parallel processes the "
                                 "group's work is split over; default one per GPU, one on a "
                                 "local CPU cluster (its slots are then its threads)")


    @field_validator("share")
    @classmethod
    def _not_a_sliver(cls, share: float) -> float:
        if share < MIN_SHARE:
            raise ValueError(f"share {share:g} is less than {MIN_SHARE:g} of the cluster (it "
                             f"would still get a whole GPU or CPU slot); give at least "
                             f"{MIN_SHARE:g}")
        return share


class StreamSpec(StrictModel):
    """Streaming between generate and train (verl fully_async): a version spans `mini_batches`
    optimizer steps, each taken as soon as its mini-batch of complete GRPO groups is ready;
    the weights are synced once per version (verl: trigger_parameter_sync_step)."""

    mini_batches: int = Field(default=4, ge=1, le=MAX_COUNT,
                              description="optimizer steps per policy version (verl: "
                              "trigger_parameter_sync_step); a mini-batch is prompts_per_step "
                              "/ mini_batches prompt groups (verl: require_batches x "
                              "ppo_mini_batch_size)")


class ScheduleSpec(StrictModel):
    """Lag bound, partial rollout and run length (seeds: generate_ahead_steps = max_lag)."""

    max_lag: int = Field(default=1, ge=0, le=MAX_LAG)
    partial_rollout: bool = False
    stream: StreamSpec | None = Field(
        default=None, description="train on each mini-batch as soon as it is generated; "
        "generate refills finished rows with new prompts (continuous batching)")
    steps: int = Field(default=100, ge=1, le=MAX_STEPS)

    @property
    def mini_batches(self) -> int:
        """Optimizer steps (and generate / train calls) per policy version: 1 unless
        streaming."""
        return self.stream.mini_batches if self.stream is not None else 1


class PricingSpec(StrictModel):
    """Which system prices the plan (`rlgraph.pricing.system.SYSTEMS`): the runtime that runs
    it, `rlgraph` by default, or another framework's (verl's hybrid engine, slime, ...), whose
    switch, refit, offload and batch-transfer costs the plan pays. `refit`: the documented
    path of that system's weights into its rollout engine (verl: `bucketed` or `per_tensor`;
    slime: `flattened` or `bucketed`); none: the system's default. `engine_revision`: the
    revision of rlgraph's static decode engine the plan is priced as (none: today's)."""

    system: str = Field(
        default="rlgraph", description="the system that runs the plan, one of: "
        + ", ".join(SYSTEMS) + " (rlgraph: its own runtime; the others: that framework as "
        "rlgraph/pricing/system.py sources it), whose switch, refit, offload and "
        "batch-transfer costs the plan pays")
    refit: str | None = Field(
        default=None, description="the system's path for the weights into its rollout engine "
        "at each switch: " + "; ".join(
            f"{name}: " + " or ".join(
                f"{path}" + (f" {rate / 1e9:.2g} GB/s" if rate else " (NVLink)")
                for path, rate in system.refit.items())
            for name, system in SYSTEMS.items() if system.refit)
        + " (sources in rlgraph/pricing/system.py); none: the system's default")

    @field_validator("system")
    @classmethod
    def _known_system(cls, system: str) -> str:
        if system not in SYSTEMS:
            raise ValueError(f"unknown system '{system}' ({unknown_system_hint(system)})")
        return system

    @model_validator(mode="after")
    def _known_refit(self) -> PricingSpec:
        paths = SYSTEMS[self.system].refit
        if self.refit is not None and self.refit not in paths:
            what = (f"one of: {', '.join(paths)}" if paths else
                    f"{self.system} has no colocation refit: leave pricing.refit out (its "
                    f"weights move by the param_update node)")
            close = did_you_mean(self.refit, paths)
            raise SpecError(f"{self.system} has no refit path '{self.refit}'",
                            ("pricing", "refit"), hint=f"{close} {what}" if close else what)
        return self

    engine_revision: Literal["shared_gpu_reserve", "slot_refill", "one_copy", "per_slot",
                             "sdpa"] | None = Field(
        default=None, description="rlgraph: the static decode engine's revision whose host "
        "time between decode steps and in-flight refill rule the plan pays (shared_gpu_reserve: "
        "today's, 0.15 ms a step, in-flight refills by free slots, leaving the oversample's "
        "groups free where generate shares train's GPU; slot_refill: the same without that "
        "slack; one_copy: the same host "
        "time, refills for the round's complete groups; per_slot: before 2026-11-27, 0.66 "
        "ms; sdpa: before the varlen decode attention, 0.85 ms and SDPA's occupancy), to "
        "price a result measured on an older engine; none: today's "
        "(`rlgraph.pricing.engine_revisions.ENGINE_REVISIONS`)")


class CheckpointSpec(StrictModel):
    """Which checkpoints a run keeps (the latest is always `RUN_DIR/checkpoint/`; older ones
    go to `RUN_DIR/checkpoints/<step>/`). A resumed run may change these."""

    keep_last: int = Field(default=1, ge=1, le=MAX_COUNT, description="the newest N "
                           "checkpoints, the latest included")
    keep_every: int = Field(default=0, ge=0, le=MAX_STEPS, description="also every checkpoint "
                            "whose step is a multiple of N (0: none)")


def _node_union() -> Any:
    specs = tuple(kind.spec for kind in KINDS.values())
    return Annotated[Union[specs], Field(discriminator="kind")]  # noqa: UP007


NodeSpecs = _node_union()


class Spec(StrictModel):
    """A whole graph.yaml."""

    name: str = "rlgraph"
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    algorithm: AlgorithmSpec = Field(default_factory=AlgorithmSpec)
    groups: dict[str, GroupSpec] = Field(default_factory=dict)
    nodes: dict[str, NodeSpecs] = Field(min_length=1)  # type: ignore[valid-type]
    edges: list[str] | None = None
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    pricing: PricingSpec = Field(default_factory=PricingSpec)
    logging: LoggingSpec = Field(default_factory=LoggingSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)

    _source: SourceMap = PrivateAttr(default_factory=SourceMap)

    @field_validator("nodes", mode="before")
    @classmethod
    def _kind_defaults_to_name(cls, nodes: Any) -> Any:
        """`logp: {}` means `logp: {kind: logp}`."""
        if not isinstance(nodes, dict):
            return nodes
        filled = {}
        for name, node in nodes.items():
            node = {} if node is None else node
            if isinstance(node, dict) and "kind" not in node and name in KINDS:
                node = {"kind": name, **node}
            filled[name] = node
        return filled

    @property
    def source(self) -> SourceMap:
        """Where each key was written (file, line, column) or which override set it."""
        return self._source

    def group_of(self, task: str) -> str | None:
        """The group a task belongs to, or None."""
        return next((g for g, spec in self.groups.items() if task in spec.tasks), None)

    def kind_of(self, task: str) -> NodeKind:
        """The registered kind of node `task`: its spec model, cost, worker and the hooks
        the runtime asks (so nothing outside `rlgraph/nodes/` compares kind names)."""
        return KINDS[self.nodes[task].kind]

    def to_yaml_dict(self) -> dict[str, Any]:
        """The spec as plain data, defaults included, ready for yaml.safe_dump."""
        return self.model_dump(mode="json", exclude_none=True)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of graph.yaml, for editors' YAML completion."""
    schema = Spec.model_json_schema()
    schema["title"] = "rlgraph graph.yaml"
    return schema
