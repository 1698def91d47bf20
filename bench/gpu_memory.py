"""Does the compile-time memory check hold on the GPU? A plan it refuses runs out of memory,
a plan it accepts fits, and its per-task bytes against torch's measured peaks.

  PYTHONUNBUFFERED=1 python bench/gpu_memory.py [--shape 1.5b] [--out DIR] [--cpu]

One GPU, one group holding generate, logp and train (the colocated plan of
bench/graphs_gpu_scale/colocated-sync.yaml on one GPU, BENCHMARK MODE: forced lengths).
Variants differ in one key, train's `activation_checkpointing`, at a `micro_tokens` large
enough that the pass without it does not fit. For each variant: the compiler's verdict
(`rlgraph.compiler.memory.group_memory`: resident state, each task's transient, need, usable
capacity), then the same workspace the runtime's actor builds
(`rlgraph.process.workspace.Workspace`) on the GPU runs one step (generate, reward, logp,
train) with torch's peak allocated memory read after each task. A variant the compiler
refuses is run too: it should end in torch's out of memory, which is what the refusal saved
the user from. Writes OUT/gpu-memory.json.
`--cpu` rehearses the script with the tiny model (no peaks; the verdicts only).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import device_info, machine  # noqa: E402

GRAPH = ROOT / "bench" / "graphs_gpu_scale" / "colocated-sync.yaml"
GB = 1e9
TASKS = ["generate", "reward", "logp", "train"]
SHAPES = {  # a train pass of micro_tokens without activation checkpointing fits neither
    # an H100 nor an H200; with it, both
    "1.5b": ["model={preset: qwen2.5-1.5b}", "data.prompts_per_step=16",
             "data.response_len={mean: 512, max: 1024, dist: lognormal, sigma: 1.5}",
             "nodes.train.micro_tokens=65536", "nodes.logp.micro_tokens=32768"],
    "3b": ["model={preset: qwen2.5-3b}", "data.prompts_per_step=32",
           "data.response_len={mean: 512, max: 1024, dist: lognormal, sigma: 1.5}",
           "nodes.train.micro_tokens=32768", "nodes.logp.micro_tokens=16384"],
}
CPU = ["model={preset: tiny}", "data.prompts_per_step=4", "data.samples_per_prompt=2",
       "data.response_len={mean: 12, max: 64, dist: lognormal, sigma: 1.5}",
       "nodes.train.micro_tokens=256", "nodes.logp.micro_tokens=256",
       "cluster={local: true, cpus: 2}"]
VARIANTS = {"with-activation-checkpointing": ["nodes.train.activation_checkpointing=true"],
            "without-activation-checkpointing": ["nodes.train.activation_checkpointing=false"]}


def verdict(spec: Any, gpu: str) -> dict[str, Any]:
    """The compiler's memory verdict for the one group on one GPU of kind `gpu`."""
    from rlgraph.compiler.memory import group_memory
    from rlgraph.presets.gpus import GPU_PRESETS

    mem = group_memory(spec, "all", ["generate", "logp", "train"], 1, GPU_PRESETS[gpu])
    out = mem.to_dict()
    out["peak_gb_by_task"] = {t: round(mem.peak_of(t) / GB, 3) for t in mem.tasks}
    out["breakdown"] = mem.breakdown()
    return out


def _peak(task: str, run: Any, out: dict[str, Any], cuda: bool) -> Any:
    """Run one task, recording its seconds and torch's peak allocated bytes while it ran."""
    import torch

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    result = run()
    if cuda:
        torch.cuda.synchronize()
        out["peak_gb_by_task"][task] = round(torch.cuda.max_memory_allocated() / GB, 3)
    out[f"{task}_s"] = round(time.time() - t0, 2)
    return result


