"""Where the device time of rlgraph's padded passes goes, kernel by kernel: the long-tail
graph's batch (bench/train_split.py's rows and lengths) run as train runs it (length-sorted
passes of `micro_tokens`, `token_logp` forward + backward) and as logp runs it (forward
only, passes of logp's `micro_tokens`), each once to warm up and once under torch's profiler.
Each kernel is put in one kind by its name: attention forward and backward (the
memory-efficient kernel with the padding mask's bias, flash or cuDNN), GEMMs, and the rest
(the eager passes' memory-bound work: norms, rotary, activations, casts, copies, the fp32
log-prob head). Kernel times are the profiler's device times; the wall time of each profiled
part is beside them.

    python bench/pass_profile.py [--cpu] [key=value ...]

Writes gpu-pass-profile.json under --out (bench/results by default; `--cpu`: a rehearsal on
tiny shapes, where the profiler reports CPU operators instead of kernels).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from common import ROOT, device_info, machine
from train_split import GRAPH, draw_lengths, make_batch, train_workspace

ATTENTION = ("fmha", "flash", "attention", "sdpa", "cudnn")
BACKWARD = ("cutlassb", "bwd", "backward")
GEMM = ("gemm", "xmma", "nvjet", "cublas", "cutlass", "s16816", "wgmma", "matmul", "addmm",
        "mm")


def kind_of(name: str) -> str:
    """The kind of a kernel (or, on CPU, an operator) by its name."""
    low = name.lower()
    if any(a in low for a in ATTENTION):
        return "attention_backward" if any(b in low for b in BACKWARD) else "attention_forward"
    if any(g in low for g in GEMM):
        return "gemm"
    return "other"


def profiled(fn: Any, cpu: bool) -> dict[str, Any]:
    """Run `fn` once under the profiler: device seconds by kind, the 25 longest kernels and
    the wall time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] if cpu else [ProfilerActivity.CUDA]
    if not cpu:
        torch.cuda.synchronize()
    began = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        if not cpu:
            torch.cuda.synchronize()
    wall = time.perf_counter() - began
    kernels: dict[str, list[float]] = {}
    for event in prof.key_averages():
        seconds = (event.self_cpu_time_total if cpu else event.self_device_time_total) / 1e6
        if seconds <= 0 or (not cpu and event.device_type.name != "CUDA"):
            continue
        kernels.setdefault(event.key, [0.0, 0])
        kernels[event.key][0] += seconds
        kernels[event.key][1] += event.count
    by_kind: dict[str, float] = {}
    for name, (seconds, _) in kernels.items():
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + seconds
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:25]
    return {"wall_s": round(wall, 4), "device_s": round(sum(by_kind.values()), 4),
            "by_kind_s": {k: round(v, 4) for k, v in sorted(by_kind.items())},
            "top_kernels": [{"name": n[:160], "kind": kind_of(n), "seconds": round(s, 5),
                             "count": c} for n, (s, c) in top]}


def main() -> int:
    """Profile the passes, print the kinds, write the result."""
    args, overrides, spec, device, ws = train_workspace(__doc__.splitlines()[0])
    import torch

    from rlgraph.engines.cpu_decode import length_batches, token_logp

    policy = ws.policy
    rows = spec.data.prompts_per_step * spec.data.samples_per_prompt
    lens = draw_lengths(spec, rows, 0)
    batch = make_batch(spec, policy.config.vocab_size, lens, 0)
    seq, att = batch["sequences"].to(device), batch["attention_mask"].to(device)
    mask = batch["response_mask"].float().to(device)
    P = spec.data.prompt_len
    out: dict[str, Any] = {"benchmark": "pass_profile", "machine": machine(),
                           "device": device_info(args.cpu), "graph": str(GRAPH.relative_to(ROOT)),
                           "overrides": overrides, "rows": rows,
                           "response_tokens": sum(lens), "prompt_len": P,
                           "command": "python bench/pass_profile.py " + " ".join(sys.argv[1:]),
                           "parts": {}}
    parts = {"train": (spec.nodes["train"].micro_tokens, True),
             "logp": (spec.nodes["logp"].micro_tokens, False)}
    for name, (micro, backward) in parts.items():
        passes = length_batches(batch["response_mask"], P, micro)

        def run(passes: list = passes, backward: bool = backward) -> None:
            with torch.set_grad_enabled(backward):
                for index, w in passes:
                    sl = index.to(device)
                    logp = token_logp(policy, seq[sl, :P + w], att[sl, :P + w], P, 1.0)
                    if backward:
                        (logp * mask[sl, :w]).sum().backward()

        policy.zero_grad(set_to_none=True)
        run()  # warm-up: every pass shape once
        part = profiled(run, args.cpu)
        part["passes"] = len(passes)
        part["micro_tokens"] = micro
        part["padded_tokens"] = sum(len(i) * (P + w) for i, w in passes)
        part["square"] = sum(len(i) * (P + w) ** 2 for i, w in passes)
        out["parts"][name] = part
        print(name, json.dumps({k: v for k, v in part.items() if k != "top_kernels"}),
              flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-pass-profile.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
