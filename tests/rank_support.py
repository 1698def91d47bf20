"""Run a test's gloo ranks as child processes that share one import of torch and the model
code: a forkserver (a fresh, single-threaded process, never the pytest process with its Ray
driver threads) imports them once and forks each rank from itself. Spawning each rank costs
a fresh interpreter that imports torch and transformers' Llama again (about 4 s of CPU each
on this machine's cores); a forked rank starts in milliseconds."""

from __future__ import annotations

import io
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

# what every rank imports: loaded once in the forkserver
PRELOAD = ["torch", "transformers.models.llama.modeling_llama", "rlgraph.process.workspace",
           "rlgraph.process.replicas"]


def free_port() -> int:
    """A TCP port free on localhost now (the ranks' rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _guarded(target: Callable[..., Any], rank: int, port: int, args: tuple, queue: Any,
             collect: bool) -> None:
    """A rank: its target's result (or b"" when not collected) on the queue, or its
    traceback, so the test shows the failure whatever became of the rank's stderr."""
    try:
        if collect:
            target(rank, port, *args, queue)
        else:
            target(rank, port, *args)
            queue.put(b"")
    except BaseException:
        queue.put(traceback.format_exc())
        raise


def run_ranks(target: Callable[..., Any], world: int, *args: Any, collect: bool = True,
              timeout: float = 120) -> list[Any]:
    """`target(rank, port, *args, queue)` in `world` forked ranks; each puts one
    `torch.save`d bytes object on the queue. Returns what each rank put, in rank order (each
    a tuple whose first item is its rank), after checking every rank exited cleanly. With
    `collect` False the target is `target(rank, port, *args)` and returns nothing. A rank
    that raises fails the test with its traceback."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # taken by the forkserver when it first starts
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_guarded, args=(target, rank, port, args, queue, collect))
             for rank in range(world)]
    for p in procs:
        p.start()
    answers = [queue.get() for _ in procs]
    for p in procs:
        p.join(timeout=timeout)
    failed = [a for a in answers if isinstance(a, str)]
    assert not failed, "a rank failed:\n" + "\n".join(failed)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    if not collect:
        return []
    return sorted((torch.load(io.BytesIO(a)) for a in answers), key=lambda r: r[0])
