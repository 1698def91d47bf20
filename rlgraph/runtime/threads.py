"""How many torch threads a CPU actor of several slots uses: measured at start-up, not assumed.

A local group of several CPU slots can run its model with one intra-op thread per slot, or
with one thread. For a small model each op is too short for threads to pay (the hand-off
costs more than the split saves), and on a machine shared with other work a thread waiting
for a descheduled partner stalls every op: on 2 cores the tiny preset trained 1.38x faster
on one thread than on two (bench/results/async_vs_sync.json, sync_1core vs sync), and the
329K-parameter Llama of bench/trl_workload.py, on a 2-core machine shared with other jobs
(2026-11-24), generated a step in 77 vs 417 ms and trained it in 146 vs 625 ms on one vs two
threads. A larger model gains from the second thread. So an actor holding more than one
slot times a step-like pass on one thread and on all its slots, and keeps the faster (the
least of `REPEATS` timings each, after a warm-up pass): a forward and backward of a step-sized
batch, and where the actor also generates, that many one-token forwards as a batch decodes
(decode's small ops are where a second thread loses most: timing train alone picked two
threads for the vs-TRL workload, 89 vs 121 ms, and its steps then ran 1.37x slower, 2026-11-25).
"""

from __future__ import annotations

import time

import torch

REPEATS = 3


def _pass_seconds(model: torch.nn.Module, ids: torch.Tensor, threads: int,
                  give_up: float = float("inf"), decode_steps: int = 0) -> float:
    """The least of REPEATS timed passes at `threads` threads: a forward + backward of `ids`
    and `decode_steps` no-grad forwards of one token a row (only the warm-up pass when that
    already took over `give_up` seconds: no need to wait for more)."""
    torch.set_num_threads(threads)
    best = float("inf")
    for i in range(REPEATS + 1):
        start = time.perf_counter()
        model(input_ids=ids, use_cache=False).logits.float().mean().backward()
        with torch.no_grad():
            for _ in range(decode_steps):
                model(input_ids=ids[:, -1:], use_cache=False)
        took = time.perf_counter() - start
        if i:  # the first pass warms the allocator and kernels
            best = min(best, took)
        elif took > give_up:
            best = took
            break
    model.zero_grad(set_to_none=True)
    return best


def choose_threads(model: torch.nn.Module, slots: int, rows: int, width: int,
                   seed: int = 0, decode_steps: int = 0) -> tuple[int, dict[int, float]]:
    """1 or `slots` torch threads, whichever ran a [rows, width] forward + backward and
    `decode_steps` one-token forwards faster; the choice is applied (torch.set_num_threads)
    and returned with the seconds measured."""
    if slots <= 1:
        torch.set_num_threads(1)
        return 1, {}
    vocab = model.get_input_embeddings().num_embeddings
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    ids = torch.randint(0, vocab, (max(1, rows), max(2, width)), generator=gen).to(device)
    was_training = model.training
    one = _pass_seconds(model, ids, 1, decode_steps=decode_steps)
    seconds = {slots: _pass_seconds(model, ids, slots, give_up=2 * one,
                                    decode_steps=decode_steps), 1: one}
    model.train(was_training)
    threads = min(seconds, key=lambda n: seconds[n])
    torch.set_num_threads(threads)
    return threads, seconds
