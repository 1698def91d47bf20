"""Split plans against the colocated synchronous loop where training weighs: 4 GPUs, a
multi-billion-parameter shape, FSDP2 trainers, long-tailed forced lengths.

  PYTHONUNBUFFERED=1 python bench/gpu_scale.py [--gpus 4] [--plans a,b,...] [--steps 4]
      [--shape 3b] [--out DIR] [--name gpu-scale] [--cpu] [key=value ...]

The graph is bench/graphs_gpu_scale/colocated-sync.yaml in BENCHMARK MODE (forced lengths:
each sample's response length drawn from data.response_len, lognormal, eos ignored until
it), with `--shape`'s model, batch and lengths. Plans (each a set of overrides, run one
after the other in one call, same machine):

  colocated-sync          every task on all GPUs, max_lag 0, one whole replica per GPU
  split-fsdp-lag1         trainer half (logp + train, sharding: fsdp) | rollout half
                          (generate), max_lag 1, NCCL weight sync
  split-fsdp-partial-lag3 the same with partial rollout, max_lag 3, old log-probs from the
                          rollout (no logp node: verl fully_async)
  colocated-partial-lag3  every task on all GPUs, partial rollout, max_lag 3
  tune-top                `rlgraph tune`'s best plan of the colocated graph (its groups, lag,
                          partial rollout), as tune writes it

Per plan (bench/gpu_longtail.run_mode): samples/s over the steps after the first (whole
short/long pairs where partial rollout alternates them), over colocated sync's; the compiler's
uncalibrated period over the measured mean step; the response lengths trained after step 0
(mean, p99) over sync's; the samples started but not trained when the run stopped (in
flight); the node spans. Writes OUT/NAME.json after every plan (a call cut short keeps what
finished). `--cpu` rehearses every plan on local CPU slots with the tiny model (2 replicas a
group), `--gpus 2` runs the same method on two GPUs.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import device_info, machine  # noqa: E402
from bench.gpu_longtail import run_mode, without_logp  # noqa: E402

GRAPH = ROOT / "bench" / "graphs_gpu_scale" / "colocated-sync.yaml"
SHAPES = {  # --shape: model, batch and lengths
    "1.5b": ["model={preset: qwen2.5-1.5b}", "data.prompts_per_step=128",
             "data.response_len={mean: 512, max: 1024, dist: lognormal, sigma: 1.5}",
             "nodes.train.activation_checkpointing=true"],
    "3b": ["model={preset: qwen2.5-3b}", "data.prompts_per_step=128",
           "data.response_len={mean: 512, max: 1024, dist: lognormal, sigma: 1.5}",
           "nodes.train.activation_checkpointing=true"],
    "7b": ["model={preset: qwen2.5-7b}", "data.prompts_per_step=64",
           "data.response_len={mean: 512, max: 8192, dist: lognormal, sigma: 1.5}",
           "nodes.train.micro_tokens=8192", "nodes.train.activation_checkpointing=true"],
}
CPU = ["model={preset: tiny}", "data.prompts_per_step=8", "data.samples_per_prompt=2",
       "data.response_len={mean: 12, max: 64, dist: lognormal, sigma: 1.5}",
       "nodes.train.micro_tokens=256", "nodes.logp.micro_tokens=256",
       "cluster={local: true, cpus: 4}"]
PARTIAL = ["schedule.partial_rollout=true"]


def split(cpu: bool) -> list[str]:
    """The trainer half sharded with FSDP2, the rollout half generating, NCCL between."""
    reps = ", replicas: 2" if cpu else ""
    return [f"groups={{trainer: {{share: 0.5, tasks: [logp, train]{reps}}}, "
            f"rollout: {{share: 0.5, tasks: [generate]{reps}}}}}",
            "nodes.train.sharding=fsdp", "nodes.logp.sharding=fsdp",
            "nodes.param_update.transport=nccl"]


def plans(cpu: bool, base: list[str]) -> dict[str, list[str]]:
    """Plan name -> overrides of the graph (`base`, the shape's, included); tune-top is
    added later."""
    colocated = ["groups={all: {share: 1.0, tasks: [generate, logp, train], replicas: 2}}"
                 ] if cpu else []
    return {
        "colocated-sync": [*base, *colocated, "schedule.max_lag=0"],
        "split-fsdp-lag1": [*base, *split(cpu), "schedule.max_lag=1"],
        "split-fsdp-partial-lag3": without_logp(GRAPH, [
            *base, *split(cpu), *PARTIAL, "schedule.max_lag=3", "nodes.train.old_logp=rollout"]),
        "colocated-partial-lag3": [*base, *colocated, *PARTIAL, "schedule.max_lag=3"],
    }


def tuned_graph(overrides: list[str], out: Path) -> tuple[Path, dict[str, Any]]:
    """`rlgraph tune`'s best plan of the graph (with `overrides`) written as a graph file
    beside it, and what tune said of it."""
    from rlgraph.cli.tune import tuned_graph_data
    from rlgraph.config.load import load_spec
    from rlgraph.tune.search import tune

    spec = load_spec(GRAPH, overrides)
    result = tune(spec, top=3)
    data = tuned_graph_data(GRAPH, overrides, result)
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    best = result.best
    return out, {"groups": best.groups, "max_lag": best.max_lag,
                 "partial_rollout": best.partial_rollout, "predicted_period_s":
                 round(best.period_s, 3), "origin": best.origin,
                 "top": [{"groups": p.groups, "max_lag": p.max_lag,
                          "partial_rollout": p.partial_rollout,
                          "period_s": round(p.period_s, 3)} for p in result.top]}


def memory_verdicts(overrides: list[str]) -> dict[str, Any]:
    """What the compiler's memory check says of variants of the plans that may not fit: the
    colocated plan without activation checkpointing, the trainer half without sharding."""
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import load_spec
    from rlgraph.errors import SpecError

    out = {}
    for name, extra in {
            "colocated-sync-without-activation-checkpointing": [
                "nodes.train.activation_checkpointing=false", "schedule.max_lag=0"],
            "split-replicated-trainer": [
                *split(False), "nodes.train.sharding=none", "nodes.logp.sharding=none",
                "schedule.max_lag=1"]}.items():
        try:
            compile_plan(load_spec(GRAPH, [*overrides, *extra]))
            out[name] = "accepted"
        except SpecError as err:
            out[name] = f"refused: {err}"
    return out


def summary_row(name: str, r: dict[str, Any], sync: dict[str, Any] | None, gpus: int,
                model: str) -> dict[str, Any]:
    """The issue's row of one plan (None where the run left no figure)."""
    rate = r.get("samples_per_s_even_steps") or r.get("samples_per_s_steady")
    lengths = r.get("lengths", {})
    trained = lengths.get("trained_after_step_0", {})
    sync_trained = (sync or {}).get("lengths", {}).get("trained_after_step_0", {})
    sync_rate = sync and (sync.get("samples_per_s_even_steps")
                          or sync.get("samples_per_s_steady"))
    mean_step = r.get("step_s_steady_mean")
    return {
        "name": name, "gpus": gpus, "model": model,
        "samples_per_s": rate,
        "over_colocated_sync": round(rate / sync_rate, 3) if rate and sync_rate else None,
        "predicted_over_measured": round(r["predicted_period_s"] / mean_step, 3)
        if mean_step else None,
        "trained_mean_over_sync": round(trained["mean"] / sync_trained["mean"], 3)
        if trained.get("mean") and sync_trained.get("mean") else None,
        "trained_p99_over_sync": round(trained["p99"] / sync_trained["p99"], 3)
        if trained.get("p99") and sync_trained.get("p99") else None,
        "in_flight_at_end": lengths.get("started_not_trained_in_flight_at_end"),
        "step_s_mean": mean_step, "predicted_period_s": r.get("predicted_period_s"),
        "train_s_per_step": r.get("train_s_per_step"),
    }


def main() -> int:
    """Run the plans, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--plans", default="colocated-sync,split-fsdp-lag1,"
                        "split-fsdp-partial-lag3,colocated-partial-lag3,tune-top")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--shape", default="3b", choices=sorted(SHAPES))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--name", default="gpu-scale")
    parser.add_argument("--cpu", action="store_true", help="rehearse on CPU slots, tiny model")
    parser.add_argument("overrides", nargs="*", help="key=value for every plan")
    args = parser.parse_args()
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_scale: no CUDA device here; rehearse with --cpu")
        return 0
    base = [*(CPU if args.cpu else SHAPES[args.shape]),
            *([] if args.cpu else [f"cluster.gpus_per_node={args.gpus}",
                                   f"cluster.gpu={gpu_kind(torch)}"]), *args.overrides]
    model = "tiny (CPU rehearsal)" if args.cpu else args.shape
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    runs = Path(tempfile.mkdtemp(prefix="rlgraph-scale-"))
    res: dict[str, Any] = {
        "machine": machine(), "device": device_info(dry=args.cpu),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv), "graph": str(GRAPH.relative_to(ROOT)),
        "overrides": base, "shape": model,
        "workload": "BENCHMARK MODE (generate.forced_lengths): response lengths forced per "
                    "sample, eos ignored; " + " ".join(base),
        "plans": [], "runs": {}}

    def save() -> None:
        path.write_text(json.dumps(res, indent=1, default=str) + "\n")

    try:
        res["memory_check"] = memory_verdicts(base) if not args.cpu else {}
    except Exception as exc:  # the check is optional: record why it did not run
        res["memory_check"] = {"error": f"{type(exc).__name__}: {exc}"}
    todo = plans(args.cpu, base)
    for name in args.plans.split(","):
        graph = GRAPH
        overrides = todo.get(name, [])
        try:
            if name == "tune-top":
                graph, res["tune"] = tuned_graph(base, GRAPH.with_name(".tuned.yaml"))
                if res["tune"]["origin"] == "input" and "colocated-sync" in res["runs"]:
                    res["tune"]["same_plan_as"] = "colocated-sync"  # the graph as given
                    print("tune-top: tune keeps the graph as given (colocated sync), "
                          "measured above", flush=True)
                    continue
                overrides = ["groups.all.replicas=2"] if args.cpu and any(
                    g["name"] == "all" for g in res["tune"]["groups"]) else []
            r = run_mode(name, graph, overrides, args.steps, runs, forced=True,
                         progress=args.out)
        except Exception as exc:  # record it and go on to the next plan
            r = {"error": f"{type(exc).__name__}: {exc}"}
        res["runs"][name] = {k: v for k, v in r.items() if k != "events"} | {
            "events": r.get("events", [])}
        sync = res["runs"].get("colocated-sync")
        res["plans"] = [summary_row(n, x, sync, args.gpus if not args.cpu else 0, model)
                        for n, x in res["runs"].items() if "error" not in x]
        print(name, json.dumps(res["plans"][-1] if "error" not in r else r), flush=True)
        save()
    print(f"\n{'plan':<26}{'samples/s':>10}{'x sync':>8}{'pred/meas':>10}{'mean':>7}"
          f"{'p99':>7}{'in flight':>10}")
    for row in res["plans"]:
        print(f"{row['name']:<26}{row['samples_per_s'] or 0:>10.2f}"
              f"{row['over_colocated_sync'] or 0:>8.3f}{row['predicted_over_measured'] or 0:>10.3f}"
              f"{row['trained_mean_over_sync'] or 0:>7.3f}{row['trained_p99_over_sync'] or 0:>7.3f}"
              f"{row['in_flight_at_end'] or 0:>10}")
    for name, r in res["runs"].items():
        if "error" in r:
            print(f"{name}: failed: {r['error'][:300]}")
    return 0 if all("error" not in r for r in res["runs"].values()) else 1


def gpu_kind(torch: Any) -> str:
    """The GPU preset of this machine's cards (H100 or H200), so the prediction prices them."""
    name = torch.cuda.get_device_name(0)
    return "H200" if "H200" in name else "H100"


if __name__ == "__main__":
    raise SystemExit(main())
