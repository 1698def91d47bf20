"""backend megatron on GPUs: the megatron-core policy against the transformers one, tp=1 and 2.

For each tp, tp processes (torch.multiprocessing, NCCL) build the same seeded transformers
model, convert it, and check in fp32: logits and token log-probs on a padded batch (max abs
difference over real tokens), the gradients of a PPO loss (gathered over tp, in the
transformers layout, max abs difference relative to the largest gradient), the clipped
grad norm, and that the gathered state dict is bit-identical to the transformers one. In
bf16 it times a forward+backward of the same loss, megatron (tp GPUs) against transformers
(one GPU), side by side in one run. Writes bench/results/megatron-check.json.

    python bench/megatron_check.py --tp 1,2            # on a 2-GPU machine
    python bench/megatron_check.py --tp 1 --cpu        # smoke run of the fp32 checks on CPU
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import machine, write_result


def _loss(model: torch.nn.Module, seq: torch.Tensor, mask: torch.Tensor, prompt: int,
          adv: torch.Tensor) -> torch.Tensor:
    from rlgraph.engines.cpu_decode import token_logp
    from rlgraph.rl.loss import policy_loss

    lp = token_logp(model, seq, mask, prompt)
    old = lp.detach() + 0.01
    resp = mask[:, prompt:].float()
    return policy_loss(lp, old, old, adv, resp, 0.2, 2.0, old - 0.05, 0.1,
                       normaliser=resp.sum()).loss


def _batch(vocab: int, rows: int, prompt: int, response: int, device: torch.device
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded tokens; every third row left-padded by a quarter prompt, every other row
    right-padded by a quarter response."""
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(3, vocab, (rows, prompt + response), generator=gen)
    mask = torch.ones_like(seq)
    mask[::3, :prompt // 4] = 0
    mask[1::2, prompt + response - response // 4:] = 0
    adv = torch.randn(rows, generator=gen)
    return seq.to(device), mask.to(device), adv.to(device)


def _time(fn, reps: int, device: torch.device) -> float:
    """Median seconds of `fn()` over `reps` runs after one warm-up."""
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _fp32_checks(hf: torch.nn.Module, seq: torch.Tensor, mask: torch.Tensor, prompt: int,
                 adv: torch.Tensor, tp: int, device: torch.device, attention: str) -> dict:
    """Logits, log-probs, gradients, grad norm and state dict of megatron against `hf`."""
    from rlgraph.backends.megatron import _gather_tp, build_megatron_policy
    from rlgraph.backends.megatron_layout import megatron_to_hf, merge_tp
    from rlgraph.engines.cpu_decode import position_ids, token_logp
    from rlgraph.weights.buckets import digest

    real = mask.bool()
    ref = hf.to(device).float()
    mg = build_megatron_policy(hf.config, hf.state_dict(), tp=tp, device=device,
                               attention=attention)
    with torch.no_grad():
        want = ref(input_ids=seq, attention_mask=mask, position_ids=position_ids(mask)).logits
        got = mg(input_ids=seq, attention_mask=mask).logits
        lp = (token_logp(ref, seq, mask, prompt) - token_logp(mg, seq, mask, prompt))
    check = {"logits_max_abs_diff": float((got - want)[real].abs().max()),
             "logits_max_abs": float(want[real].abs().max()),
             "logp_max_abs_diff": float(lp[mask[:, prompt:].bool()].abs().max())}
    ref.zero_grad(set_to_none=True)
    _loss(ref, seq, mask, prompt, adv).backward()
    _loss(mg, seq, mask, prompt, adv).backward()
    grads = {n: p.grad.detach() for n, p in mg.gpt.named_parameters()}
    grads = megatron_to_hf(merge_tp(_gather_tp(grads, tp)), mg.layout, with_lm_head=False)
    scale = max(float(p.grad.abs().max()) for p in ref.parameters())
    check["grad_max_abs_diff_rel"] = max(float((grads[n] - p.grad).abs().max())
                                         for n, p in ref.named_parameters()) / scale
    check["grad_norm"] = [float(torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)),
                          float(mg.clip_grad_norm(1.0))]
    check["state_dict_bit_exact"] = digest(mg.state_dict()) == digest(hf.state_dict())
    return check


def worker(rank: int, tp: int, port: int, args: argparse.Namespace, queue: mp.Queue) -> None:
    """One tp rank: the fp32 checks, then the bf16 timing; rank 0 reports."""
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    from rlgraph.backends.megatron import build_megatron_policy
    from rlgraph.config.schema import ModelSpec
    from rlgraph.model.build import build_model
    from rlgraph.model.tokenizer import build_tokenizer

    device = torch.device("cpu") if args.cpu else torch.device("cuda", rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if args.cpu else "nccl", rank=rank, world_size=tp,
                            init_method=f"tcp://127.0.0.1:{port}")
    tok = build_tokenizer(None)
    hf = build_model(ModelSpec(preset=args.preset), tok, seed=0, device="cpu")
    seq, mask, adv = _batch(tok.vocab_size, args.rows, args.prompt, args.response, device)
    prompt = args.prompt
    out: dict = {"tp": tp}
    for attention in ("sdpa", "local") if device.type == "cuda" else ("sdpa",):
        try:
            out[f"fp32_{attention}"] = _fp32_checks(hf, seq, mask, prompt, adv, tp, device,
                                                    attention)
        except Exception as exc:  # megatron's own attention is a cross-check, not the backend
            if attention == "sdpa":
                raise
            out[f"fp32_{attention}"] = {"error": f"{type(exc).__name__}: {exc}"}
    if device.type == "cuda":
        ref16 = hf.to(device=device, dtype=torch.bfloat16)
        mg16 = build_megatron_policy(hf.config, ref16.state_dict(), tp=tp, device=device)

        def step(model: torch.nn.Module) -> None:
            model.zero_grad(set_to_none=True)
            _loss(model, seq, mask, prompt, adv).backward()

        out["bf16_fwd_bwd_s"] = {"megatron": _time(lambda: step(mg16), args.reps, device)}
        if tp == 1:
            out["bf16_fwd_bwd_s"]["transformers"] = _time(lambda: step(ref16), args.reps, device)
        out["gpu"] = torch.cuda.get_device_name(device)
    if rank == 0:
        queue.put(out)
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    """Run the checks for each tp; print and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", default="1,2", help="comma-separated tp sizes")
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--response", type=int, default=768)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cpu", action="store_true", help="fp32 checks on CPU (tp=1 only)")
    args = parser.parse_args(argv)
    import megatron.core.package_info as info

    results = {"machine": machine(), "megatron_core": info.__version__,
               "torch": torch.__version__, "preset": args.preset,
               "batch": [args.rows, args.prompt, args.response], "runs": []}
    ctx = mp.get_context("spawn")
    for tp in (int(t) for t in args.tp.split(",")):
        if not args.cpu and tp > torch.cuda.device_count():
            print(f"tp={tp}: skipped, {torch.cuda.device_count()} GPU(s)")
            continue
        queue = ctx.Queue()
        mp.spawn(worker, args=(tp, _free_port(), args, queue), nprocs=tp, join=True)
        run = queue.get()
        results["runs"].append(run)
        print(json.dumps(run))
    if args.cpu:
        return results
    write_result("megatron-check.json", results)
    return results


if __name__ == "__main__":
    main()
