"""In-flight weight updates on the long-tail workload: each plan with `generate.inflight`
against the same plan without it, side by side in one device call, and the log-prob gap
between a kept and a recomputed KV cache after a version change.

  PYTHONUNBUFFERED=1 python bench/gpu_inflight.py --modes MODE[,MODE...] [--steps 4]
      [--stop-after-s S] [--name NAME] [--out DIR] [--cpu] [key=value ...]
  python bench/gpu_inflight.py --kv-gap [--name NAME] [--out DIR] [--cpu] [key=value ...]
  python bench/gpu_inflight.py --merge PART.json [PART.json ...] --out DIR
      [--name gpu-inflight]
  python bench/gpu_inflight.py --length-bias-engine ROUNDS [--length-scale 8] [key=value ...]
  python bench/gpu_inflight.py --host-idle ROUNDS [--length-scale 8] [key=value ...]

Modes (bench/graphs_gpu/longtail-1gpu.yaml in BENCHMARK MODE: generate.forced_lengths draws
each sample's length from data.response_len and ignores eos until it; see gpu_longtail.py):
split-partial-lag3[-inflight] put train and logp on one GPU and generate on another, with
partial rollout at max_lag 3 (the plan the issue's 2-GPU figure ran; split-partial-lag6 and
-lag8 the same at max_lag 6 and 8, where the long tails fit the lag); stream4-colocated-
lag3[-inflight] keep every task on one GPU and stream 4 mini-batches a version with partial
rollout; partial-lag3 is the unstreamed partial rollout on one GPU (what the streamed one
must beat). A mode runs `--steps` versions with `gpu_longtail.run_mode` (the first is
warm-up); the part files are written after every mode, so several parts can run at once
on different GPUs (CUDA_VISIBLE_DEVICES) and be merged. With --stop-after-s a mode still
running S seconds after the start stops after its running tasks and keeps the steps it
finished (rates and lengths cover those).

--kv-gap: the policy (random init, bf16) decodes rows on the static engine; after `--kv-gap-
before` tokens a version change (an Adam first step of size `lr` on every weight: each
moves by lr x sign(noise)) is copied into the live weights in place and decoding goes on
for `--kv-gap-after` tokens with the KV cache kept. Every token's log-prob is then
recomputed from scratch under the weights that sampled it (what kv: recompute would give).
Reported per lr: |kept - recomputed| for the tokens after the change (mean, p99, max), the
same for the tokens before it (the engine's own noise floor: same weights, recomputed) and
|v1 - v0| on the tokens after the change (how far the version change itself moves them).

--length-bias-engine: the trained-length bias over a long run of the runtime's own decode on
the CPU (`length_bias_engine`). --host-idle: the host's time per look that a GPU would idle
on, measured on the CPU (`host_idle`).

--merge writes NAME.json: the parts, and `plans`: name, gpus, samples_per_s (after the
warm-up version, over `window_rate`'s window; samples_per_s_after_fill from version
max_lag + 1 on, when the run has it), over_without_inflight (the same plan without
in-flight updates, same call),
trained_mean_over_sync / trained_p99_over_sync (trained response lengths against those a
synchronous run trains over the same steps: data positions 0.. in order, forced lengths
known per position), predicted_over_measured (the compiler's samples/s over the measured),
and the issue's targets checked.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STARTED = time.time()  # --stop-after-s counts from here
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import device_info, machine  # noqa: E402
from bench.gpu_longtail import CPU, GRAPHS, length_stats, run_mode  # noqa: E402

SPLIT = ["cluster.gpus_per_node=2", "groups={trainer: {share: 0.5, tasks: [logp, train]}, "
         "rollout: {share: 0.5, tasks: [generate]}}"]
ONE = ["cluster.gpus_per_node=1"]
PARTIAL = ["schedule.partial_rollout=true", "schedule.max_lag=3"]
STREAM = ["schedule.stream={mini_batches: 4}"]
INFLIGHT = ["nodes.generate.inflight=true"]
SPLIT_LAGS = (3, 6, 8)  # the split pair's max_lag: 3 is the issue's plan, 6 and 8 its tails'
MODES = {
    **{f"split-partial-lag{lag}{suffix}": [*SPLIT, "schedule.partial_rollout=true",
                                           f"schedule.max_lag={lag}", *extra]
       for lag in SPLIT_LAGS for suffix, extra in (("", []), ("-inflight", INFLIGHT))},
    "stream4-colocated-lag3": [*ONE, *PARTIAL, *STREAM],
    "stream4-colocated-lag3-inflight": [*ONE, *PARTIAL, *STREAM, *INFLIGHT],
    "partial-lag3": [*ONE, *PARTIAL],
}
PLANS = [  # (name, GPUs, mode, the same plan without in-flight updates)
    *(plan for lag in SPLIT_LAGS for plan in (
        (f"split + partial rollout + in-flight, max_lag {lag}", 2,
         f"split-partial-lag{lag}-inflight", f"split-partial-lag{lag}"),
        (f"split + partial rollout, max_lag {lag}", 2, f"split-partial-lag{lag}", None))),
    ("colocated streamed (4 mini-batches) + partial + in-flight, max_lag 3", 1,
     "stream4-colocated-lag3-inflight", "stream4-colocated-lag3"),
    ("colocated streamed (4 mini-batches) + partial, max_lag 3", 1, "stream4-colocated-lag3",
     None),
    ("unstreamed partial rollout, max_lag 3 (one GPU)", 1, "partial-lag3", None),
]
CPU_MODES = ["cluster.cpus=2"]


def sync_lengths(spec: Any, prompts: int, first: int = 0) -> dict[str, float]:
    """Response lengths a synchronous run trains over `prompts` prompts from data position
    `first` on, in order (the steps it trains them at), each sample's forced length."""
    from rlgraph.bench_mode import forced_length

    data = spec.data
    return length_stats([forced_length(data.seed, p, k, data.response_len)
                         for p in range(first, first + prompts)
                         for k in range(data.samples_per_prompt)])


