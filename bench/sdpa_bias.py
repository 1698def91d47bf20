"""The attention kernel of rlgraph's padded passes: scaled-dot-product attention with the
padding mask's additive bias (transformers' SDPA path with a mask: K/V heads repeated, the
memory-efficient kernel, cuDNN left out as `token_logp` leaves it out), forward and forward +
backward, beside flash attention's causal kernel without a mask, at passes of one token
budget (rows x length = 16384) of the qwen2.5-0.5b shape (14 query heads of 64, 2 K/V
heads). Each figure is the median of `--repeats` CUDA-event timings after a warm-up; the
achieved rate counts the FLOPs of the full length x length product (the bias kernel cannot
skip the causal half: the bias is arbitrary) and forward + backward as 3 forwards.

    python bench/sdpa_bias.py [--cpu]

Writes gpu-sdpa-bias.json under --out (bench/results by default).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, device_info, machine

SHAPES = [(32, 512), (8, 2048), (2, 8192)]  # (rows, length): 16384 tokens a pass
HEADS, KV_HEADS, HEAD_DIM = 14, 2, 64


def main() -> int:
    """Time the kernels, print them, write the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="rehearse on the CPU, tiny shapes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    device = "cpu" if args.cpu else "cuda"
    dtype = torch.float32 if args.cpu else torch.bfloat16
    shapes = [(r, n // 16) for r, n in SHAPES] if args.cpu else SHAPES

    def timed(fn: Any) -> float:
        fn()  # warm-up: the kernel's first call
        out = []
        for _ in range(args.repeats):
            if args.cpu:
                began = time.perf_counter()
                fn()
                out.append(time.perf_counter() - began)
                continue
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        return statistics.median(out)

    rows_out = []
    for rows, length in shapes:
        g = torch.Generator(device=device).manual_seed(0)
        q = torch.randn(rows, HEADS, length, HEAD_DIM, device=device, dtype=dtype, generator=g)
        kv = [torch.randn(rows, KV_HEADS, length, HEAD_DIM, device=device, dtype=dtype,
                          generator=g) for _ in range(2)]
        # rows of different lengths, left-aligned as the passes have them: half to full
        valid = torch.linspace(length // 2, length, rows, device=device).long()
        keep = (torch.arange(length, device=device)[None, :] < valid[:, None])
        causal = torch.ones(length, length, device=device, dtype=torch.bool).tril()
        allowed = causal[None] & keep[:, None, :]
        bias = torch.zeros(rows, 1, length, length, device=device, dtype=dtype)
        bias.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
        leaves = [t.clone().requires_grad_(True) for t in (q, *kv)]

        def bias_pass(backward: bool, leaves: list = leaves, bias: torch.Tensor = bias) -> None:
            qq, k, v = leaves
            k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (k, v))
            kernels = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH] if not args.cpu \
                else [SDPBackend.MATH]
            with sdpa_kernel(kernels), torch.set_grad_enabled(backward):
                out = F.scaled_dot_product_attention(qq, k, v, attn_mask=bias)
                if backward:
                    out.sum().backward()

        def flash_pass(backward: bool, leaves: list = leaves) -> None:
            qq, k, v = leaves
            kernels = [SDPBackend.FLASH_ATTENTION] if not args.cpu else [SDPBackend.MATH]
            with sdpa_kernel(kernels), torch.set_grad_enabled(backward):
                out = F.scaled_dot_product_attention(qq, k, v, is_causal=True,
                                                     enable_gqa=True)
                if backward:
                    out.sum().backward()

        full_fwd = 4 * rows * HEADS * length ** 2 * HEAD_DIM  # QK^T and AV, every block
        row = {"rows": rows, "length": length, "tokens": rows * length}
        for name, fn in (("bias", bias_pass), ("flash_causal", flash_pass)):
            fwd, both = timed(lambda fn=fn: fn(False)), timed(lambda fn=fn: fn(True))
            row[f"{name}_forward_ms"] = round(fwd * 1e3, 3)
            row[f"{name}_forward_backward_ms"] = round(both * 1e3, 3)
            row[f"{name}_full_tflops_forward"] = round(full_fwd / fwd / 1e12, 1)
            row[f"{name}_full_tflops_forward_backward"] = round(3 * full_fwd / both / 1e12, 1)
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    out = {"benchmark": "sdpa_bias", "machine": machine(), "device": device_info(args.cpu),
           "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
           "torch": torch.__version__, "repeats": args.repeats, "shapes": rows_out,
           "command": "python bench/sdpa_bias.py " + " ".join(sys.argv[1:])}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-sdpa-bias.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
