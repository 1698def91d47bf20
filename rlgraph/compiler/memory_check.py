"""The memory check of the placement pass: every group's bytes per GPU (`rlgraph.compiler.memory`)
against its GPU's, FSDP's limits as the runtime has them, and, for a group that does not fit,
a refusal naming the smallest change that fits (node settings first, then more GPUs)."""

from __future__ import annotations

import math
from typing import Any

from rlgraph.compiler.memory import GB, GroupMemory, group_memory, sharded, with_nodes
from rlgraph.compiler.shapes import shape_of
from rlgraph.config.schema import Spec
from rlgraph.errors import SpecError
from rlgraph.nodes import KINDS
from rlgraph.presets.models import ModelShape


def _shardable(node: Any) -> bool:
    """A node FSDP can shard: a torch-backend forward (+ backward) over sequences."""
    return (KINDS[node.kind].sequence_passes and getattr(node, "backend", "torch") == "torch"
            and not sharded(node))


def _knobs(spec: Spec, tasks: list[str]) -> list[tuple[str, str, dict[str, dict[str, Any]]]]:
    """What could make a group fit without more GPUs: (what to write, key, node changes)."""
    nodes = spec.nodes
    width = spec.data.prompt_len + spec.data.response_len.max
    out = []
    shard = sorted((t for t in tasks if _shardable(nodes[t])),
                   key=lambda t: not KINDS[nodes[t].kind].advances_policy)
    if shard and not any(KINDS[nodes[t].kind].samples for t in tasks):  # see check_sharding
        out.append((f"sharding: fsdp on {', '.join(shard)}", shard[0],
                    {t: {"sharding": "fsdp"} for t in shard}))
    trains = [t for t in tasks if KINDS[nodes[t].kind].advances_policy
              and hasattr(nodes[t], "micro_tokens")
              and not getattr(nodes[t], "activation_checkpointing", False)]
    if trains:
        out.append((f"activation_checkpointing: true on {', '.join(trains)}", trains[0],
                    {t: {"activation_checkpointing": True} for t in trains}))
    budget = max(width, 16384)
    passes = [t for t in tasks if KINDS[nodes[t].kind].sequence_passes
              and hasattr(nodes[t], "micro_tokens")
              and (nodes[t].micro_tokens or math.inf) > budget]
    if passes:
        out.append((f"micro_tokens: {budget} on {', '.join(passes)}", passes[0],
                    {t: {"micro_tokens": budget} for t in passes}))
    return out


