"""In-flight weight updates over a long run of the split plan, on the CPU: a timed model of
the pipeline that drives the runtime's own rollout cache, checked against two GPU calls.

    python bench/inflight_pipeline.py [--batches 100] [--lags 3,6,8] [--out DIR]

Why a model: on the long-tail workload a window of a few steps is rated by whichever long
samples fall into it (a sample of 8192 tokens decodes for ~30 s), and a long run on the GPU
does not fit a device budget. The model runs the split plan of bench/gpu_inflight.py
(generate on one GPU; logp and train on the other) for `--batches` batches:

- the rollout cache is the runtime's (`RolloutCache`: eviction, admission, in-flight
  refills, must-finish under `stale: finish`), over the workload's forced lengths per data
  position, so every plan admits the same samples in the same order;
- generate call t starts when call t-1 has ended and version t - max_lag exists; each look
  decodes `sync_every` tokens of every unfinished sample and adopts the newest version; a
  call ends when its batch is complete (with every must-finish group); without in-flight
  updates a call first re-encodes its carried rows, with them a call refills at every look:
  `slots` (the runtime's rule: whole groups into the engine's free slots, within the
  version's window, `RolloutRules.target` with `room`) or `taken` (the rule before it: the
  complete groups' places, `in_flight + taken` groups held, and must-finish only for the
  groups due now, as the GPU calls ran);
- each look's steps cost what the cost model's physics gives for that look's live rows,
  their mean context and the longest (`pricing.decode_step.decode_step_seconds`: weights and
  KV at HBM speed, the static engine's split-KV attention bound by its longest row, the
  per-layer floor, the engine revision's host time; `--flat` prices every step at the GPU
  call's median instead);
- train (with logp) of batch t starts when the batch is complete and train t-1 has ended;
  its end makes version t + 1.

The other times are medians of the GPU call in bench/results/gpu-inflight.json (the split
pair at max_lag 3): logp + train, the carried rows' re-encode (`generate/prefill_s` without
in-flight updates) and a call's time outside the engine. The checks: per batch, the
model's decode steps and ms a step against those of that call and of the max_lag-8 call
(gpu-inflight-lag8.json), both run with the `taken` rule, and the same-work ratio
(`gpu_inflight.same_work`) of the max_lag-3 call; then the same for the max_lag-8 call that
ran the `slots` rule (gpu-inflight-slots.json). Then, per max_lag, each plan's
samples/s until every data position below P is trained, P the smallest final prefix, and
the trained lengths against sync's over the same number of samples. Writes
inflight-pipeline.json.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import machine  # noqa: E402
from bench.gpu_inflight import GRAPHS, MODES, ratio  # noqa: E402

CALL = ROOT / "bench" / "results" / "gpu-inflight.json"
CALL_LAG8 = ROOT / "bench" / "results" / "gpu-inflight-lag8.json"
CALL_SLOTS = ROOT / "bench" / "results" / "gpu-inflight-slots.json"
PAIR = ("split-partial-lag3-inflight", "split-partial-lag3")
REFILLS = ("slots", "taken")  # the runtime's in-flight refill rule, and the one before it


def measured_times(call: dict[str, Any]) -> dict[str, float]:
    """Medians over the steps after the first of the split pair's GPU runs (seconds)."""
    steps, trains, reencode, outside = [], [], [], []
    for mode in PAIR:
        r = call["modes"][mode]
        per, nodes = r["per_step"], r["node_s_per_step"]
        steps += [x / 1e3 for x in per["generate/decode_ms_per_step"][1:] if x]
        trains += [a + b for a, b in zip(nodes["logp"][1:], nodes["train"][1:], strict=False)]
        gens = sorted((e for e in r["events"] if e["node"] == "generate"),
                      key=lambda e: e["step"])
        outside += [e["end"] - e["start"] - s for e, s
                    in zip(gens[1:], per["generate/engine_s"][1:], strict=False) if s]
        if mode == "split-partial-lag3":
            reencode += [x for x in per["generate/prefill_s"][1:] if x]
    return {name: round(statistics.median(xs), 5) for name, xs in (
        ("decode_step_s", steps), ("train_s", trains), ("reencode_s", reencode),
        ("call_s", outside))}


