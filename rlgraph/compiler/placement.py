"""Placement pass: group shares -> whole GPUs (or local CPU slots) -> `[node, gpu]` devices.

Shares become GPU counts by the largest-remainder method over the cluster's slots. Groups are
laid out largest first: a group larger than one node takes whole free nodes (its remainder
packs like a small group), smaller groups pack inside one node (best fit) and split across
nodes only when fragmentation leaves no node with room. Then every rule a run would trip
over later is checked here, naming the graph.yaml key: shares over 1, a group with no GPU,
tp / pp / ep not dividing a group, a batch not divisible by the data-parallel size, a
data-parallel rank left without work, and a group whose memory per GPU does not fit
(`rlgraph.compiler.memory`). A node's data-parallel size is its group's GPUs / (tp x pp);
rows are sharded by sample (GRPO advantages are computed before the split), so a step needs
one sample per data-parallel rank of every update, and a sampling node one prompt per engine
replica (a replica samples whole prompts). A local CPU cluster gives every group at least one
slot (slots are then shared) and skips the memory check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rlgraph.compiler.memory import GroupMemory
from rlgraph.compiler.memory_check import check_memory, check_sharding
from rlgraph.config.schema import Spec
from rlgraph.errors import SpecError
from rlgraph.nodes import KINDS
from rlgraph.presets.gpus import GPU_PRESETS, GPUPreset
from rlgraph.pricing.system import colocated_groups, system_of

SHARE_TOLERANCE = 1e-6  # shares may sum to 1 + float error (1/3 + 1/3 + 1/3)


@dataclass
class GroupPlacement:
    """One group's tasks, its share and the devices it got."""

    name: str
    tasks: list[str]
    share: float
    gpus: int
    devices: list[tuple[int, int]]
    replicas: int = 1  # processes: one per GPU, or a local group's CPU replicas
    data_parallel: dict[str, int] = field(default_factory=dict)  # task -> its DP ranks

    def nodes(self) -> set[int]:
        """Cluster nodes (machines) the group's devices sit on."""
        return {node for node, _ in self.devices}


@dataclass
class Placement:
    """Where every group runs; `gpu` is the preset the cost models read ("cpu" when local)."""

    local: bool
    slots: int
    gpu: str
    groups: dict[str, GroupPlacement]
    shared_slots: bool = False
    messages: list[str] = field(default_factory=list)
    memory: dict[str, GroupMemory] = field(default_factory=dict)  # on GPU clusters

    @property
    def preset(self) -> GPUPreset:
        """The hardware preset of the devices."""
        return GPU_PRESETS[self.gpu]

    def gpus_of(self, group: str | None) -> int:
        """GPUs (slots) of a group; 1 for a node in no group."""
        return self.groups[group].gpus if group in self.groups else 1

    def to_dict(self) -> dict[str, Any]:
        """The plan's `placement` section."""
        return {
            "local": self.local, "slots": self.slots, "gpu": self.gpu,
            "shared_slots": self.shared_slots,
            "groups": [{"name": g.name, "tasks": list(g.tasks), "share": g.share, "gpus": g.gpus,
                        "replicas": g.replicas, "data_parallel": dict(g.data_parallel),
                        "devices": [list(d) for d in g.devices]}
                       for g in self.groups.values()],
        }


def largest_remainder(shares: dict[str, float], slots: int) -> dict[str, int]:
    """Whole slots per group: floors of share * slots, the rest to the largest remainders."""
    quotas = {g: s * slots for g, s in shares.items()}
    counts = {g: math.floor(q + SHARE_TOLERANCE) for g, q in quotas.items()}
    total = min(slots, math.floor(sum(shares.values()) * slots + SHARE_TOLERANCE))
    order = sorted(quotas, key=lambda g: (-(quotas[g] - counts[g]), list(shares).index(g)))
    for g in order[: max(0, total - sum(counts.values()))]:
        counts[g] += 1
    return counts


def _check_shares(spec: Spec) -> None:
    total = 0.0
    for name, group in spec.groups.items():
        total += group.share
        if total > 1 + SHARE_TOLERANCE:
            shares = " + ".join(f"{g.share:g}" for g in spec.groups.values())
            raise SpecError(f"group shares sum to {sum(g.share for g in spec.groups.values()):g}"
                            f" ({shares}), more than the whole cluster",
                            ("groups", name, "share"),
                            hint=f"lower it to at most {max(0.0, 1 - total + group.share):g}")


