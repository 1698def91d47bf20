"""The engine-level parts of bench/gpu_longtail.py: the static decoder's sliced and
varlen decode attention by live rows against the HBM roofline, on a synchronous and a partial
rollout position mix (`decode`), one captured step per (attention kernel, width, length) with a
profile (`sweep`), and what a new train pass shape costs with cuDNN's SDPA and without
(`trainshapes`)."""

from __future__ import annotations

import gc
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


def _mixes(rng, spec, rows: int, longest: int, cpu: bool) -> dict[str, list[tuple[int, int]]]:
    """(carried prefix, total length) per row of the two position mixes: `sync`, one
    synchronous batch of forced lognormal lengths (clipped at `longest`); `partial`, a partial
    round: the same fresh rows but 1/16 of them replaced by carried rows resuming a prefix of
    1/4..3/4 of max_len with 1/16..1/4 of max_len still to generate (long next to short)."""
    from rlgraph.lengths import of

    lengths = of(spec.data.response_len.model_copy(update={"max": longest}))
    fresh = [lengths.draw(rng) for _ in range(rows)]
    top = 48 if cpu else spec.data.response_len.max
    carried = []
    for _ in range(rows // 16):
        prefix = rng.randint(top // 4, 3 * top // 4)
        carried.append((prefix, prefix + rng.randint(top // 16, top // 4)))
    return {"sync": [(0, n) for n in fresh],
            "partial": carried + [(0, n) for n in fresh[len(carried):]]}


def _attention_check(model, device: str, kv_len: int) -> dict[str, Any]:
    """One layer's decode attention on random bf16 inputs with random per-row positions (a
    tenth of the rows finished): relative error of the sliced (sdpa) and varlen kernels
    against a float64 reference, over the live rows."""
    import torch

    from rlgraph.engines import varlen_attention
    from rlgraph.engines.static_ops import attention as sliced

    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    g = torch.Generator(device=device).manual_seed(0)
    rows = 64
    q = torch.randn(rows, heads, 1, d, device=device, generator=g, dtype=torch.bfloat16)
    k, v = (torch.randn(rows, kv_heads, kv_len, d, device=device, generator=g,
                        dtype=torch.bfloat16) for _ in range(2))
    pos = torch.randint(0, kv_len, (rows,), device=device, generator=g)
    done = torch.rand(rows, device=device, generator=g) < 0.1
    keep = torch.arange(kv_len, device=device)[None, :] <= pos[:, None]
    scale = d ** -0.5
    qf = q.double().reshape(rows, kv_heads, heads // kv_heads, d)
    scores = (qf @ k.double().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    ref = (torch.softmax(scores, -1) @ v.double()).reshape(rows, 1, heads, d)
    mask = varlen_attention.RowLengthMask(pos, done, kv_len, heads // kv_heads).build(rows)
    outs = {"sdpa": sliced(None, q, k, v, keep[:, None, None, :], scaling=scale)[0],
            "varlen": varlen_attention.attention(None, q, k, v, mask, scaling=scale)[0]}
    live = ~done
    return {f"{name}_rel_err": float((o[live].double() - ref[live]).norm() / ref[live].norm())
            for name, o in outs.items()}


def decode_part(cpu: bool, overrides: list[str], rows: int | None = None,
                longest: int | None = None) -> dict[str, Any]:
    """Static engine (slots compacted) with the sliced attention (`sdpa`: every row reads the
    longest live row's length) and with `varlen` (each row its own length), on two position
    mixes (`_mixes`), same requests, graphs captured first: wall time, device ms per decode
    step by live rows against the HBM roofline of those rows (weights + the K/V the live rows
    need, over the copy bandwidth measured here); plus the kernels' error against float64 and
    greedy decoding under both kernels (same tokens, log-prob differences)."""
    import random

    import torch

    from bench.gpu_bench import copy_bandwidth
    from rlgraph.bench_mode import EngineKnobs
    from rlgraph.config.load import load_spec
    from rlgraph.engines.static_decode import Request, StaticDecoder
    from rlgraph.engines.varlen_attention import padded_len
    from rlgraph.process.workspace import Workspace

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
    longest = longest or (48 if cpu else min(spec.data.response_len.max, 4096))
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    max_len = len(prompt) + (96 if cpu else spec.data.response_len.max) + 1  # one K/V length
    mixes = _mixes(random.Random(0), spec, rows, longest, cpu)
    out: dict[str, Any] = {
        "hbm_copy_gb_s": round(bw / 1e9, 1), "weights_bytes": weights,
        "kv_bytes_per_token": kv, "rows": rows, "max_len": max_len,
        "mixes": {m: {"carried_rows": sum(1 for p, _ in xs if p),
                      "mean_len": round(statistics.fmean(n for _, n in xs), 1),
                      "max_len": max(n for _, n in xs)} for m, xs in mixes.items()},
        "sync_every": spec.nodes["generate"].sync_every,
        "attention_check": _attention_check(model, device, padded_len(max_len)),
        "variants": {}}
    print("attention_check", out["attention_check"], flush=True)
    vocab = cfg.vocab_size
    greedy: dict[str, list] = {}
    for mix, kind in (("sync", "sdpa"), ("sync", "varlen"), ("partial", "sdpa"),
                      ("partial", "varlen")):
        dec = StaticDecoder(model, max_batch=rows, max_len=max_len, timing=not cpu,
                            attn_block=128, compact=True,
                            sync_every=spec.nodes["generate"].sync_every,
                            bench=EngineKnobs(attention_kind=kind, trace=True))
        t = time.perf_counter()
        graphs = dec.warmup(use_top_p=False)
        capture_s = time.perf_counter() - t
        rng = random.Random(1)
        reqs = [Request(prompt, n, ignore_eos=True, tokens=[rng.randrange(3, vocab)
                                                           for _ in range(p)],
                        logprobs=[0.0] * p, versions=[0] * p) for p, n in mixes[mix]]
        if not cpu:
            torch.cuda.synchronize()
        t = time.perf_counter()
        done = dec.run(reqs)
        if not cpu:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t
        assert sorted(len(c.tokens) for c in done) == sorted(n for _, n in mixes[mix])
        out["variants"][f"{mix}/{kind}"] = {
            "wall_s": round(wall, 3), "graphs": graphs, "capture_s": round(capture_s, 2),
            "decode_steps": int(dec.stats["decode_steps"]),
            "slot_steps": int(dec.stats["slot_steps"]),
            "busy_slot_steps": int(dec.stats["busy_slot_steps"]),
            "slot_moves": int(dec.stats["slot_moves"]),
            "device_ms_per_step": round(dec.stats["decode_ms"] / dec.stats["decode_steps"], 3)
            if dec.stats["decode_ms"] else None,
            "by_live_rows": _roofline_bins(dec.trace or [], weights, kv, bw)}
        print(f"{mix}/{kind}", json.dumps(out["variants"][f"{mix}/{kind}"]), flush=True)
        if mix == "sync":  # greedy, 32 rows x 64 tokens: both kernels' tokens and log-probs
            got = dec.run([Request([*prompt[:4], i + 3], 64, temperature=0.0, request_id=i)
                           for i in range(32)])
            greedy[kind] = sorted(got, key=lambda c: c.request.request_id)
        del dec, done
        gc.collect()  # the decoder holds a cycle (its bound step): free its cache now
        if not cpu:
            torch.cuda.empty_cache()
    same, diffs = 0, []
    for a, b in zip(greedy["sdpa"], greedy["varlen"]):
        n = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y),
                 len(a.tokens))
        same += n
        diffs += [abs(x - y) for x, y in zip(a.logprobs[:n + 1], b.logprobs[:n + 1])]
    out["greedy_sdpa_vs_varlen"] = {
        "tokens": 32 * 64, "same_before_first_divergence": same,
        "logp_abs_diff_mean": round(statistics.fmean(diffs), 5),
        "logp_abs_diff_max": round(max(diffs), 5)}
    v = out["variants"]
    for mix in mixes:
        out[f"{mix}_varlen_speedup_wall"] = round(v[f"{mix}/sdpa"]["wall_s"]
                                                  / v[f"{mix}/varlen"]["wall_s"], 2)
        if v[f"{mix}/sdpa"]["device_ms_per_step"]:
            out[f"{mix}_varlen_speedup_device"] = round(
                v[f"{mix}/sdpa"]["device_ms_per_step"] / v[f"{mix}/varlen"]["device_ms_per_step"],
                2)
    return out


def step_sweep_part(cpu: bool, overrides: list[str], compiled: bool = False) -> dict[str, Any]:
    """One captured decode step replayed at each (attention kernel, width, attention length),
    every row live at that length: device ms per step against the roofline of those rows; and
    the kernels of one eager step (torch.profiler) at a narrow width and long context.
    `compiled`: varlen attention with the step uncompiled against torch.compile'd (CUDA graphs
    both), widths 1-512, and whether greedy decoding gives the same tokens (no profile)."""
    import torch

    from bench.gpu_bench import copy_bandwidth
    from rlgraph.bench_mode import EngineKnobs
    from rlgraph.config.load import load_spec
    from rlgraph.engines.static_decode import StaticDecoder
    from rlgraph.process.workspace import Workspace

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
    variants = [("sdpa", False), ("varlen", False)]
    if compiled:
        widths = [1, 4] if cpu else [1, 4, 16, 64, 256, 512]
        variants = [("varlen", False), ("varlen", True)]
    out: dict[str, Any] = {"hbm_copy_gb_s": round(bw / 1e9, 1), "rows": []}
    max_len = max(lengths) if cpu else 8 + spec.data.response_len.max + 1  # as decode_part
    tokens = {}
    for kind, comp in variants:
        began = time.perf_counter()
        dec = StaticDecoder(model, max_batch=max(widths), max_len=max_len, timing=True,
                            attn_block=128, compile=comp,
                            bench=EngineKnobs(attention_kind=kind, min_width=min(widths)))
        if compiled:
            tokens[comp] = _greedy_tokens(dec, cfg.vocab_size)
            out[f"greedy_s_compiled_{comp}"] = round(time.perf_counter() - began, 1)
        for width in widths:
            for length in lengths:
                attn = length if kind == "sdpa" else dec.cache_len  # varlen: rows' own length
                dec.pos.fill_(length - 40)
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
                roof = (weights + width * (length - 30) * kv) / bw * 1e3
                out["rows"].append({"attention": kind, "compiled": comp, "width": width,
                                    "attn_len": length, "ms_per_step": round(ms, 3),
                                    "roofline_ms": round(roof, 3),
                                    "over_roofline": round(ms / roof, 2)})
                print(json.dumps(out["rows"][-1]), flush=True)
        if not cpu and not compiled:
            from torch.profiler import ProfilerActivity, profile

            dec.cuda_graphs = False
            attn = max(lengths) if kind == "sdpa" else dec.cache_len
            with torch.no_grad(), dec._attn_impl():
                dec._run(attn, min(widths), False, False)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        dec._run(attn, min(widths), False, False)
                    torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14)
            out[f"profile_{kind}_width{min(widths)}_len{max(lengths)}"] = table
            print(table, flush=True)
        del dec
        gc.collect()  # the decoder holds a cycle (its bound step): free its cache now
        if not cpu:
            torch.cuda.empty_cache()
    if compiled:
        same = sum(tokens[False][r] == tokens[True][r] for r in tokens[False])
        out["greedy_same_tokens"] = f"{same} of {len(tokens[False])} sequences"
        out["greedy_first_token_differing"] = [
            next((i for i, (a, b) in enumerate(zip(tokens[False][r], tokens[True][r]))
                  if a != b), None) for r in tokens[False]]
    return out


def _greedy_tokens(dec: Any, vocab: int) -> dict[int, list[int]]:
    """Greedy continuations of 6 fixed prompts (16 to 256 new tokens, at most what fits)."""
    import torch

    from rlgraph.engines.static_decode import Request

    reqs = [Request(prompt=torch.randint(3, min(vocab, 20), (8,), generator=torch.Generator()
                                         .manual_seed(i)).tolist(),
                    max_new_tokens=min(16 << (i % 5), dec.L - 8), temperature=0.0, ignore_eos=True,
                    request_id=i) for i in range(6)]
    return {c.request.request_id: list(c.tokens) for c in dec.run(reqs)}


def train_shapes_part(cpu: bool, overrides: list[str]) -> dict[str, Any]:
    """What a pass shape not seen before costs train: forward + backward of `token_logp` at the
    pass shapes `length_batches` makes (rows = micro_tokens // width), first call against the
    repeat, with cuDNN's SDPA allowed and not (each setting on widths of its own, so neither
    inherits the other's warm shapes)."""
    import torch

    from rlgraph.config.load import load_spec
    from rlgraph.engines.cpu_decode import token_logp
    from rlgraph.process.workspace import Workspace

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
