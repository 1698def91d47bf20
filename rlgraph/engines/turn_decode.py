"""The static decoder for multi-turn trajectories: a sequence keeps its slot, and its KV,
between turns.

A model turn is a `Request` (the trajectory so far as its prompt, the turn's token budget).
When it finishes (eos, its budget, or `finish` at a stop string) `TurnDecoder` parks the slot
instead of freeing it: the K/V of every position it encoded stays. The trajectory's next turn
(`extend`: the same request id, a prompt that starts with what the slot holds and goes on
with the observation) encodes only the new tokens, at the positions after the kept ones, and
decodes on: a trajectory of T turns is prefilled once and then T - 1 observations, not T
times whole. The rest is `StaticDecoder`: slots decode together whatever turn each is in,
a slot's next turn joins at the next `step` (no waves), compaction moves parked slots with
their K/V. After a weight change (`invalidate`) the kept K/V is stale: the next turn of a
parked slot encodes its whole prompt again. `release` frees a slot whose trajectory ended.
`pause` parks the running sequences mid-turn (in-flight updates: a trajectory carried to the
next call goes on in its slot, its K/V kept).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from rlgraph.engines.static_decode import PREFILL_TOKENS, Completion, Request, StaticDecoder


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TurnDecoder(StaticDecoder):
    """StaticDecoder whose finished sequences keep their slot (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # parked slot -> (the sequence its K/V belongs to, positions of it encoded)
        self.parked: dict[int, tuple[list[int], int]] = {}
        self.stats["extend_tokens"] = 0
        self.stats["reused_tokens"] = 0

    # ------------------------------------------------------------------ public API

    def extend(self, requests: Iterable[Request]) -> None:
        """Start the next turn of each request: in its parked slot (same request id), encoding
        only what the slot does not hold yet; a request with no parked slot is queued."""
        starts: list[tuple[int, Request, int]] = []
        fresh: list[Request] = []
        by_id = {self.slots[b].request_id: b for b in self.parked}
        for r in requests:
            b = by_id.get(r.request_id)
            if b is None:
                fresh.append(r)
                continue
            seq, held = self.parked.pop(b)
            full = r.prompt + r.tokens
            if len(full) + r.max_new_tokens - len(r.tokens) > self.L:
                raise ValueError(f"request {r.request_id!r}: {len(full)} positions and "
                                 f"{r.max_new_tokens - len(r.tokens)} new tokens exceed "
                                 f"max_len={self.L}")
            keep = min(held, common_prefix(seq, full), len(full) - 1)
            self.slots[b] = r
            starts.append((b, r, keep))
        if fresh:
            self.submit(fresh)
        if not starts:
            return
        start = self._event()  # device time of the prefills (stats prefill_ms, CUDA)
        with torch.no_grad(), self._attn_impl():
            chunk: list[tuple[int, Request, int]] = []
            longest = 0
            for item in starts:  # in chunks of at most PREFILL_TOKENS padded tokens
                n = len(item[1].prompt) + len(item[1].tokens) - item[2]
                if chunk and (len(chunk) + 1) * max(longest, n) > PREFILL_TOKENS:
                    self._prefill(*map(list, zip(*chunk)))
                    chunk, longest = [], 0
                chunk.append(item)
                longest = max(longest, n)
            self._prefill(*map(list, zip(*chunk)))
        if start is not None:
            self._phases.append(("prefill_ms", start, self._event()))
        self.stats["reused_tokens"] += sum(k for _, _, k in starts)
        self.stats["extend_tokens"] += sum(len(r.prompt) + len(r.tokens) - k
                                           for _, r, k in starts)

    def finish(self, request_ids: Iterable[Any]) -> list[Completion]:
        """Stop these running sequences now (a stop string ended their turn) and park them;
        their completions."""
        ids = set(request_ids)
        slots = [b for b, r in enumerate(self.slots)
                 if r is not None and b not in self.parked and r.request_id in ids]
        if not slots:
            return []
        with torch.no_grad():
            self.done[torch.tensor(slots, device=self.device)] = True
            return self._collect(slots)

    def pause(self) -> list[Completion]:
        """Stop every running sequence and park it with its K/V (in-flight updates: the
        trajectory's turn goes on in a later call, in the same slot, encoding only its last
        token); their completions, the unfinished ones interrupted."""
        with torch.no_grad():
            done, _ = self._read_slots()
            running = [b for b, r in enumerate(self.slots) if r is not None
                       and b not in self.parked]
            if not running:
                return []
            rows = torch.tensor(running, device=self.device)
            pos = self.pos[rows].cpu().tolist()
            out = StaticDecoder._collect(self, running, {b for b in running if not done[b]},
                                         free=False)
            self.done[rows] = True
        for b, c, p in zip(running, out, pos):
            self.parked[b] = (c.request.prompt + c.tokens, int(p))
        return out

    @property
    def parked_ids(self) -> set[Any]:
        """Request ids of the parked slots."""
        return {self.slots[b].request_id for b in self.parked}

    def release(self, request_ids: Iterable[Any]) -> None:
        """Free the parked slots of these request ids (their trajectories ended)."""
        ids = set(request_ids)
        for b in [b for b in self.parked if self.slots[b].request_id in ids]:
            del self.parked[b]
            self.slots[b] = None

    def release_all(self) -> None:
        """Free every parked slot."""
        for b in self.parked:
            self.slots[b] = None
        self.parked.clear()

    def invalidate(self) -> None:
        """The weights changed: no parked K/V is reused (the next turn re-encodes it all)."""
        self.parked = {b: (seq, 0) for b, (seq, _) in self.parked.items()}

    @property
    def decoding(self) -> bool:
        """Whether a sequence is running or queued (parked slots aside)."""
        return bool(self.queue) or any(r is not None and b not in self.parked
                                       for b, r in enumerate(self.slots))

    @property
    def can_step(self) -> bool:
        """Whether `step` would decode: a sequence is running, or one is queued and a slot
        is free (with every slot parked, queued turns wait for a trajectory to end)."""
        return any(r is not None and b not in self.parked for b, r in enumerate(self.slots)) \
            or (bool(self.queue) and any(r is None for r in self.slots))

    def cancel(self, request_ids: Iterable[Any]) -> int:
        """StaticDecoder.cancel, parked slots included."""
        ids = set(request_ids)
        for b in [b for b in self.parked if self.slots[b].request_id in ids]:
            del self.parked[b]
        return super().cancel(ids)

    # ------------------------------------------------------------------ internals

    def _collect(self, slots: list[int], interrupted: set[int] = frozenset(),
                 free: bool = True) -> list[Completion]:
        """StaticDecoder._collect; a finished sequence's slot is parked, not freed."""
        slots = [b for b in slots if b not in self.parked]
        ended = [b for b in slots if b not in interrupted]
        if not free or not ended:
            return super()._collect(slots, interrupted, free)
        out = super()._collect([b for b in slots if b in interrupted], interrupted, free)
        pos = self.pos[torch.tensor(ended, device=self.device)].cpu().tolist()
        done = super()._collect(ended, free=False)
        for b, c, p in zip(ended, done, pos):
            self.parked[b] = (c.request.prompt + c.tokens, int(p))
        return out + done

    def _move_slots(self, moves: list[tuple[int, int]], upto: int) -> None:
        """StaticDecoder._move_slots; a parked slot moves with all the K/V it holds."""
        held = [self.parked[a][1] for a, _ in moves if a in self.parked]
        super()._move_slots(moves, max([upto, *held]))
        for a, b in moves:
            if a in self.parked:
                self.parked[b] = self.parked.pop(a)
