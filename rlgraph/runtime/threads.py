"""How many torch threads a CPU actor of several slots uses: measured at start-up, not assumed.

A local group of several CPU slots can run its model with one intra-op thread per slot, or
with one thread. For a small model each op is too short for threads to pay (the hand-off
costs more than the split saves), and on a machine shared with other work a thread waiting
for a descheduled partner stalls every op: on 2 cores shared with other work the tiny preset
trained 1.38x faster on one thread than on two, and the 329K-parameter Llama of
bench/trl_workload.py (2026-11-24) generated a step in 77 vs 417 ms and trained it in 146 vs
625 ms on one vs two threads. On the same 2 cores, quiet (bench/results/async_vs_sync.json,
2026-11-26), two threads trained the tiny preset 1.33x faster but decoded 2.3x slower. So an
actor holding more than one
slot times a forward and backward of a step-sized batch on one thread and on all its slots,
and keeps the faster (the least of `REPEATS` timings each, after a warm-up pass).
"""

from __future__ import annotations

import time

import torch

REPEATS = 3


def _pass_seconds(model: torch.nn.Module, ids: torch.Tensor, threads: int,
                  give_up: float = float("inf")) -> float:
    """The least of REPEATS timed forward + backward passes at `threads` threads (only the
    warm-up pass when that already took over `give_up` seconds: no need to wait for more)."""
    torch.set_num_threads(threads)
    best = float("inf")
    for i in range(REPEATS + 1):
        start = time.perf_counter()
        model(input_ids=ids, use_cache=False).logits.float().mean().backward()
        took = time.perf_counter() - start
        if i:  # the first pass warms the allocator and kernels
            best = min(best, took)
        elif took > give_up:
            best = took
            break
    model.zero_grad(set_to_none=True)
    return best


def choose_threads(model: torch.nn.Module, slots: int, rows: int, width: int,
                   seed: int = 0) -> tuple[int, dict[int, float]]:
    """1 or `slots` torch threads, whichever ran a [rows, width] forward + backward faster;
    the choice is applied (torch.set_num_threads) and returned with the seconds measured."""
    if slots <= 1:
        torch.set_num_threads(1)
        return 1, {}
    vocab = model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    ids = torch.randint(0, vocab, (max(1, rows), max(2, width)), generator=gen).to(device)
    was_training = model.training
    one = _pass_seconds(model, ids, 1)
    seconds = {slots: _pass_seconds(model, ids, slots, give_up=2 * one), 1: one}
    model.train(was_training)
    threads = min(seconds, key=lambda n: seconds[n])
    torch.set_num_threads(threads)
    return threads, seconds
