"""The Plan: what the compiler hands the runtime, the reports and the tuner, typed.

`compile_plan` returns a `Plan`; `plan.json` is `Plan.to_json()` and `Plan.from_json` reads
it back (the spec it was compiled from is revalidated, the step's graph rebuilt from it).
The runtime reads nothing else: placement (groups, devices), each node's cost, the lag
(bound, per edge, the version gate `max_lag`), the schedule, every channel's capacity and
every weight-sync route with its `bucket_mb`. Sections keep the keys of plan.json that
users, tools and tests read (see the design notes); `version` counts changes to them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from rlgraph.config.load import validate_spec
from rlgraph.config.safe_yaml import SourceMap
from rlgraph.config.schema import Spec
from rlgraph.errors import RLGraphError, SpecError
from rlgraph.nodes import KINDS
from rlgraph.weights import BucketMiB, resolve_transport

PLAN_VERSION = 2  # 1: the untyped dict of before (no "version" key); 2: this module


class PlanError(RLGraphError):
    """A plan.json that is not a plan this version of rlgraph can read."""


class _Section(BaseModel):
    """A frozen plan section; unknown keys of a newer plan.json are kept, not refused."""

    model_config = ConfigDict(frozen=True, extra="allow")


class GroupPlan(_Section):
    """One group: its tasks, share of the cluster, GPUs (or CPU slots) and devices."""

    name: str
    tasks: tuple[str, ...]
    share: float
    gpus: int
    replicas: int = 1
    data_parallel: dict[str, int] = Field(default_factory=dict)  # task -> data-parallel ranks
    devices: tuple[tuple[int, int], ...] = ()  # (node, gpu) per slot


class PlacementPlan(_Section):
    """Where groups run: a local CPU cluster (`slots`) or GPUs of a preset."""

    local: bool = False
    slots: int = 0
    gpu: str | None = None
    shared_slots: int = 0
    groups: tuple[GroupPlan, ...] = ()

    def group(self, name: str) -> GroupPlan:
        """The group called `name`."""
        return next(g for g in self.groups if g.name == name)

    @property
    def names(self) -> list[str]:
        """Group names in placement order."""
        return [g.name for g in self.groups]


class CostPlan(_Section):
    """Seconds one step of a node takes and where the figure comes from."""

    seconds: float
    source: str  # "model" | "override" | "calibrated"
    detail: str = ""


class LagPlan(_Section):
    """The off-policy lag: the version gate the runtime applies and the bound it proves."""

    max_lag: int = 0  # generate of step t waits for policy version >= t - max_lag
    max_policy_lag: int = 0  # the proven bound on any token's lag
    per_edge: dict[str, int] = Field(default_factory=dict)
    token_version_span: int = 0
    smallest_max_lag_for_best_period: int | None = None
    periods_by_max_lag: dict[str, float | None] = Field(default_factory=dict)
    note: str = ""
    mini_batches: int = 1  # streaming: optimizer steps (generate / train calls) per version
    per_mini_batch: str = ""  # streaming: the bound per mini-batch, in words


class SchedulePlan(_Section):
    """The predicted steady state: period, bound, baseline, utilisation and the timeline."""

    period_s: float = 0.0
    bound_s: float = 0.0
    sync_period_s: float = 0.0
    speedup_vs_sync: float = 1.0
    utilization: dict[str, float] = Field(default_factory=dict)
    idle: dict[str, float] = Field(default_factory=dict)
    bottleneck: str = ""
    policy: str = ""
    steps_simulated: int = 0
    cyclicity: int = 0
    events: list[dict[str, Any]] = Field(default_factory=list)


class RoutePlan(_Section):
    """One param_update: sender, receiver, buckets and the transport as written."""

    src: str
    dst: str
    bucket_mb: BucketMiB  # the spec's own sizes (rlgraph.weights.BucketMiB)
    transport: str = "auto"


def weight_routes(spec: Spec) -> dict[str, RoutePlan]:
    """Every weight-carrying node's route: sender, receiver, buckets (MiB), transport."""
    return {name: RoutePlan(src=node.src, dst=node.dst, transport=node.transport,
                            bucket_mb=node.bucket_mb)
            for name, node in spec.nodes.items() if KINDS[node.kind].carries_weights}


def check_buckets(spec: Spec, local: bool) -> None:
    """A route the nccl transport carries cuts each produce bucket into consume chunks:
    refuse sizes that do not divide, naming the key (`local`: a CPU cluster, where `auto` is
    the object store)."""
    for name, route in weight_routes(spec).items():
        buckets = route.bucket_mb
        transport = resolve_transport(route.transport, "cpu" if local else "cuda")
        if transport == "nccl" and not buckets.chunks_evenly():
            raise SpecError(f"the nccl transport cuts each produce bucket into consume chunks: "
                            f"produce {buckets.produce:g} MiB is not a multiple of consume "
                            f"{buckets.consume:g} MiB", ("nodes", name, "bucket_mb"),
                            hint="e.g. bucket_mb: {produce: 512, consume: 128}")