def step_pricer(spec: Any) -> Callable[[int, float, float], float]:
    """Seconds of one decode step of the generate replica over `rows` live rows of mean
    context `context` and longest `longest`: the cost model's physics
    (`pricing.decode_step.decode_step_seconds`: weights and KV read at HBM speed, the static
    engine's split-KV attention bound by its longest row, the per-layer floor and the engine
    revision's host time, each a cited measurement), on the graph's GPU."""
    from rlgraph.compiler.shapes import shape_of
    from rlgraph.presets.gpus import GPU_PRESETS
    from rlgraph.pricing.context import CostContext
    from rlgraph.pricing.decode_step import decode_step_seconds

    node = spec.nodes["generate"]
    ctx = CostContext(spec=spec, name="generate", shape=shape_of(spec),
                      gpu=GPU_PRESETS[spec.cluster.gpu], gpus=1, extra={"local": False})
    return lambda rows, context, longest: decode_step_seconds(rows, context, node, ctx,
                                                              longest)


def decode_look(live: list[Any], look: int, version: int, prompt_len: int = 0,
                price: Callable[[int, float, float], float] | None = None) -> float:
    """Decode `look` steps of the `live` rows (their tokens tagged `version`, a row stops at
    its budget); the seconds a step of the look costs by `price` (live rows, mean context,
    longest context: `step_pricer`), 0.0 without one."""
    cost = 0.0
    if price is not None:
        contexts = [prompt_len + len(s.tokens) + look / 2 for s in live]
        cost = price(len(live), sum(contexts) / len(contexts), max(contexts))
    for sample in live:
        n = min(look, sample.budget - len(sample.tokens))
        sample.tokens += [0] * n
        sample.versions += [version] * n
        sample.finished = len(sample.tokens) >= sample.budget
    return cost


def due_now(cache: Any, step: int) -> set[int]:
    """The must-finish rule before the look-ahead (with the `taken` refill it replaced): the
    groups the next call could no longer train, at most a batch in admission order."""
    floor = cache.rules.floor(step + 1)
    old = [i for i, g in enumerate(cache.groups) if (v := g.oldest()) is not None and v < floor]
    return set(old[:cache.prompts_per_step])


