"""Where a GPU node's time goes, and how it scales with the rows it gets: the workers of
bench/graphs_gpu/colocated-sync.yaml on one GPU, at the whole batch and at a half and a
quarter of it (what each of 2 or 4 data-parallel replicas gets), plus the torch profiler's
device-busy share of one logp and one train call. Tells whether splitting a step over
replicas can pay (compute-bound nodes) or not (launch / host-bound ones).

  PYTHONUNBUFFERED=1 python bench/node_profile.py [--out DIR] [--name NAME] [--reps N]
                                                 [key=value ...]

Writes OUT/NAME.json (default bench/results/gpu-node-profile.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import device_info, machine  # noqa: E402

GRAPH = ROOT / "bench" / "graphs_gpu" / "colocated-sync.yaml"


def sync() -> None:
    """Wait for the GPU (nothing to wait for on CPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps: int) -> float:
    """Median wall seconds of `fn()` (GPU work finished), after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def busy_share(fn) -> dict[str, float]:
    """Wall time of one call and the share of it the GPU spent in kernels (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fn()
        sync()
        wall = time.perf_counter() - start
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), flush=True)
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    device_s = sum(e.device_time for e in kernels) / 1e6  # microseconds -> s
    return {"wall_s": round(wall, 4), "kernel_s": round(device_s, 4),
            "kernels": len(kernels), "busy": round(device_s / wall, 3)}


def main() -> int:
    import torch

    from rlgraph.config.load import load_spec
    from rlgraph.process.workspace import Workspace
    from rlgraph.rl.batch import take_rows

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--name", default="gpu-node-profile", help="OUT/NAME.json")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cuda", help="cpu: a rehearsal")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    spec = load_spec(GRAPH, ["nodes.generate.cuda_decode=graphs", *args.overrides])
    tasks = ["generate", "logp", "ref_logp", "train"]
    ws = Workspace(spec, tasks, seed=0, device=args.device)
    workers = {t: ws.worker(t) for t in tasks}
    batch = workers["generate"].run(0, {})
    batch["rewards"] = torch.rand(len(batch["group"]), generator=torch.Generator().manual_seed(0))
    batch = workers["logp"].run(0, {"b": batch})
    batch = workers["ref_logp"].run(0, {"b": batch})
    total = len(batch["group"])
    out: dict = {"machine": machine(), "device": device_info(),
                 "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                 "graph": str(GRAPH.relative_to(ROOT)), "rows": {}}
    for share in (1, 2, 4):
        rows = total // share
        part = take_rows(batch, slice(0, rows))
        node_s = {t: timed(lambda t=t, p=part: workers[t].run(0, {"b": dict(p)}), args.reps)
                  for t in ("logp", "ref_logp", "train")}
        node_s["generate"] = timed(lambda: workers["generate"].run(0, {}), 2) if share == 1 \
            else None
        out["rows"][rows] = {k: (round(v, 4) if v is not None else None)
                             for k, v in node_s.items()}
        print(f"{rows:5d} rows: " + "  ".join(f"{k} {v}" for k, v in out["rows"][rows].items()),
              flush=True)
    out["profile"] = {t: busy_share(lambda t=t: workers[t].run(0, {"b": dict(batch)}))
                      for t in ("logp", "train")}
    print(json.dumps(out["profile"]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
