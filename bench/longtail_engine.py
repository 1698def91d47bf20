"""The engine-level parts of bench/gpu_longtail.py (issue 15): the static decoder with and
without slot compaction by live rows against the HBM roofline (`decode`), one captured step
per (attention kernel, width, length) with a profile (`sweep`), and what a new train pass
shape costs with cuDNN's SDPA and without (`trainshapes`)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

GRAPHS = Path(__file__).resolve().parent / "graphs_gpu"


def _roofline_bins(trace: list[dict], weights: int, kv: int, bw: float) -> list[dict]:
    """Device ms per decode step by live rows (bins of powers of two) against the HBM roofline
    of those rows (the weights plus the live rows' K/V, read once a step, over `bw`)."""
    bins: dict[int, list[dict]] = {}
    for t in trace:
        if "ms_per_step" in t:
            bins.setdefault(1 << max(0, t["live"] - 1).bit_length(), []).append(t)
    out = []
    for top, ts in sorted(bins.items(), reverse=True):
        steps = sum(t["steps"] for t in ts)
        ms = sum(t["ms_per_step"] * t["steps"] for t in ts) / steps
        roof = sum((weights + t["live_positions"] * kv) / bw * 1e3 * t["steps"]
                   for t in ts) / steps
        out.append({"live_rows_up_to": top, "decode_steps": steps,
                    "widths": sorted({t["width"] for t in ts}),
                    "ms_per_step": round(ms, 3), "roofline_ms": round(roof, 3),
                    "over_roofline": round(ms / roof, 2),
                    "share_of_decode_time": None})
    total = sum(r["ms_per_step"] * r["decode_steps"] for r in out) or 1.0
    for r in out:
        r["share_of_decode_time"] = round(r["ms_per_step"] * r["decode_steps"] / total, 3)
    return out


def decode_part(cpu: bool, overrides: list[str], rows: int | None = None,
                longest: int | None = None) -> dict[str, Any]:
    """Static engine on one forced-length synchronous batch, without and with slot compaction
    (same requests, graphs captured first): wall time, and device ms per decode step by live
    rows against the HBM roofline of those rows (weights + live K/V over the copy bandwidth
    measured here)."""
    import random

    import torch

    from bench.gpu_bench import copy_bandwidth
    from rlgraph.config.load import load_spec
    from rlgraph.engines.static_decode import Request, StaticDecoder
    from rlgraph.presets.tasks import draw_length
    from rlgraph.worker.workspace import Workspace

    spec = load_spec(GRAPHS / "longtail-1gpu.yaml", overrides)
    device = "cpu" if cpu else "cuda"
    ws = Workspace(spec, ["generate"], seed=0, device=device)
    model = ws.policy
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2  # K and V, bf16
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    bw = (copy_bandwidth(torch.device(device)) if not cpu else 10.0) * 1e9
    rows = rows or (64 if cpu else spec.data.prompts_per_step * spec.data.samples_per_prompt)
    lengths_spec = spec.data.response_len.model_copy(
        update={"max": longest or (48 if cpu else min(spec.data.response_len.max, 4096))})
    rng = random.Random(0)
    lengths = [draw_length(rng, lengths_spec, limit=10**9) for _ in range(rows)]
    out: dict[str, Any] = {
        "hbm_copy_gb_s": round(bw / 1e9, 1), "weights_bytes": weights,
        "kv_bytes_per_token": kv, "rows": rows, "response_len": lengths_spec.model_dump(),
        "lengths": {"mean": round(statistics.fmean(lengths), 1), "max": max(lengths)},
        "sync_every": spec.nodes["generate"].sync_every, "variants": {}}
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    for name, compact, kind in (("all_slots", False, "sdpa"), ("compacted", True, "sdpa"),
                                ("compacted_matmul", True, "matmul")):
        dec = StaticDecoder(model, max_batch=rows, max_len=len(prompt) + max(lengths) + 1,
                            timing=not cpu, attn_block=128, compact=compact, trace=True,
                            sync_every=spec.nodes["generate"].sync_every, attention_kind=kind)
        t = time.perf_counter()
        graphs = dec.warmup(use_top_p=False)
        capture_s = time.perf_counter() - t
        reqs = [Request(prompt, n, ignore_eos=True) for n in lengths]
        if not cpu:
            torch.cuda.synchronize()
        t = time.perf_counter()
        done = dec.run(reqs)
        if not cpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
        assert sorted(len(c.tokens) for c in done) == sorted(lengths)
        out["variants"][name] = {
            "wall_s": round(wall, 3), "graphs": graphs, "capture_s": round(capture_s, 2),
            "decode_steps": int(dec.stats["decode_steps"]),
            "slot_steps": int(dec.stats["slot_steps"]),
            "busy_slot_steps": int(dec.stats["busy_slot_steps"]),
            "slot_moves": int(dec.stats["slot_moves"]),
            "device_ms_per_step": round(dec.stats["decode_ms"] / dec.stats["decode_steps"], 3)
            if dec.stats["decode_ms"] else None,
            "by_live_rows": _roofline_bins(dec.trace or [], weights, kv, bw)}
        print(name, json.dumps(out["variants"][name]), flush=True)
        del dec, done
        if not cpu:
            torch.cuda.empty_cache()
    v = out["variants"]
    out["compacted_speedup_wall"] = round(v["all_slots"]["wall_s"] / v["compacted"]["wall_s"], 2)
    return out


def step_sweep_part(cpu: bool, overrides: list[str]) -> dict[str, Any]:
    """One captured decode step replayed at each (attention kernel, width, attention length),
    every row live at that length: device ms per step against the roofline of those rows; and
    the kernels of one eager step (torch.profiler) at a narrow width and long context."""
    import torch

    from bench.gpu_bench import copy_bandwidth
    from rlgraph.config.load import load_spec
    from rlgraph.engines.static_decode import StaticDecoder
    from rlgraph.worker.workspace import Workspace

    spec = load_spec(GRAPHS / "longtail-1gpu.yaml", overrides)
    device = "cpu" if cpu else "cuda"
    model = Workspace(spec, ["generate"], seed=0, device=device).policy
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    bw = (copy_bandwidth(torch.device(device)) if not cpu else 10.0) * 1e9
    widths = [4, 16] if cpu else [16, 32, 64, 128, 256, 512]
    lengths = [64, 128] if cpu else [1024, 4096]
    out: dict[str, Any] = {"hbm_copy_gb_s": round(bw / 1e9, 1), "rows": []}
    for kind in ("sdpa", "matmul"):
        dec = StaticDecoder(model, max_batch=max(widths), max_len=max(lengths), timing=True,
                            attn_block=128, attention_kind=kind, min_width=min(widths))
        for width in widths:
            for attn in lengths:
                dec.pos.fill_(attn - 40)
                dec.done.zero_()
                dec.max_new.fill_(10**6)
                dec.cur_tok.random_(3, cfg.vocab_size)
                with torch.no_grad(), dec._attn_impl():
                    dec._run(attn, width, False, False)
                    if cpu:
                        began = time.perf_counter()
                        for _ in range(4):
                            dec._run(attn, width, False, False)
                        ms = (time.perf_counter() - began) * 1e3 / 4
                    else:
                        start = torch.cuda.Event(enable_timing=True)
                        end = torch.cuda.Event(enable_timing=True)
                        start.record()
                        for _ in range(20):
                            dec._run(attn, width, False, False)
                        end.record()
                        end.synchronize()
                        ms = start.elapsed_time(end) / 20
                roof = (weights + width * (attn - 30) * kv) / bw * 1e3
                out["rows"].append({"attention": kind, "width": width, "attn_len": attn,
                                    "ms_per_step": round(ms, 3), "roofline_ms": round(roof, 3),
                                    "over_roofline": round(ms / roof, 2)})
                print(json.dumps(out["rows"][-1]), flush=True)
        if not cpu:
            from torch.profiler import ProfilerActivity, profile

            dec.cuda_graphs = False
            with torch.no_grad(), dec._attn_impl():
                dec._run(max(lengths), min(widths), False, False)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        dec._run(max(lengths), min(widths), False, False)
                    torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14)
            out[f"profile_{kind}_width{min(widths)}_len{max(lengths)}"] = table
            print(table, flush=True)
        del dec
        if not cpu:
            torch.cuda.empty_cache()
    return out


