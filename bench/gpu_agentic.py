"""Multi-turn rollouts on one GPU: the synchronous plan against partial rollout on a
long-tailed multi-turn workload, side by side in one process, and the compiler's prediction
of each.

  PYTHONUNBUFFERED=1 python bench/gpu_agentic.py [--steps 5] [--out DIR] [--cpu]

The workload (BENCHMARK MODE): a random-init Llama (character vocabulary, bf16) acts in the
built-in `delay` environment, which sleeps `sleep_s` every step (a tool's latency) and ends a
trajectory after a forced number of turns drawn per trajectory (lognormal, mean 2, at most
8); each turn's length is forced too (`generate.forced_lengths`: drawn from
data.response_len divided by the mean turns, eos ignored), so both plans decode the same work
per trajectory. Every task sits on the one GPU (a colocated group). sync: max_lag 0, every
trajectory of a batch ends before train; partial: partial rollout, max_lag 2, oversample 2,
trajectories still running (mid-turn or waiting for the env) carry to the next step;
partial-inflight: the same with in-flight updates (`generate.inflight`, kv: keep), where a
carried trajectory goes on in its slot with its KV instead of prefilling its context again.

Every plan but sync-waves decodes on the turn engine (engines/turn_decode.py): a trajectory
keeps its KV in its slot across turns and only each observation is prefilled; sync-waves is
the synchronous plan on the dynamic KV cache's waves (every turn re-encodes the trajectory),
what keeping the KV saves. Before the plans, `kept_kv_check` decodes three turns of a few
trajectories both ways on the device (kept KV against whole re-encoding) and records whether
the greedy tokens agree.

The steps run through the serial driver (`rlgraph.runtime.serial.run_serial`, the runtime's
pipeline without Ray; the env pool runs on threads); the first step of each plan is warm-up.
Per plan: seconds per step after the first (mean), trajectories a second, turns, env
seconds, carried trajectories, lag; the compiler's predicted period (`rlgraph compile`,
uncalibrated) over the measured one. Writes OUT/gpu-agentic.json; `--cpu` rehearses the
same code on the CPU with a tiny model and short turns.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import device_info, machine  # noqa: E402

MODEL_GPU = dict(model_type="llama", vocab_size=64, hidden_size=1024, num_hidden_layers=8,
                 num_attention_heads=16, num_key_value_heads=8, intermediate_size=2816,
                 max_position_embeddings=2048, tie_word_embeddings=True)
MODEL_CPU = dict(model_type="llama", vocab_size=64, hidden_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                 max_position_embeddings=256, tie_word_embeddings=True)
MODES = {"sync": {"max_lag": 0, "partial_rollout": False},
         "partial": {"max_lag": 2, "partial_rollout": True},
         # partial rollout with in-flight updates (kv: keep): a carried trajectory goes on
         # in its slot, its KV kept, instead of prefilling its context again
         "partial-inflight": {"max_lag": 2, "partial_rollout": True},
         # the synchronous plan on the waves of the dynamic KV cache (every turn re-encodes
         # the whole trajectory): what keeping the KV across turns saves
         "sync-waves": {"max_lag": 0, "partial_rollout": False}}
NODE = {"sync-waves": {"cuda_decode": "dynamic"},  # generate's keys a plan changes
        "partial-inflight": {"inflight": True, "kv": "keep"}}
WAVES_STEPS = 2  # sync-waves runs few steps: each is long


def graph(cpu: bool, mode: str, gpu: str = "H100") -> dict[str, Any]:
    """The benchmark graph of one plan (see the module docstring) on one `gpu`."""
    return {
        "name": f"gpu-agentic-{mode}",
        "cluster": {"local": True, "cpus": 1} if cpu else
        {"nodes": 1, "gpus_per_node": 1, "gpu": gpu},
        "model": {"hf_config": dict(MODEL_CPU if cpu else MODEL_GPU)},
        "data": {"task": "add_small", "prompts_per_step": 8,
                 "samples_per_prompt": 4, "prompt_len": 8,
                 "response_len": {"mean": 16 if cpu else 64, "max": 96 if cpu else 256,
                                  "dist": "lognormal", "sigma": 1.0}, "seed": 0},
        "algorithm": {"name": "grpo", "kl_coef": 0.0},
        "groups": {"all": {"share": 1.0, "tasks": ["generate", "train"]}},
        "nodes": {
            "generate": {"kind": "generate", "forced_lengths": True, "oversample": 2.0,
                         "stale": "finish",
                         "cuda_decode": "graphs", **NODE.get(mode, {}),
                         "env": {"fn": "delay", "max_turns": 8, "turns": 2,
                                 "latency_s": 0.05, "observation_len": 3, "threads": 64,
                                 "sleep_s": 0.05, "rounds": 2, "rounds_max": 8,
                                 "sigma": 1.0}},
            "reward": {"kind": "reward"},
            "train": {"kind": "train", "lr": 1e-6},
            "param_update": {"kind": "param_update", "src": "train", "dst": "generate"}},
        "schedule": {**MODES[mode], "steps": 5},
    }


def overrides_of(mode: str) -> list[str]:
    """The plan `mode` as overrides of the recorded graph (the sync plan's)."""
    out = [f"schedule.{k}={json.dumps(v)}" for k, v in MODES[mode].items()]
    return out + [f"nodes.generate.{k}={json.dumps(v)}" for k, v in NODE.get(mode, {}).items()]


def run_mode(cpu: bool, mode: str, steps: int, gpu: str) -> dict[str, Any]:
    """One plan: compile (predicted period), run `steps` steps, the figures."""
    import torch

    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import validate_spec
    from rlgraph.errors import SourceMap
    from rlgraph.runtime.serial import run_serial

    if cpu:
        torch.set_num_threads(1)
    spec = validate_spec(graph(cpu, mode, gpu), SourceMap())
    plan = compile_plan(spec)
    stamps: list[float] = []
    if mode == "sync-waves":
        steps = min(steps, WAVES_STEPS)
    start = time.perf_counter()
    run = run_serial(plan, steps, device="cpu" if cpu else "cuda",
                     on_step=lambda step, out: stamps.append(time.perf_counter()))
    if not cpu:
        torch.cuda.synchronize()
    step_s = [b - a for a, b in zip([start, *stamps], stamps)]
    steady = step_s[1:] or step_s
    measured = sum(steady) / len(steady)
    rows = [m["metrics"] for m in run.metrics]
    gen_rows = run.node_metrics.get("generate", [])[1:] or run.node_metrics.get("generate", [])
    samples = spec.data.samples_per_step()
    predicted = plan.schedule.period_s
    gen = plan.costs.get("generate")

    def mean(key: str) -> float | None:
        values = [r[key] for r in gen_rows if key in r]
        return round(sum(values) / len(values), 4) if values else None

    return {
        "mode": mode, "schedule": MODES[mode], "steps": steps,
        "overrides": overrides_of(mode),
        "cuda_decode": spec.nodes["generate"].cuda_decode,
        "inflight": spec.nodes["generate"].inflight,
        "step_s": [round(s, 3) for s in step_s],
        "step_s_steady_mean": round(measured, 3),
        "trajectories_per_s": round(samples / measured, 2),
        "node_s_per_step": {k: round(v, 3) for k, v in run.seconds.items()},
        "predicted_period_s": round(predicted, 3),
        "predicted_over_measured": round(predicted / measured, 3),
        "predicted_generate_s": round(gen.seconds, 3) if gen else None,
        "generate_detail": getattr(gen, "detail", None),
        "lag_max": max(r["lag/max"] for r in rows),
        "response_tokens_mean": [round(r["response/length_mean"], 1) for r in rows],
        # generate's own figures, mean over the steps after the first
        "generate_metrics": {k: mean(k) for k in (
            "env/turns_mean", "env/turns_max", "env/seconds", "env/wait_s", "env/engine_s",
            "env/extend_s", "env/step_s",
            "env/decode_steps", "env/decode_ms_per_step", "env/prefill_ms", "env/decode_waves",
            "env/prefill_tokens", "env/reused_tokens", "env/observation_tokens_mean",
            "env/ended_done", "env/ended_length", "env/ended_timeout", "env/ended_error",
            "env/trajectories", "rollout/carried")},
        "in_flight_at_end": (run.node_metrics.get("generate") or [{}])[-1].get("env/in_flight"),
        "decode_host_ms_per_step": host_ms_per_step(gen_rows),
        "setup_s": round(run.setup_s, 2), "wall_s": round(run.wall_s, 2),
    }


def kept_kv_check(cpu: bool) -> dict[str, Any]:
    """Greedy turns on the turn engine (KV kept, observations prefilled alone) against the
    static decoder re-encoding every turn whole, on the benchmark's device and model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlgraph.engines.static_decode import Request, StaticDecoder
    from rlgraph.engines.turn_decode import TurnDecoder

    torch.manual_seed(0)
    shape = dict(MODEL_CPU if cpu else MODEL_GPU)
    config = AutoConfig.for_model(**shape)
    device = "cpu" if cpu else "cuda"
    model = AutoModelForCausalLM.from_config(config).to(device, torch.float32).eval()
    kw = dict(max_batch=4, max_len=160, eos_token_id=None, sync_every=4)
    engine, whole = TurnDecoder(model, **kw), StaticDecoder(model, **kw)
    seqs = {i: [1 + i, 5, 9, 13 + i] for i in range(4)}
    agree = max_logp_gap = 0.0
    for _ in range(3):
        engine.extend([Request(list(x), 6 + i, temperature=0, request_id=i)
                       for i, x in seqs.items()])
        kept: dict[int, Any] = {}
        while engine.decoding:
            kept.update({c.request.request_id: c for c in engine.step()})
        again = {c.request.request_id: c for c in whole.run(
            [Request(list(x), 6 + i, temperature=0, request_id=i) for i, x in seqs.items()])}
        for i in seqs:
            agree += kept[i].tokens == again[i].tokens
            max_logp_gap = max(max_logp_gap, *(abs(a - b) for a, b in
                                               zip(kept[i].logprobs, again[i].logprobs)))
            seqs[i] += [*kept[i].tokens, 3, 4, 5]
    out = {"turns_agreeing": agree / (3 * len(seqs)), "max_logp_gap": round(max_logp_gap, 5),
           "reused_tokens": engine.stats["reused_tokens"],
           "prefilled_tokens": engine.stats["extend_tokens"]}
    return {**out, **engine_timings(model.to(torch.bfloat16), device)}


def engine_timings(model: Any, device: str, rows: int = 32) -> dict[str, float]:
    """The turn engine's pieces on this device, timed alone: a decode step over `rows`
    slots (CUDA graphs on a GPU), one observation's prefill (4 tokens, one row, eager) and
    the same for all rows in one call."""
    import torch

    from rlgraph.engines.static_decode import Request
    from rlgraph.engines.turn_decode import TurnDecoder

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    engine = TurnDecoder(model, max_batch=rows, max_len=264, eos_token_id=None, sync_every=8,
                         timing=True)
    engine.warmup(use_top_p=False)
    seqs = {i: [1 + i % 7] * 8 for i in range(rows)}

    def turn(length: int) -> None:
        engine.extend([Request(list(x), length, request_id=i, ignore_eos=True)
                       for i, x in seqs.items()])
        while engine.decoding:
            for c in engine.step():
                seqs[c.request.request_id] += [*c.tokens, 3, 4, 5]

    turn(8)  # warm-up: first prefill, first graph replays
    steps, ms, start = engine.stats["decode_steps"], engine.stats["decode_ms"], time.perf_counter()
    turn(64)
    sync()
    wall = time.perf_counter() - start
    steps = engine.stats["decode_steps"] - steps
    timings = {"decode_steps": steps,
               "decode_device_ms_per_step": round((engine.stats["decode_ms"] - ms) / steps, 3),
               "turn_wall_ms_per_step": round(wall * 1e3 / steps, 3)}
    for label, ids in (("observation_prefill_ms_one_row", [0]),
                       ("observation_prefill_ms_all_rows", list(seqs))):
        times = []
        for _ in range(5):
            sync()
            start = time.perf_counter()
            engine.extend([Request(list(seqs[i]), 2, request_id=i, ignore_eos=True) for i in ids])
            sync()
            times.append(time.perf_counter() - start)
            while engine.decoding:
                for c in engine.step():
                    seqs[c.request.request_id] += [*c.tokens, 3, 4, 5]
        timings[label] = round(sorted(times)[len(times) // 2] * 1e3, 3)
    return timings


def host_ms_per_step(rows: list[dict[str, float]]) -> float | None:
    """The host's ms a decode step on the turn engine (CUDA): the time in its decode calls
    (env/step_s) less their device time, per decode step, over the steps given."""
    steps = sum(r.get("env/decode_steps", 0.0) for r in rows)
    device = sum(r.get("env/decode_ms_per_step", 0.0) * r.get("env/decode_steps", 0.0)
                 for r in rows)
    if not steps or not device:
        return None
    return round((sum(r.get("env/step_s", 0.0) for r in rows) * 1e3 - device) / steps, 4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"))
    parser.add_argument("--cpu", action="store_true", help="rehearse on the CPU")
    parser.add_argument("--no-check", action="store_true",
                        help="skip the kept-KV check and the engine's timings alone")
    parser.add_argument("--modes", default="sync,partial,sync-waves",
                        help="plans to run, in order")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = device_info(dry=args.cpu)
    gpu = "H200" if "H200" in str(device.get("name")) else "H100"
    result: dict[str, Any] = {"benchmark": "gpu_agentic", "machine": machine(),
                              "device": device, "graph": graph(args.cpu, "sync", gpu),
                              "modes": {}}
    path = out / ("cpu-agentic-rehearsal.json" if args.cpu else "gpu-agentic.json")
    if not args.no_check:
        try:
            result["kept_kv_check"] = kept_kv_check(args.cpu)
        except Exception as err:  # recorded; the plans still run
            result["kept_kv_check"] = {"error": f"{type(err).__name__}: {err}"}
        print("kept KV check:", result["kept_kv_check"], flush=True)
    for mode in args.modes.split(","):
        try:
            result["modes"][mode] = run_mode(args.cpu, mode, args.steps, gpu)
        except Exception as err:  # one plan failing still leaves the others' figures
            import traceback

            traceback.print_exc()
            result["errors"] = {**result.get("errors", {}), mode: f"{type(err).__name__}: {err}"}
            path.write_text(json.dumps(result, indent=1))
            continue
        m = result["modes"][mode]
        print(f"{mode:8s} {m['step_s_steady_mean']:8.3f} s/step  predicted "
              f"{m['predicted_period_s']:8.3f} ({m['predicted_over_measured']:.2f}x)  "
              f"lag {m['lag_max']:.0f}  steps {m['step_s']}", flush=True)
        path.write_text(json.dumps(result, indent=1))
    if not {"sync", "partial"} <= set(result["modes"]):
        return 0
    sync, partial = result["modes"]["sync"], result["modes"]["partial"]
    for mode, m in result["modes"].items():  # the headline figures of each plan
        key = mode.replace("-", "_")
        result[f"{key}_step_s_steady_mean"] = m["step_s_steady_mean"]
        result[f"{key}_predicted_over_measured"] = m["predicted_over_measured"]
    result["decode_host_ms_per_step_measured"] = sync["decode_host_ms_per_step"]
    result["partial_over_sync"] = round(sync["step_s_steady_mean"]
                                        / partial["step_s_steady_mean"], 3)
    result["predicted_partial_over_sync"] = round(sync["predicted_period_s"]
                                                  / partial["predicted_period_s"], 3)
    path.write_text(json.dumps(result, indent=1))
    if "partial-inflight" in result["modes"]:
        kept = result["modes"]["partial-inflight"]
        result["partial_inflight_over_partial"] = round(
            partial["step_s_steady_mean"] / kept["step_s_steady_mean"], 3)
        path.write_text(json.dumps(result, indent=1))
    if "sync-waves" in result["modes"]:
        waves = result["modes"]["sync-waves"]
        result["kv_kept_over_waves"] = round(waves["step_s_steady_mean"]
                                             / sync["step_s_steady_mean"], 3)
        path.write_text(json.dumps(result, indent=1))
    print(f"partial rollout / sync: {result['partial_over_sync']}x measured, "
          f"{result['predicted_partial_over_sync']}x predicted -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