def _least_gpus(spec: Spec, group: str, tasks: list[str], gpus: int, gpu: Any,
                shape: ModelShape, limit: int) -> int | None:
    """The fewest GPUs (a multiple of every task's tp x pp, above `gpus`, at most `limit`)
    on which the group fits; memory per GPU never grows with GPUs."""
    step = math.lcm(*[spec.nodes[t].model_parallel() for t in tasks
                      if hasattr(spec.nodes[t], "model_parallel")] or [1])

    def fits(n: int) -> bool:
        return group_memory(spec, group, tasks, n, gpu, shape).fits

    hi = max(step, -(-gpus // step) * step)
    while not fits(hi):
        if hi >= limit:
            return None
        hi = min(limit, hi * 2)
    lo = max(step, -(-gpus // step) * step)
    while lo < hi:  # the smallest fitting multiple of `step` in [lo, hi]
        mid = (lo // step + hi // step) // 2 * step
        if fits(mid):
            hi = mid
        else:
            lo = mid + step
    return hi


def refusal(spec: Spec, mem: GroupMemory, slots: int, shape: ModelShape, gpu: Any
            ) -> SpecError:
    """The error of a group that does not fit: its numbers, and the key to change to the
    smallest change that fits (node settings first, then more GPUs)."""
    tasks = list(mem.tasks)
    head = (f"group '{mem.group}' needs {mem.need / GB:.1f} GB per GPU on {mem.gpus} GPU(s); "
            f"a {mem.gpu} has {mem.capacity / GB:.0f} GB usable ({mem.breakdown()})")
    knobs = _knobs(spec, tasks)
    sglang = [t for t in tasks if getattr(spec.nodes[t], "engine", None) == "sglang"]
    for t in sglang:
        tp = spec.nodes[t].tp
        bigger = [d for d in range(tp + 1, mem.gpus + 1) if mem.gpus % d == 0]
        if bigger:
            knobs.append((f"tp: {bigger[0]} on {t} (raise tp)", t, {t: {"tp": bigger[0]}}))
    combos = [[k] for k in knobs] + ([knobs] if len(knobs) > 1 else [])

    def variant_of(combo: list) -> Spec:
        changes: dict[str, dict[str, Any]] = {}
        for _, _, change in combo:
            for node, fields in change.items():
                changes.setdefault(node, {}).update(fields)
        return with_nodes(spec, changes)

    alone = _least_gpus(spec, mem.group, tasks, mem.gpus, gpu, shape, slots)
    more = f", or give group '{mem.group}' at least {alone} GPUs" if alone else ""
    for combo in combos:  # node settings alone
        after = group_memory(variant_of(combo), mem.group, tasks, mem.gpus, gpu, shape)
        if after.fits:
            _, node, change = combo[0]
            what = " and ".join(c[0] for c in combo)
            return SpecError(head, ("nodes", node, next(iter(change[node]))),
                             hint=f"set {what} (then {after.need / GB:.1f} GB per GPU){more}")
    if alone:
        return SpecError(head, ("groups", mem.group, "share"),
                         hint=f"give group '{mem.group}' at least {alone} GPUs")
    for combo in combos:  # node settings and more GPUs
        least = _least_gpus(variant_of(combo), mem.group, tasks, mem.gpus, gpu, shape,
                            slots if combo is not combos[-1] else 1 << 16)
        if least is not None:
            what = " and ".join(c[0] for c in combo)
            where = "" if least <= slots else f" (the cluster has {slots})"
            return SpecError(head, ("groups", mem.group, "share"),
                             hint=f"set {what} and give group '{mem.group}' at least "
                             f"{least} GPUs{where}")
    if not combos:
        least = _least_gpus(spec, mem.group, tasks, mem.gpus, gpu, shape, 1 << 16)
        if least is not None:
            return SpecError(head, ("groups", mem.group, "share"),
                             hint=f"give group '{mem.group}' at least {least} GPUs (the "
                             f"cluster has {slots})")
    return SpecError(head, ("groups", mem.group, "share"),
                     hint="no setting of this graph fits: use a smaller model, fewer samples "
                     "per step or a GPU with more memory (cluster.gpu)")


def check_sharding(spec: Spec, group: str, tasks: list[str]) -> None:
    """FSDP's limits as the runtime has them (rlgraph.process.sharding): the passes over one
    model (the policy: logp and train; the reference) are all sharded or none, and a sharded
    policy holds no generate (its engine decodes with a whole model)."""
    nodes = spec.nodes
    for model in ("policy", "reference"):
        users = [t for t in tasks if model in KINDS[nodes[t].kind].models
                 and hasattr(nodes[t], "sharding")]
        fsdp = [t for t in users if sharded(nodes[t])]
        if fsdp and len(fsdp) < len(users):
            other = next(t for t in users if t not in fsdp)
            raise SpecError(f"'{other}' shares the {model} with '{fsdp[0]}' in group "
                            f"'{group}' but not its sharding", ("nodes", other, "sharding"),
                            hint=f"give '{other}' sharding: fsdp too (or neither)")
    fsdp = [t for t in tasks if sharded(nodes[t]) and "policy" in KINDS[nodes[t].kind].models]
    decoding = [t for t in tasks if KINDS[nodes[t].kind].samples]
    if fsdp and decoding:
        raise SpecError(f"sharding: fsdp cannot share group '{group}' with '{decoding[0]}' "
                        f"(the decode engine runs a whole model)",
                        ("nodes", fsdp[0], "sharding"),
                        hint=f"give {decoding[0]} its own group, or write sharding: none")


def check_memory(spec: Spec, groups: dict[str, Any], gpu: Any, slots: int,
                 refuse: bool = True) -> dict[str, GroupMemory]:
    """Every group's memory per GPU (`groups`: name -> its placement); the first group that
    does not fit is refused with its numbers and the key to change (`refuse=False`: only
    measured, for tests of other passes)."""
    shape = shape_of(spec)
    out = {name: group_memory(spec, name, list(g.tasks), g.gpus, gpu, shape)
           for name, g in groups.items()}
    for mem in out.values():
        if refuse and not mem.fits:
            raise refusal(spec, mem, slots, shape, gpu)
    return out
