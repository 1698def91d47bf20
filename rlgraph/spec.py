"""graph.yaml as pydantic models, loaded with line numbers and `key=value` overrides.

`load_spec(path, overrides)` returns a validated `Spec` whose `source` maps every key to
its line; any problem raises `SpecError` that renders as `graph.yaml:LINE:COL: ...`. The
file and the overrides are read by `rlgraph.safe_yaml` (limits on size, depth, aliases).
Node sections are validated by their kind's own model from `rlgraph.nodes.KINDS`.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from rlgraph.errors import Key, SourceMap, SpecError, did_you_mean
from rlgraph.nodes import KINDS
from rlgraph.nodes.base import (
    MAX_COUNT,
    MAX_PARALLEL,
    MAX_SEED,
    MAX_STEPS,
    MAX_TOKENS,
    StrictModel,
)
from rlgraph.presets import GPU_PRESETS, MODEL_PRESETS
from rlgraph.safe_yaml import MAX_DEPTH, parse_value, read_graph, shown
from rlgraph.safe_yaml import located as _located
from rlgraph.safe_yaml import parse_yaml as parse_yaml

MAX_LAG = 256  # policy versions; the seeds use 1 to 8
MIN_SHARE = 1e-3  # of the cluster; a sliver would still get a whole slot


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

    @model_validator(mode="after")
    def _mean_below_max(self) -> ResponseLength:
        if self.mean > self.max:
            raise ValueError(f"mean ({self.mean}) is larger than max ({self.max})")
        return self


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
        from rlgraph.data import TASKS

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


class AlgorithmSpec(StrictModel):
    """The RL objective (verl: algorithm.* and actor.*_loss settings)."""

    name: Literal["grpo", "ppo"] = "grpo"
    kl_coef: float = Field(default=0.001, ge=0, le=100)
    kl_type: Literal["k3", "low_var_kl", "k1"] = "low_var_kl"
    clip: float = Field(default=0.2, ge=1e-4, le=10)
    is_truncation: float = Field(default=2.0, ge=1e-3, le=1e6,
                                 description="decoupled-PPO weight cap")
    norm_adv_by_std: bool = Field(default=True, description="GRPO: divide by the group's std")


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


class ScheduleSpec(StrictModel):
    """Lag bound, partial rollout and run length (seeds: generate_ahead_steps = max_lag)."""

    max_lag: int = Field(default=1, ge=0, le=MAX_LAG)
    partial_rollout: bool = False
    steps: int = Field(default=100, ge=1, le=MAX_STEPS)


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

    def to_yaml_dict(self) -> dict[str, Any]:
        """The spec as plain data, defaults included, ready for yaml.safe_dump."""
        return self.model_dump(mode="json", exclude_none=True)


# ---------------------------------------------------------------- overrides


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], source: SourceMap) -> None:
    """Apply verl-style `a.b.c=value` overrides (value parsed as YAML) in place."""
    for text in overrides:
        if "=" not in text:
            raise _located(SpecError(f"override '{text}' has no '='",
                                     hint="write key.path=value, e.g. schedule.max_lag=2"),
                           f"<override {text}>")
        dotted, _, raw = text.partition("=")
        keys = [k for k in dotted.lstrip("+").split(".") if k]
        if len(keys) > MAX_DEPTH:
            raise _located(SpecError(f"override '{shown(dotted)}' names {len(keys)} levels of "
                                     f"keys, more than {MAX_DEPTH}"), f"<override {shown(text)}>")
        if not keys:
            raise _located(SpecError(f"override '{text}' names no key",
                                     hint="e.g. schedule.max_lag=2"), f"<override {text}>")
        value = parse_value(raw, f"<override {shown(text)}>")
        target = data
        for i, key in enumerate(keys[:-1]):
            nxt = target.setdefault(key, {})
            if not isinstance(nxt, dict):
                raise SpecError(
                    f"override '{text}': '{'.'.join(keys[: i + 1])}' is not a mapping",
                    tuple(keys[: i + 1]),
                )
            target = nxt
        target[keys[-1]] = value
        source.overrides[tuple(keys)] = text
        for stale in [k for k in source.positions if k[:len(keys)] == tuple(keys)]:
            del source.positions[stale]  # the file's lines under it no longer hold its value


# ---------------------------------------------------------------- validation errors


def _unwrap(annotation: Any) -> Any:
    """Strip Optional / Annotated down to the class or container inside."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else annotation
    return annotation


