#!/usr/bin/env python
"""GPU benchmark, one script per device call; every ratio is measured side by side in one run.

(a) 2 GPUs: raw NCCL broadcast bandwidth (128 MB and 512 MB messages) and rlgraph's bucketed
    weight sync (rlgraph/weights/nccl.py) of bf16 models of 1.5B and 7.6B parameters
    (random weights from the qwen2.5 presets), GPU 0 -> GPU 1, checked bit for bit.
(b) 1 GPU: decode of the 374M Llama preset in bf16 at batch 64 and 256: ms per decode step and
    tokens/s for transformers `generate` (dynamic cache; `cache_implementation="static"`) and
    for rlgraph's StaticDecoder (CUDA graphs; torch.compile + CUDA graphs; that plus fused
    q/k/v and gate/up projections), against the HBM roofline: weights + KV bytes read per step
    over the device-to-device copy bandwidth measured here; a kernel profile of the fused step;
    refill and interrupt / resume exercised.

    PYTHONUNBUFFERED=1 python bench/gpu_bench.py --out DIR [--parts nccl,decode]

Writes DIR/gpu-nccl-sync.json and DIR/gpu-decode.json (copied to bench/results/). Without
CUDA it prints a message and exits 0. Needs torch and transformers only (no ray, no pydantic).
RLGRAPH_GPU_BENCH_DRY=1 rehearses the same code on the CPU (gloo, tiny model, no compile).
One run on 2x H200 takes about 4 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
PROMPT_LEN, NEW_TOKENS = 32, 128
T0 = time.perf_counter()
DRY = os.environ.get("RLGRAPH_GPU_BENCH_DRY") == "1"  # CPU rehearsal: gloo, tiny sizes


def sync() -> None:
    if not DRY:
        torch.cuda.synchronize()


def load_rlgraph() -> types.SimpleNamespace:
    """rlgraph's GPU modules, without running package __init__ files (they may import ray or
    pydantic, which the GPU machines lack)."""
    for pkg in ("rlgraph", "rlgraph.runtime", "rlgraph.engines",  # rlgraph.weights's own
                "rlgraph.presets", "rlgraph.model"):  # __init__ runs: it imports nothing
        if pkg not in sys.modules:
            mod = types.ModuleType(pkg)
            mod.__path__ = [str(ROOT / pkg.replace(".", "/"))]
            sys.modules[pkg] = mod
    import importlib

    return types.SimpleNamespace(
        presets=importlib.import_module("rlgraph.presets.models"),
        nccl_sync=importlib.import_module("rlgraph.weights.nccl"),
        sync_group=importlib.import_module("rlgraph.weights.sync_group"),
        static_decode=importlib.import_module("rlgraph.engines.static_decode"))


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def device_name() -> str:
    return "cpu (dry run)" if DRY else torch.cuda.get_device_name(0)


def machine() -> dict[str, Any]:
    import transformers

    return {"device": device_name(), "gpus": 0 if DRY else torch.cuda.device_count(),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}


def write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2))


def model_specs(preset: str) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of a preset's parameters, from a transformers model on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    rl = load_rlgraph()
    cfg = dict(rl.presets.MODEL_PRESETS[preset])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return [(n, tuple(p.shape)) for n, p in model.named_parameters()]


# ----------------------------------------------------------------------------- (a) NCCL


def _randn(specs, device, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device).manual_seed(seed)
    return {n: torch.randn(s, generator=g, device=device, dtype=torch.bfloat16)
            for n, s in specs}


def _raw_broadcast(group, nbytes: int, moved: int, reps: int = 5) -> list[float]:
    buf = torch.full((nbytes,), 7, dtype=torch.uint8, device=group.device)
    iters = max(4, moved // nbytes)
    for _ in range(3):
        group.broadcast(buf).wait()
    out = []
    for _ in range(reps):
        group.barrier()
        t = time.perf_counter()
        works = [group.broadcast(buf) for _ in range(iters)]
        works[-1].wait()
        sync()
        out.append(nbytes * iters / (time.perf_counter() - t) / 1e9)
    return out


def nccl_worker(rank: int, port: int, out_dir: str) -> None:
    rl = load_rlgraph()
    ns = rl.nccl_sync
    from rlgraph.weights import MIB, BucketMiB
    backend = "gloo" if DRY else "nccl"
    dev = torch.device("cpu") if DRY else torch.device("cuda", rank)
    if not DRY:
        torch.cuda.set_device(rank)
    scale = 1024 if DRY else 1  # the dry run moves KB where the real one moves MB
    res: dict[str, Any] = {"rank": rank, "raw": {}, "syncs": []}
    try:
        group = rl.sync_group.init(rank, 2, "127.0.0.1", port, backend=backend, device=rank,
                                   timeout_s=180)
        group.barrier()
        res["group"] = "private ProcessGroupNCCL over TCPStore"
    except Exception as err:  # recorded; then the default group is tried
        res["private_group_error"] = repr(err)
        group = rl.sync_group.init(rank, 2, "127.0.0.1", port + 1, backend=backend,
                                   device=rank, timeout_s=180, private=False)
        res["group"] = "torch default process group"
    for mb in (128, 512):
        res["raw"][str(mb)] = _raw_broadcast(group, mb * MIB // scale, 8 * 2**30 // scale)
        if rank == 1:
            log(f"raw broadcast {mb} MB: {statistics.median(res['raw'][str(mb)]):.1f} GB/s")
    configs = [("qwen2.5-1.5b", 512, 128, False), ("qwen2.5-1.5b", 512, 128, True),
               ("qwen2.5-1.5b", 512, 512, False), ("qwen2.5-1.5b", 1024, 512, True),
               ("qwen2.5-7b", 512, 128, False), ("qwen2.5-7b", 512, 512, False)]
    if DRY:
        configs = [("tiny", p, c, d) for _, p, c, d in configs[:4]]
    weights: dict[str, dict[str, torch.Tensor]] = {}
    for preset, produce, consume, dual in configs:
        specs = model_specs(preset)
        if preset not in weights:
            weights.clear()
            torch.cuda.empty_cache()
            weights[preset] = (_randn(specs, dev, 1234) if rank == 0 else
                               {n: torch.zeros(s, dtype=torch.bfloat16, device=dev)
                                for n, s in specs})
        w = weights[preset]
        total = sum(t.numel() * 2 for t in w.values())
        if rank == 0:
            side = ns.WeightSender(group, BucketMiB(produce / scale, consume / scale))
        else:
            side = ns.WeightReceiver(group, w, BucketMiB(produce / scale, consume / scale),
                                     dual_buffer=dual)
        times, transfer, host = [], [], []
        for rep in range(7):
            if rank == 1 and rep == 6:  # the last sync lands on zeroed weights: verify it
                for t in w.values():
                    t.zero_()
            group.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                host.append(side.send(w.items(), version=rep + 1).host_seconds)
            else:
                host.append(side.receive(wait=True).host_seconds)
                transfer.append(time.perf_counter() - t0)
                side.commit()
                sync()
            times.append(time.perf_counter() - t0)
        row = {"model": preset, "params": sum(t.numel() for t in w.values()), "bytes": total,
               "tensors": len(w), "produce_mb": produce, "consume_mb": consume,
               "dual_buffer": dual, "seconds": times[1:], "host_seconds": host[1:]}
        if rank == 1:
            expect = _randn(specs, dev, 1234)
            row["bit_exact"] = all(torch.equal(w[n], expect[n]) for n in expect)
            row["transfer_seconds"] = transfer[1:]
            del expect
            log(f"sync {preset} {produce}/{consume} dual={dual}: "
                f"{statistics.median(times[1:]) * 1e3:.2f} ms, "
                f"{total / statistics.median(times[1:]) / 1e9:.1f} GB/s, "
                f"bit_exact={row['bit_exact']}")
        res["syncs"].append(row)
        del side
    group.barrier()
    Path(out_dir, f"nccl-rank{rank}.json").write_text(json.dumps(res))


def run_nccl(out: Path, info: dict[str, Any]) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log("NCCL: spawning 2 ranks")
    mp.spawn(nccl_worker, args=(port, str(out)), nprocs=2, join=True)
    r0 = json.loads((out / "nccl-rank0.json").read_text())
    r1 = json.loads((out / "nccl-rank1.json").read_text())
    raw = {mb: statistics.median(v) for mb, v in r1["raw"].items()}
    rows = []
    for s0, s1 in zip(r0["syncs"], r1["syncs"]):
        sec = statistics.median(s1["seconds"])  # the receiver finishes last
        gbps = s1["bytes"] / sec / 1e9
        ref = raw[str(s1["consume_mb"])]
        rows.append({**{k: s1[k] for k in ("model", "params", "bytes", "tensors", "produce_mb",
                                            "consume_mb", "dual_buffer", "bit_exact")},
                     "sync_seconds": sec, "gbps": gbps,
                     "transfer_seconds": statistics.median(s1["transfer_seconds"]),
                     "transfer_gbps": s1["bytes"] / statistics.median(s1["transfer_seconds"]) / 1e9,
                     "sender_seconds": statistics.median(s0["seconds"]),
                     "sender_host_seconds": statistics.median(s0["host_seconds"]),
                     "receiver_host_seconds": statistics.median(s1["host_seconds"]),
                     "raw_gbps_same_message": ref, "percent_of_raw": 100 * gbps / ref})
    data = {"benchmark": "NCCL weight sync vs raw broadcast, GPU 0 -> GPU 1", **info,
            "group": r1.get("group"), "private_group_error": r1.get("private_group_error"),
            "raw_broadcast_gbps": raw, "raw_broadcast_runs": r1["raw"], "syncs": rows,
            "notes": "GB/s = bytes / seconds (1e9). sync_seconds: receiver wall time from a "
                     "two-way barrier until the version is live (dual_buffer: receive into "
                     "staging while generation could go on, then the commit copy into the live "
                     "weights); transfer_seconds: until every chunk arrived. *_host_seconds: "
                     "time the host spent enqueueing. Median of 6 after one warm-up."}
    for f in ("nccl-rank0.json", "nccl-rank1.json"):
        (out / f).unlink()
    write(out / "gpu-nccl-sync.json", data)
    return data


# ----------------------------------------------------------------------------- (b) decode


def copy_bandwidth(dev: torch.device) -> float:
    """Device-to-device copy, bytes read + written per second (GB/s)."""
    n = 2**26 if DRY else 2 * 2**30
    a = torch.randint(0, 255, (n,), dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    if DRY:
        t = time.perf_counter()
        b.copy_(a)
        return 2 * n / (time.perf_counter() - t) / 1e9
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n / statistics.median(times) / 1e9


def roofline_ms(shape, config: dict[str, Any], batch: int, bw_gbps: float) -> float:
    """Bytes a decode step must read (weights but the embedding table; each live token's K/V
    once, at the mean context of the run) over the copy bandwidth."""
    embed = config["vocab_size"] * config["hidden_size"]
    weights = (shape.params - embed) * 2 + batch * config["hidden_size"] * 2
    ctx = PROMPT_LEN + (NEW_TOKENS - 1) / 2
    kv = batch * ctx * shape.kv_bytes_per_token(2)
    return (weights + kv) / (bw_gbps * 1e9) * 1e3


def bench_ours(rl, model, prompts: torch.Tensor, compile: bool | str,
               fuse: bool = False) -> dict[str, Any]:
    sd = rl.static_decode
    b = prompts.shape[0]
    dec = sd.StaticDecoder(model, max_batch=b, max_len=PROMPT_LEN + NEW_TOKENS, sync_every=16,
                           attn_block=None if compile else 32, compile=compile,
                           timing=True, bench=sd.EngineKnobs(fuse=fuse))
    reqs = [sd.Request(p, NEW_TOKENS, temperature=0.0) for p in prompts.tolist()]
    t = time.perf_counter()
    dec.run(reqs)
    warm = time.perf_counter() - t
    runs = []
    for _ in range(3):
        for k in dec.stats:
            dec.stats[k] = 0
        sync()
        t = time.perf_counter()
        out = dec.run(reqs)
        wall = time.perf_counter() - t
        assert all(len(c.tokens) == NEW_TOKENS for c in out)
        decode_ms = dec.stats["decode_ms"] or wall * 1e3  # no device timer on the CPU
        runs.append((decode_ms / dec.stats["decode_steps"], wall))
    ms = statistics.median(r[0] for r in runs)
    wall = statistics.median(r[1] for r in runs)
    return {"ms_per_step": ms, "tokens_per_s": b * 1e3 / ms,
            "e2e_seconds": wall, "e2e_tokens_per_s": b * NEW_TOKENS / wall,
            "warmup_seconds": warm, "graphs": len(dec._graphs), "decoder": dec}


def profile_step(dec, steps: int = 10) -> dict[str, Any]:
    """Kernels of one decode step (the compiled step run without its graph): the top ones by
    device time, and how many launches a step makes."""
    from torch.profiler import ProfilerActivity, profile

    key = next(iter(dec._graphs))
    for _ in range(2):
        dec._step(*key)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            dec._step(*key)
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows)
    return {"kernels_per_step": sum(e.count for e in rows) / steps,
            "device_ms_per_step": total / steps / 1e3,
            "top": [{"name": e.key[:90], "calls_per_step": e.count / steps,
                     "us_per_step": e.device_time_total / steps} for e in rows[:14]]}


def bench_hf(model, prompts: torch.Tensor, static: bool) -> dict[str, Any]:
    kw: dict[str, Any] = dict(attention_mask=torch.ones_like(prompts), do_sample=False,
                              pad_token_id=0)
    if static:
        kw["cache_implementation"] = "static"

    def gen(n: int) -> float:
        sync()
        t = time.perf_counter()
        out = model.generate(prompts, max_new_tokens=n, min_new_tokens=n, **kw)
        sync()
        assert out.shape[1] == PROMPT_LEN + n
        return time.perf_counter() - t

    t = time.perf_counter()
    gen(NEW_TOKENS)  # compiles (static) at the full cache length; later calls reuse it
    warm = time.perf_counter() - t
    short, full = NEW_TOKENS // 4, NEW_TOKENS
    ts = [gen(short) for _ in range(2)]
    tf = [gen(full) for _ in range(2)]
    ms = (min(tf) - min(ts)) / (full - short) * 1e3
    b = prompts.shape[0]
    return {"ms_per_step": ms, "tokens_per_s": b * 1e3 / ms, "e2e_seconds": min(tf),
            "e2e_tokens_per_s": b * full / min(tf), "warmup_seconds": warm}


def exercise(rl, model, vocab: int) -> dict[str, Any]:
    """Refill with uneven lengths; interrupt + resume under the same weights; GPU greedy vs
    transformers greedy (bf16, so late divergence at near ties is expected)."""
    sd = rl.static_decode
    g = torch.Generator().manual_seed(7)
    out: dict[str, Any] = {}
    b = 64
    dec = sd.StaticDecoder(model, max_batch=b, max_len=PROMPT_LEN + NEW_TOKENS, sync_every=16,
                           attn_block=32, timing=True)
    lens = torch.randint(8, NEW_TOKENS + 1, (3 * b,), generator=g).tolist()
    reqs = [sd.Request(torch.randint(3, vocab, (PROMPT_LEN,), generator=g).tolist(), n,
                       temperature=1.0, top_p=0.95, request_id=i) for i, n in enumerate(lens)]
    t = time.perf_counter()
    done = dec.run(reqs)
    wall = time.perf_counter() - t
    out["refill"] = {
        "requests": len(reqs), "slots": b, "completed": len(done),
        "lengths_ok": all(len(c.tokens) == lens[c.request.request_id] for c in done),
        "slot_utilization": dec.stats["busy_slot_steps"] / dec.stats["slot_steps"],
        "idle_slot_steps_with_queue": dec.stats["idle_slot_steps_with_queue"],
        "prefills": dec.stats["prefills"], "tokens_per_s": sum(lens) / wall,
        "note": "temperature 1.0, top_p 0.95, lengths uniform in [8, 128], sync_every 16 (a "
                "slot that finishes mid-chunk idles until the next host sync)"}
    prompts = torch.randint(3, vocab, (b, PROMPT_LEN), generator=g).tolist()
    greedy = [sd.Request(p, NEW_TOKENS, temperature=0.0, request_id=i)
              for i, p in enumerate(prompts)]
    ref = {c.request.request_id: c.tokens for c in dec.run(greedy)}
    dec.submit(greedy)
    for _ in range(3):
        dec.step()
    finished = dec.swap_weights(lambda: 1)
    resumed = {c.request.request_id: c for c in finished + dec.run()}
    same = [resumed[i].tokens == ref[i] for i in range(b)]
    first_diff = [next((j for j, (x, y) in enumerate(zip(resumed[i].tokens, ref[i])) if x != y),
                       NEW_TOKENS) for i in range(b)]
    out["interrupt_resume"] = {
        "sequences": b, "interrupted_after_tokens": 1 + 3 * 16,
        "identical_to_uninterrupted": sum(same), "median_first_difference": statistics.median(
            first_diff), "versions_ok": all(
            resumed[i].versions[:49] == [0] * 49 and set(resumed[i].versions[49:]) <= {1}
            for i in range(b)),
        "note": "greedy, same weights; resumed prefixes are re-encoded by a prefill (other "
                "kernels than decode), so bf16 rounding can flip a near-tie later on"}
    ids = torch.tensor(prompts[:8], device=model.device)
    hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                        min_new_tokens=32, do_sample=False, pad_token_id=0)[:, PROMPT_LEN:]
    agree = [next((j for j in range(32) if hf[i, j].item() != ref[i][j]), 32) for i in range(8)]
    out["greedy_vs_transformers"] = {"sequences": 8, "tokens": 32,
                                     "first_difference_per_sequence": agree}
    return out


STAGES = ("ours", "exercises", "hf", "ours-compiled", "ours-fused", "hf-static",
          "ours-autotune")


def run_decode(out: Path, info: dict[str, Any], budget_s: float,
               stages: tuple[str, ...] = STAGES) -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    rl = load_rlgraph()
    dev = torch.device("cpu") if DRY else torch.device("cuda", 0)
    if not DRY:
        torch.cuda.set_device(dev)
    preset = dict(rl.presets.MODEL_PRESETS["tiny" if DRY else "llama-374m"])
    shape = rl.presets.model_shape(preset)
    cfg = {k: v for k, v in preset.items() if k != "model_type"}
    bw = copy_bandwidth(dev)
    log(f"copy bandwidth {bw:.0f} GB/s (read + write)")
    torch.manual_seed(0)
    with torch.device(dev):
        model = LlamaForCausalLM(LlamaConfig(**cfg, bos_token_id=None, eos_token_id=None,
                                             pad_token_id=None, attn_implementation="sdpa"))
    model = model.to(torch.bfloat16).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    data: dict[str, Any] = {
        "benchmark": "decode ms/step vs HBM roofline, llama-374m bf16, one GPU", **info,
        "model": "llama-374m", "params": shape.params, "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS, "copy_bandwidth_gbps": bw, "variants": [],
        "notes": "ms_per_step: decode steps only (ours: CUDA events around the graph replays; "
                 "transformers: (t(128 new) - t(32 new)) / 96, same prompts, greedy). "
                 "roofline: (weights except the embedding table + K/V of every live token at "
                 "the mean context) / copy bandwidth."}
    g = torch.Generator().manual_seed(0)
    prompts = {b: torch.randint(3, cfg["vocab_size"], (b, PROMPT_LEN), generator=g)
               for b in (64, 256)}
    plan = [("rlgraph StaticDecoder (CUDA graphs)", "ours", False), "exercises",
            ("transformers generate (dynamic cache)", "hf", False),
            ("rlgraph StaticDecoder (torch.compile + CUDA graphs)", "ours", True),
            ("rlgraph StaticDecoder (compile + graphs + fused qkv/gate-up)", "fused", True),
            ("transformers generate (static cache, compiled)", "hf", True),
            ("rlgraph StaticDecoder (max-autotune + graphs + fused)", "fused",
             "max-autotune-no-cudagraphs")]
    fused_model = None
    plan = [p for p, key in zip(plan, STAGES) if key in stages]
    with torch.no_grad():
        for stage in plan:
            if stage == "exercises":
                try:
                    data["exercises"] = exercise(rl, model, cfg["vocab_size"])
                except Exception as err:  # recorded in the results
                    data["exercises"] = {"error": repr(err)[:500]}
                log(f"exercises: {json.dumps(data['exercises'])[:800]}")
                continue
            name, kind, flag = stage
            for b in (64, 256):
                if DRY and (b == 256 or isinstance(flag, str)):
                    continue
                if DRY and kind != "hf":
                    flag = False  # no compile in the CPU rehearsal
                if time.perf_counter() - T0 > budget_s:
                    data["variants"].append({"engine": name, "batch": b,
                                             "skipped": "time budget of this device call"})
                    continue
                roof = roofline_ms(shape, preset, b, bw)
                try:
                    if kind == "ours":
                        r = bench_ours(rl, model, prompts[b], compile=flag)
                        r.pop("decoder")
                    elif kind == "fused":
                        if fused_model is None:  # the baselines keep the unfused model
                            import copy

                            fused_model = copy.deepcopy(model)
                        r = bench_ours(rl, fused_model, prompts[b], compile=flag, fuse=True)
                        dec = r.pop("decoder")
                        if b == 64 and flag is True and not DRY:
                            r["profile"] = profile_step(dec)
                        del dec
                    else:
                        r = bench_hf(model, prompts[b].to(dev), static=flag)
                    r.update(roofline_ms=roof, x_roofline=r["ms_per_step"] / roof)
                except Exception as err:  # recorded in the results
                    r = {"error": repr(err)[:500]}
                data["variants"].append({"engine": name, "batch": b, **r})
                log(f"{name} b={b}: {json.dumps(r)[:1500]}")
                write(out / "gpu-decode.json", data)
                if not DRY:
                    torch.cuda.empty_cache()
    write(out / "gpu-decode.json", data)
    return data


def table(nccl: dict[str, Any] | None, decode: dict[str, Any] | None) -> None:
    if nccl:
        print(f"\nNCCL on {nccl['device']}: raw broadcast " + ", ".join(
            f"{mb} MB {v:.0f} GB/s" for mb, v in nccl["raw_broadcast_gbps"].items()))
        print(f"{'model':14} {'prod/cons':>10} {'dual':>5} {'ms':>8} {'GB/s':>7} {'%raw':>6} ok")
        for r in nccl["syncs"]:
            print(f"{r['model']:14} {r['produce_mb']:>5}/{r['consume_mb']:<4} "
                  f"{r['dual_buffer']!s:>5} {r['sync_seconds'] * 1e3:8.2f} {r['gbps']:7.1f} "
                  f"{r['percent_of_raw']:6.1f} {r['bit_exact']}")
    if decode:
        print(f"\nDecode llama-374m bf16 on {decode['device']}, copy bw "
              f"{decode['copy_bandwidth_gbps']:.0f} GB/s")
        print(f"{'engine':52} {'B':>4} {'ms/step':>8} {'tok/s':>9} {'roof ms':>8} {'x roof':>7}")
        for v in decode["variants"]:
            if "ms_per_step" in v:
                print(f"{v['engine']:52} {v['batch']:>4} {v['ms_per_step']:8.2f} "
                      f"{v['tokens_per_s']:9.0f} {v['roofline_ms']:8.2f} {v['x_roofline']:7.1f}")
            else:
                print(f"{v['engine']:52} {v['batch']:>4} {v.get('error', v.get('skipped'))}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="default: $OUT, else bench/results (a dry run "
                    "writes to a temporary folder, never over measured results)")
    ap.add_argument("--parts", default="nccl,decode")
    ap.add_argument("--stages", default=",".join(STAGES[:-1]),
                    help=f"decode stages to run, of {','.join(STAGES)} (ours-autotune: "
                         "max-autotune compile, minutes per batch size and no faster here)")
    ap.add_argument("--budget-s", type=float, default=470.0,
                    help="start no new decode variant after this many seconds")
    args = ap.parse_args()
    if not torch.cuda.is_available() and not DRY:
        print("gpu_bench: no CUDA device on this machine; skipped (run it on a GPU machine)")
        return 0
    out = Path(args.out or os.environ.get("OUT") or
               (tempfile.mkdtemp(prefix="gpu-bench-dry-") if DRY else ROOT / "bench" / "results"))
    out.mkdir(parents=True, exist_ok=True)
    info = {"machine": machine(), "device": device_name(),
            "command": "python bench/gpu_bench.py " + " ".join(sys.argv[1:])}
    log(f"{info['machine']}")
    parts = set(args.parts.split(","))
    nccl = decode = None
    if "nccl" in parts:
        if DRY or torch.cuda.device_count() >= 2:
            nccl = run_nccl(out, info)
        else:
            log("NCCL part skipped: needs 2 GPUs")
    if "decode" in parts:
        decode = run_decode(out, info, args.budget_s, tuple(args.stages.split(",")))
    table(nccl, decode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