def sync_spread(spec: Any, prompts: int, windows: int = 16) -> dict[str, Any]:
    """How far sync's own trained lengths move between windows of `prompts` prompts (positions
    [j * prompts, (j + 1) * prompts) against window 0, j = 1..windows-1): the resolution a
    comparison of trained lengths over that many prompts has, forced lengths being drawn
    independently per sample."""
    base = sync_lengths(spec, prompts)
    means, p99s = [], []
    for j in range(1, windows):
        w = sync_lengths(spec, prompts, j * prompts)
        means.append(w["mean"] / base["mean"])
        p99s.append(w["p99"] / base["p99"])
    return {"prompts": prompts, "windows": windows,
            "mean_ratio_min_max": [round(min(means), 3), round(max(means), 3)],
            "p99_ratio_min_max": [round(min(p99s), 3), round(max(p99s), 3)]}


def throughput(modes: list[str], steps: int, overrides: list[str], out: Path,
               res: dict[str, Any], save: Any, stop_at: float | None = None,
               until_prefix: int | None = None) -> None:
    """Run each mode (gpu_longtail.run_mode; a mode still running at `stop_at`, or that has
    trained every data position below `until_prefix`, stops after its running tasks) and
    add its figures and sync's lengths."""
    from rlgraph.config.load import load_spec

    runs = Path(tempfile.mkdtemp(prefix="rlgraph-inflight-"))
    graph = GRAPHS / "longtail-1gpu.yaml"
    for mode in modes:
        ov = [*MODES[mode], *overrides]
        try:
            r = run_mode(mode, graph, ov, steps, runs, forced=True, progress=out,
                         stop_at=stop_at, until_prefix=until_prefix)
        except Exception as exc:  # record it and go on to the next mode
            res["modes"][mode] = {"error": f"{type(exc).__name__}: {exc}"}
            print(mode, res["modes"][mode], flush=True)
            save()
            continue
        spec = load_spec(graph, ov)
        lengths, k = r["lengths"], spec.data.samples_per_prompt
        rows_n = lengths["trained"]["n"] // k
        lengths["sync_same_steps"] = sync_lengths(spec, rows_n)
        before = lengths["trained_prompts_before_fill"]
        if rows_n > before:
            lengths["sync_same_steps_after_fill"] = sync_lengths(spec, rows_n - before, before)
            lengths["sync_spread_after_fill"] = sync_spread(spec, rows_n - before)
        r["predicted_samples_per_s"] = round(spec.data.samples_per_step()
                                             / r["predicted_period_s"], 3)
        res["modes"][mode] = r
        print(mode, json.dumps({k: v for k, v in r.items() if k not in ("events", "per_step")}),
              flush=True)
        save()


