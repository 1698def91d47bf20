"""`ref_logp`: log-probs under the frozen reference model, for the KL term."""

from __future__ import annotations

from typing import Literal

from rlgraph.nodes.base import NodeKind, inputs_from_kinds
from rlgraph.nodes.logp import LogpWorker
from rlgraph.nodes.parallel_spec import ParallelNodeSpec
from rlgraph.pricing.logp import forward_cost


class RefLogpSpec(ParallelNodeSpec):
    """Forward pass of the frozen reference model."""

    kind: Literal["ref_logp"] = "ref_logp"


KIND = NodeKind(
    name="ref_logp",
    spec=RefLogpSpec,
    cost=forward_cost,
    uses_gpu=True,
    default_edges=inputs_from_kinds("generate"),
    worker="rlgraph.nodes.ref_logp:RefLogpWorker",
    sequence_passes=True,
    colour="#f28e2b",
    doc="reference-model log-probs for the KL penalty",
    models=frozenset({"reference"}),
    provides=frozenset({"ref_logp"}),
)


class RefLogpWorker(LogpWorker):
    """Adds `ref_logp`: log-probs under the frozen version-0 reference, for the KL term."""

    model_attr, key = "reference", "ref_logp"