class MemoryPlan(_Section):
    """Memory per GPU of every group (`rlgraph.compiler.memory`), in GB: what stays resident,
    each task's peak, the usable capacity; empty on a local CPU cluster (not checked)."""

    checked: bool = False
    groups: dict[str, dict[str, Any]] = Field(default_factory=dict)


class PricingPlan(_Section):
    """Which runtime the plan's colocated baseline is priced as, and why."""

    runtime: str = ""
    why: str = ""
    system: str = "rlgraph"  # the system the plan is priced as (graph.yaml pricing.system)
    refit: str = ""  # its refit path where it has one (pricing.refit)
    baseline: str = "rlgraph"  # the system of the baseline speedup_vs_sync compares with
    baselines: dict[str, float] = Field(default_factory=dict)  # colocated sync period by system


class TrustPlan(_Section):
    """How far to trust the period: calibrated nodes and the dominant assumptions."""

    calibrated: bool = False
    calibrated_nodes: list[str] = Field(default_factory=list)
    modelled_nodes: list[str] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)


class Plan(_Section):
    """A compiled graph: the only thing the runtime, reports and tuner read."""

    version: int = PLAN_VERSION
    name: str
    spec: Spec = Field(exclude=True)  # the validated spec it was compiled from
    placement: PlacementPlan
    costs: dict[str, CostPlan] = Field(default_factory=dict)
    lag: LagPlan = Field(default_factory=LagPlan)
    schedule: SchedulePlan = Field(default_factory=SchedulePlan)
    channels: dict[str, int] = Field(default_factory=dict)  # "src->dst" -> steps it holds
    weight_sync: dict[str, RoutePlan] = Field(default_factory=dict)  # param_update node -> route
    memory: MemoryPlan = Field(default_factory=MemoryPlan)
    pricing: PricingPlan = Field(default_factory=PricingPlan)
    trust: TrustPlan = Field(default_factory=TrustPlan)
    messages: list[str] = Field(default_factory=list)

    _graph: nx.DiGraph | None = PrivateAttr(default=None)
    _data: dict[str, Any] | None = PrivateAttr(default=None)

    @property
    def graph(self) -> nx.DiGraph:
        """The step's dataflow graph (`rlgraph.graph.build_graph` of the plan's spec)."""
        if self._graph is None:
            from rlgraph.graph import build_graph

            self._graph = build_graph(self.spec)
        return self._graph

    def with_graph(self, graph: nx.DiGraph) -> Plan:
        """This plan holding `graph`, the one the compiler already built (not rebuilt)."""
        self._graph = graph
        return self

    @property
    def kinds(self) -> dict[str, str]:
        """node -> its kind's name."""
        return {name: node.kind for name, node in self.spec.nodes.items()}

    def capacity(self, src: str, dst: str) -> int:
        """Steps the channel `src -> dst` holds."""
        return self.channels[f"{src}->{dst}"]

    def to_dict(self) -> dict[str, Any]:
        """plan.json as plain data (the spec written back as graph.yaml data)."""
        data = self.model_dump(mode="json")
        return {"version": data.pop("version"), "name": data.pop("name"),
                "spec": self.spec.to_yaml_dict(), **data}

    def __getitem__(self, key: str) -> Any:
        """plan.json's section `key`, as scripts that read the file index it (bench, tools);
        rlgraph's own modules read the typed attributes."""
        if self._data is None:
            self._data = self.to_dict()
        return self._data[key]

    def get(self, key: str, default: Any = None) -> Any:
        """plan.json's section `key`, or `default`."""
        try:
            return self[key]
        except KeyError:
            return default

    def to_json(self) -> str:
        """plan.json's text."""
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "plan.json") -> Plan:
        """A plan from plan.json's data; a file that is no plan is a PlanError naming `where`."""
        if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
            raise PlanError(f"{where}: not a plan (no 'spec' section); write one with "
                            f"`rlgraph compile graph.yaml -o DIR`")
        version = data.get("version", 1)
        if not isinstance(version, int) or version > PLAN_VERSION:
            raise PlanError(f"{where}: plan version {version!r} is newer than this rlgraph "
                            f"reads ({PLAN_VERSION}); compile the graph again")
        spec = validate_spec(data["spec"], SourceMap())
        if version == 1:  # before the Plan: no routes, no version gate of its own
            data = {**data, "weight_sync": weight_routes(spec),
                    "lag": {"max_lag": spec.schedule.max_lag, **(data.get("lag") or {})}}
        try:
            return cls.model_validate({**data, "version": PLAN_VERSION, "spec": spec})
        except ValidationError as exc:
            first = exc.errors()[0]
            key = ".".join(str(p) for p in first["loc"])
            raise PlanError(f"{where}: key '{key}': {first['msg']}; compile the graph "
                            f"again") from None

    @classmethod
    def from_json(cls, text: str, where: str = "plan.json") -> Plan:
        """A plan from plan.json's text."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"{where}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg})") from None
        return cls.from_dict(data, where)

    @classmethod
    def read(cls, path: str | Path) -> Plan:
        """A plan from a plan.json file."""
        path = Path(path)
        return cls.from_json(path.read_text(), str(path))
