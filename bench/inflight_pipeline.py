"""In-flight weight updates over a long run of the split plan, on the CPU: a timed model of
the pipeline that drives the runtime's own rollout cache, checked against a GPU call.

    python bench/inflight_pipeline.py [--batches 100] [--lags 3,6] [--out DIR]

Why a model: on the long-tail workload a window of a few steps is rated by whichever long
samples fall into it (a sample of 8192 tokens decodes for ~30 s), and a long run on the GPU
does not fit a device budget. The model runs the split plan of bench/gpu_inflight.py
(generate on one GPU; logp and train on the other) for `--batches` batches:

- the rollout cache is the runtime's (`RolloutCache`: eviction, admission, in-flight
  refills with `taken`, must-finish under `stale: finish`), over the workload's forced
  lengths per data position, so every plan admits the same samples in the same order;
- generate call t starts when call t-1 has ended and version t - max_lag exists; each look
  decodes `sync_every` tokens of every unfinished sample and adopts the newest version; a
  call ends when its batch is complete (with every must-finish group); without in-flight
  updates a call first re-encodes its carried rows, with them a call refills completed
  groups' places at every look;
- train (with logp) of batch t starts when the batch is complete and train t-1 has ended;
  its end makes version t + 1.

The times are medians of the GPU call in bench/results/gpu-inflight.json (the split pair):
a decode step (`generate/decode_ms_per_step`, flat in the batch width), logp + train, the
carried rows' re-encode (`generate/prefill_s` without in-flight updates) and a call's time
outside the engine. The check: the model's decode steps per batch and its samples/s to
the same prefix (`gpu_inflight.same_work`) against that call's. Then, per max_lag, the two
plans' samples/s until every data position below P is trained, P the smaller of their
final prefixes. Writes inflight-pipeline.json.
"""

from __future__ import annotations

import argparse
import bisect
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

CALL = ROOT / "bench" / "results" / "gpu-inflight.json"
PAIR = ("split-partial-lag3-inflight", "split-partial-lag3")


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


def run(inflight: bool, batches: int, max_lag: int, times: dict[str, float],
        overrides: list[str]) -> dict[str, Any]:
    """The model (module docstring) for `batches` batches: per batch its decode steps,
    train end, trained data positions and the generator's version lag at the call start."""
    from rlgraph.bench_mode import forced_length
    from rlgraph.config.load import load_spec
    from rlgraph.engines.partial_rollout import RolloutCache

    spec = load_spec(GRAPHS / "longtail-1gpu.yaml",
                     [*MODES["split-partial-lag3"], *overrides, f"schedule.max_lag={max_lag}"])
    data, node = spec.data, spec.nodes["generate"]
    prompts, look = data.prompts_per_step, node.sync_every
    cache = RolloutCache(prompts_per_step=prompts, samples_per_prompt=data.samples_per_prompt,
                         oversample=node.oversample, max_lag=max_lag, stale=node.stale,
                         max_new_tokens=data.response_len.max, prompt_of=lambda position: [1],
                         length_of=lambda p, s: forced_length(data.seed, p, s,
                                                              data.response_len))
    now, ends = 0.0, []  # the generator's clock; train ends (version v exists at ends[v - 1])
    out: dict[str, list] = {"decode_steps": [], "train_end_s": [], "positions": [], "lag": []}
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
        must, steps = cache.must_finish(t), 0
        while True:
            done = {i for i, g in enumerate(cache.groups) if g.complete}
            if len(done) >= prompts and must <= done:
                break
            if inflight:
                cache.refill(t, version, taken=min(len(done), prompts))
            for sample in (s for g in cache.groups for s in g.samples if not s.finished):
                n = min(look, sample.budget - len(sample.tokens))
                sample.tokens += [0] * n
                sample.versions += [version] * n
                sample.finished = len(sample.tokens) >= sample.budget
            now += look * times["decode_step_s"]
            steps += look
            version = bisect.bisect_right(ends, now)
        ends.append(max(now, ends[-1] if ends else 0.0) + times["train_s"])
        out["decode_steps"].append(steps)
        out["train_end_s"].append(round(ends[-1], 3))
        out["positions"].append([g.position for g in cache.take()])
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


def rate_to_prefix(r: dict[str, Any], prefix: int, samples_per_step: int) -> tuple[float, int]:
    """Samples a second from the first batch's train end to the train end of the first batch
    after which every position below `prefix` is trained (as gpu_inflight.rate_to_prefix)."""
    step = next(s for s, p in enumerate(prefixes(r["positions"])) if p >= prefix)
    ends = r["train_end_s"]
    return round(samples_per_step * step / (ends[step] - ends[0]), 3), step


def compare(runs: dict[str, dict[str, Any]], samples_per_step: int,
            prefix: int | None = None) -> dict[str, Any]:
    """In-flight against partial rollout to the same prefix (the smaller final one)."""
    prefix = prefix or min(prefixes(r["positions"])[-1] for r in runs.values())
    (ours, step), (theirs, base_step) = (rate_to_prefix(runs[k], prefix, samples_per_step)
                                         for k in ("inflight", "partial"))
    return {"prefix": prefix, "inflight_samples_per_s": ours, "inflight_until_batch": step,
            "partial_samples_per_s": theirs, "partial_until_batch": base_step,
            "inflight_over_partial": ratio(ours, theirs)}


def main() -> int:
    """Check the model against the GPU call, then run it long per max_lag; write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--lags", default="3,6")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    call = json.loads(CALL.read_text())
    times = measured_times(call)
    overrides = ["data.prompts_per_step=32"]  # the GPU call's workload
    per_step = call["modes"][PAIR[0]]["samples_per_step"]
    began = time.perf_counter()
    res: dict[str, Any] = {"benchmark": "inflight_pipeline", "machine": machine(),
                           "command": " ".join(sys.argv), "times_from": CALL.name,
                           "times_s": times, "batches": args.batches, "by_max_lag": {}}
    checked = {}
    for lag in (int(x) for x in args.lags.split(",")):
        runs = {name: run(name == "inflight", args.batches, lag, times, overrides)
                for name in ("partial", "inflight")}
        res["by_max_lag"][str(lag)] = {
            "long_run": compare(runs, per_step),
            "decode_steps_per_batch_mean": {
                k: round(statistics.fmean(r["decode_steps"][lag + 1:]), 1)
                for k, r in runs.items()},
            "generate_version_lag_mean": {k: round(statistics.fmean(r["lag"][lag + 1:]), 2)
                                          for k, r in runs.items()}}
        print(lag, json.dumps(res["by_max_lag"][str(lag)]), flush=True)
        if lag == 3:
            checked = runs
    if checked:  # the model against the GPU call (max_lag 3, the same data positions)
        gpu = {"inflight": call["modes"][PAIR[0]], "partial": call["modes"][PAIR[1]]}
        work = call["plans"][0]["same_work"]
        model = compare(checked, per_step, work["prefix"])
        res["check_against_gpu_call"] = {
            "decode_steps": {k: {"model": checked[k]["decode_steps"][:len(gpu[k]["per_step"][
                "rollout/decode_steps"])], "gpu": gpu[k]["per_step"]["rollout/decode_steps"]}
                for k in gpu},
            "same_work_model": model,
            "same_work_gpu": {"prefix": work["prefix"], "inflight_samples_per_s":
                              work["samples_per_s"], "partial_samples_per_s":
                              work["other_samples_per_s"], "inflight_over_partial":
                              work["over_other"]}}
        print("check", json.dumps(res["check_against_gpu_call"]), flush=True)
    res["cpu_s"] = round(time.perf_counter() - began, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inflight-pipeline.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