def _lay_out(counts: dict[str, int], per_node: int, nodes: int) -> tuple[dict, list[str]]:
    """Devices per group: big groups on whole nodes, the rest best-fit inside nodes."""
    free = {n: list(range(per_node)) for n in range(nodes)}
    devices: dict[str, list[tuple[int, int]]] = {g: [] for g in counts}
    notes: list[str] = []
    rest: dict[str, int] = {}
    for g in sorted(counts, key=lambda g: -counts[g]):
        whole = counts[g] // per_node
        for n in [n for n in free if len(free[n]) == per_node][:whole]:
            devices[g] += [(n, i) for i in free.pop(n)]
        rest[g] = counts[g] - len(devices[g])
    for g in sorted(rest, key=lambda g: -rest[g]):
        need = rest[g]
        if not need:
            continue
        fits = [n for n in free if len(free[n]) >= need]
        if fits:
            n = min(fits, key=lambda n: (len(free[n]), n))
            devices[g] += [(n, i) for i in free[n][:need]]
            free[n] = free[n][need:]
            continue
        for n in sorted(free, key=lambda n: (-len(free[n]), n)):
            take = free[n][:need]
            devices[g] += [(n, i) for i in take]
            free[n] = free[n][len(take):]
            need -= len(take)
            if not need:
                break
        notes.append(f"group '{g}' is split across nodes by fragmentation; shares that are "
                     f"multiples of 1/{nodes * per_node} per node keep each group inside one")
    return {g: sorted(d) for g, d in devices.items()}, notes


