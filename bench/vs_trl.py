"""rlgraph against TRL's GRPOTrainer on TRL's own small workload, side by side on this machine.

The workload (bench/trl_workload.py builds it once into `--work`): a ~330K-parameter Llama
with a character tokenizer in a local Hugging Face folder, warm-started by supervised
cross-entropy; addition prompts in verl's parquet format; a verl-style `compute_score`.
GRPO with 16 prompts x 8 samples a step, 8 new tokens at most, temperature 1, lr 1e-4
(constant), no KL, clip 0.2, one update per batch, `--steps` steps (300).

Modes, each a fresh process as a user would start it:

- trl: `GRPOTrainer` (`use_cpu`, loss_type dapo = token-mean, scale_rewards group,
  gradient checkpointing off: TRL turns it on by default, off is faster here), torch's
  default threads (one per core), then greedy exact-match accuracy on the held-out prompts
  (transformers `generate`);
- trl_1thread (a control): the same with `torch.set_num_threads(1)`, the thread count
  rlgraph's start-up measurement picks for this model: how much of a difference is threads;
- sync: `rlgraph run` of one colocated group on both cores, max_lag 0 (verl's hybrid
  engine); the old-log-prob forward is skipped (on-policy, trained once);
- sync_replicas: the same colocated plan as two data-parallel replicas of one core each;
- one_step_off: trainer | rollout groups of one core each, max_lag 1;
- tuned: the plan `rlgraph tune` proposes for the one-step-off graph (written to `--work`).

rlgraph's held-out accuracy is the run's final validation (`val/accuracy`: greedy, the
same 1000 prompts, the same `compute_score`, after the last step). Round r seeds both
contenders with r (TRL's `seed`, rlgraph's `data.seed`: data order and sampling), so the
medians and ranges of accuracy cover training noise as well as the evaluation's.

Per run: samples/s = steps x 128 / train seconds (TRL: first step begin to last step end;
rlgraph: the sum of `time/step_s`, the first step's start to the last train's end; start-up
excluded in both), wall (the whole command, start-up included), held-out accuracy, and the
memory of every process of the run (PSS from /proc/PID/smaps_rollup, sampled each
`SAMPLE_S` s over the process tree; the sample with the largest total is kept, with each
process's share). Rounds are interleaved (mode order reversed every other round) so slow
spells of other load hit every mode; the JSON keeps every run, medians and ranges, and the
same-round ratio of every mode to TRL.

    python bench/vs_trl.py [--rounds 6] [--steps 300] [--modes trl,sync,...] [--work DIR]
    python bench/vs_trl.py --rounds 1 --steps 30      # short mode: proves it runs (~4 min)

Writes bench/results/vs_trl.json (`--out` to write elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, machine, spread
from trl_workload import build, greedy_accuracy

SAMPLES_PER_STEP = 16 * 8
TRL_THREADS = {"trl": 0, "trl_1thread": 1}
TRL_MODES = {"trl": "TRL GRPOTrainer, torch's default threads",
             "trl_1thread": "control: TRL GRPOTrainer on one torch thread"}
SAMPLE_S = 1.0
TARGETS = {"best_vs_trl": 1.2, "sync_vs_trl": 1.0, "accuracy_gap": 0.02}
COMMON = """cluster: {{local: true, cpus: 2}}
model: {{path: model}}
data:
  train_files: [data/train.parquet]
  val_files: [data/val.parquet]
  prompts_per_step: 16
  samples_per_prompt: 8
  prompt_len: 8
  response_len: {{mean: 3, max: 8}}
  seed: 0
algorithm: {{name: grpo, kl_coef: 0.0, clip: 0.2}}
schedule: {{max_lag: {max_lag}, steps: {steps}}}
"""
NODES = """nodes:
  generate: {kind: generate, temperature: 1.0}
  reward: {kind: reward, fn: reward.py:compute_score}
  logp: {kind: logp}
  train: {kind: train, lr: 1.0e-4}
  validate: {kind: validate, every: 100000, prompts: 1000}
  param_update: {kind: param_update, src: train, dst: generate}
