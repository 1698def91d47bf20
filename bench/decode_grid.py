"""The static engine's varlen decode step over a width x context grid with long rows beside
short ones, as partial rollout's carried rows sit beside fresh ones: one captured step of
the qwen2.5-0.5b shape (bench/graphs_gpu/longtail-1gpu.yaml, random init, bf16) replayed at
each (width, fresh rows' context, longest row, long rows), every slot live, each row at its
own length. Device ms per step (CUDA events over `--repeats` replays) beside the uniform
rows of the same width (no long row), so that what a long row adds, and how it adds to the
rest of the step's KV reads, can be read off.

    python bench/decode_grid.py [--cpu] [--out DIR]

Writes gpu-decode-grid.json under --out (bench/results by default).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

from common import ROOT, device_info, machine

GRAPH = ROOT / "bench" / "graphs_gpu" / "longtail-1gpu.yaml"
WIDTHS = [64, 128, 256, 512]
FRESH = [512, 2048]  # the fresh rows' context
LONGEST = [2048, 4096, 8192]  # the long rows' context (longer than the fresh rows')


def grid(cpu: bool) -> list[tuple[int, int, int, int]]:
    """(width, fresh rows' context, longest, long rows) of every point: per width and fresh
    context the uniform rows (no long row), then 1 and width / 16 long rows at each longest
    row longer than the fresh ones."""
    widths, fresh, longest = ([4, 16], [16], [48]) if cpu else (WIDTHS, FRESH, LONGEST)
    points = []
    for width in widths:
        for c in fresh:
            points.append((width, c, c, 0))
            for top in longest:
                if top > c:
                    points += [(width, c, top, n) for n in sorted({1, max(1, width // 16)})]
    return points


def main() -> int:
    """Time every grid point, print it, write the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="rehearse on the CPU, tiny shapes")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    import torch

    from bench.gpu_bench import copy_bandwidth
    from rlgraph.bench_mode import EngineKnobs
    from rlgraph.config.load import load_spec
    from rlgraph.engines.static_decode import StaticDecoder
    from rlgraph.process.workspace import Workspace

    began = time.perf_counter()
    spec = load_spec(GRAPH, [])
    device = "cpu" if args.cpu else "cuda"
    model = Workspace(spec, ["generate"], seed=0, device=device).policy
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    bw = (copy_bandwidth(torch.device(device)) if not args.cpu else 10.0) * 1e9
    points = grid(args.cpu)
    widths = sorted({p[0] for p in points})
    max_len = 64 if args.cpu else 8 + spec.data.response_len.max + 1
    dec = StaticDecoder(model, max_batch=max(widths), max_len=max_len, timing=True,
                        attn_block=128,
                        bench=EngineKnobs(attention_kind="varlen", min_width=min(widths)))
    out: dict[str, Any] = {
        "benchmark": "decode_grid", "machine": machine(), "device": device_info(args.cpu),
        "command": "python bench/decode_grid.py" + (" --cpu" if args.cpu else ""),
        "model": "qwen2.5-0.5b shape (random init, bf16)", "weights_bytes": weights,
        "kv_bytes_per_token": kv, "kv_heads": cfg.num_key_value_heads,
        "layers": cfg.num_hidden_layers, "hbm_copy_gb_s": round(bw / 1e9, 1),
        "repeats": args.repeats, "rows": []}
    for width, fresh, longest, n_long in points:
        lengths = [longest] * n_long + [fresh] * (width - n_long)
        dec.pos.zero_()
        dec.pos[:width] = torch.tensor([n - args.repeats - 8 for n in lengths])
        dec.done.zero_()
        dec.max_new.fill_(10**6)
        dec.cur_tok.random_(3, cfg.vocab_size)
        with torch.no_grad(), dec._attn_impl():
            dec._run(dec.cache_len, width, False, False)  # capture (or warm up) this width
            dec.pos[:width] = torch.tensor([n - args.repeats - 4 for n in lengths])
            if args.cpu:
                t = time.perf_counter()
                for _ in range(args.repeats):
                    dec._run(dec.cache_len, width, False, False)
                ms = (time.perf_counter() - t) * 1e3 / args.repeats
            else:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.repeats):
                    dec._run(dec.cache_len, width, False, False)
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end) / args.repeats
        positions = sum(lengths) - width * (args.repeats // 2 + 4)
        row = {"width": width, "fresh_context": fresh, "longest": longest, "long_rows": n_long,
               "mean_context": round(positions / width, 1), "ms_per_step": round(ms, 3),
               "roofline_ms": round((weights + positions * kv) / bw * 1e3, 3)}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    out["wall_s"] = round(time.perf_counter() - began, 1)
    del dec
    gc.collect()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("cpu-decode-grid.json" if args.cpu else "gpu-decode-grid.json")
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
