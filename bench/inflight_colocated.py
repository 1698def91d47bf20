"""In-flight weight updates on ONE GPU, on the CPU: a timed model of the colocated plans
(generate, logp and train time-share the device) that drives the runtime's rollout cache.

    python bench/inflight_colocated.py [--batches 60] [--out DIR]

On one GPU nothing overlaps: a generate call, then logp and train of what it emitted, then
the next call. Every decode step is paid by the whole loop, and the engine (its rows kept
from one call to the next with in-flight updates) does not decode while train runs. The
model runs, over the long-tail workload's forced lengths per data position (every plan
admits the same samples in the same order):

- `partial`: the unstreamed partial rollout (one call a step; carried rows re-encoded at a
  call's start);
- `stream`: colocated streaming (K mini-batch calls a version), partial rollout, no
  in-flight updates (carried rows re-encoded at every call);
- `stream+inflight`: the same with in-flight updates (rows stay in the engine; free slots
  are refilled with whole groups at every look, `RolloutCache.refill(room=)`), with the
  cache's `reserve` (the runtime's rule for a generate that shares train's GPU) or without
  it (the rule before, which filled the version's window to the brim);
- `partial+inflight`: the unstreamed partial rollout with in-flight updates, likewise.

Each look's `sync_every` decode steps cost `pricing.decode_step.decode_step_seconds` for that
look's live rows, their mean context and the longest row (H200). logp + train per step or
mini-batch, the carried rows' re-encode and a call's time outside the engine are the medians
of the one-GPU call (bench/results/gpu-inflight-1gpu.json). Each plan is rated in samples/s
from its first train's end until every data position below P is trained, P the smallest
final prefix of the plans (the same work, long samples included), with the trained lengths
against sync's and what is in flight at the end. Writes inflight-colocated.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import machine  # noqa: E402
from bench.gpu_inflight import GRAPHS, MODES, ratio  # noqa: E402
from bench.inflight_pipeline import (  # noqa: E402
    decode_look,
    prefixes,
    rate_to_prefix,
    step_pricer,
    trained_over_sync,
)

CALL = ROOT / "bench" / "results" / "gpu-inflight-1gpu.json"
STREAMED, UNSTREAMED = "stream4-colocated-lag3-inflight", "partial-lag3"


def measured_times(call: dict[str, Any]) -> dict[str, float]:
    """Medians (seconds) of the one-GPU call: logp + train a step (unstreamed) and a
    mini-batch (streamed), the carried rows' re-encode at a call's start (unstreamed) and a
    call's time outside the engine (both plans)."""
    out: dict[str, list[float]] = {"train_step_s": [], "train_mini_batch_s": [],
                                   "reencode_s": [], "call_s": []}
    for mode, key in ((UNSTREAMED, "train_step_s"), (STREAMED, "train_mini_batch_s")):
        r = call["modes"][mode]
        nodes, per = r["node_s_per_step"], r["per_step"]
        out[key] += [a + b for a, b in zip(nodes["logp"][1:], nodes["train"][1:], strict=False)]
        gens = sorted((e for e in r["events"] if e["node"] == "generate"),
                      key=lambda e: e["step"])
        out["call_s"] += [e["end"] - e["start"] - (s or 0.0) - (p or 0.0) for e, s, p in zip(
            gens[1:], per["generate/engine_s"][1:], per["generate/prefill_s"][1:],
            strict=False) if s is not None]
        if mode == UNSTREAMED:
            out["reencode_s"] += [x for x in per["generate/prefill_s"][1:] if x]
    return {k: round(statistics.median(v), 5) for k, v in out.items()}