def kv_gap(cpu: bool, overrides: list[str], before: int, after: int, rows: int,
           lrs: list[float]) -> dict[str, Any]:
    """The log-prob gap between kept and recomputed KV after a version change (module
    docstring)."""
    import torch

    from rlgraph.config.load import load_spec
    from rlgraph.engines.cpu_decode import token_logp
    from rlgraph.engines.static_decode import Request, StaticDecoder
    from rlgraph.engines.static_rollout import seed_device
    from rlgraph.process.workspace import Workspace

    spec = load_spec(GRAPHS / "longtail-1gpu.yaml", overrides)
    device = "cpu" if cpu else "cuda"
    ws = Workspace(spec, ["generate"], seed=0, device=device)
    model = ws.policy.eval()
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    dtype = next(model.parameters()).dtype
    prompts = [[5 + (i % 40), 6, 7 + (i % 13), 8, 9, 10, 11, 12] for i in range(rows)]
    engine = StaticDecoder(model, max_batch=rows, max_len=8 + before + after + 8,
                           eos_token_id=ws.tokenizer.eos_id, sync_every=8, timing=False,
                           compact=False)
    out: dict[str, Any] = {"rows": rows, "tokens_before": before, "tokens_after": after,
                           "dtype": str(dtype), "by_lr": {}}
    for lr in lrs:
        with torch.no_grad():
            for name, t in model.state_dict().items():
                t.copy_(base[name])
        gen = torch.Generator().manual_seed(1)
        update = {n: lr * torch.sign(torch.randn(t.shape, generator=gen)).to(t.device, t.dtype)
                  for n, t in base.items() if t.is_floating_point()}
        seed_device(engine.device, 0)
        engine.set_policy_version(0)
        engine.submit([Request(p, before + after, temperature=1.0, request_id=i,
                               ignore_eos=True) for i, p in enumerate(prompts)])
        done = engine.step()  # the prefill (ngen still holds the last lr's counts before it)
        while engine.busy and min(int(n) for n in engine.ngen[:rows].tolist()) < before:
            done += engine.step()
        swap_start = time.perf_counter()
        with torch.no_grad():  # the dual buffer's in-place copy, as a version change
            for name, t in model.state_dict().items():
                if name in update:
                    t.add_(update[name])
        if device == "cuda":
            torch.cuda.synchronize()
        pause = time.perf_counter() - swap_start
        engine.set_policy_version(1)
        while engine.busy:
            done += engine.step()
        done.sort(key=lambda c: c.request.request_id)
        seqs = torch.tensor([c.request.prompt + c.tokens for c in done], device=device)
        mask = torch.ones_like(seqs)
        versions = torch.tensor([c.versions for c in done], device=device)
        kept = torch.tensor([c.logprobs for c in done], device=device)
        with torch.no_grad():
            v1 = token_logp(model, seqs, mask, 8).float()
            for name, t in model.state_dict().items():
                if name in update:
                    t.sub_(update[name])
            v0 = token_logp(model, seqs, mask, 8).float()
        exact = torch.where(versions == 1, v1, v0)
        gap = (kept - exact).abs()
        after_mask, before_mask = versions == 1, versions == 0

        def stats(x: torch.Tensor) -> dict[str, float]:
            xs = x.flatten().double().cpu()
            return {"mean": round(float(xs.mean()), 6), "p99": round(float(xs.quantile(0.99)), 6),
                    "max": round(float(xs.max()), 6), "n": int(xs.numel())}

        first = after_mask & (after_mask.cumsum(1) <= 32)
        out["by_lr"][f"{lr:g}"] = {
            "kept_vs_recomputed_after_change": stats(gap[after_mask]),
            "kept_vs_recomputed_first_32_after": stats(gap[first]),
            "noise_floor_before_change": stats(gap[before_mask]),
            "version_change_itself_v1_vs_v0": stats((v1 - v0).abs()[after_mask]),
            "mean_signed_kept_minus_recomputed": round(float(
                (kept - exact)[after_mask].double().mean()), 6),
            "swap_pause_s": round(pause, 5)}
        print("kv_gap", lr, json.dumps(out["by_lr"][f"{lr:g}"]), flush=True)
    return out


