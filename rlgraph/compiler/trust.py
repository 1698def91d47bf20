"""How much to trust a plan's period: whether its costs are calibrated, and the assumptions
that dominate it (`Plan.trust`, the summary's "trust" lines)."""

from __future__ import annotations

import re
from typing import Any

from rlgraph.compiler.costs import NodeCost
from rlgraph.compiler.shapes import shape_of
from rlgraph.config.schema import Spec
from rlgraph.lengths import moments
from rlgraph.lengths import of as lengths_of
from rlgraph.nodes import KINDS
from rlgraph.presets.gpus import GPU_PRESETS
from rlgraph.pricing.constants import COSTS, pass_efficiency
from rlgraph.pricing.system import refit_path, system_of

_SWITCH = re.compile(r"colocation switch ([0-9.e+-]+) s")
_DRIVER = re.compile(r"\S+ driver transfer ([0-9.e+-]+) s")
_HOST = re.compile(r"\+ host ([0-9.e+-]+) s \(rlgraph runtime")


def _summed(costs: dict[str, NodeCost], pattern: re.Pattern[str]) -> float:
    """Seconds a detail term adds up to over the nodes whose detail names it."""
    return sum(float(m.group(1)) for c in costs.values() for m in [pattern.search(c.detail)]
               if m)


# Per GPU, verl's dedicated trainers of its published split runs against the colocated trainer
# of the same recipe (update_actor x GPUs, colocated over dedicated): one_step_off_policy
# README 1.13 (FSDP2, 16 vs 12 H20) and 1.32 (Megatron); fully_async_policy README 1.72 /
# 1.70 / 2.01 (7B, 32 / 64 / 128 H20), 1.67 (Qwen3-30B-A3B, 128 vs 32), 1.25 (multi-turn,
# 32 vs 16). The recipes' scripts run both trainers alike (recipe/fully_async_policy/exp/*:
# use_dynamic_bsz at one token budget, ulysses sp 4, fsdp_size 2, gradient checkpointing);
# only the colocated actor offloads its parameters and optimizer (a few seconds a step over
# PCIe for a 7B). In the fully_async rows the trainer's work a step (step less its wait) is
# 0.58-1.0x the least time its GPUs need for the stated tokens with that recompute
# (bench/fidelity.py's floor table), so those runs trained shorter responses than their
# colocated baselines. Said where train is at least a fifth of the modelled work.
SPLIT_TRAINER_CAVEAT = (
    "verl's published split runs trained 1.1-2.0x faster per GPU on their dedicated trainer "
    "than on the colocated one (median 1.7, 7 runs on H20: verl's one_step_off_policy and "
    "fully_async_policy READMEs); their scripts run both trainers alike, and the fully_async "
    "trainers' published work is at or below what a guessed mean of 2000 tokens needs at "
    "100% of peak, so those runs trained shorter responses than their baselines; this model "
    "prices both at one length, so the split's trainer may be over-priced and its speedup "
    "under-priced")


def _split_trainer(spec: Spec) -> bool:
    """Whether the plan prices verl and trains in a group of part of the cluster."""
    return system_of(spec).name == "verl" and any(
        group.share < 1 and any(spec.nodes[t].kind == "train" for t in group.tasks)
        for group in spec.groups.values())


DEFAULT_WHY = {
    "prompt_len": "published prompts run 100s to 1000s of tokens; every pass and decode "
                  "step reads them",
    "prompts_per_step": "the batch's prompts",
    "samples_per_prompt": "samples per prompt (n)",
    "mean": "the mean response length decides throughput",
    "max": "the cap decides a synchronous batch's longest",
    "sigma": "the lognormal tail decides a synchronous batch's longest and partial "
             "rollout's carry",
    "alpha": "the pareto tail decides a synchronous batch's longest",
}


def defaults_left(spec: Spec) -> list[str]:
    """The workload keys a graph left at rlgraph's defaults, with what each decides: a
    published run's prompts and length tail are its own, not rlgraph's examples'; a system
    that packs nothing pads to micro_tokens where the graph gives them, else to the batch's
    longest."""
    data, length, cluster = spec.data, spec.data.response_len, spec.cluster
    out = [f"cluster.{key} {getattr(cluster, key)}"
           for key in ("gpu", "nodes", "gpus_per_node") if key not in cluster.model_fields_set]
    if spec.model.preset == "tiny":
        out.append("model: preset tiny (rlgraph's 4-layer test model: give the run's preset, "
                   "hf_config or path)")
    out += [f"data.{key} {getattr(data, key)} ({DEFAULT_WHY[key]})"
            for key in ("prompts_per_step", "samples_per_prompt", "prompt_len")
            if key not in data.model_fields_set]
    shape = ["mean", "max", "sigma" if length.dist == "lognormal" else "alpha"]
    out += [f"data.response_len.{key} {getattr(length, key):g} ({DEFAULT_WHY[key]})"
            for key in shape if key not in length.model_fields_set
            and not (key == "mean" and length.clipped_mean is not None)]
    system = system_of(spec)
    if not system.runs_here and not system.packs_sequences:
        unsized = [name for name, node in spec.nodes.items()
                   if KINDS[node.kind].sequence_passes and not getattr(node, "micro_tokens", 0)]
        if unsized:
            out.append(f"micro_tokens of {', '.join(unsized)} (none: {system.label}'s passes "
                       f"priced padded to the batch's expected longest response)")
    return out


