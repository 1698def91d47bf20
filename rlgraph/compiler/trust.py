"""How much to trust a plan's period: whether its costs are calibrated, and the assumptions
that dominate it (`Plan.trust`, the summary's "trust" lines)."""

from __future__ import annotations

import re
from typing import Any

from rlgraph.compiler.costs import NodeCost
from rlgraph.compiler.shapes import shape_of
from rlgraph.config.schema import Spec
from rlgraph.nodes import KINDS
from rlgraph.presets.costs import COSTS, pass_efficiency
from rlgraph.presets.gpus import GPU_PRESETS

_SWITCH = re.compile(r"colocation switch ([0-9.e+-]+) s")
_DRIVER = re.compile(r"verl driver transfer ([0-9.e+-]+) s")
_HOST = re.compile(r"\+ host ([0-9.e+-]+) s \(rlgraph runtime")


def _summed(costs: dict[str, NodeCost], pattern: re.Pattern[str]) -> float:
    """Seconds a detail term adds up to over the nodes whose detail names it."""
    return sum(float(m.group(1)) for c in costs.values() for m in [pattern.search(c.detail)]
               if m)


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
        lines.append(f"response_len is assumed (mean {data.response_len.mean:g}, max "
                     f"{data.response_len.max}, {data.response_len.dist} sigma "
                     f"{data.response_len.sigma:g}): decode, logp and train scale with it")
    gpu = GPU_PRESETS.get(spec.cluster.gpu)
    if gpu is not None and not spec.cluster.local and any(
            KINDS[spec.nodes[n].kind].sequence_passes for _, n in modelled):
        moe = shape_of(spec).moe_layers > 0
        figure = pass_efficiency(gpu.bf16_flops, gpu.hbm_bytes_per_s) * (
            COSTS.moe_pass_factor if moe else 1.0)
        lines.append(f"train / logp passes run at {figure:.0%} of {gpu.name} peak (roofline "
                     f"from Megatron's 52% on A100"
                     + (f", x {COSTS.moe_pass_factor:g} for routed experts" if moe else "")
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
        lines.append(f"verl's driver moving the padded batch is {driver / busy:.0%} of the "
                     f"modelled work (Ray object store at "
                     f"{COSTS.object_store_bytes_per_s / 1e9:.2g} GB/s, our measurement)")
    if busy > 0 and host >= 0.05 * busy:
        lines.append(f"generate's host time (per call and row) is {host / busy:.0%} of the "
                     f"modelled work (fit over our H200 runs; Python-bound, host-dependent)")
    switch = _summed(sync_costs, _SWITCH)
    if sync > 0 and switch > 0:
        lines.append(f"the hybrid-engine switch is {switch / sync:.0%} of the colocated step "
                     f"(resharding at {COSTS.reshard_bytes_per_s / 1e9:.2g} GB/s, verl "
                     f"issue 2419)")
    return {"calibrated": bool(calibrated), "calibrated_nodes": calibrated,
            "modelled_nodes": [n for _, n in reversed(modelled)], "assumptions": lines}
