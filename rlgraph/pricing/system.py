"""Which system a plan prices: the runtime that runs it (`pricing.system` in graph.yaml,
default `rlgraph`) or another system for comparison (`rlgraph compile --baseline SYSTEM`).

A system is a row of `SYSTEMS`: how a group that both trains and generates switches between
the two (offload, engine sleep / wake, the refit of the weights into the engine), how its
passes run (packed or padded sequences, fused or eager kernels), how its batches move (a
single controller through Ray's object store, or not) and whether its baseline computes the
old log-probs. Every number of a row names its source in `SOURCES`
(`rlgraph.pricing.system_sources`); where a system has two
documented paths for one thing (verl's bucketed or per-tensor refit), the path is a
parameter of the graph (`pricing.refit`), never a guess. The engine a generate node names
(`engine: native | sglang`) is the decoder only: it prices the decode, never the system;
rlgraph's own decoder's revisions are `rlgraph.pricing.engine_revisions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlgraph.errors import did_you_mean
from rlgraph.pricing.constants import COSTS

GB = 1e9


@dataclass(frozen=True)
class System:
    """One system's costs and habits, as data (every field's source: `SOURCES[name]`)."""

    name: str
    label: str
    runs_here: bool  # rlgraph's own runtime: the plan runs on it (char vocab without a path,
    # eager passes measured on our GPUs, proximal log-prob forward inside train)
    colocated_switch: bool  # a group that trains and generates switches every step
    offload: bool  # the switch offloads the train state to host memory and reloads it
    sleep_wake: bool  # the engine's weights are released and reloaded at each switch
    # path -> bytes/s of the switch's refit into the engine; None: no measurement is cited,
    # so the refit runs at the GPU preset's NVLink (NCCL) bandwidth, `PHYSICAL_REFIT`
    refit: dict[str, float | None] = field(default_factory=dict)
    default_refit: str | None = None
    old_logp_always: bool = False  # the baseline computes old_log_prob on every batch
    packs_sequences: bool = False  # remove_padding: tokens = rows x (prompt + E[L])
    driver_transfer: bool = False  # a single controller moves every pass's batch via Ray
    activation_recompute: bool = False  # train recomputes activations unless the graph says
    colocates: bool = True  # a group may hold both train and generate (else: GPUs apart only)
    # its synchronous runs keep rollout and training on their GPUs apart, at max_lag 0 (the
    # baseline keeps the plan's groups); always so where it never colocates
    sync_apart: bool = False
    # a MoE model's passes at this fraction of the dense roofline figure (None: the measured
    # Megatron-core figure, COSTS.moe_pass_factor), where the system's own MoE training path
    # is measured slower
    moe_pass_factor: float | None = None
    # bytes/s at which the trainer gathers its model-parallel shards into whole bf16 tensors
    # before sending them to generate GPUs apart (None: the param_update node's transfer is the
    # whole refit)
    refit_gather_bytes_per_s: float | None = None
    refit_overhead_s: float = 0.0  # fixed seconds of every colocated refit beside its bytes

    @property
    def syncs_apart(self) -> bool:
        """Whether this system's synchronous baseline keeps the plan's groups."""
        return self.sync_apart or not self.colocates

    def refit_rate(self, path: str | None, link_bytes_per_s: float = 0.0) -> tuple[str, float]:
        """(path, bytes/s) of the refit: the graph's `pricing.refit`, else the default; a
        path without a cited measurement runs at `link_bytes_per_s` (the GPU preset's
        NVLink bandwidth)."""
        chosen = path or self.default_refit
        if chosen is None or chosen not in self.refit:
            return "", 0.0
        rate = self.refit[chosen]
        return chosen, link_bytes_per_s if rate is None else rate

    def why(self, path: str | None = None, link_bytes_per_s: float = 0.0) -> str:
        """One line: what pricing this system means for a plan."""
        if not self.colocated_switch:
            if self.runs_here:
                return ("decodes with the training weights: a colocated group pays no switch; "
                        "groups apart receive the weights over NCCL into a second buffer; train "
                        "recomputes the proximal log-probs when no logp node feeds it")
            return (f"{self.label} runs rollout and training on GPUs apart: no switch; the "
                    f"weights go over NCCL after each update (the param_update node)"
                    + ("; old log-probs recomputed on every batch" if self.old_logp_always
                       else "; old log-probs taken from the rollout")
                    + ("; sequences packed" if self.packs_sequences else ""))
        chosen, rate = self.refit_rate(path, link_bytes_per_s)
        measured = "" if self.refit.get(chosen) is not None else " (NVLink: no measurement cited)"
        return ("a group that trains and generates pays the switch every step ("
                + ("offload, " if self.offload else "")
                + ("engine sleep/wake, " if self.sleep_wake else "")
                + f"{chosen} refit at {rate / GB:.2g} GB/s{measured})"
                + ("; the synchronous baseline computes old_log_prob" if self.old_logp_always
                   else "")
                + ("; sequences packed" if self.packs_sequences else "")
                + ("; the driver moves every batch through Ray" if self.driver_transfer
                   else ""))


PHYSICAL_REFIT = None  # a refit path's rate where no measurement is cited: NVLink (NCCL)
# Qwen3-30B-A3B's bf16 weights (rlgraph/presets/models.py: 30.5B parameters, 61.1 GB), the
# model of slime's measured refits
QWEN3_30B_A3B_BYTES = 61.1 * GB


SYSTEMS: dict[str, System] = {
    "rlgraph": System(
        name="rlgraph", label="rlgraph runtime", runs_here=True,
        colocated_switch=False, offload=False, sleep_wake=False),
    "verl": System(
        name="verl", label="verl hybrid engine", runs_here=False,
        colocated_switch=True, offload=True, sleep_wake=True,
        refit={"per_tensor": 32 * GB / 175, "bucketed": 32 * GB / 18},
        default_refit="bucketed",
        old_logp_always=True, packs_sequences=True, driver_transfer=True,
        activation_recompute=True),
    "areal": System(
        name="areal", label="AReaL", runs_here=False,
        colocated_switch=False, offload=False, sleep_wake=False,
        old_logp_always=True, packs_sequences=True, sync_apart=True),
    "slime": System(
        name="slime", label="slime", runs_here=False,
        colocated_switch=True, offload=True, sleep_wake=True,
        refit={"flattened": QWEN3_30B_A3B_BYTES / 6, "bucketed": QWEN3_30B_A3B_BYTES / 16},
        default_refit="flattened",
        old_logp_always=True, packs_sequences=True),
    "openrlhf": System(
        name="openrlhf", label="OpenRLHF", runs_here=False,
        colocated_switch=True, offload=True, sleep_wake=True,
        refit={"cuda_ipc": PHYSICAL_REFIT}, default_refit="cuda_ipc",
        old_logp_always=True, packs_sequences=True, driver_transfer=True,
        activation_recompute=True),
    "roll": System(
        name="roll", label="ROLL", runs_here=False,
        colocated_switch=True, offload=True, sleep_wake=True,
        refit={"model_update": PHYSICAL_REFIT}, default_refit="model_update",
        driver_transfer=True),
    "skyrl": System(
        name="skyrl", label="SkyRL", runs_here=False,
        colocated_switch=True, offload=True, sleep_wake=True,
        refit={"batched": 2 * 14e9 / 1.6, "per_param": 2 * 14e9 / 4.4}, default_refit="batched",
        old_logp_always=True, packs_sequences=True, driver_transfer=True,
        activation_recompute=True),
    "prime-rl": System(
        name="prime-rl", label="prime-rl", runs_here=False,
        colocated_switch=False, offload=False, sleep_wake=False,
        packs_sequences=True, colocates=False),
    "pipelinerl": System(
        name="pipelinerl", label="PipelineRL", runs_here=False,
        colocated_switch=False, offload=False, sleep_wake=False,
        packs_sequences=True, activation_recompute=True, colocates=False),
    "nemo-rl": System(
        name="nemo-rl", label="NeMo-RL", runs_here=False,
        colocated_switch=True, offload=True, sleep_wake=True,
        refit={"ipc_zmq": 33.4 * GB}, default_refit="ipc_zmq", refit_overhead_s=7.3,
        old_logp_always=True, packs_sequences=True, driver_transfer=True,
        moe_pass_factor=0.29, refit_gather_bytes_per_s=2 * 671.0e9 / 12.2),
}

def switch_terms(system: System, path: str | None, params: float, gpus: int, tp: int,
                 host_bytes_per_s: float, link_bytes_per_s: float = 0.0) -> dict[str, float]:
    """Seconds of each term of the switch a group of `gpus` GPUs that trains and generates
    pays every step under `system` (none where it has no switch): the train state
    (COSTS.train_state_bytes_per_param, sharded over the group) offloaded to host and back,
    the engine's bf16 weights (a tp shard per GPU) put to sleep and woken, both over PCIe,
    and the bf16 weights refit into the engine at the path's measured rate (a path without
    a cited measurement at `link_bytes_per_s`, the GPU preset's NVLink bandwidth)."""
    if not system.colocated_switch:
        return {}
    terms = {}
    if system.offload:
        terms["offload"] = 2 * COSTS.train_state_bytes_per_param * params / gpus / host_bytes_per_s
    if system.sleep_wake:
        terms["sleep_wake"] = 2 * 2 * params / tp / host_bytes_per_s
    chosen, rate = system.refit_rate(path, link_bytes_per_s)
    if rate:
        terms[f"{chosen} refit"] = system.refit_overhead_s + 2 * params / rate
    return terms