def _model_at(path: Key, raw: Any) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at `path` (for key hints)."""
    cls: Any = Spec
    node: Any = raw
    keys = list(path)
    while keys:
        key = keys.pop(0)
        node = node.get(key) if isinstance(node, dict) else None
        field = cls.model_fields.get(key) if isinstance(cls, type) else None
        if field is None:
            return None
        ann = _unwrap(field.annotation)
        if typing.get_origin(ann) is dict:
            if not keys:
                return None
            item_key = keys.pop(0)
            node = node.get(item_key) if isinstance(node, dict) else None
            ann = _unwrap(typing.get_args(ann)[1])
            if typing.get_origin(ann) in (Union, types.UnionType):
                kind = node.get("kind") if isinstance(node, dict) else None
                ann = KINDS[kind].spec if kind in KINDS else None
        cls = ann
    return cls if isinstance(cls, type) and issubclass(cls, BaseModel) else None


def _clean_loc(loc: tuple[Any, ...]) -> Key:
    """Drop the tag pydantic inserts for discriminated unions: nodes.gen.generate.tp."""
    loc = tuple(loc)
    if len(loc) >= 3 and loc[0] == "nodes" and loc[2] in KINDS:
        loc = loc[:2] + loc[3:]
    return tuple(k for k in loc if not (isinstance(k, str) and k.startswith("function-")))


# Words of the seed systems' configs (verl, dots.rl async-rl, AReaL) and their rlgraph key.
SEED_WORDS: dict[str, str] = {
    "generate_ahead_steps": "schedule.max_lag",
    "staleness_threshold": "schedule.max_lag",
    "max_head_offpolicyness": "schedule.max_lag",
    "sperated_node_tasks": "groups.<name>.tasks",
    "sperated_node_ratios": "groups.<name>.share",
    "hybrid_engine": "one group holding every task with share 1",
    "param_update_preduce_bucket_size_mb": "bucket_mb.produce of the param_update node",
    "param_update_consume_bucket_size_mb": "bucket_mb.consume of the param_update node",
    "train_batch_size": "data.prompts_per_step",
    "n": "data.samples_per_prompt",
    "max_prompt_length": "data.prompt_len",
    "max_response_length": "data.response_len.max",
    "tensor_model_parallel_size": "tp of the node",
    "pipeline_model_parallel_size": "pp of the node",
    "expert_model_parallel_size": "ep of the node",
    "n_gpus_per_node": "cluster.gpus_per_node",
    "nnodes": "cluster.nodes",
    "partial_rollout": "schedule.partial_rollout",
}


def _unknown_key_hint(key: Key, raw: dict[str, Any]) -> str | None:
    """did-you-mean among the keys allowed there, the seed vocabulary, or the allowed keys."""
    model = _model_at(key[:-1], raw)
    allowed = list(model.model_fields) if model else []
    word = str(key[-1])
    if word in SEED_WORDS and SEED_WORDS[word] not in allowed:
        return f"in rlgraph, {word} is {SEED_WORDS[word]}"
    return did_you_mean(word, allowed) or (
        f"allowed here: {', '.join(allowed)}" if allowed else None)


def _you_wrote(value: Any) -> str | None:
    """`you wrote 'half'` for a scalar the user typed (None for mappings and lists)."""
    if isinstance(value, dict | list) or value is None:
        return None
    text = repr(value)
    return f"you wrote {text if len(text) <= 80 else text[:77] + '...'}"


def _first_error(exc: ValidationError, raw: dict[str, Any]) -> SpecError:
    """The first pydantic error as a SpecError with a key and a hint.

    An unknown key goes first: a misspelt key also makes its real key look missing.
    """
    errors = exc.errors(include_url=False)
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    key = _clean_loc(err["loc"])
    kind, msg = err["type"], err["msg"]
    hint = None
    if kind == "extra_forbidden":
        hint = _unknown_key_hint(key, raw)
        msg = f"unknown key '{key[-1]}'"
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        tag = err.get("ctx", {}).get("tag", "")
        hint = did_you_mean(tag, KINDS) or f"kinds: {', '.join(KINDS)}"
        msg = f"unknown node kind '{tag}'" if tag else "node has no 'kind'"
        key = (*key, "kind")
    elif kind == "missing":
        msg = f"required key '{key[-1]}' is missing"
    elif kind == "value_error":
        msg = msg.removeprefix("Value error, ")
    elif kind == "dict_type":
        hint = "write a mapping (name: value, one per line), not a list or a scalar"
    else:
        hint = _you_wrote(err.get("input"))
    return SpecError(msg, key, hint)


def validate_spec(data: dict[str, Any], source: SourceMap) -> Spec:
    """Plain data -> Spec, or the first problem as a located SpecError."""
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        err = _first_error(exc, data)
        err.source = source
        raise err from None
    spec._source = source
    return spec


def load_spec(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Spec:
    """Read, override and validate a graph.yaml."""
    data, source = read_graph(path)
    try:
        apply_overrides(data, overrides, source)
    except SpecError as err:
        err.source = source
        raise
    spec = validate_spec(data, source)
    if spec.model.path is not None:
        try:
            spec.model.path = resolve_model_path(spec.model.path, Path(path).parent)
        except SpecError as err:
            err.source = source
            raise
    return spec


def resolve_model_path(path: str, graph_dir: Path) -> str:
    """`model.path` as an absolute folder: a relative one resolves against the graph's folder
    (like data and reward files), else the working directory; a folder without config.json
    is the user's error."""
    given = Path(path).expanduser()
    tries = [given] if given.is_absolute() else [graph_dir / given, given]
    for folder in tries:
        if (folder / "config.json").is_file():
            return str(folder.resolve())
    where = "" if given.is_absolute() else \
        f"; a relative path resolves against the graph's folder {graph_dir.resolve()}"
    raise SpecError(f"no Hugging Face model folder at '{path}' (no config.json there{where})",
                    ("model", "path"), hint="point model.path at a Hugging Face model folder "
                    "with config.json, weights and tokenizer files")


def json_schema() -> dict[str, Any]:
    """The JSON Schema of graph.yaml, for editors' YAML completion."""
    schema = Spec.model_json_schema()
    schema["title"] = "rlgraph graph.yaml"
    return schema
