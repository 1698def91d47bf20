"""Generation pause per weight sync on CPU: dual buffer vs a receive queued behind generate.

Two Ray actors (train, generate) hold a mid-size Llama (fp32, default ~25M parameters).
Per sync, side by side in one run:
- `queued`: the receive runs in the generate actor's own task queue (what param_update did
  before the dual buffer): generation waits for the whole receive plus the switch;
- `dual` (object store, and the nccl transport over gloo): the receive runs in the actor's
  `sync` concurrency group into the second buffer; generation waits only for the switch.
Also: one generate call alone vs the same call with a sync landing during it (the cost of
the overlap on a machine whose cores the two share).

    python bench/weight_sync_bench.py [--syncs 5] [--layers 8] [--hidden 512]

Writes bench/results/weight_sync.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                         os.environ.get("PYTHONPATH")]))

from bench.common import RESULTS, machine  # noqa: E402

PRODUCE_MB, CONSUME_MB = 16, 4
NODE = "param_update"  # the quickstart's param_update node: its worker runs in the actors


def _switch_s(actor) -> float:
    """On the actor: switch a staged version in; the seconds it took (the generation pause)."""
    ws = actor.workspace
    ws.take_pause_s()
    assert ws.swap_if_staged() is not None, "nothing staged"
    return ws.take_pause_s()


def _new_weights(trainer, version: int) -> None:
    import ray
    import torch

    state = ray.get(trainer.state_for_checkpoint.remote())
    gen = torch.Generator().manual_seed(version)
    state["weights"] = {k: v + 1e-3 * torch.randn(v.shape, generator=gen)
                        for k, v in state["weights"].items()}
    state["policy_version"] = version
    ray.get(trainer.load_checkpoint.remote(state))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    args = parser.parse_args(argv)

    import ray

    from rlgraph.config.load import load_spec
    from rlgraph.runtime import weight_sync
    from rlgraph.runtime.actors import start_actor
    from rlgraph.weights import BucketMiB

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    hidden = args.hidden
    config = {"model_type": "llama", "vocab_size": 64, "hidden_size": hidden,
              "num_hidden_layers": args.layers, "num_attention_heads": 8,
              "num_key_value_heads": 8, "intermediate_size": int(hidden * 2.6875),
              "max_position_embeddings": 512, "tie_word_embeddings": True}
    spec = load_spec(ROOT / "graphs" / "quickstart.yaml",
                     ["model={hf_config: " + json.dumps(config) + "}",
                      "data.prompts_per_step=4", "data.samples_per_prompt=4",
                      "data.response_len={mean: 24, max: 32}"])
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=512 * 2**20,
             logging_level=logging.WARNING, log_to_driver=False)
    opts = {"seed": 0, "threads": 1, "device": "cpu", "options": {"num_cpus": 0}}
    trainer = start_actor(spec, ["train"], **opts)
    rollout = start_actor(spec, ["generate"], **opts)
    ray.get([trainer.ready.remote(), rollout.ready.remote()])
    bucket_mb = BucketMiB(PRODUCE_MB, CONSUME_MB)
    route = weight_sync.Route(NODE, trainer, rollout, bucket_mb, "nccl")
    weight_sync.connect_route(route, "gloo")
    probe = rollout.__ray_call__.options(concurrency_group=weight_sync.RECEIVE)

    def generate(step: int) -> float:
        _, info = ray.get(rollout.run.options(num_returns=2).remote("generate", step, []))
        return info["end"] - info["start"]

    rows: dict[str, list[dict]] = {"queued": [], "dual": [], "dual_gloo": []}
    version = 0
    generate(0)  # warm-up
    for i in range(args.syncs):
        for mode in rows:
            version += 1
            _new_weights(trainer, version)
            if mode == "queued":
                key = f"{NODE}:{version}"  # the receive queued behind generate
                trainer.export_weights.remote(key, bucket_mb)
                info = ray.get(rollout.apply_weights.remote(trainer, key, bucket_mb))
                switch = ray.get(probe.remote(_switch_s))
                pause = info["end"] - info["recv_start"] + switch
            else:
                ref = (weight_sync.start_param_update(route, version)[0] if mode == "dual_gloo"
                       else weight_sync.submit_param_update(trainer, rollout, NODE, bucket_mb,
                                                            step=version))
                info = ray.get(ref)
                switch = ray.get(probe.remote(_switch_s))
                pause = switch
            rows[mode].append({"param_update_s": info["end"] - info["start"],
                               "GBps": info["summary"]["metrics"]["sync/GBps"],
                               "pause_s": pause, "switch_s": switch, "bytes": info["bytes"]})
        print(f"sync {i + 1}/{args.syncs}: " + "  ".join(
            f"{m} pause {r[-1]['pause_s'] * 1e3:.1f} ms" for m, r in rows.items()), flush=True)
    # generation alone vs with a sync landing during it
    alone = [generate(100 + i) for i in range(3)]
    overlapped = []
    for i in range(3):
        version += 1
        _new_weights(trainer, version)
        gen = rollout.run.options(num_returns=2).remote("generate", 200 + i, [])
        time.sleep(0.05)
        info = ray.get(weight_sync.submit_param_update(trainer, rollout, NODE, bucket_mb,
                                                       step=version))
        _, ginfo = ray.get(gen)
        overlapped.append({"generate_s": ginfo["end"] - ginfo["start"],
                           "sync_inside": info["end"] < ginfo["end"]})
        ray.get(probe.remote(_switch_s))

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[mode])

    summary = {m: {k: med(m, k) for k in ("pause_s", "switch_s", "param_update_s", "GBps")}
               for m in rows}
    result = {
        "machine": machine(), "model_bytes": rows["dual"][0]["bytes"],
        "produce_mb": PRODUCE_MB, "consume_mb": CONSUME_MB, "syncs": args.syncs,
        "median": summary,
        "pause_ratio_queued_over_dual": summary["queued"]["pause_s"] / summary["dual"]["pause_s"],
        "generate_alone_s": statistics.median(alone),
        "generate_with_sync_inside_s": statistics.median(o["generate_s"] for o in overlapped),
        "overlap_runs": overlapped, "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = Path(RESULTS / "weight_sync.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "machine")},
                     indent=2))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