"""
GRAPHS = {
    "sync": ("colocated sync, max_lag 0, every task (reward too) in one process of both "
             "cores (verl hybrid engine)", 0, "groups:\n  colocated: {share: 1.0, tasks: "
             "[generate, reward, validate, logp, train]}\n"),
    "sync_replicas": ("colocated sync, max_lag 0, two replicas of one core each", 0,
                      "groups:\n  colocated: {share: 1.0, tasks: [generate, reward, validate, "
                      "logp, train], replicas: 2}\n"),
    "one_step_off": ("trainer | rollout, one core each, max_lag 1 (one-step-off)", 1,
                     "groups:\n  trainer: {share: 0.5, tasks: [logp, train]}\n"
                     "  rollout: {share: 0.5, tasks: [generate, validate]}\n"),
}


def write_graphs(work: Path, steps: int) -> dict[str, Path]:
    """The rlgraph graphs of every mode in the workload folder; `tuned` from `rlgraph tune`."""
    paths = {}
    for mode, (_, lag, groups) in GRAPHS.items():
        text = (f"name: vs-trl-{mode}\n" + COMMON.format(max_lag=lag, steps=steps) + groups
                + NODES)
        paths[mode] = work / f"{mode}.yaml"
        paths[mode].write_text(text)
    paths["tuned"] = work / "tuned.yaml"
    # tune may change groups, replicas and max_lag up to the one-step-off graph's 1
    proc = subprocess.run([sys.executable, "-m", "rlgraph", "tune", str(paths["one_step_off"]),
                           "-o", str(paths["tuned"])], cwd=ROOT, text=True, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"rlgraph tune failed: {proc.stderr.strip()}")
    return paths


# ------------------------------------------------------------------ memory of a process tree

def _pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _label(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in cmd if w]
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0]
    name = Path(words[0]).name
    for w in words[1:3]:
        if w.endswith(".py") or w in ("-m",):
            continue
        name += " " + Path(w).name
        break
    return name[:60]


def _tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


class MemorySampler(threading.Thread):
    """Polls the PSS of a process and all its descendants; keeps the largest total."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.stop = pid, threading.Event()
        self.peak: dict[str, Any] = {"total_mib": 0.0, "processes": []}

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            procs = [(pid, _label(pid), _pss_kib(pid)) for pid in _tree(self.pid)]
            total = sum(k for _, _, k in procs) / 1024
            if total > self.peak["total_mib"]:
                self.peak = {"total_mib": round(total, 1), "processes": sorted(
                    ({"pid": p, "what": w, "pss_mib": round(k / 1024, 1)} for p, w, k in procs
                     if k), key=lambda d: -d["pss_mib"])}


def timed(cmd: list[str], cwd: Path) -> tuple[float, dict[str, Any], subprocess.CompletedProcess]:
    """Run `cmd`, sampling its memory; (wall seconds, peak memory, the finished process)."""
    start = time.time()
    proc = subprocess.Popen(cmd, cwd=cwd, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    sampler = MemorySampler(proc.pid)
    sampler.start()
    out, err = proc.communicate()
    wall = time.time() - start
    sampler.stop.set()
    sampler.join()
    return wall, sampler.peak, subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# ------------------------------------------------------------------ the two contenders

def trl_child(work: Path, steps: int, out: Path, threads: int, seed: int) -> None:
    """Runs inside a fresh process: GRPOTrainer on the workload, then held-out accuracy
    (`threads` 0: torch's default)."""
    import importlib.util

    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(seed)
    if threads:
        torch.set_num_threads(threads)
    spec = importlib.util.spec_from_file_location("reward", work / "reward.py")
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)

    def compute_score(completions, reward_model, data_source, **_):
        return [reward.compute_score(ds, c, rm["ground_truth"])
                for c, rm, ds in zip(completions, reward_model, data_source)]

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.begin, self.ends = 0.0, []

        def on_step_begin(self, args, state, control, **kw):
            self.begin = self.begin or time.time()

        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.time())

    tokenizer = AutoTokenizer.from_pretrained(work / "model")
    model = AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32)
    data = load_dataset("parquet", data_files=str(work / "data" / "train.parquet"))["train"]
    config = GRPOConfig(
        output_dir=str(out.parent / "trl-out"), per_device_train_batch_size=SAMPLES_PER_STEP,
        num_generations=8, max_completion_length=8, temperature=1.0, learning_rate=1e-4,
        lr_scheduler_type="constant", beta=0.0, epsilon=0.2, num_iterations=1,
        max_steps=steps, logging_steps=max(1, steps // 10), save_strategy="no", report_to=[],
        use_cpu=True, seed=seed, disable_tqdm=True, dataloader_num_workers=0, bf16=False,
        gradient_checkpointing=False)  # TRL turns it on by default; off is faster here
    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=compute_score, args=config,
                          train_dataset=data, processing_class=tokenizer, callbacks=[clock])
    trainer.train()
    train_s = clock.ends[-1] - clock.begin
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    out.write_text(json.dumps({
        "train_s": train_s, "steps": len(clock.ends),
        "accuracy": greedy_accuracy(trainer.model.eval(), tokenizer),
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "torch_threads": torch.get_num_threads()}))