def run(plan: str, batches: int, times: dict[str, float], overrides: list[str],
        reserve: bool = True) -> dict[str, Any]:
    """The model (module docstring) of `plan` ("partial", "partial+inflight", "stream",
    "stream+inflight") for
    `batches` steps: per call its decode steps and seconds, mean live rows, train end and
    trained data positions; the cache's totals and what is in flight at the end.
    `reserve`: in-flight refills keep the reserve of a generate sharing train's GPU (the
    runtime's rule; False: the rule before it, which the GPU call ran)."""
    from rlgraph.bench_mode import forced_length
    from rlgraph.config.load import load_spec
    from rlgraph.engines.partial_rollout import RolloutCache

    streamed, inflight = plan.startswith("stream"), plan.endswith("inflight")
    mode = STREAMED if streamed else UNSTREAMED
    spec = load_spec(GRAPHS / "longtail-1gpu.yaml", [
        *[o for o in MODES[mode] if "inflight" not in o],
        *(["nodes.generate.inflight=true"] if inflight else []), *overrides])
    data, node, k = spec.data, spec.nodes["generate"], spec.schedule.mini_batches
    look, price = node.sync_every, step_pricer(spec)
    cache = RolloutCache(
        prompts_per_step=data.prompts_per_step // k, samples_per_prompt=data.samples_per_prompt,
        oversample=k * node.oversample, max_lag=spec.schedule.max_lag, stale=node.stale,
        stride=k, max_new_tokens=data.response_len.max, prompt_of=lambda position: [1],
        length_of=lambda p, s: forced_length(data.seed, p, s, data.response_len),
        shares_device=inflight and reserve)
    slots = cache.in_flight * data.samples_per_prompt  # as generate sizes its engine
    train_s = times["train_mini_batch_s" if streamed else "train_step_s"]
    now = 0.0
    out: dict[str, Any] = {"decode_steps": [], "decode_s": [], "mean_width": [],
                           "train_end_s": [], "call_positions": []}
    for call in range(batches * k):
        version = call // k  # one GPU: train of every earlier mini-batch has run
        now += times["call_s"]
        cache.evict(call, version)
        cache.refill(call, version)
        if not inflight and any(s.tokens and not s.finished
                                for g in cache.groups for s in g.samples):
            now += times["reencode_s"]
        must = cache.must_finish(call, started=inflight)
        steps, seconds, rows_steps = 0, 0.0, 0
        while True:
            done = {i for i, g in enumerate(cache.groups) if g.complete}
            if len(done) >= cache.prompts_per_step and must <= done:
                break
            if inflight:  # the engine's free slots (one a row), whole groups
                busy = sum(not s.finished for g in cache.groups for s in g.samples)
                if cache.refill(call, version, room=(slots - busy) // data.samples_per_prompt):
                    must = cache.must_finish(call, started=True)
            live = [s for g in cache.groups for s in g.samples if not s.finished]
            cost = decode_look(live, look, version, data.prompt_len, price)
            now += look * cost
            steps, seconds, rows_steps = steps + look, seconds + look * cost, \
                rows_steps + look * len(live)
        now += train_s
        out["decode_steps"].append(steps)
        out["decode_s"].append(round(seconds, 3))
        out["mean_width"].append(round(rows_steps / steps, 1) if steps else None)
        out["train_end_s"].append(round(now, 3))
        out["call_positions"].append([g.position for g in cache.take()])
    # a step is K calls: its train end is its last mini-batch's
    out["positions"] = [[p for batch in out["call_positions"][i:i + k] for p in batch]
                        for i in range(0, batches * k, k)]
    out["step_end_s"] = out["train_end_s"][k - 1::k]
    out["totals"] = dict(cache.totals)
    out["in_flight_at_end_samples"] = sum(1 for g in cache.groups for s in g.samples
                                          if s.tokens or inflight)
    return out


def main() -> int:
    """Run each one-GPU plan for `--batches` steps; rate them to the same prefix; write the
    JSON."""
    from rlgraph.config.load import load_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    call = json.loads(CALL.read_text())
    times = measured_times(call)
    overrides = ["data.prompts_per_step=32"]  # the GPU call's workload
    spec = load_spec(GRAPHS / "longtail-1gpu.yaml", overrides)
    per_step = spec.data.prompts_per_step * spec.data.samples_per_prompt
    began = time.perf_counter()
    plans = {"partial": ("partial", True), "stream": ("stream", True),
             "stream+inflight (no reserve)": ("stream+inflight", False),
             "stream+inflight": ("stream+inflight", True),
             "partial+inflight (no reserve)": ("partial+inflight", False),
             "partial+inflight": ("partial+inflight", True)}
    runs = {name: run(plan, args.batches, times, overrides, reserve)
            for name, (plan, reserve) in plans.items()}
    prefix = min(prefixes(r["positions"])[-1] for r in runs.values())
    base, _ = rate_to_prefix(runs["partial"], prefix, per_step, "step_end_s")
    table = {}
    for name, r in runs.items():
        rate, step = rate_to_prefix(r, prefix, per_step, "step_end_s")
        widths = [w for w in r["mean_width"] if w]
        table[name] = {
            "samples_per_s": rate, "until_step": step,
            "over_unstreamed_partial": ratio(rate, base),
            "trained_over_sync": trained_over_sync(r, step, spec),
            "decode_steps_per_step": round(sum(r["decode_steps"]) / args.batches, 1),
            "decode_s_per_step": round(sum(r["decode_s"]) / args.batches, 3),
            "live_rows_mean": round(statistics.fmean(widths), 1) if widths else None,
            "dropped_samples": r["totals"]["dropped"],
            "in_flight_at_end_samples": r["in_flight_at_end_samples"]}
        print(f"{name:30s} {json.dumps(table[name])}", flush=True)
    res = {"benchmark": "inflight_colocated", "machine": machine(), "command": " ".join(sys.argv),
           "times_from": CALL.name, "times_s": times, "decode_step": "physics: pricing."
           "decode_step.decode_step_seconds per look (H200)", "batches": args.batches,
           "prefix": prefix, "plans": table, "cpu_s": round(time.perf_counter() - began, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inflight-colocated.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
