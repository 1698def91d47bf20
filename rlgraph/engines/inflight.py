"""In-flight weight updates: generate's decode loop adopts a new policy version between two
decode steps and goes on, and its rows stay in the engine from one call to the next.

Partial rollout's round (`partial_rollout.generate_round`) interrupts every unfinished row at
the end of a call and re-encodes its prompt and prefix in the next, and re-encodes every live
row when weights change mid-call. With `generate.inflight`, `InflightDecode` runs step 3 of
the round on the static engine (`static_rollout.StaticRollout`: CUDA graphs on a GPU, the
same code eagerly on the CPU) instead:

- no stop: an unfinished row keeps its slot and its KV cache when the call returns and goes
  on in the next call (its tokens so far are read back, `StaticDecoder.peek`, for the rollout
  cache's checkpoint state); only the rows the cache evicts are cancelled;
- finished rows are refilled from the data queue inside the call (`RolloutCache.refill` with
  `room`): new prompt groups take the free slots at once, a whole group at a time, and go
  to later batches; a call admits no more than the batches its version can still reach
  take (`RolloutRules.window`), and `must_finish` looks ahead over those batches, so a
  group admitted this way is never dropped for want of a batch;
- the host looks at the slots every `sync_every` steps while the next `sync_every` run
  (`StaticDecoder.step(lookahead=True)`): recording, refilling and checking groups do not
  idle the GPU, and a call ends one look after its batch is complete (the rows go on
  anyway);
- a version staged between decode steps is swapped in (`swap()`: the dual buffer's in-place
  copy, the only pause) and decoding goes on. `kv: keep` keeps every row's KV cache (computed
  under the versions that sampled its earlier tokens: PipelineRL's in-flight updates);
  `kv: recompute` re-encodes the live rows under the new weights (the exact behaviour policy,
  at the price of their prefill);
- every token records the version whose weights sampled it and its log-prob under them, on
  the KV its row holds: the behaviour log-prob.

The lag bound, per token: batch t trains only groups that survived the cache's eviction at
the start of call t (`RolloutCache.evict`: a sample whose first token is older than
t - max_lag is dropped or restarted, and its row cancelled here), so every row's first token,
and with `kv: keep` its prompt's KV (encoded with it), is of version >= t - max_lag; every
later token of the row, and every KV entry it attends to, is newer. A group admitted inside
call t goes to batch t + 1 or later and is admitted only while its version can still be
trained there. train checks the bound again token by token and leaves a token older than it
out of the loss (`lag/stale_tokens`, also written to the ledger): an error here cannot train
such a token silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from rlgraph.engines.partial_rollout import RolloutCache, Sample

KV = Literal["keep", "recompute"]


class InflightDecode:
    """The rows one generate replica keeps decoding across calls (module docstring):
    `decode` is partial rollout's step 3 with in-flight updates."""

    def __init__(self, rollout: Any, kv: KV = "keep") -> None:
        self.rollout, self.kv = rollout, kv  # rollout: a StaticRollout
        self.live: dict[int, tuple[list[int], Sample]] = {}  # request id -> (prompt, sample)
        self.next_id = 0

    def reset(self) -> None:
        """Cancel every row (a checkpoint was restored: its samples re-encode their prefixes
        in the next call)."""
        self.rollout.engine.cancel(list(self.live))
        self.live.clear()

    def _submit(self, rows: list[tuple[list[int], Sample]], cache: RolloutCache, step: int,
                temperature: float, top_p: float) -> None:
        """Queue samples on the engine (a prefix is re-encoded under the current weights)."""
        from rlgraph.engines.static_decode import Request

        requests = []
        for prompt, sample in rows:
            rid, self.next_id = self.next_id, self.next_id + 1
            self.live[rid] = (prompt, sample)
            if sample.first_step < 0:
                sample.first_step = step
            requests.append(Request(prompt, sample.budget or cache.max_new_tokens,
                                    temperature=temperature, top_p=top_p, request_id=rid,
                                    ignore_eos=sample.budget is not None,
                                    tokens=list(sample.tokens), logprobs=list(sample.logps),
                                    versions=list(sample.versions)))
        self.rollout.engine.submit(requests)

    def _record(self, completions: list[Any], finished: bool) -> None:
        """Copy completions (or running rows read by `peek`) into their samples."""
        for c in completions:
            rid = c.request.request_id
            _, sample = self.live[rid] if not finished else self.live.pop(rid)
            sample.tokens, sample.logps = list(c.tokens), list(c.logprobs)
            sample.versions = list(c.versions)
            sample.finished = finished

    def _free_slots(self) -> int:
        """Engine slots neither decoding a row nor promised to a queued one."""
        eng = self.rollout.engine
        return len(eng.slots) - sum(r is not None for r in eng.slots) - len(eng.queue)

    def _reencode(self) -> int:
        """`kv: recompute`: every running row is re-encoded under the current weights before
        its next token; the tokens re-encoded."""
        eng = self.rollout.engine
        stopped = eng.interrupt()
        self._record([c for c in stopped if c.finished], finished=True)
        resumed = [c for c in stopped if not c.finished]
        eng.submit([c.resume() for c in resumed], front=True)
        return sum(len(c.request.prompt) + len(c.tokens) for c in resumed)

    def decode(self, cache: RolloutCache, step: int, version: int,
               swap: Callable[[], int | None], *, temperature: float, top_p: float,
               seed: int) -> dict[str, float]:
        """Decode until `prompts_per_step` groups are complete (and, with `stale: finish`, the
        groups batch `step` must take), refilling finished rows and adopting staged versions
        between steps; unfinished rows stay in the engine. The round's statistics and the
        engine's `generate/*` metrics."""
        from rlgraph.engines.static_rollout import seed_device

        eng = self.rollout.engine
        before, start = dict(eng.stats), time.perf_counter()
        present = {id(s) for g in cache.groups for s in g.samples}
        gone = [rid for rid, (_, s) in self.live.items()
                if id(s) not in present or s.first_step < 0]  # evicted: dropped or restarted
        eng.cancel(gone)
        for rid in gone:
            del self.live[rid]
        kept = float(len(self.live))
        reencoded = 0
        if self.kv == "recompute" and self.live and eng.policy_version != version:
            reencoded += self._reencode()
        eng.set_policy_version(version)
        seed_device(eng.device, seed)
        running = {id(s) for _, s in self.live.values()}
        fresh = [(g.prompt, s) for g in cache.groups for s in g.samples
                 if not s.finished and id(s) not in running]
        carried = float(sum(1 for _, s in fresh if s.tokens))  # a checkpoint's: re-encoded
        self._submit(fresh, cache, step, temperature, top_p)
        must = cache.must_finish(step, started=True)
        switches = refilled = 0
        k = cache.samples_per_prompt

        def complete() -> set[int]:
            return {i for i, g in enumerate(cache.groups) if g.complete}

        def enough(done: set[int]) -> bool:
            return len(done) >= cache.prompts_per_step and must <= done

        done = complete()
        while not enough(done):
            # finished rows free their slots: later batches' groups take them, a whole group
            # at a time, within the window of batches the version can still reach
            size = len(cache.groups)
            added = cache.refill(step, version, room=self._free_slots() // k)
            if added:
                self._submit([(g.prompt, s) for g in cache.groups[size:] for s in g.samples],
                             cache, step, temperature, top_p)
                refilled += added
                must = cache.must_finish(step, started=True)  # more groups due by a call
            if not eng.busy:
                break
            finished = eng.step(lookahead=True)  # the next steps run while we look
            self._record(finished, finished=True)
            if finished:
                done = complete()
                if enough(done):
                    break
            new = swap()
            if new is not None:  # weights changed in place between two decode steps
                version, switches = new, switches + 1
                if self.kv == "recompute":
                    reencoded += self._reencode()
                eng.set_policy_version(new)
        self._record(eng.drain(), finished=True)  # the rows the last steps finished
        self._record(eng.peek(), finished=False)  # the running rows' tokens so far
        return {**self.rollout.metrics_since(before, start), "carried": carried,
                "kept": kept, "switches": float(switches), "refilled": float(refilled),
                "reencoded_tokens": float(reencoded)}
