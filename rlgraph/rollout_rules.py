"""Partial rollout's rules, written once: which prompt groups a round admits, which samples it
evicts or restarts, and which groups it may not end without.

The runtime's rollout cache (`engines.partial_rollout.RolloutCache`, and the multi-turn
`envs.rollout.AgentCache`) and the cost model's simulation of its rounds
(`pricing.rollout_rounds.simulate`) both ask one `RolloutRules`, so the prediction follows
the runtime's rules by construction. The rules only read versions and counts (the cache
keeps its samples, the simulation its lengths); pure Python, the compiler imports it too.

- **evict** (`is_stale`, `drops_stale`): a sample whose oldest token version is below the
  oldest version call `step` may train (`versions.oldest_trainable`) could never be trained
  within the bound: its group is dropped (`stale: drop` / `finish`) or the sample restarts
  from no tokens (`restart`). Without `mix_versions` (streaming without partial rollout) an
  unfinished sample begun under another version than the call's restarts too
  (`restarts_unmixed`).
- **admit** (`target`): new groups in data order until `in_flight` are held; where nothing
  sampled with the call's version could be carried to a later batch (the version is already
  the oldest the bound allows), only enough to fill this batch. Streaming (`stride` K > 1,
  one call per mini-batch, version = call // K) admits only while the version's window
  (mini-batches through (version + max_lag) * K + K - 1) has room. `taken` > 0: a refill
  inside the round (in-flight updates) for groups the round will emit, only where the
  version can be carried, and no more than the batches it can still reach take; `room`:
  whole groups into the engine's free slots, within that window less `reserve` (generate
  sharing train's GPU keeps the oversample's slack, so must-finish does not force a call to
  take exactly the oldest groups, stragglers included).
- **must finish** (`must_finish`, `stale: finish`): a round does not end while a group that
  the next call could no longer train (a token as old as the bound allows) is open, at most
  a batch of them in admission order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from rlgraph.versions import oldest_trainable

Stale = Literal["drop", "restart", "finish"]


@dataclass(frozen=True)
class RolloutRules:
    """The admission, eviction and must-finish rules of one generate node's rollout cache."""

    prompts: int  # groups a call emits (a mini-batch's with streaming)
    in_flight: int  # groups held in flight
    max_lag: int
    stale: Stale = "drop"
    stride: int = 1  # calls per policy version (streaming's mini-batches; 1 without)
    mix_versions: bool = True  # a sample may span versions (partial rollout, in-flight)
    reserve: int = 0  # groups of the window in-flight refills leave free (`of`)

    @classmethod
    def of(cls, *, prompts: int, oversample: float, max_lag: int, stale: Stale = "drop",
           stride: int = 1, mix_versions: bool = True,
           shares_device: bool = False) -> RolloutRules:
        """The rules of a cache that holds `ceil(oversample x prompts)` groups (at least a
        batch). `shares_device`: generate time-shares its GPU with train (one GPU, colocated),
        so every decode step is paid by the whole loop and a call that must finish a long
        straggler at a few rows stalls train too; in-flight refills then leave the window
        the slack the cache holds over a version's batch (`in_flight - stride x prompts`, the
        oversample's groups) as `reserve`, so a call can take the groups that complete first
        instead of exactly the oldest."""
        in_flight = max(prompts, math.ceil(oversample * prompts))
        reserve = max(0, in_flight - stride * prompts) if shares_device else 0
        return cls(prompts, in_flight, max_lag, stale, stride, mix_versions, reserve)

    def floor(self, step: int) -> int:
        """The oldest policy version call `step` may train."""
        return oldest_trainable(step, self.max_lag, self.stride)

    def is_stale(self, oldest: int, step: int) -> bool:
        """Whether a sample whose first token has version `oldest` is too old for `step`."""
        return oldest < self.floor(step)

    @property
    def drops_stale(self) -> bool:
        """Whether a stale sample drops its whole group (else it restarts alone)."""
        return self.stale in ("drop", "finish")

    def restarts_unmixed(self, oldest: int, version: int) -> bool:
        """Without `mix_versions`: whether an unfinished sample begun under version `oldest`
        restarts in a call of `version`."""
        return not self.mix_versions and oldest != version

    def can_carry(self, step: int, version: int) -> bool:
        """Whether a sample begun with `version` at call `step` may still be trained later."""
        return self.last_call(version) > step

    def window(self, step: int, version: int) -> int:
        """Groups call `step` may hold when it admits with `version`: as many as the calls
        that can still train a sample begun with it take (through `last_call(version)`)."""
        return max(0, self.last_call(version) - step + 1) * self.prompts

    def target(self, step: int, version: int, taken: int = 0, held: int = 0,
               room: int | None = None) -> int:
        """How many groups call `step` (weights of `version`) holds after admitting;
        `taken`: complete groups it will emit that a refill inside the round replaces.
        `room` (a refill inside the round on an engine that keeps rows across calls, with
        `held` groups held now): the whole groups the engine's free slots take now; the round
        then admits up to that, within the version's `window` less `reserve` (a complete
        group, or one with a single long row left, holds no slot, so counting slots, not
        groups, keeps the engine as wide as its memory allows)."""
        if room is not None:  # none where a sample begun now could only be trained now
            return max(held, min(held + room, self.window(step, version) - self.reserve)
                       if self.can_carry(step, version) else held)
        if self.stride > 1:
            window = (version + self.max_lag) * self.stride + self.stride - step
            return min(self.in_flight + taken, max(1, window) * self.prompts)
        if not self.can_carry(step, version):
            return 0 if taken else self.prompts
        if taken:  # no more than the batches this version can still reach take
            return min(self.in_flight + taken,
                       (version + self.max_lag + 1 - step) * self.prompts)
        return self.in_flight

    def last_call(self, oldest: int) -> int:
        """The last call that may train a sample whose oldest token is of version `oldest`
        (the largest step whose `floor` is <= oldest)."""
        return (oldest + self.max_lag + 1) * self.stride - 1

    def must_finish(self, oldest: Sequence[int | None], step: int) -> set[int]:
        """`stale: finish`: of groups whose oldest token versions are `oldest` (None: no
        token yet), in admission order, the indices that call `step` must take, at most a
        batch of them, oldest first; empty for the other policies. A group must be trained
        by `last_call` of its oldest version; calls step..d take `prompts` groups each, so
        of the N(d) groups due by call d, this call must take N(d) - (d - step) x prompts
        (the most over every d): the groups due now, and, where more are due by a later call
        than the calls until it can take (in-flight refills admit up to a version's
        window), enough of the oldest that none is dropped."""
        if self.stale != "finish":
            return set()
        order = sorted((v, i) for i, v in enumerate(oldest) if v is not None)
        need = 0
        for n, (v, _) in enumerate(order, 1):
            need = max(need, n - (self.last_call(v) - step) * self.prompts)
        return {i for _, i in order[:min(need, self.prompts)]}