def train_shapes_part(cpu: bool, overrides: list[str]) -> dict[str, Any]:
    """What a pass shape not seen before costs train: forward + backward of `token_logp` at the
    pass shapes `length_batches` makes (rows = micro_tokens // width), first call against the
    repeat, with cuDNN's SDPA allowed and not (each setting on widths of its own, so neither
    inherits the other's warm shapes)."""
    import torch

    from rlgraph.config.load import load_spec
    from rlgraph.engines.cpu_decode import token_logp
    from rlgraph.worker.workspace import Workspace

    spec = load_spec(GRAPHS / "longtail-1gpu.yaml", overrides)
    device = "cpu" if cpu else "cuda"
    model = Workspace(spec, ["train"], seed=0, device=device).policy
    model.train()
    micro, P = spec.nodes["train"].micro_tokens or 16384, spec.data.prompt_len
    vocab = model.config.vocab_size
    settings = {"cudnn_sdpa_on": [768, 1792, 3840], "cudnn_sdpa_off": [1280, 2816, 4864],
                "cudnn_sdpa_on_again": [1536, 3328, 5888]}
    if cpu:
        settings = {k: [w // 64 for w in ws] for k, ws in settings.items()}
    out: dict[str, Any] = {"micro_tokens": micro, "rows": []}

    def timed(rows: int, width: int) -> float:
        seq = torch.randint(3, vocab, (rows, P + width), device=device)
        mask = torch.ones_like(seq)
        if not cpu:
            torch.cuda.synchronize()
        began = time.perf_counter()
        token_logp(model, seq, mask, P).mean().backward()
        if not cpu:
            torch.cuda.synchronize()
        return (time.perf_counter() - began) * 1e3

    timed(max(1, micro // (P + 256)), 256)  # the model's own first-call costs
    for name, widths in settings.items():
        if not cpu:
            torch.backends.cuda.enable_cudnn_sdp(not name.endswith("off"))
        for w in widths:
            rows = max(1, micro // (P + w))
            first, again = timed(rows, w), timed(rows, w)
            out["rows"].append({"setting": name, "rows": rows, "width": w,
                                "first_ms": round(first, 1), "repeat_ms": round(again, 1)})
            print(json.dumps(out["rows"][-1]), flush=True)
    if not cpu:
        torch.backends.cuda.enable_cudnn_sdp(True)
    model.zero_grad(set_to_none=True)
    return out