def system_of(spec: Any, name: str | None = None) -> System:
    """The system that prices `spec`: `name` if given (a baseline), else the graph's
    `pricing.system`. A local CPU cluster is always priced as rlgraph's runtime (the
    measured CPU figures are rlgraph's own)."""
    if spec.cluster.local:
        return SYSTEMS["rlgraph"]
    pricing = getattr(spec, "pricing", None)
    chosen = name or (pricing.system if pricing is not None else "rlgraph")
    return SYSTEMS[chosen]


def refit_path(spec: Any) -> str | None:
    """The refit path the graph states (`pricing.refit`), or None for the system's default."""
    pricing = getattr(spec, "pricing", None)
    return pricing.refit if pricing is not None else None


def hybrid_engine_priced(spec: Any) -> bool:
    """Whether the plan is priced as a system whose colocated group switches between
    training and a rollout engine that keeps its own weights (verl's hybrid engine)."""
    return system_of(spec).colocated_switch


def with_system(spec: Any, name: str) -> Any:
    """A copy of `spec` priced as system `name`: its `pricing.refit` kept where that system
    has the path, else the system's default."""
    refit = spec.pricing.refit if spec.pricing.refit in SYSTEMS[name].refit else None
    pricing = spec.pricing.model_copy(update={"system": name, "refit": refit})
    return spec.model_copy(update={"pricing": pricing})


def unknown_system_hint(name: str) -> str:
    """did-you-mean among the systems, and the list of them."""
    close = did_you_mean(name, SYSTEMS)
    known = f"known: {', '.join(SYSTEMS)}"
    return f"{close} {known}" if close else known


def refit_paths() -> list[str]:
    """Every refit path of every system (the values `pricing.refit` may take)."""
    return sorted({path for system in SYSTEMS.values() for path in system.refit})


def colocated_groups(spec: Any) -> list[str]:
    """Groups of `spec` that hold both a node that samples and one that advances the policy."""
    from rlgraph.nodes import KINDS

    out = []
    for name, group in spec.groups.items():
        roles = [KINDS[spec.nodes[t].kind] for t in group.tasks if t in spec.nodes]
        if any(r.samples for r in roles) and any(r.advances_policy for r in roles):
            out.append(name)
    return out