def _check_parallel(spec: Spec, group: GroupPlacement) -> None:
    """tp / pp / ep divide the group's GPUs; the batch divides over the data-parallel size of
    every node but a sampling one, whose replicas each sample whole prompts, within one
    prompt of each other (`rl.batch.shard_bounds`; an engine server is fed request by request:
    AReaL spreads 512 prompts over 96 SGLang GPUs), at least one each (`_replicas`)."""
    batch = spec.data.samples_per_step()
    for task in group.tasks:
        node = spec.nodes[task]
        for size in ("tp", "pp", "ep", "cp"):
            value = getattr(node, size, 1)
            if value > 1 and group.gpus % value:
                divisors = [d for d in range(1, group.gpus + 1) if group.gpus % d == 0]
                raise SpecError(f"{size} {value} does not divide the {group.gpus} GPUs of group "
                                f"'{group.name}'", ("nodes", task, size),
                                hint=f"use one of {', '.join(map(str, divisors))}, or change "
                                f"groups.{group.name}.share")
        if not hasattr(node, "model_parallel"):
            continue
        mp = node.model_parallel()
        if group.gpus % mp:
            what = "tp x pp x cp" if getattr(node, "cp", 1) > 1 else "tp x pp"
            raise SpecError(f"{what} = {mp} does not divide the {group.gpus} GPUs of group "
                            f"'{group.name}'", ("nodes", task, "tp"),
                            hint=f"make {what} a divisor of the group's GPUs")
        dp = group.data_parallel.get(task, group.gpus // mp)
        per_node = spec.cluster.gpus_per_node
        if (KINDS[node.kind].samples and not spec.cluster.local and node.tp > per_node
                and node.tp % per_node):
            raise SpecError(f"'{task}' has tp {node.tp}: an engine replica wider than a node "
                            f"takes whole nodes of {per_node} GPUs, and {node.tp} is not a "
                            f"multiple of {per_node}", ("nodes", task, "tp"),
                            hint=f"use tp {per_node * (node.tp // per_node)} or "
                            f"{per_node * (node.tp // per_node + 1)}")
        if KINDS[node.kind].samples:
            if dp > spec.data.prompts_per_step:
                raise SpecError(f"'{task}' runs {dp} engine replicas ({group.gpus} GPUs / tp "
                                f"{mp}) in group '{group.name}' but a step has "
                                f"{spec.data.prompts_per_step} prompts: a replica samples "
                                f"whole prompts, so some would get none",
                                ("data", "prompts_per_step"),
                                hint=f"use at least {dp} prompts per step, raise "
                                f"nodes.{task}.tp, or give the group fewer GPUs")
            continue
        updates = spec.schedule.mini_batches * getattr(node, "mini_batches", 1)
        rows = batch // updates
        if dp > rows:
            raise SpecError(f"'{task}' has {dp} data-parallel ranks ({group.gpus} GPUs / "
                            f"(tp x pp = {mp})) in group '{group.name}' but an update has "
                            f"{rows} samples ({batch} a step over {updates} update(s)): "
                            f"some ranks would get none", ("data", "prompts_per_step"),
                            hint=f"use at least {dp} samples an update, raise tp or pp, or "
                            f"give the group fewer GPUs")
        if batch % dp:
            prompts = dp // math.gcd(dp, spec.data.samples_per_prompt)
            raise SpecError(f"{batch} samples per step (prompts_per_step x samples_per_prompt) "
                            f"do not split over the {dp} data-parallel replicas of '{task}' in "
                            f"group '{group.name}'", ("data", "prompts_per_step"),
                            hint=f"use a multiple of {prompts} prompts, or change "
                            f"groups.{group.name}.share")


def _replicas(spec: Spec, group: str, slots: int, strict: bool) -> int:
    """Processes of `group`: one per GPU, or `replicas` (default 1) of a local group's CPU
    slots (each a data-parallel rank; `_check_parallel` checks each gets work)."""
    asked = spec.groups[group].replicas
    where = ("groups", group, "replicas")
    if spec.cluster.local:
        replicas = asked or 1
        if strict and replicas > slots:
            raise SpecError(f"{replicas} replicas need a CPU slot each; group '{group}' has "
                            f"{slots}", where, hint=f"use at most {slots}, or raise its share")
    else:
        replicas = max(1, slots)
        if strict and asked not in (None, replicas):
            raise SpecError(f"rlgraph runs one replica per GPU: group '{group}' has {slots} "
                            f"GPUs, so replicas is {slots}", where,
                            hint="drop the key, or change the group's share")
    return replicas


def data_parallel_sizes(spec: Spec, group: str, gpus: int, replicas: int, local: bool
                        ) -> dict[str, int]:
    """Data-parallel ranks of each model-running task of a group: GPUs / (tp x pp) on GPUs
    (a sampling node: GPUs / tp engine replicas), the group's replicas on a local cluster."""
    out = {}
    for task in spec.groups[group].tasks:
        node = spec.nodes.get(task)
        if node is None or not hasattr(node, "model_parallel"):
            continue
        out[task] = replicas if local else max(1, gpus // node.model_parallel())
    return out


def check_system_groups(spec: Spec) -> None:
    """Refuse a plan whose priced system cannot run its groups: a system that runs rollout
    and training only on GPUs apart (`System.colocates` False) under a group that holds
    both."""
    system = system_of(spec)
    if system.colocates or spec.cluster.local:
        return
    for name in colocated_groups(spec):
        raise SpecError(f"{system.label} runs rollout and training on GPUs apart, but group "
                        f"'{name}' holds both a generate and a train node",
                        ("groups", name), hint="give generate and train groups of their own "
                        "(see docs/how-to/price-a-published-run.md), or price a system that "
                        "colocates (pricing.system)")


def place(spec: Spec, strict: bool = True) -> Placement:
    """Placement of every group; `strict=False` skips the checks of shares, parallelism and
    memory (for the sync baseline), never the priced system's own (`check_system_groups`)."""
    check_system_groups(spec)
    cluster = spec.cluster
    if strict:
        _check_shares(spec)
    slots = cluster.slots()
    shares = {g: s.share for g, s in spec.groups.items()}
    counts = largest_remainder(shares, slots)
    messages: list[str] = []
    shared = False
    if cluster.local:
        devices = {}
        cursor = 0
        for g, n in counts.items():
            n = max(1, n)
            counts[g] = n
            devices[g] = [(0, (cursor + i) % slots) for i in range(n)]
            cursor += n
        if cursor > slots:
            shared = True
            messages.append(f"local CPU: {len(counts)} groups need {cursor} slots but the "
                            f"machine has {slots}; groups share slots, so the predicted period "
                            f"is optimistic")
        devices = {g: sorted(set(d)) for g, d in devices.items()}
    else:
        if strict:
            for g, n in counts.items():
                if n == 0:
                    raise SpecError(f"share {shares[g]:g} of {slots} GPUs rounds to 0 GPUs",
                                    ("groups", g, "share"),
                                    hint=f"raise it to at least {1 / slots:.4g} (one GPU)")
        devices, notes = _lay_out(counts, cluster.gpus_per_node, cluster.nodes)
        messages += notes
    groups = {}
    for g, s in spec.groups.items():
        replicas = _replicas(spec, g, counts[g], strict)
        groups[g] = GroupPlacement(g, list(s.tasks), s.share, counts[g], devices[g], replicas,
                                   data_parallel_sizes(spec, g, counts[g], replicas,
                                                       cluster.local))
    placement = Placement(cluster.local, slots, "cpu" if cluster.local else cluster.gpu, groups,
                          shared, messages)
    if strict:
        for group in groups.values():
            _check_parallel(spec, group)
            check_sharding(spec, group.name, group.tasks)
    if not cluster.local and all(g.gpus for g in groups.values()):
        placement.memory = check_memory(spec, groups, placement.preset, slots,
                                        refuse=strict and system_of(spec).runs_here)
    return placement