def run_trl(work: Path, steps: int, scratch: Path, threads: int = 0, seed: int = 0
            ) -> dict[str, Any]:
    """One TRL run in a fresh process (`threads` 0: torch's default)."""
    out = scratch / "trl.json"
    wall, memory, proc = timed([sys.executable, str(Path(__file__).resolve()), "--trl-child",
                                str(work), str(steps), str(out), str(threads), str(seed)],
                               ROOT / "bench")
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        raise SystemExit(f"the TRL run failed with status {proc.returncode}")
    got = json.loads(out.read_text())
    return {"samples_per_s": steps * SAMPLES_PER_STEP / got["train_s"], "wall_s": wall,
            "train_s": got["train_s"], "accuracy": got["accuracy"],
            "reward_first": got["reward_first"], "reward_last": got["reward_last"],
            "memory": memory, "torch_threads": got["torch_threads"]}


def run_rlgraph(graph: Path, steps: int, scratch: Path, seed: int = 0) -> dict[str, Any]:
    """`rlgraph run` as a user would, in a fresh process."""
    out = scratch / graph.stem
    wall, memory, proc = timed([sys.executable, "-m", "rlgraph", "run", str(graph),
                                f"data.seed={seed}", "--steps", str(steps), "--out", str(out),
                                "--no-progress", "--trust-code"], ROOT)  # our reward.py
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-3000:])
        raise SystemExit(f"rlgraph run {graph.name} failed with status {proc.returncode}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_s = sum(r["time/step_s"] for r in rows)
    last = rows[-1]
    node_s = {k.removeprefix("time/").removesuffix("_s"): statistics.median(
        r[k] for r in rows[1:] or rows) for k in rows[-1] if k.startswith("time/")
        and k.endswith("_s") and k != "time/step_s"}
    return {"samples_per_s": len(rows) * SAMPLES_PER_STEP / train_s, "wall_s": wall,
            "train_s": train_s, "accuracy": last.get("val/accuracy"),
            "val_policy_version": last.get("val/policy_version"),
            "reward_first": rows[0]["reward/mean"], "reward_last": last["reward/mean"],
            "logp_skipped_frac": statistics.mean(r.get("logp/skipped", 0.0) for r in rows),
            "step_s_median": statistics.median(r["time/step_s"] for r in rows),
            "node_s_median": {k: round(v, 4) for k, v in node_s.items()},
            "memory": memory}


def predicted(graph: Path) -> dict[str, Any]:
    """The compiler's plan of a mode: period, groups, what logp costs."""
    sys.path.insert(0, str(ROOT))
    from rlgraph.compiler import compile_plan
    from rlgraph.config.load import load_spec

    plan = compile_plan(load_spec(graph))
    return {"period_s": plan["schedule"]["period_s"],
            "groups": {g["name"]: {"tasks": g["tasks"], "replicas": g.get("replicas", 1),
                                   "slots": g["gpus"]} for g in plan["placement"]["groups"]},
            "max_lag": plan["spec"]["schedule"]["max_lag"],
            "logp": plan["costs"].get("logp")}


# ------------------------------------------------------------------ rounds and the summary

def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode, rs in runs.items():
        out[mode] = {key: spread([r[key] for r in rs], 4) for key in
                     ("samples_per_s", "wall_s", "train_s", "accuracy")
                     if all(r.get(key) is not None for r in rs)}
        out[mode]["memory_total_mib"] = spread([r["memory"]["total_mib"] for r in rs], 4)
        for trl_mode in TRL_THREADS:  # the same round's TRL runs
            if mode != trl_mode and trl_mode in runs:
                ratios = [r["samples_per_s"] / t["samples_per_s"]
                          for r, t in zip(rs, runs[trl_mode])]
                out[mode][f"vs_{trl_mode}_same_round"] = spread(ratios, 4)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--modes",
                        default="trl,trl_1thread,sync,sync_replicas,one_step_off,tuned")
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "rlgraph-vs-trl"))
    parser.add_argument("--out", default=str(RESULTS / "vs_trl.json"))
    parser.add_argument("--trl-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trl_child:
        work, steps, out, threads, seed = args.trl_child
        trl_child(Path(work), int(steps), Path(out), int(threads), int(seed))
        return 0
    import trl

    work = Path(args.work)
    workload = build(work)
    graphs = write_graphs(work, args.steps)
    modes = args.modes.split(",")
    plans = {m: predicted(graphs[m]) for m in modes if not m.startswith("trl")}
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    began, load_before = time.time(), os.getloadavg()  # other load skews every timing
    for rnd in range(args.rounds):
        order = modes if rnd % 2 == 0 else modes[::-1]
        for mode in order:
            with tempfile.TemporaryDirectory() as scratch:
                result = (run_trl(work, args.steps, Path(scratch), TRL_THREADS[mode], rnd)
                          if mode in TRL_THREADS else
                          run_rlgraph(graphs[mode], args.steps, Path(scratch), rnd))
            result["round"] = rnd
            runs[mode].append(result)
            print(f"round {rnd} {mode:14s} {result['samples_per_s']:8.1f} samples/s  wall "
                  f"{result['wall_s']:6.1f} s  accuracy {result['accuracy']}  memory "
                  f"{result['memory']['total_mib']:.0f} MiB", flush=True)
    summary = summarize(runs)
    best = max((m for m in modes if m not in TRL_THREADS), key=lambda m:
               summary[m]["samples_per_s"]["median"], default=None)
    verdict = {}
    if "trl" in summary and best:
        trl_acc = summary["trl"]["accuracy"]["median"]
        verdict = {
            "best_mode": best,
            "best_vs_trl": summary[best]["vs_trl_same_round"]["median"],
            "sync_vs_trl": summary.get("sync", {}).get("vs_trl_same_round", {}).get("median"),
            "best_vs_trl_1thread": summary[best].get("vs_trl_1thread_same_round", {}).get(
                "median"),
            "sync_vs_trl_1thread": summary.get("sync", {}).get(
                "vs_trl_1thread_same_round", {}).get("median"),
            "accuracy_gap": {m: round(summary[m]["accuracy"]["median"] - trl_acc, 4)
                             for m in modes if m != "trl" and "accuracy" in summary[m]},
        }
        gaps = verdict["accuracy_gap"].values()
        verdict["met"] = {
            "best_vs_trl": verdict["best_vs_trl"] >= TARGETS["best_vs_trl"],
            "sync_vs_trl": (verdict["sync_vs_trl"] or 0) >= TARGETS["sync_vs_trl"],
            "accuracy_gap": all(abs(g) <= TARGETS["accuracy_gap"] for g in gaps)}
    import torch
    import transformers

    result = {
        "bench": "vs_trl", "command": "python bench/vs_trl.py " + " ".join(argv or sys.argv[1:]),
        "machine": machine(), "trl": trl.__version__, "transformers": transformers.__version__,
        "torch": torch.__version__, "rounds": args.rounds, "steps": args.steps,
        "samples_per_step": SAMPLES_PER_STEP, "workload": workload,
        "modes": {m: GRAPHS[m][0] if m in GRAPHS else TRL_MODES.get(
            m, "the plan rlgraph tune proposes from the one-step-off graph") for m in modes},
        "predicted": plans, "summary": summary, "verdict": verdict, "targets": TARGETS,
        "bench_wall_s": round(time.time() - began, 1),
        "load_average_1_5_15": {"before": load_before, "after": os.getloadavg()}, "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"summary": summary, "verdict": verdict}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