def length_assumption(response_len: Any) -> str:
    """The response lengths a plan is priced at, in words: the mean before the cap and, where
    the cap lowers it by more than 2%, the mean as trained (what a run reports; the key
    `response_len.clipped_mean` states that one instead)."""
    r = response_len
    shape = f"{r.dist} sigma {r.sigma:g}" if r.dist == "lognormal" else f"pareto alpha {r.alpha:g}"
    trained = moments(lengths_of(r))[0]
    if trained < 0.98 * r.mean:
        return (f"mean {r.mean:.0f} before the cap, {trained:.0f} as trained "
                f"(response_len.clipped_mean states that one), max {r.max}, {shape}")
    return f"mean {r.mean:g}, max {r.max}, {shape}"


def trust(spec: Spec, costs: dict[str, NodeCost], sync_costs: dict[str, NodeCost],
          sync: float) -> dict[str, Any]:
    """How much to trust the period: whether costs are calibrated, and the assumptions that
    dominate it (the largest modelled terms, the switch's share of the colocated step, the
    assumed response lengths)."""
    modelled = sorted((c.seconds, n) for n, c in costs.items() if c.source == "model")
    calibrated = sorted(n for n, c in costs.items() if c.source == "calibrated")
    lines = []
    data = spec.data
    if any(KINDS[spec.nodes[n].kind].uses_gpu for _, n in modelled):  # model forwards
        lines.append(f"response_len is assumed ({length_assumption(data.response_len)}): "
                     f"decode, logp and train scale with it")
        left = defaults_left(spec) if not system_of(spec).runs_here else []
        if left and not spec.cluster.local:  # rlgraph's own tasks are what its defaults say
            lines.append(f"left at rlgraph's defaults, not {system_of(spec).label}'s run's: "
                         + "; ".join(left) + ": state them as the run did")
    gpu = GPU_PRESETS.get(spec.cluster.gpu)
    if gpu is not None and not spec.cluster.local and any(
            KINDS[spec.nodes[n].kind].sequence_passes for _, n in modelled):
        moe = shape_of(spec).moe_layers > 0
        own = system_of(spec).moe_pass_factor
        factor = COSTS.moe_pass_factor if own is None else own
        figure = pass_efficiency(gpu.bf16_flops, gpu.hbm_bytes_per_s) * (factor if moe else 1.0)
        lines.append(f"train / logp passes run at {figure:.0%} of {gpu.name} peak (roofline "
                     f"from Megatron's 52% on A100"
                     + (f", x {factor:g} for routed experts"
                        + (f" ({system_of(spec).label}'s measured MoE path)"
                           if own is not None else "") if moe else "")
                     + "; not measured on this cluster: `rlgraph compile --calibrate RUN`)")
    if spec.cluster.local and modelled:
        lines.append("CPU costs are one quiet 2-core AMD EPYC (Zen 5) VM's, measured by "
                     "bench/async_vs_sync.py; the same VM beside other load ran 1.6-2.5x "
                     "slower: `rlgraph compile --calibrate RUN` on this host")
    busy = sum(s for s, _ in modelled)
    for seconds, name in reversed(modelled[-2:]):
        if busy > 0 and seconds >= 0.2 * busy:
            lines.append(f"{name} is {seconds / busy:.0%} of the modelled work")
    driver, host = _summed(costs, _DRIVER), _summed(costs, _HOST)
    if busy > 0 and driver >= 0.05 * busy:
        lines.append(f"{system_of(spec).label}'s driver moving the padded batch is "
                     f"{driver / busy:.0%} of the "
                     f"modelled work (Ray object store at "
                     f"{COSTS.object_store_bytes_per_s / 1e9:.2g} GB/s, our measurement)")
    if busy > 0 and host >= 0.05 * busy:
        lines.append(f"generate's host time (per call and row) is {host / busy:.0%} of the "
                     f"modelled work (fit over our H200 runs; Python-bound, host-dependent)")
    trained = sum(sec for sec, n in modelled if spec.nodes[n].kind == "train")
    if _split_trainer(spec) and busy > 0 and trained >= 0.2 * busy:
        lines.append(SPLIT_TRAINER_CAVEAT)
    switch = _summed(sync_costs, _SWITCH)
    if sync > 0 and switch > 0:
        system = system_of(spec)
        path, rate = system.refit_rate(refit_path(spec), gpu.nvlink_bytes_per_s if gpu else 0.0)
        cited = ("a cited measurement" if system.refit.get(path) is not None
                 else "no measurement cited: NVLink")
        lines.append(f"the {system.label} colocation switch is {switch / sync:.0%} of the "
                     f"colocated step ({path} refit at {rate / 1e9:.3g} GB/s, {cited}, "
                     f"rlgraph/pricing/system_sources.py; pricing.refit states the path)")
    return {"calibrated": bool(calibrated), "calibrated_nodes": calibrated,
            "modelled_nodes": [n for _, n in reversed(modelled)], "assumptions": lines}