def bias_figures(trained: list[list[int]], lag: int, k: int, cache: Any,
                 length_of: Any) -> dict[str, Any]:
    """Trained lengths per round (`trained`) against those a synchronous run trains over the
    same number of prompts (`length_of(position, sample)`), after the first `lag + 1` rounds
    (the pipeline's fill) and over all rounds, and what `cache` still holds at the end."""
    steady = [n for r in trained[lag + 1:] for n in r]
    every = [n for r in trained for n in r]
    sync_steady = [length_of(p, s) for p in range(len(steady) // k) for s in range(k)]
    sync_all = [length_of(p, s) for p in range(len(every) // k) for s in range(k)]
    st, ss = length_stats(steady), length_stats(sync_steady)
    at, sa = length_stats(every), length_stats(sync_all)
    return {"trained_after_fill": st, "sync_same_count": ss,
            "mean_over_sync_after_fill": ratio(st["mean"], ss["mean"]),
            "p99_over_sync_after_fill": ratio(st["p99"], ss["p99"]),
            "mean_over_sync_all_rounds": ratio(at["mean"], sa["mean"]),
            "p99_over_sync_all_rounds": ratio(at["p99"], sa["p99"]),
            "in_flight_at_end_samples": cache.samples(),
            "dropped": cache.totals["dropped"]}


def micro_model(longest: int) -> Any:
    """The model spec of the CPU engine checks: a one-layer Llama of width 16 whose positions
    hold `longest` tokens and a prompt."""
    from rlgraph.config.load import load_spec

    return load_spec(GRAPHS / "longtail-1gpu.yaml", [
        "model={hf_config: {model_type: llama, vocab_size: 64, hidden_size: 16, "
        "num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, "
        f"intermediate_size: 16, max_position_embeddings: {longest + 16}}}}}"]).model


def length_bias(overrides: list[str], rounds: int) -> dict[str, Any]:
    """The trained-length bias over a long run, without a model: the runtime's rollout cache
    (`RolloutCache`) over the throughput graph's forced lengths (the same per data position
    as on the GPU), each round decoding every live row `sync_every` tokens between looks
    until its batch is complete; partial rollout as it runs (rows stop at the end of a round
    and go on in the next) and with in-flight updates (groups refilled at every look
    inside the round). Trained lengths against those a synchronous run trains over the same
    number of prompts, after the first `max_lag + 1` rounds (the pipeline's fill) and over
    all rounds, and what is still in flight at the end."""
    from rlgraph.bench_mode import forced_length
    from rlgraph.config.load import load_spec
    from rlgraph.engines.partial_rollout import RolloutCache

    spec = load_spec(GRAPHS / "longtail-1gpu.yaml", [*MODES["split-partial-lag3"], *overrides])
    data, node, lag = spec.data, spec.nodes["generate"], spec.schedule.max_lag
    k, prompts = data.samples_per_prompt, data.prompts_per_step
    out: dict[str, Any] = {"rounds": rounds, "prompts_per_step": prompts, "samples": k,
                           "response_len": data.response_len.model_dump(), "max_lag": lag,
                           "oversample": node.oversample, "stale": node.stale,
                           "sync_every": node.sync_every}
    for inflight in (False, True):
        cache = RolloutCache(prompts_per_step=prompts, samples_per_prompt=k,
                             oversample=node.oversample, max_lag=lag, stale=node.stale,
                             max_new_tokens=data.response_len.max,
                             prompt_of=lambda position: [1],
                             length_of=lambda p, s: forced_length(data.seed, p, s,
                                                                  data.response_len))
        trained: list[list[int]] = []
        for t in range(rounds):
            cache.evict(t, t)
            cache.refill(t, t)
            must = cache.must_finish(t)

            def complete(cache: RolloutCache = cache) -> set[int]:
                return {i for i, g in enumerate(cache.groups) if g.complete}

            done = complete()
            while not (len(done) >= prompts and must <= done):
                if inflight:
                    cache.refill(t, t, taken=min(len(done), prompts))
                for g in cache.groups:
                    for s in g.samples:
                        if not s.finished:
                            n = min(node.sync_every, s.budget - len(s.tokens))
                            s.tokens += [0] * n
                            s.versions += [t] * n
                            s.finished = len(s.tokens) >= s.budget
                done = complete()
            trained.append([len(s.tokens) for g in cache.take() for s in g.samples])
        key = "inflight" if inflight else "partial"
        out[key] = bias_figures(trained, lag, k, cache, lambda p, s: forced_length(
            data.seed, p, s, data.response_len))
        print("length_bias", key, json.dumps(out[key]), flush=True)
    return out


def length_bias_engine(overrides: list[str], rounds: int, scale: int) -> dict[str, Any]:
    """The trained-length bias over a long run on the CPU with the runtime's own decode: the
    rollout cache (`RolloutCache`), `generate_round` and, with in-flight updates,
    `InflightDecode` on the static engine (run eagerly; a micro random-init model, slots as
    the GPU run's). Lengths are the throughput graph's forced lengths divided by `scale`
    and the engine looks every `sync_every / scale` steps (at least 1), so a round decodes
    the same share of each answer between looks as on the GPU. Round t runs under version
    t - 2 (the split plan's measured lag). Trained lengths against those a synchronous run
    trains over as many prompts, after the first `max_lag + 1` rounds and over all."""
    import torch

    from rlgraph.bench_mode import forced_length
    from rlgraph.config.load import load_spec
    from rlgraph.engines.inflight import InflightDecode
    from rlgraph.engines.partial_rollout import RolloutCache, generate_round
    from rlgraph.engines.static_rollout import StaticRollout
    from rlgraph.model.build import build_model
    from rlgraph.model.tokenizer import CharTokenizer

    spec = load_spec(GRAPHS / "longtail-1gpu.yaml", [*MODES["split-partial-lag3"], *overrides])
    data, node, lag = spec.data, spec.nodes["generate"], spec.schedule.max_lag
    k, prompts = data.samples_per_prompt, data.prompts_per_step
    longest = data.response_len.max // scale
    tok = CharTokenizer()
    micro = micro_model(longest)
    torch.set_num_threads(1)

    def length_of(position: int, sample: int) -> int:
        return max(1, forced_length(data.seed, position, sample, data.response_len) // scale)

    out: dict[str, Any] = {"rounds": rounds, "prompts_per_step": prompts, "samples": k,
                           "response_len": data.response_len.model_dump(), "scale": scale,
                           "max_lag": lag, "oversample": node.oversample, "stale": node.stale,
                           "sync_every": max(1, node.sync_every // scale)}
    for inflight in (False, True):
        model = build_model(micro, tok, seed=0).eval()
        cache = RolloutCache(prompts_per_step=prompts, samples_per_prompt=k,
                             oversample=node.oversample, max_lag=lag, stale=node.stale,
                             max_new_tokens=longest, prompt_of=lambda position: [1, 2, 3],
                             length_of=length_of)
        engine = StaticRollout(model, slots=cache.in_flight * k, max_len=longest + 8,
                               eos_id=tok.eos_id, compile=False, top_p=1.0,
                               sync_every=max(1, node.sync_every // scale))
        decode = InflightDecode(engine) if inflight else None
        trained: list[list[int]] = []
        started = time.perf_counter()
        for t in range(rounds):
            with torch.no_grad():
                groups, _ = generate_round(
                    cache, t, model, max(0, t - 2), lambda: None,
                    engine=None if inflight else engine, inflight=decode, eos_id=tok.eos_id,
                    pad_id=tok.pad_id, temperature=1.0,
                    generator=torch.Generator().manual_seed(t))
            trained.append([len(s.tokens) for g in groups for s in g.samples])
        key = "inflight" if inflight else "partial"
        out[key] = {**bias_figures(trained, lag, k, cache, length_of),
                    "cpu_s": round(time.perf_counter() - started, 1)}
        print("length_bias_engine", key, json.dumps(out[key]), flush=True)
    return out


def host_idle(overrides: list[str], rounds: int, scale: int) -> dict[str, Any]:
    """The host's time per look that a GPU would idle on, measured on the CPU: from the
    slot read that waits for a look's decode steps to the launch of the next look's steps,
    less the prefill computed in between (device work), over `rounds` rounds of the
    throughput graph's forced lengths divided by `scale` (the micro model of
    `length_bias_engine`, the GPU run's slots), partial rollout with and without in-flight
    updates. The first two rounds are left out."""
    import torch

    from rlgraph.bench_mode import forced_length
    from rlgraph.config.load import load_spec
    from rlgraph.engines import static_decode
    from rlgraph.engines.inflight import InflightDecode
    from rlgraph.engines.partial_rollout import RolloutCache, generate_round
    from rlgraph.engines.static_rollout import StaticRollout
    from rlgraph.model.build import build_model
    from rlgraph.model.tokenizer import CharTokenizer

    spec = load_spec(GRAPHS / "longtail-1gpu.yaml", [*MODES["split-partial-lag3"], *overrides])
    data, node, lag = spec.data, spec.nodes["generate"], spec.schedule.max_lag
    k, prompts, longest = data.samples_per_prompt, data.prompts_per_step, \
        data.response_len.max // scale
    tok = CharTokenizer()
    micro = micro_model(longest)
    torch.set_num_threads(1)
    cls = static_decode.StaticDecoder
    read, run, prefill = cls._read_slots, cls._run, cls._prefill
    state = {"since": None, "launched": False, "prefill": 0.0, "idle": 0.0, "looks": 0}

    def timed_read(self: Any) -> Any:
        out = read(self)
        if state["launched"]:  # the read that waits for a look's launched steps
            state.update(since=time.perf_counter(), launched=False, prefill=0.0)
        return out

    def timed_run(self: Any, *key: Any) -> None:
        if not state["launched"] and state["since"] is not None:
            state["idle"] += time.perf_counter() - state["since"] - state["prefill"]
            state["looks"] += 1
        state["launched"] = True
        run(self, *key)

    def timed_prefill(self: Any, *args: Any) -> None:
        began = time.perf_counter()
        prefill(self, *args)
        if not state["launched"]:
            state["prefill"] += time.perf_counter() - began

    out: dict[str, Any] = {"rounds": rounds, "scale": scale, "sync_every": node.sync_every,
                           "prompts_per_step": prompts}
    cls._read_slots, cls._run, cls._prefill = timed_read, timed_run, timed_prefill
    try:
        for inflight in (False, True):
            model = build_model(micro, tok, seed=0).eval()
            cache = RolloutCache(
                prompts_per_step=prompts, samples_per_prompt=k, oversample=node.oversample,
                max_lag=lag, stale=node.stale, max_new_tokens=longest,
                prompt_of=lambda position: [1, 2, 3],
                length_of=lambda p, s: max(1, forced_length(data.seed, p, s,
                                                            data.response_len) // scale))
            engine = StaticRollout(model, slots=cache.in_flight * k, max_len=longest + 8,
                                   eos_id=tok.eos_id, compile=False, top_p=1.0,
                                   sync_every=node.sync_every)
            decode = InflightDecode(engine) if inflight else None
            for t in range(rounds):
                if t == 2:
                    state.update(idle=0.0, looks=0)
                with torch.no_grad():
                    generate_round(cache, t, model, max(0, t - 2), lambda: None,
                                   engine=None if inflight else engine, inflight=decode,
                                   eos_id=tok.eos_id, pad_id=tok.pad_id, temperature=1.0,
                                   generator=torch.Generator().manual_seed(t))
            key = "inflight" if inflight else "partial"
            out[key] = {"looks": state["looks"],
                        "host_idle_ms_per_look": round(state["idle"] / state["looks"] * 1e3, 3)}
            print("host_idle", key, json.dumps(out[key]), flush=True)
    finally:
        cls._read_slots, cls._run, cls._prefill = read, run, prefill
    return out


def window_rate(r: dict[str, Any], first: int = 1) -> float | None:
    """Samples a second from version `first` on (1: after the warm-up version), from the
    node events. A plan whose tasks share one GPU group runs them one after another, and
    partial rollout may run step 1's generate before step 0's train: the window between
    train ends (`samples_per_s_steady`) then holds one generate fewer than trains. Here the
    window runs from the start of the first generate of version `first` to the end of the
    last event, less the earlier versions' events inside it. A plan of several groups
    overlaps them: its window runs from the train end before version `first` to the last."""
    events, k = r.get("events") or [], r.get("mini_batches", 1)
    steady = [e for e in events if e["step"] >= first * k]
    trained = len({e["step"] for e in steady if e["node"] == "train"})
    if not trained:
        return None if first > 1 else r.get("samples_per_s_steady")
    last = max(e["step"] for e in events if e["node"] == "train")
    end = max(e["end"] for e in events if e["step"] <= last)
    if len(r.get("groups", {})) == 1:
        start = min(e["start"] for e in steady if e["node"] == "generate")
        # less the earlier versions' events, and the later steps' (a run stopped on time)
        end -= sum(e["end"] - e["start"] for e in events
                   if (e["step"] < first * k or e["step"] > last)
                   and e["start"] >= start and e["end"] <= end)
    else:
        start = max(e["end"] for e in events if e["node"] == "train"
                    and e["step"] == first * k - 1)
    return round(r["samples_per_step"] * trained / (end - start), 3)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b rounded, None when either is missing."""
    return round(a / b, 3) if a and b else None


def merge(parts: list[Path]) -> dict[str, Any]:
    """One result from the part files: their modes, kv gap, and the plans table."""
    res: dict[str, Any] = {"parts": {}, "modes": {}}
    for path in parts:
        part = json.loads(path.read_text())
        res["parts"][path.stem] = {k: part.get(k) for k in ("command", "machine", "device",
                                                            "date", "overrides")}
        res["modes"].update(part.get("modes", {}))
        for key in ("kv_gap", "length_bias_long_run", "length_bias_engine"):
            if key in part:
                res[key] = part[key]
    first = next(json.loads(p.read_text()) for p in parts
                 if "device" in json.loads(p.read_text()))
    res.update(machine=first["machine"], device=first["device"], workload=first["workload"])
    return plan_table(res)


def rate_to_prefix(r: dict[str, Any], prefix: int) -> tuple[float | None, int]:
    """Samples a second from the end of the warm-up version's train step to the end of the
    first train step after which every data position below `prefix` is trained, counting
    every sample trained in between (positions beyond `prefix` too); and that step."""
    done = r["lengths"].get("prefix_by_step") or []
    k = r.get("mini_batches", 1)
    ends = {e["step"]: e["end"] for e in r.get("events") or [] if e["node"] == "train"}
    step = next((s for s, p in enumerate(done) if p >= prefix), None)
    if step is None or step < k or step not in ends or k - 1 not in ends:
        return None, -1
    samples = r["samples_per_step"] * (step + 1 - k)  # per train step (a mini-batch's)
    return round(samples / (ends[step] - ends[k - 1]), 3), step


def same_work(r: dict[str, Any], base: dict[str, Any] | None) -> dict[str, Any]:
    """A plan against another (the same plan without in-flight updates) over windows that
    hold the same long samples: each run's window ends at the train step after which every
    data position below P is trained, P the smaller of the two runs' final prefixes. A
    window of so many steps rates whatever long samples fell into it (one of 8192 tokens
    decodes for ~30 s at any width), and partial rollout trains the long ones late."""
    if base is None or "error" in base:
        return {}
    ours, theirs = (x["lengths"].get("prefix_by_step") or [0] for x in (r, base))
    prefix = min(ours[-1], theirs[-1])
    (rate, step), (base_rate, base_step) = rate_to_prefix(r, prefix), rate_to_prefix(base,
                                                                                     prefix)
    return {"prefix": prefix, "samples_per_s": rate, "until_step": step,
            "other_samples_per_s": base_rate, "other_until_step": base_step,
            "over_other": ratio(rate, base_rate)}


def same_steps(r: dict[str, Any], base: dict[str, Any] | None
               ) -> tuple[dict[str, float], dict[str, float]]:
    """Trained lengths of `r` and of `base` (the same plan without in-flight updates) over
    the steps both ran: a paired comparison (both admit the same data positions in order),
    free of the sampling spread a comparison with sync's positions has."""
    if base is None:
        return {}, {}
    ours, theirs = r["lengths"].get("trained_by_step"), base["lengths"].get("trained_by_step")
    if not ours or not theirs:
        return {}, {}
    n = min(len(ours), len(theirs))
    return (length_stats([x for step in ours[:n] for x in step]),
            length_stats([x for step in theirs[:n] for x in step]))


def plan_table(res: dict[str, Any]) -> dict[str, Any]:
    """`plans` and `targets` from the measured modes (rates over `window_rate`'s window)."""
    plans = []
    for name, gpus, mode, without in PLANS:
        r = res["modes"].get(mode)
        if not r or "error" in r:
            continue
        base = res["modes"].get(without) if without else None
        rate = window_rate(r)
        base_rate = window_rate(base) if base and "error" not in base else None
        fill = r["max_lag"] + 1  # versions until the cache holds its steady mix
        after = window_rate(r, fill)
        base_after = window_rate(base, fill) if base and "error" not in base else None
        lengths = r["lengths"]
        sync, trained = lengths["sync_same_steps"], lengths["trained"]
        sync_after = lengths.get("sync_same_steps_after_fill", {})
        trained_after = lengths.get("trained_after_fill", {})
        paired, base_paired = same_steps(r, base if base and "error" not in base else None)
        plans.append({
            "name": name, "mode": mode, "gpus": gpus,
            "samples_per_s": rate,
            "samples_per_s_between_train_ends": r["samples_per_s_steady"],
            "samples_per_s_after_fill": after,
            "over_without_inflight_after_fill": ratio(after, base_after),
            "over_without_inflight": ratio(rate, base_rate),
            "same_work": same_work(r, base),
            "without_inflight_samples_per_s": base_rate,
            "trained_mean_over_sync": ratio(trained["mean"], sync["mean"]),
            "trained_p99_over_sync": ratio(trained["p99"], sync["p99"]),
            "trained_mean_over_sync_after_fill": ratio(trained_after.get("mean"),
                                                       sync_after.get("mean")),
            "trained_p99_over_sync_after_fill": ratio(trained_after.get("p99"),
                                                      sync_after.get("p99")),
            "trained_samples_after_fill": trained_after.get("n", 0),
            "sync_own_spread_after_fill": lengths.get("sync_spread_after_fill"),
            "trained_mean_over_without_inflight": ratio(paired.get("mean"),
                                                        base_paired.get("mean")),
            "trained_p99_over_without_inflight": ratio(paired.get("p99"), base_paired.get("p99")),
            "trained_samples_over_without_inflight": paired.get("n", 0),
            "trained_mean_over_started": ratio(trained["mean"], lengths["started"]["mean"]),
            "in_flight_at_end_samples": lengths["started_not_trained_in_flight_at_end"],
            "share_dropped": lengths.get("share_dropped"),
            "predicted_samples_per_s": r["predicted_samples_per_s"],
            "predicted_over_measured": ratio(r["predicted_samples_per_s"], rate),
            "predicted_over_measured_after_fill": ratio(r["predicted_samples_per_s"], after),
            "lag_max": r["lag_max"], "lag_violations": r["lag_violations"],
            "stale_tokens": sum(x or 0 for x in r["per_step"].get("lag/stale_tokens", [])),
            "steps": r["steps"]})
    res["plans"] = plans
    by = {p["mode"]: p for p in plans}
    split = next((by[m] for m in (f"split-partial-lag{lag}-inflight" for lag in SPLIT_LAGS)
                  if m in by), None)  # the lag 3 first, where the file has it
    stream = by.get("stream4-colocated-lag3-inflight")
    unstreamed = by.get("partial-lag3")
    res["targets"] = {
        "split_inflight_over_without_at_least_1.3": split and split["over_without_inflight"],
        "split_inflight_over_without_after_fill_at_least_1.3": split and split[
            "over_without_inflight_after_fill"],
        "split_inflight_over_without_same_work_at_least_1.3": split and split[
            "same_work"].get("over_other"),
        "split_trained_mean_within_5pct_of_sync": split and split["trained_mean_over_sync"],
        "split_trained_p99_within_5pct_of_sync": split and split["trained_p99_over_sync"],
        "split_trained_mean_within_5pct_of_sync_after_fill": split and split[
            "trained_mean_over_sync_after_fill"],
        "split_trained_p99_within_5pct_of_sync_after_fill": split and split[
            "trained_p99_over_sync_after_fill"],
        "one_gpu_streamed_inflight_over_unstreamed_partial_at_least_1": ratio(
            stream and stream["samples_per_s"], unstreamed and unstreamed["samples_per_s"]),
        "one_gpu_streamed_inflight_over_unstreamed_partial_same_work": same_work(
            res["modes"]["stream4-colocated-lag3-inflight"], res["modes"]["partial-lag3"]).get(
            "over_other") if stream and unstreamed else None,
        "predicted_within_25pct": {p["mode"]: p["predicted_over_measured"] for p in plans},
        "no_lag_violation": all(p["lag_violations"] == 0 and p["stale_tokens"] == 0
                                for p in plans),
    }
    return res


def main() -> int:
    """Run a part (modes or the kv gap) or merge parts; print a table; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--kv-gap", action="store_true")
    parser.add_argument("--kv-gap-rows", type=int, default=64)
    parser.add_argument("--kv-gap-before", type=int, default=256)
    parser.add_argument("--kv-gap-after", type=int, default=256)
    parser.add_argument("--kv-gap-lr", default="1e-4,1e-3")
    parser.add_argument("--length-bias", type=int, metavar="ROUNDS",
                        help="the trained-length bias over ROUNDS rounds (no model, CPU)")
    parser.add_argument("--length-bias-engine", type=int, metavar="ROUNDS",
                        help="the trained-length bias over ROUNDS rounds of the runtime's "
                             "decode (micro model, CPU)")
    parser.add_argument("--length-scale", type=int, default=8,
                        help="--length-bias-engine: lengths (and look interval) divided by this")
    parser.add_argument("--host-idle", type=int, metavar="ROUNDS",
                        help="the host's time per look a GPU would idle on (CPU, micro model)")
    parser.add_argument("--merge", nargs="*", type=Path)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default="gpu-inflight")
    parser.add_argument("--cpu", action="store_true", help="rehearse on the CPU, tiny shapes")
    parser.add_argument("--until-prefix", type=int, metavar="P",
                        help="a mode stops after the train step that has trained every data "
                             "position below P (the same work for every plan, long tails "
                             "included)")
    parser.add_argument("--stop-after-s", type=float,
                        help="a mode still running this many seconds after the start stops "
                             "after its running tasks (its figures cover the steps it finished)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    stop_at = STARTED + args.stop_after_s if args.stop_after_s else None
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    if args.length_bias:
        res = {"machine": machine(), "command": " ".join(sys.argv),
               "length_bias_long_run": length_bias(args.overrides, args.length_bias)}
        path.write_text(json.dumps(res, indent=1) + "\n")
        return 0
    if args.length_bias_engine:
        res = {"machine": machine(), "command": " ".join(sys.argv),
               "length_bias_engine": length_bias_engine(args.overrides, args.length_bias_engine,
                                                        args.length_scale)}
        path.write_text(json.dumps(res, indent=1) + "\n")
        return 0
    if args.host_idle:
        print(json.dumps(host_idle(args.overrides, args.host_idle, args.length_scale)))
        return 0
    if args.merge:
        res = merge(args.merge)
        res["command"] = " ".join(sys.argv)
        path.write_text(json.dumps(res, indent=1, default=str) + "\n")
        def cells(p: dict[str, Any], keys: tuple[str, ...]) -> str:
            return "".join(f"{'-' if p[k] is None else p[k]:>10}" for k in keys)

        print(f"{'plan':<72}{'GPUs':>5}{'samples/s':>10}{'x without':>10}"
              f"{'mean/sync':>10}{'p99/sync':>10}{'pred/meas':>10}")
        for p in res["plans"]:
            print(f"{p['name']:<72}{p['gpus']:>5}" + cells(p, (
                "samples_per_s", "over_without_inflight", "trained_mean_over_sync",
                "trained_p99_over_sync", "predicted_over_measured")))
            print(f"{'  after the fill (versions max_lag + 1 on)':<77}" + cells(p, (
                "samples_per_s_after_fill", "over_without_inflight_after_fill",
                "trained_mean_over_sync_after_fill", "trained_p99_over_sync_after_fill",
                "predicted_over_measured_after_fill")))
        print(json.dumps(res["targets"], indent=1))
        return 0
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_inflight: no CUDA device here; rehearse with --cpu")
        return 0
    overrides = [*(CPU + CPU_MODES if args.cpu else []), *args.overrides]
    res: dict[str, Any] = {
        "machine": machine(), "device": device_info(dry=args.cpu),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv), "overrides": overrides,
        "workload": "BENCHMARK MODE (generate.forced_lengths): response lengths forced per "
                    "sample, eos ignored; bench/graphs_gpu/longtail-1gpu.yaml "
                    + " ".join(overrides), "modes": {}}

    def save() -> None:
        path.write_text(json.dumps(res, indent=1, default=str) + "\n")

    if args.kv_gap:
        res["kv_gap"] = kv_gap(args.cpu, overrides, args.kv_gap_before, args.kv_gap_after,
                               args.kv_gap_rows, [float(x) for x in args.kv_gap_lr.split(",")])
        save()
    modes = [m for m in args.modes.split(",") if m]
    if modes:
        throughput(modes, args.steps, overrides, args.out, res, save, stop_at,
                   args.until_prefix)
    for mode, r in res["modes"].items():
        if "error" in r:
            print(f"{mode:<34} failed: {r['error'][:90]}")
            continue
        tr = r["lengths"]["trained"]
        print(f"{mode:<34}{r['samples_per_s_steady'] or 0:>9.2f} samples/s, predicted "
              f"{r['predicted_samples_per_s']:.2f}; trained mean {tr.get('mean', 0)} "
              f"(sync {r['lengths']['sync_same_steps'].get('mean')}), lag max {r['lag_max']}")
    return 0 if all("error" not in r for r in res["modes"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