def measured(spec: Any, device: str) -> dict[str, dict[str, Any]]:
    """Both variants in one workspace (the runtime actor's, built once, with activation
    checkpointing): one step of every task with it, then train again on the same inputs
    with the layers' checkpointing undone. torch's peak allocated bytes per task, or where
    it ran out of memory."""
    import torch

    from rlgraph.process.sharding import decoder_layers
    from rlgraph.process.workspace import Workspace

    cuda = device != "cpu"
    runs: dict[str, dict[str, Any]] = {name: {"peak_gb_by_task": {}} for name in VARIANTS}
    first = runs["with-activation-checkpointing"]
    t0 = time.time()
    ws = Workspace(spec, TASKS, seed=0, device=device)
    first["build_s"] = round(time.time() - t0, 1)
    if cuda:
        first["resident_gb_after_build"] = round(torch.cuda.memory_allocated() / GB, 3)
    done: dict[str, Any] = {}
    for task, needs in [("generate", ()), ("reward", ("generate",)), ("logp", ("generate",)),
                        ("train", ("reward", "logp"))]:
        inputs = {name: done[name] for name in needs}
        done[task] = _peak(task, functools.partial(ws.worker(task).run, 0, inputs), first, cuda)
    first["outcome"] = "ran"
    second = runs["without-activation-checkpointing"]
    for layer in decoder_layers(ws.policy):  # back to the class's own forward
        layer.__dict__.pop("forward", None)
    try:
        _peak("train", lambda: ws.worker("train").run(
            0, {"reward": done["reward"], "logp": done["logp"]}), second, cuda)
        second["outcome"] = "ran"
    except torch.OutOfMemoryError as exc:
        second["outcome"] = "out of memory"
        second["error"] = str(exc).strip().splitlines()[0][:300]
        if cuda:
            second["peak_gb_before_failure"] = round(torch.cuda.max_memory_allocated() / GB, 3)
    return runs


def main() -> int:
    """Each variant: the verdict, then the run; print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1.5b", choices=sorted(SHAPES))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--cpu", action="store_true", help="rehearse with the tiny model")
    args = parser.parse_args()
    import torch

    from rlgraph.config.load import load_spec

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_memory: no CUDA device here; rehearse with --cpu")
        return 0
    gpu = "H100" if args.cpu or "H200" not in torch.cuda.get_device_name(0) else "H200"
    base = [*(CPU if args.cpu else SHAPES[args.shape]), "schedule.max_lag=0",
            "groups={all: {share: 1.0, tasks: [generate, logp, train]}}",
            *([] if args.cpu else ["cluster.gpus_per_node=1", f"cluster.gpu={gpu}"])]
    res: dict[str, Any] = {
        "benchmark": "compile-time memory check against torch's measured peaks, one GPU",
        "machine": machine(), "device": device_info(dry=args.cpu),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv), "graph": str(GRAPH.relative_to(ROOT)),
        "overrides": base, "gpu_preset": gpu, "variants": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    specs = {name: load_spec(GRAPH, [*base, *extra]) for name, extra in VARIANTS.items()}
    for name, extra in VARIANTS.items():
        row = {"overrides": extra, "compiler": verdict(specs[name], gpu)}
        row["compiler_says"] = "accepted" if row["compiler"]["fits"] else "refused"
        res["variants"][name] = row
    runs = measured(specs["with-activation-checkpointing"], "cpu" if args.cpu else "cuda")
    for name, run in runs.items():
        res["variants"][name]["run"] = run
        print(name, json.dumps(res["variants"][name]), flush=True)
    (args.out / "gpu-memory.json").write_text(json.dumps(res, indent=1) + "\n")
    print(f"\n{'variant':<36}{'compiler':>10}{'need GB':>9}{'outcome':>15}{'peak GB':>9}")
    for name, row in res["variants"].items():
        peaks = row["run"]["peak_gb_by_task"].values()
        peak = max(peaks, default=row["run"].get("peak_gb_before_failure", 0.0))
        print(f"{name:<36}{row['compiler_says']:>10}{row['compiler']['need_gb']:>9.1f}"
              f"{row['run']['outcome']:>15}{peak:>9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
