"""End to end on GPUs: `rlgraph run`'s Runner on a 2-GPU machine, split one-step-off vs
colocated synchronous, side by side in one process on one machine.

  PYTHONUNBUFFERED=1 python bench/gpu_e2e.py [--steps N] [--out DIR] [--name NAME]
  PYTHONUNBUFFERED=1 python bench/gpu_e2e.py --check [--out DIR]
  PYTHONUNBUFFERED=1 python bench/gpu_e2e.py --check-partial [--out DIR] [key=value ...]
  PYTHONUNBUFFERED=1 python bench/gpu_e2e.py \
      --runs split-one-step-off+partial,split-one-step-off,colocated-sync [key=value ...]

Runs bench/graphs_gpu/split-one-step-off.yaml (train on GPU 0, generate on GPU 1, max_lag 1,
weights over NCCL) and bench/graphs_gpu/colocated-sync.yaml (every task in one group holding
both GPUs, max_lag 0) for a few steps each on a local Ray cluster that the runtime starts with
the machine's GPUs. Records samples/s and step time (steady state: the first step, which
includes CUDA warm-up and the decode engine's compile, is left out), generate's own metrics
(static engine: decode steps, device ms per step), the compiler's predicted period, the period
recompiled with the run's measured node times (`rlgraph compile --calibrate RUN_DIR`) and the
measured one; writes OUT/NAME.json (default bench/results/gpu-e2e.json).

`--check` (one GPU): the generate worker of the split graph's rollout workspace, on the static
engine, against a fresh forward pass of the sequences it sampled (behaviour log-probs within
bf16 tolerance, masks, eos, token versions), before and after an in-place weight switch, beside
the Decoder (dynamic cache) path on the same prompts; writes OUT/NAME-check.json.
`--device cpu` rehearses the check on CPU (static engine forced, eager).

`--check-partial`: the same for partial rollout (schedule.partial_rollout on the split graph):
four rounds on the static engine, version 1 switched in the middle of round 1, versions 2 and 3
before rounds 2 and 3 (a fresh round admits spares, a max_lag-old one does not), every token's
behaviour log-prob against a fresh forward under the weights of the version that sampled it,
then two rounds through the Decoder (dynamic cache) in the same process for the time per
decode step; writes OUT/NAME-check-partial.json.

`--runs`: which plans to run; `NAME+partial` is bench/graphs_gpu/NAME.yaml with
schedule.partial_rollout=true.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import device_info, machine, run_figures  # noqa: E402

GRAPHS = ROOT / "bench" / "graphs_gpu"
RUNS = ("split-one-step-off", "colocated-sync")
PARTIAL = "+partial"  # a run name's suffix: the graph with schedule.partial_rollout=true


def run_one(name: str, steps: int, out: Path, overrides: list[str], runs: Path) -> dict:
    """One graph for `steps` train steps: measured step time and samples/s, predicted and
    calibrated periods. The run dir (checkpoints of GB size) stays in a temporary folder;
    its trace.json is copied to OUT/trace-NAME.json."""
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import load_spec
    from rlgraph.runtime.runner import Runner, RunOptions

    graph = name.removesuffix(PARTIAL)
    if name.endswith(PARTIAL):
        overrides = [*overrides, "schedule.partial_rollout=true"]
    spec = load_spec(GRAPHS / f"{graph}.yaml", overrides)
    plan = compile_plan(spec)
    run_dir = runs / name
    began = time.time()
    result = Runner(plan, RunOptions(out_dir=run_dir, steps=steps,
                                           tensorboard=False)).run()
    steady = [r["time/step_s"] for r in result.rows[1:]] or [r["time/step_s"]
                                                             for r in result.rows]
    step_s = statistics.median(steady)
    calibrated = compile_plan(spec, calibration=run_dir)
    shutil.copy(run_dir / "trace.json", out / f"trace-{name.replace('+', '-')}.json")
    return {
        "graph": f"bench/graphs_gpu/{graph}.yaml",
        "partial_rollout": spec.schedule.partial_rollout,
        **run_figures(spec, plan, result, step_s, calibrated),
        "generate_metrics_median": generate_metrics(result.rows[1:] or result.rows),
        "rollout_metrics_median": generate_metrics(result.rows[1:] or result.rows,
                                                   ("rollout/", "response/", "lag/")),
        "replica_metrics_median": generate_metrics(result.rows[1:] or result.rows,
                                                   ("replicas/",)),
        "wall_s": round(time.time() - began, 2),
        "bottleneck_calibrated": calibrated["schedule"]["bottleneck"],
    }


def verify(ws, batch: dict, version: int, temperature: float) -> dict:
    """Masks, eos, versions of one generate batch, and |behaviour - fresh forward| log-probs."""
    import torch

    from rlgraph.engines.cpu_decode import token_logp

    tok, P = ws.tokenizer, batch["prompt_len"]
    mask = batch["response_mask"].bool()
    response = batch["sequences"][:, P:]
    lengths = mask.sum(1)
    width = response.shape[1]
    contiguous = torch.equal(mask, torch.arange(width)[None, :] < lengths[:, None])
    stops_ok = all(
        tok.eos_id not in row[:n - 1] and (row[n - 1] == tok.eos_id or n == width)
        and row[n:] == [tok.pad_id] * (width - n)
        for row, n in zip(response.tolist(), lengths.tolist()))
    versions_ok = torch.equal(batch["token_version"], torch.where(mask, version, -1))
    dev = next(ws.policy.parameters()).device
    with torch.no_grad():
        fresh = token_logp(ws.policy, batch["sequences"].to(dev),
                           batch["attention_mask"].to(dev), P, temperature).float().cpu()
    diff = (batch["behavior_logp"] - fresh)[mask].abs()
    return {"rows": int(mask.shape[0]), "tokens": int(mask.sum()), "width": width,
            "eos_rows": int((lengths < width).sum()), "mask_contiguous": contiguous,
            "eos_and_padding_ok": stops_ok, "versions_ok": versions_ok,
            "off_mask_logp_zero": bool((batch["behavior_logp"][~mask] == 0).all()),
            "logp_abs_diff_mean": round(float(diff.mean()), 5),
            "logp_abs_diff_p99": round(float(diff.quantile(0.99)), 5),
            "logp_abs_diff_max": round(float(diff.max()), 5)}


def rollout_workspace(device: str, overrides: list[str], what: str) -> tuple[Any, Any, dict]:
    """The split graph with `overrides`, its rollout workspace on `device` (on CPU, a
    rehearsal: the static engine forced, eager) and the result header (machine, date, graph
    and `what` of it, build time)."""
    from rlgraph.config.load import load_spec
    from rlgraph.nodes import generate as generate_mod
    from rlgraph.process.workspace import Workspace

    if device == "cpu":
        generate_mod.use_static_engine = lambda *args: True
    spec = load_spec(GRAPHS / "split-one-step-off.yaml", overrides)
    began = time.perf_counter()
    ws = Workspace(spec, ["generate"], seed=0, device=device)
    res: dict = {"machine": machine(), "device": device_info(),
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "graph": f"bench/graphs_gpu/split-one-step-off.yaml{what}",
                 "build_s": round(time.perf_counter() - began, 2)}
    return spec, ws, res


def check(out: Path, name: str, device: str) -> int:
    """The static engine's generate batches against a fresh forward (see the docstring)."""
    import torch

    from rlgraph.engines.cpu_decode import sample

    overrides = []
    if device == "cpu":  # a rehearsal: tiny model
        overrides = ["model={preset: tiny}", "data.prompts_per_step=4",
                     "data.samples_per_prompt=2"]
    spec, ws, res = rollout_workspace(device, overrides, " (rollout workspace)")
    temp = spec.nodes["generate"].temperature
    worker = ws.worker("generate")
    timings = {}
    for step in range(3):
        t = time.perf_counter()
        batch = worker.run(step)
        if device != "cpu":
            torch.cuda.synchronize()
        timings[step] = round(time.perf_counter() - t, 4)
        if step == 1:
            first = batch
    res["engine"] = type(worker.static.engine).__name__ if worker.static else "Decoder"
    res["generate_s_per_call"] = timings  # call 0 holds the compile and graph capture
    res["engine_metrics_last_call"] = batch.get("metrics")
    res["version0"] = verify(ws, first, 0, temp)
    res["same_seed_same_batch"] = bool(torch.equal(worker.run(1)["sequences"],
                                                   first["sequences"]))
    # the Decoder (transformers' dynamic cache) on the same prompts, same process
    data = spec.data
    _, ids = worker.prompts(1)
    prompts = [p for p in ids for _ in range(data.samples_per_prompt)]
    times = []
    for _ in range(2):
        t = time.perf_counter()
        with torch.no_grad():
            ref = sample(ws.policy, prompts, max_new_tokens=data.response_len.max,
                         eos_id=ws.tokenizer.eos_id, pad_id=ws.tokenizer.pad_id,
                         temperature=temp, generator=ws.generator("generate", 1))
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    res["decoder_dynamic_cache_s"] = round(times[-1], 4)
    dyn = {"step": 1, "prompt_len": ref.prompt_len, "sequences": ref.sequences.cpu(),
           "attention_mask": ref.attention_mask.cpu(), "response_mask": ref.response_mask.cpu(),
           "behavior_logp": ref.behavior_logp.cpu(), "token_version": ref.token_version.cpu()}
    res["decoder_dynamic_cache_check"] = verify(ws, dyn, 0, temp)
    res["version0"].update(fp32_gap(ws, first, temp))
    # an in-place weight switch (what the dual buffer does): the captured graphs must see it
    live = {k: v.data_ptr() for k, v in ws.policy.state_dict().items()}
    gen = torch.Generator(device="cpu").manual_seed(1)
    new = {k: (v.float() + 0.02 * torch.randn(v.shape, generator=gen).to(v.device)).to(v.dtype)
           for k, v in ws.policy.state_dict().items()}

    def switch() -> None:
        for k, v in ws.policy.state_dict().items():
            v.copy_(new[k])

    ws.stage_weights(1, switch)
    batch = worker.run(3)
    res["after_switch"] = verify(ws, batch, 1, temp)
    res["after_switch"]["addresses_kept"] = live == {
        k: v.data_ptr() for k, v in ws.policy.state_dict().items()}
    # the batch sampled before the switch no longer matches the (new) weights' forward
    res["after_switch"]["old_batch_vs_new_weights_diff_mean"] = verify(
        ws, first, 0, temp)["logp_abs_diff_mean"]
    res["switch_explained"] = explain_switch(ws, worker, batch, temp)
    checks = [res["version0"], res["after_switch"]]
    res["ok"] = bool(
        res["same_seed_same_batch"] and res["after_switch"]["addresses_kept"]
        and all(c["mask_contiguous"] and c["eos_and_padding_ok"] and c["versions_ok"]
                and c["off_mask_logp_zero"] and c["logp_abs_diff_mean"] < 0.05
                and c["logp_abs_diff_p99"] < 0.25 for c in checks)
        and res["after_switch"]["old_batch_vs_new_weights_diff_mean"]
        > 5 * res["after_switch"]["logp_abs_diff_mean"])
    (out / f"{name}-check.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(json.dumps(res, indent=1, default=str), flush=True)
    return 0 if res["ok"] else 1


def fp32_gap(ws, batch: dict, temp: float) -> dict:
    """The bf16 forward against an fp32 forward of the same weights on one batch's tokens (the
    numerics floor of the behaviour log-probs), and the batch's mean -logp (sharper policies
    sit further from the floor)."""
    import copy

    import torch

    from rlgraph.engines.cpu_decode import token_logp

    dev = next(ws.policy.parameters()).device
    mask = batch["response_mask"].bool()
    ref = copy.deepcopy(ws.policy).float()
    with torch.no_grad():
        args = (batch["sequences"].to(dev), batch["attention_mask"].to(dev),
                batch["prompt_len"], temp)
        lo = token_logp(ws.policy, *args).float().cpu()
        hi = token_logp(ref, *args).float().cpu()
    del ref
    diff = (lo - hi)[mask].abs()
    return {"bf16_vs_fp32_forward_mean": round(float(diff.mean()), 5),
            "bf16_vs_fp32_forward_max": round(float(diff.max()), 5),
            "behaviour_vs_fp32_mean": round(float(
                (batch["behavior_logp"] - hi)[mask].abs().mean()), 5),
            "mean_neg_logp": round(float(-batch["behavior_logp"][mask].mean()), 4)}


def explain_switch(ws, worker, switched: dict, temp: float) -> dict:
    """Why the behaviour log-probs after the in-place switch differ more from a fresh forward
    than before it: (1) a static engine built from scratch on the switched weights (no buffer
    of the old engine can be stale there), (2) the bf16 forward against an fp32 forward of the
    same weights (the numerics floor), (3) a switch to weights of the original's scale (a
    +0.02 N(0,1) move, each tensor rescaled to its old std)."""
    import torch

    out = {"switched_weights": fp32_gap(ws, switched, temp)}
    worker.static = None  # a fresh engine (new cache, new graphs) on the switched weights
    out["fresh_engine_after_switch"] = verify(ws, worker.run(3), 1, temp)
    gen = torch.Generator(device="cpu").manual_seed(2)
    scaled = {}
    for k, v in ws.policy.state_dict().items():
        moved = v.float() + 0.02 * torch.randn(v.shape, generator=gen).to(v.device)
        std0, std1 = v.float().std() if v.numel() > 1 else 0, moved.std()
        scaled[k] = (moved * (std0 / std1) if v.numel() > 1 and std0 > 0 else v.float()
                     ).to(v.dtype)

    def switch() -> None:
        for k, v in ws.policy.state_dict().items():
            v.copy_(scaled[k])

    ws.stage_weights(2, switch)
    same_scale = worker.run(4)
    out["same_scale_switch"] = verify(ws, same_scale, 2, temp)
    out["same_scale_switch"].update(fp32_gap(ws, same_scale, temp))
    return out


def verify_partial(ws, batch: dict, weights: dict, temperature: float) -> dict:
    """`verify` for a partial-rollout batch: every token's behaviour log-prob against a fresh
    forward under the weights of the version that sampled it (loaded in place, then the live
    version's again); versions non-decreasing along a row, -1 off the mask."""
    import torch

    from rlgraph.engines.cpu_decode import token_logp

    res = verify(ws, batch, -1, temperature)  # layout; its log-prob and version parts redone
    del res["versions_ok"]
    mask, versions = batch["response_mask"].bool(), batch["token_version"]
    res["versions_ok"] = bool((versions[~mask] == -1).all() and all(
        r[m].tolist() == sorted(r[m].tolist()) for r, m in zip(versions, mask)))
    res["versions"] = sorted(versions[mask].unique().tolist())
    res["mixed_version_rows"] = int(sum(len(set(r[m].tolist())) > 1
                                        for r, m in zip(versions, mask)))
    dev = next(ws.policy.parameters()).device
    diff = torch.zeros(mask.shape)
    live = {k: v.clone() for k, v in ws.policy.state_dict().items()}
    with torch.no_grad():
        for v in res["versions"]:
            for k, t in ws.policy.state_dict().items():
                t.copy_(weights[v][k])
            fresh = token_logp(ws.policy, batch["sequences"].to(dev),
                               batch["attention_mask"].to(dev), batch["prompt_len"],
                               temperature).float().cpu()
            here = mask & (versions == v)
            diff[here] = (batch["behavior_logp"] - fresh)[here].abs()
        for k, t in ws.policy.state_dict().items():
            t.copy_(live[k])
    diff = diff[mask]
    res.update(logp_abs_diff_mean=round(float(diff.mean()), 5),
               logp_abs_diff_p99=round(float(diff.quantile(0.99)), 5),
               logp_abs_diff_max=round(float(diff.max()), 5),
               response_len_mean=round(float(mask.sum(1).float().mean()), 2))
    return res


def check_partial(out: Path, name: str, device: str, overrides: list[str]) -> int:
    """Partial rollout on the static engine against fresh forwards, and beside the Decoder
    (see the docstring)."""
    import torch

    from rlgraph.nodes import generate as generate_mod
    from rlgraph.nodes.generate import GenerateWorker

    overrides = [*overrides, "schedule.partial_rollout=true"]
    real = generate_mod.use_static_engine
    spec, ws, res = rollout_workspace(device, overrides, ", rollout workspace, "
                                      "schedule.partial_rollout=true")
    res["overrides"] = overrides
    temp = spec.nodes["generate"].temperature
    worker = ws.worker("generate")
    dev = next(ws.policy.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(1)
    weights = {0: {k: v.clone() for k, v in ws.policy.state_dict().items()}}
    for v in (1, 2, 3):  # version v: v seeded moves of 0.02 x N(0, 1) per weight
        weights[v] = {k: (t.float() + 0.02 * torch.randn(t.shape, generator=gen, device=dev))
                      .to(t.dtype) for k, t in weights[v - 1].items()}

    def stage(v: int) -> None:
        def switch_in() -> None:
            for k, t in ws.policy.state_dict().items():
                t.copy_(weights[v][k])
        ws.stage_weights(v, switch_in)

    calls, switch = [0], worker._swap

    def mid_round() -> int | None:  # the second check of round 1: between decode steps
        calls[0] += 1
        if calls[0] == 2:
            stage(1)
        return switch()

    def rounds(w: GenerateWorker, steps: range, tag: str) -> list[dict]:
        batches = []
        for step in steps:
            w._swap = mid_round if (tag == "static" and step == 1) else switch
            if tag == "static" and step >= 2:
                stage(step)  # the next version arrives before the round (one step off)
            t = time.perf_counter()
            batch = w.run(step)
            if device != "cpu":
                torch.cuda.synchronize()
            wall = time.perf_counter() - t
            m = batch["metrics"]
            res.setdefault(f"{tag}_rounds", []).append({
                "step": step, "s": round(wall, 4),
                "ms_per_decode_step": round(1e3 * wall / max(m["rollout/decode_steps"], 1), 3),
                **{k.split("/")[1]: round(v, 4) for k, v in m.items()
                   if not k.endswith("_total")}})
            batches.append(batch)
        return batches

    static = rounds(worker, range(4), "static")  # round 0 holds the compile and graph capture
    res["engine"] = type(worker.static.engine).__name__ if worker.static else "Decoder"
    res["static_checks"] = [verify_partial(ws, b, weights, temp) for b in static]
    generate_mod.use_static_engine = lambda *args: False
    dyn_worker = GenerateWorker("generate", spec.nodes["generate"], ws)
    dynamic = rounds(dyn_worker, range(2), "decoder")
    generate_mod.use_static_engine = real
    res["decoder_checks"] = [verify_partial(ws, b, weights, temp) for b in dynamic]
    res["same_keys"] = all(set(b) == set(dynamic[0]) | {"metrics"} for b in static) and all(
        set(b["metrics"]) >= set(dynamic[0]["metrics"]) for b in static)
    def per_step(rounds: list[dict]) -> float:  # wall ms per decode step, prefills included
        return 1e3 * sum(r["s"] for r in rounds) / max(sum(r["decode_steps"] for r in rounds), 1)

    res["wall_ms_per_decode_step"] = {"static": round(per_step(res["static_rounds"][1:]), 3),
                                      "decoder": round(per_step(res["decoder_rounds"]), 3)}
    res["ms_per_decode_step_static_over_decoder"] = round(
        res["wall_ms_per_decode_step"]["static"] / res["wall_ms_per_decode_step"]["decoder"], 4)
    checks = res["static_checks"]
    res["ok"] = bool(
        res["same_keys"] and res["static_rounds"][1]["switches"] == 1
        and sum(r["carried"] for r in res["static_rounds"]) > 0
        and any(c["mixed_version_rows"] for c in checks)
        and all(c["mask_contiguous"] and c["eos_and_padding_ok"] and c["versions_ok"]
                and c["off_mask_logp_zero"] and c["logp_abs_diff_mean"] < 0.05
                and c["logp_abs_diff_p99"] < 0.25 for c in checks))
    (out / f"{name}-check-partial.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    print(json.dumps(res, indent=1, default=str), flush=True)
    return 0 if res["ok"] else 1


def generate_metrics(rows: list[dict], prefixes: tuple[str, ...] = ("generate/",)) -> dict:
    """Medians of the metrics named `prefixes*` (generate's own) over the steady rows."""
    keys = sorted({k for r in rows for k in r if k.startswith(prefixes)})
    return {k: round(statistics.median([r[k] for r in rows if k in r]), 4) for k in keys}


def main() -> int:
    """Run both graphs, print a table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default="gpu-e2e", help="OUT/NAME.json")
    parser.add_argument("--check", action="store_true", help="the static engine check only")
    parser.add_argument("--check-partial", action="store_true",
                        help="the static engine's partial-rollout check only")
    parser.add_argument("--runs", default=",".join(RUNS),
                        help="plans to run, comma-separated (NAME or NAME+partial)")
    parser.add_argument("--device", default="cuda", help="--check's device (cpu: rehearsal)")
    parser.add_argument("--baseline", type=Path, help="an earlier gpu-e2e.json to compare with")
    parser.add_argument("overrides", nargs="*", help="key=value for both graphs (CPU checks)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.check:
        return check(args.out, args.name, args.device)
    if args.check_partial:
        return check_partial(args.out, args.name, args.device, args.overrides)
    results = {"machine": machine(), "device": device_info(),
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": {}}
    runs = Path(tempfile.mkdtemp(prefix="rlgraph-gpu-e2e-"))
    for name in args.runs.split(","):
        try:
            results["runs"][name] = run_one(name, args.steps, args.out, args.overrides, runs)
        except Exception as exc:  # record it and go on to the other plan
            results["runs"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            if (runs / name / "error.log").exists():
                shutil.copy(runs / name / "error.log", args.out / f"error-{name}.log")
        print(name, json.dumps(results["runs"][name]), flush=True)
    sync = results["runs"].get("colocated-sync", {})
    for name, r in results["runs"].items():
        if name != "colocated-sync" and "samples_per_s" in r and "samples_per_s" in sync:
            key = name.replace("split-one-step-off", "split").replace("+", "_")
            results[f"{key}_over_sync_samples_per_s"] = round(
                r["samples_per_s"] / sync["samples_per_s"], 3)
    split, partial = (results["runs"].get(n, {}) for n in (RUNS[0], RUNS[0] + PARTIAL))
    if "samples_per_s" in split and "samples_per_s" in partial:
        results["split_partial_over_split_samples_per_s"] = round(
            partial["samples_per_s"] / split["samples_per_s"], 3)
    if args.baseline and args.baseline.exists():
        base = json.loads(args.baseline.read_text())["runs"]
        results["vs_baseline"] = {"baseline": str(args.baseline.relative_to(ROOT))
                                  if args.baseline.is_relative_to(ROOT) else str(args.baseline)}
        for name, r in results["runs"].items():
            b = base.get(name, {})
            if "samples_per_s" in r and "samples_per_s" in b:
                results["vs_baseline"][name] = {
                    "samples_per_s": [b["samples_per_s"], r["samples_per_s"]],
                    "step_s": [b["step_s_median"], r["step_s_median"]],
                    "generate_s": [b["node_s_median"].get("generate"),
                                   r["node_s_median"].get("generate")],
                    "speedup_samples_per_s": round(r["samples_per_s"] / b["samples_per_s"], 3)}
    print(f"\n{'plan':<30}{'step s':>9}{'samples/s':>11}{'predicted':>11}{'calibrated':>12}"
          f"{'lag max':>9}")
    for name, r in results["runs"].items():
        if "error" in r:
            print(f"{name:<30} failed: {r['error'][:90]}")
            continue
        print(f"{name:<30}{r['step_s_median']:>9.3f}{r['samples_per_s']:>11.1f}"
              f"{r['predicted_period_s']:>11.3f}{r['calibrated_period_s']:>12.3f}"
              f"{r['lag_max']:>9.0f}")
    (args.out / f"{args.name}.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all("error" not in r for r in results["runs"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