def run(inflight: bool, batches: int, max_lag: int, times: dict[str, float],
        overrides: list[str], physics: bool = True, refill: str = "slots") -> dict[str, Any]:
    """The model (module docstring) for `batches` batches: per batch its decode steps,
    decode seconds, mean live rows, train end, trained data positions and the generator's
    version lag at the call start; the cache's totals. `physics`: each look's steps priced
    by `step_pricer` (live rows, context and longest row of that look), else at the flat
    measured median. `refill`: the in-flight refill rule (`REFILLS`)."""
    from rlgraph.bench_mode import forced_length
    from rlgraph.config.load import load_spec
    from rlgraph.engines.partial_rollout import RolloutCache

    spec = load_spec(GRAPHS / "longtail-1gpu.yaml",
                     [*MODES[f"split-partial-lag3{'-inflight' if inflight else ''}"],
                      *overrides, f"schedule.max_lag={max_lag}"])
    data, node = spec.data, spec.nodes["generate"]
    prompts, look = data.prompts_per_step, node.sync_every
    price = step_pricer(spec) if physics else None
    cache = RolloutCache(prompts_per_step=prompts, samples_per_prompt=data.samples_per_prompt,
                         oversample=node.oversample, max_lag=max_lag, stale=node.stale,
                         max_new_tokens=data.response_len.max, prompt_of=lambda position: [1],
                         length_of=lambda p, s: forced_length(data.seed, p, s,
                                                              data.response_len))
    slots = cache.in_flight * data.samples_per_prompt  # as generate sizes its engine
    now, ends = 0.0, []  # the generator's clock; train ends (version v exists at ends[v - 1])
    out: dict[str, list] = {"decode_steps": [], "decode_s": [], "mean_width": [],
                            "train_end_s": [], "positions": [], "lag": []}
    for t in range(batches):
        if t - max_lag > 0:
            now = max(now, ends[t - max_lag - 1])
        now += times["call_s"]
        version = bisect.bisect_right(ends, now)
        out["lag"].append(t - version)
        cache.evict(t, version)
        cache.refill(t, version)
        if not inflight and any(s.tokens and not s.finished
                                for g in cache.groups for s in g.samples):
            now += times["reencode_s"]
        must = (cache.must_finish(t, started=True) if inflight and refill == "slots" else
                cache.must_finish(t) if not inflight else due_now(cache, t))
        steps, seconds, rows_steps = 0, 0.0, 0
        while True:
            done = {i for i, g in enumerate(cache.groups) if g.complete}
            if len(done) >= prompts and must <= done:
                break
            if inflight and refill == "slots":  # the engine's free slots (one a row)
                busy = sum(not s.finished for g in cache.groups for s in g.samples)
                if cache.refill(t, version, room=(slots - busy) // data.samples_per_prompt):
                    must = cache.must_finish(t, started=True)
            elif inflight:
                cache.refill(t, version, taken=min(len(done), prompts))
                must = due_now(cache, t)
            live = [s for g in cache.groups for s in g.samples if not s.finished]
            cost = decode_look(live, look, version, data.prompt_len, price)
            if price is None:  # --flat: every step at the calls' median
                cost = times["decode_step_s"]
            now += look * cost
            steps, seconds, rows_steps = steps + look, seconds + look * cost, \
                rows_steps + look * len(live)
            version = bisect.bisect_right(ends, now)
        ends.append(max(now, ends[-1] if ends else 0.0) + times["train_s"])
        out["decode_steps"].append(steps)
        out["decode_s"].append(round(seconds, 3))
        out["mean_width"].append(round(rows_steps / steps, 1) if steps else None)
        out["train_end_s"].append(round(ends[-1], 3))
        out["positions"].append([g.position for g in cache.take()])
    out["totals"] = dict(cache.totals)
    return out


def prefixes(positions: list[list[int]]) -> list[int]:
    """After each batch, the count P of data positions 0..P-1 all trained."""
    seen: set[int] = set()
    out, prefix = [], 0
    for batch in positions:
        seen.update(batch)
        while prefix in seen:
            prefix += 1
        out.append(prefix)
    return out


def rate_to_prefix(r: dict[str, Any], prefix: int, samples_per_step: int,
                   ends_key: str = "train_end_s") -> tuple[float, int]:
    """Samples a second from the first batch's train end (`r[ends_key]`) to the train end of
    the first batch after which every position below `prefix` is trained (as
    gpu_inflight.rate_to_prefix)."""
    step = next(s for s, p in enumerate(prefixes(r["positions"])) if p >= prefix)
    ends = r[ends_key]
    return round(samples_per_step * step / (ends[step] - ends[0]), 3), step


def compare(runs: dict[str, dict[str, Any]], samples_per_step: int,
            prefix: int | None = None, ours: str = "inflight") -> dict[str, Any]:
    """`ours` against partial rollout to the same prefix (the smaller final one)."""
    prefix = prefix or min(prefixes(r["positions"])[-1] for r in runs.values())
    (rate, step), (theirs, base_step) = (rate_to_prefix(runs[k], prefix, samples_per_step)
                                         for k in (ours, "partial"))
    return {"prefix": prefix, "inflight_samples_per_s": rate, "inflight_until_batch": step,
            "partial_samples_per_s": theirs, "partial_until_batch": base_step,
            "inflight_over_partial": ratio(rate, theirs)}


def trained_over_sync(r: dict[str, Any], until: int, spec: Any) -> dict[str, float]:
    """Mean and p99 of the lengths batches 1..`until` trained, over sync's for as many
    samples (data positions in order, after sync's first batch)."""
    from bench.gpu_inflight import sync_lengths
    from bench.gpu_longtail import length_stats
    from rlgraph.bench_mode import forced_length

    data = spec.data
    positions = [p for batch in r["positions"][1:until + 1] for p in batch]
    ours = length_stats([forced_length(data.seed, p, k, data.response_len)
                         for p in positions for k in range(data.samples_per_prompt)])
    sync = sync_lengths(spec, len(positions), data.prompts_per_step)
    return {"mean": ratio(ours["mean"], sync["mean"]), "p99": ratio(ours["p99"], sync["p99"])}


def per_batch_check(r: dict[str, Any], gpu: dict[str, Any]) -> dict[str, Any]:
    """The model's decode steps and ms a step per batch beside a GPU run's."""
    per = gpu["per_step"]
    n = len(per["generate/decode_ms_per_step"])
    ms = [round(1e3 * s / k, 2) if k else None for s, k in zip(r["decode_s"][:n],
                                                               r["decode_steps"][:n])]
    pairs = [(a, b) for a, b in zip(ms, per["generate/decode_ms_per_step"]) if a and b]
    return {"decode_steps": {"model": r["decode_steps"][:n],
                             "gpu": per["rollout/decode_steps"][:n]},
            "decode_ms_per_step": {"model": ms, "gpu": per["generate/decode_ms_per_step"]},
            "decode_ms_model_over_gpu_median": round(statistics.median(
                a / b for a, b in pairs), 3)}


def main() -> int:
    """Check the model against the GPU calls, then run it long per max_lag; write the JSON."""
    from rlgraph.config.load import load_spec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--lags", default="3,6,8")
    parser.add_argument("--flat", action="store_true",
                        help="every decode step at the GPU call's median (no physics)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    call, lag8 = json.loads(CALL.read_text()), json.loads(CALL_LAG8.read_text())
    times = measured_times(call)
    overrides = ["data.prompts_per_step=32"]  # the GPU calls' workload
    spec = load_spec(GRAPHS / "longtail-1gpu.yaml", overrides)
    per_step = call["modes"][PAIR[0]]["samples_per_step"]
    physics = not args.flat
    began = time.perf_counter()
    res: dict[str, Any] = {
        "benchmark": "inflight_pipeline", "machine": machine(), "command": " ".join(sys.argv),
        "times_from": CALL.name, "times_s": times, "decode_step": "physics: pricing.generate."
        "decode_step_seconds per look (H200)" if physics else "flat: the GPU call's median",
        "batches": args.batches, "by_max_lag": {}}
    # the model against the GPU calls, which ran the `taken` rule
    check = {}
    for lag, gpu_in, gpu_out in (
            (3, call["modes"][PAIR[0]], call["modes"][PAIR[1]]),
            (8, lag8["plans"][0], lag8["modes"]["split-partial-lag8"])):
        runs = {"inflight": run(True, 16, lag, times, overrides, physics, "taken"),
                "partial": run(False, 16, lag, times, overrides, physics)}
        check[f"max_lag_{lag}"] = {"inflight (taken)": per_batch_check(runs["inflight"],
                                                                        gpu_in),
                                   "partial": per_batch_check(runs["partial"], gpu_out)}
        if lag == 3:
            work = call["plans"][0]["same_work"]
            check["same_work_max_lag_3"] = {
                "model": compare(runs, per_step, work["prefix"]),
                "gpu": {"prefix": work["prefix"], "inflight_samples_per_s":
                        work["samples_per_s"], "partial_samples_per_s":
                        work["other_samples_per_s"], "inflight_over_partial":
                        work["over_other"]}}
    if CALL_SLOTS.exists():  # the call that ran the `slots` rule (max_lag 8)
        slots = json.loads(CALL_SLOTS.read_text())
        runs = {"inflight": run(True, 24, 8, times, overrides, physics, "slots"),
                "partial": run(False, 24, 8, times, overrides, physics)}
        work = slots["plans"][0]["same_work"]
        check["max_lag_8_slots"] = {
            "inflight (slots)": per_batch_check(runs["inflight"],
                                                slots["modes"]["split-partial-lag8-inflight"]),
            "same_work_model": compare(runs, per_step, work["prefix"]),
            "same_work_gpu": {"prefix": work["prefix"], "inflight_samples_per_s":
                              work["samples_per_s"], "partial_samples_per_s":
                              work["other_samples_per_s"], "inflight_over_partial":
                              work["over_other"]}}
    res["check_against_gpu_calls"] = check
    print("check", json.dumps(check), flush=True)
    for lag in (int(x) for x in args.lags.split(",")):
        runs = {"partial": run(False, args.batches, lag, times, overrides, physics),
                **{f"inflight ({rule})": run(True, args.batches, lag, times, overrides,
                                             physics, rule) for rule in REFILLS}}
        prefix = min(prefixes(r["positions"])[-1] for r in runs.values())
        out: dict[str, Any] = {}
        for rule in REFILLS:
            name = f"inflight ({rule})"
            c = compare(runs, per_step, prefix, name)
            out[f"long_run_{rule}"] = {**c, "trained_over_sync": trained_over_sync(
                runs[name], c["inflight_until_batch"], spec)}
        out["partial_trained_over_sync"] = trained_over_sync(
            runs["partial"], out["long_run_slots"]["partial_until_batch"], spec)
        for key, fn in (("decode_steps_per_batch_mean", lambda r: r["decode_steps"]),
                        ("decode_ms_per_step_mean", None),
                        ("live_rows_mean", lambda r: [x for x in r["mean_width"] if x]),
                        ("generate_version_lag_mean", lambda r: r["lag"])):
            if fn is None:
                out[key] = {k: round(1e3 * sum(r["decode_s"][lag + 1:])
                                     / max(1, sum(r["decode_steps"][lag + 1:])), 2)
                            for k, r in runs.items()}
            else:
                out[key] = {k: round(statistics.fmean(fn(r)[lag + 1:]), 2)
                            for k, r in runs.items()}
        out["dropped_samples"] = {k: r["totals"]["dropped"] for k, r in runs.items()}
        res["by_max_lag"][str(lag)] = out
        print(lag, json.dumps(out), flush=True)
    res["cpu_s"] = round(time.perf_counter() - began, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inflight-pipeline.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
