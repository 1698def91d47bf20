"""What every node kind shares: the spec fields common to all nodes, the cost override, and
the `NodeKind` record each kind module registers.

A kind module (`rlgraph/nodes/<kind>.py`) defines its spec class and its worker, takes its
cost model from `rlgraph/pricing/<kind>.py` (what a cost model reads:
`rlgraph.pricing.context.CostContext`), and ends with `KIND = NodeKind(...)`. Kind modules
import neither torch nor ray at module level.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlgraph.limits import (  # the shared maxima, also for the kind modules  # noqa: F401
    MAX_COUNT,
    MAX_PARALLEL,
    MAX_SECONDS,
    MAX_SEED,
    MAX_STEPS,
    MAX_TOKENS,
)
from rlgraph.pricing.context import CostContext


class StrictModel(BaseModel):
    """A spec section: unknown keys are errors, so typos never pass silently; numbers are
    finite and bounded."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class CostOverride(StrictModel):
    """`cost: {seconds: S}` (fixed per step) or `cost: {gpu_seconds: W}` (W / group GPUs)."""

    seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    gpu_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS * MAX_PARALLEL)

    @model_validator(mode="after")
    def _exactly_one(self) -> CostOverride:
        if (self.seconds is None) == (self.gpu_seconds is None):
            raise ValueError("give exactly one of 'seconds' or 'gpu_seconds'")
        return self


class NodeSpec(StrictModel):
    """Fields every node has; each kind subclasses it with `kind: Literal[...]`."""

    kind: str
    cost: CostOverride | None = None


class GraphSpec(Protocol):
    """What a kind reads of the whole graph.yaml (`rlgraph.config.schema.Spec` is one); typed
    here so that kinds, which the spec is assembled from, never import it."""

    cluster: Any
    model: Any
    data: Any
    algorithm: Any
    groups: Mapping[str, Any]
    nodes: Mapping[str, Any]
    schedule: Any

    def group_of(self, task: str) -> str | None:
        """The group a task belongs to, or None."""
        ...


EdgeList = list[tuple[str, str]]


@dataclass(frozen=True)
class NodeKind:
    """A registered node kind: how it is specified, wired, costed and executed."""

    name: str
    spec: type[NodeSpec]
    cost: Callable[[NodeSpec, CostContext], float]
    uses_gpu: bool
    default_edges: Callable[[str, NodeSpec, Mapping[str, NodeSpec]], EdgeList]  # edges it adds
    carries_weights: bool = False  # out-edges are back edges of distance max_lag + 1
    worker: str | None = None  # "module:attr" of the runtime worker, imported lazily
    doc: str = ""
    # --- What a kind does, for code outside rlgraph/nodes/ to ask instead of comparing its
    # name (compiler, runtime, reports, tuner). Each kind module sets the ones true of it.
    advances_policy: bool = False  # an optimizer step: step t produces policy version t + 1
    samples: bool = False  # samples tokens with the policy it holds (waits for a version)
    proximal_logp: bool = False  # recomputes the current policy's log-probs of the samples
    validates: bool = False  # evaluates the policy on held-out prompts, every few steps
    sequence_passes: bool = False  # forward (+ backward) passes over whole sequences, no decode
    trains: bool = False  # holds a policy-sized model's weights, grads and optimizer states
    provides: frozenset[str] = frozenset()  # batch keys its worker adds that others require
    colour: str = "#9c9c9c"  # its colour in timelines (Tableau 10)
    # --- end of the block
    # --- what a task of this kind needs from the Workspace of its group (kinds helper) ------
    # The worker side asks these instead of comparing kind names. `models`: "policy" (the
    # group's trainable policy, shared by its tasks) and/or "reference" (a frozen copy of the
    # initial policy). `optimizer(node, policy)`: the optimizer this kind steps over the
    # policy's parameters (a group holds one: its first such task's).
    models: frozenset[str] = frozenset()
    optimizer: Callable[[NodeSpec, Any], Any] | None = None

    @property
    def runs_on_batches(self) -> bool:
        """Whether a task of this kind runs on a step's batches (its worker's `run`); a kind
        that carries weights (param_update) runs its worker's transfer halves instead."""
        return self.worker is not None and not self.carries_weights


def inputs_from_kinds(*kinds: str) -> Callable[[str, NodeSpec, Mapping[str, NodeSpec]], EdgeList]:
    """Default wiring: an edge from every node of the first of `kinds` present in the graph."""

    def edges(name: str, node: NodeSpec, nodes: Mapping[str, NodeSpec]) -> EdgeList:
        for group in kinds:
            sources = [n for n, s in nodes.items() if s.kind in group.split("|")]
            if sources:
                return [(src, name) for src in sources]
        return []

    return edges


def no_inputs(name: str, node: NodeSpec, nodes: Mapping[str, NodeSpec]) -> EdgeList:
    """Default wiring of a source node."""
    return []
