"""Fused projections for decode: one GEMM for q/k/v and one for gate/up, parameters unchanged.

At small decode batches a step is a few hundred small kernels, and q/k/v (gate/up) are three
(two) GEMMs over the same input. `fuse_projections` stores each group's weights in one tensor
and makes the original parameters views of it, so names, shapes, `named_parameters()` and
in-place weight updates (a `WeightReceiver` writing into the live weights) work as before, and
the group's first projection computes all outputs with one GEMM; the others return their slice.
A projection called on another input than the first one saw falls back to its own GEMM, so the
result never depends on call order.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def fuse_projections(model: torch.nn.Module) -> int:
    """Fuse every q/k/v and gate/up group of Linear layers in `model`; returns how many."""
    fused = 0
    for module in model.modules():
        for names in GROUPS:
            linears = [getattr(module, n, None) for n in names]
            if all(type(lin) is torch.nn.Linear for lin in linears) and _fuse(linears):
                fused += 1
    return fused


def _fuse(linears: list[torch.nn.Linear]) -> bool:
    if getattr(linears[0], "_rlgraph_fused", False):
        return False
    w0 = linears[0].weight
    has_bias = {lin.bias is not None for lin in linears}
    if len(has_bias) != 1 or any(
            lin.in_features != linears[0].in_features or lin.weight.dtype != w0.dtype
            or lin.weight.device != w0.device for lin in linears):
        return False
    with torch.no_grad():
        weight = torch.cat([lin.weight for lin in linears])
        bias = torch.cat([lin.bias for lin in linears]) if has_bias.pop() else None
    sizes = [lin.out_features for lin in linears]
    lo = 0
    for lin, n in zip(linears, sizes):
        lin.weight.data = weight[lo:lo + n]
        if bias is not None:
            lin.bias.data = bias[lo:lo + n]
        lo += n
    state: dict[str, Any] = {}

    def first(x: torch.Tensor) -> torch.Tensor:
        parts = F.linear(x, weight, bias).split(sizes, dim=-1)
        state["x"], state["parts"] = x, parts
        return parts[0]

    def other(i: int):
        lin = linears[i]

        def forward(x: torch.Tensor) -> torch.Tensor:
            if state.get("x") is not x:
                return F.linear(x, lin.weight, lin.bias)
            out = state["parts"][i]
            if i == len(linears) - 1:
                state.clear()
            return out

        return forward

    linears[0].forward = first
    for i in range(1, len(linears)):
        linears[i].forward = other(i)
    for lin in linears:
        lin._rlgraph_fused = True
    return True
