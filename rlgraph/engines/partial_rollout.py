"""Partial rollout: the rollout cache and the resumable decode round (verl's async
partial-rollout recipe, AReaL's interruptible generation).

The unit is a prompt group: the `samples_per_prompt` samples of one prompt (GRPO needs whole
groups). State, all in `RolloutCache`: `groups`, the groups in flight in admission order, each
sample with its tokens, behaviour log-probs and the policy version of every token;
`next_position`, the next data position to admit (a fresh cache starts at its first step's
position in the synchronous order, step * prompts_per_step); running totals.

`generate_round(cache, step, ...)` is generate(t), given weights of version >= t - max_lag:
1. evict: a sample whose oldest token version is < t - max_lag could never be trained within
   the bound; its group is dropped (`stale: drop`, every sample counted in `rollout/dropped`)
   or the sample restarts from no tokens (`stale: restart`, counted in `rollout/restarted`).
   Both lose the long answers first (they need the most rounds), so the trained lengths fall
   below the started ones; `stale: finish` prevents it: round t does not end while a group
   holding a token of version t - max_lag (the oldest a batch t may train) is open, so such
   a group is trained in batch t, not evicted (drop stays the rule for what still goes
   stale: more of them than one batch takes);
2. refill (supplementation): admit new prompts in data order, deterministic in (seed,
   position), until `ceil(oversample * prompts_per_step)` groups are in flight. When the
   round's weights are already as old as the bound allows (version <= t - max_lag), a sample
   started now can only be trained in batch t, so spares would be decoded only to be dropped
   (and would favour short responses): the round then admits just enough groups to fill
   batch t. This is the case with max_lag 0, and whenever generate runs max_lag versions
   behind (a separated plan whose trainer is the bottleneck); carrying pays when generate is
   the bottleneck and runs fresher than the bound;
3. decode every unfinished sample in one `sampling.Decoder` (CPU) or on the static engine
   (GPU, `StaticRollout.resume`): its prompt and prefix are re-encoded under the current
   weights (no KV from older weights is reused), its budget is response_len.max (or its
   forced length, generate's benchmark mode) minus its prefix; the round stops once
   `prompts_per_step` groups are complete (and, with `stale: finish`, the groups that must
   be trained now; checked every step,
   or every `sync_every` steps on the static engine). Between steps `swap()` may adopt
   newly staged weights: the live rows are re-encoded and continue, so a sample's tokens
   then carry both versions;
4. emit the first `prompts_per_step` complete groups in admission order (always a full
   batch); the others stay in the cache with their tokens, log-probs and versions.

Streaming (`stride` K > 1, generate called once per mini-batch m = t*K + j of version t):
`prompts_per_step` is a mini-batch's groups and `in_flight` the whole batch's, so finished
rows are refilled with new prompts at every call (continuous batching at mini-batch
granularity); the lag floor of call m is m // K - max_lag, and a group is admitted only
while the version window it can still be trained in (through mini-batch
(version + max_lag) * K + K - 1) has room for it. Without `mix_versions` (partial rollout off)
a sample never spans versions: one started under an older version restarts at the next call.

Steps 1, 2 and the round's end ask `rlgraph.rollout_rules.RolloutRules` (`RolloutCache.rules`),
the same rules the cost model's simulation of these rounds follows.

Why no trained token exceeds the lag: batch t's tokens are either sampled in round t (version
>= t - max_lag) or survived step 1 of round t. With max_lag 0 nothing sampled earlier survives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from rlgraph.rollout_rules import RolloutRules, Stale

if TYPE_CHECKING:
    import torch


@dataclass
class Sample:
    """One response in progress: its tokens so far, their behaviour log-probs and versions."""

    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finished: bool = False  # eos sampled or response_len.max reached
    first_step: int = -1  # the generate step that sampled its first token
    budget: int | None = None  # a benchmark's forced length (eos ignored until it)

    def oldest(self) -> int | None:
        """Version of its first token (versions only grow along a sample), None if empty."""
        return self.versions[0] if self.versions else None

    def restart(self) -> None:
        """Forget every token: the sample starts again under the current weights (with the
        same budget)."""
        self.tokens, self.logps, self.versions = [], [], []
        self.finished, self.first_step = False, -1

    def state(self) -> dict[str, Any]:
        """Plain lists and numbers (a copy), for checkpoints."""
        return asdict(self)


@dataclass
class PromptGroup:
    """The samples of one prompt, admitted at data position `position`."""

    position: int
    prompt: list[int]
    samples: list[Sample]
    admitted: int | None = None  # the policy version when it was admitted (None: unknown)

    def oldest(self, started: bool = False) -> int | None:
        """The oldest token version of its samples; with `started`, a group that has no
        token yet counts as begun with the version it was admitted under (its first token
        can only be as new or newer: the bound it must meet, never a later one)."""
        versions = [s.oldest() for s in self.samples if s.versions]
        return min(versions) if versions else (self.admitted if started else None)

    @property
    def complete(self) -> bool:
        """Every sample has finished: the group may be trained on."""
        return all(s.finished for s in self.samples)


class RolloutCache:
    """The prompt groups in flight between generate calls (see the module docstring)."""

    sample_type: type[Sample] = Sample  # what a group holds (a multi-turn cache: trajectories)

    def __init__(self, *, prompts_per_step: int, samples_per_prompt: int, oversample: float,
                 max_lag: int, stale: Stale, max_new_tokens: int,
                 prompt_of: Callable[[int], list[int]],
                 length_of: Callable[[int, int], int] | None = None,
                 stride: int = 1, mix_versions: bool = True,
                 shares_device: bool = False) -> None:
        self.prompts_per_step, self.samples_per_prompt = prompts_per_step, samples_per_prompt
        # admission, eviction and must-finish (rlgraph.rollout_rules; the cost model's
        # simulation of these rounds asks the same rules)
        self.rules = RolloutRules.of(prompts=prompts_per_step, oversample=oversample,
                                     max_lag=max_lag, stale=stale, stride=stride,
                                     mix_versions=mix_versions,
                                     shares_device=shares_device)
        self.max_new_tokens = max_new_tokens
        self.prompt_of = prompt_of  # data position -> prompt token ids
        self.length_of = length_of  # (data position, sample) -> forced length, or None
        self.groups: list[PromptGroup] = []
        self.next_position: int | None = None  # set by the first round (or a checkpoint)
        self.totals = {"admitted": 0, "emitted": 0, "dropped": 0, "restarted": 0}  # samples

    @property
    def in_flight(self) -> int:
        """Prompt groups the cache holds after admitting."""
        return self.rules.in_flight

    @property
    def mix_versions(self) -> bool:
        """Whether a sample may span policy versions."""
        return self.rules.mix_versions

    def samples(self) -> int:
        """Samples in the cache."""
        return sum(len(g.samples) for g in self.groups)

    def evict(self, step: int, version: int | None = None) -> tuple[int, int]:
        """Drop or restart every sample too old to be trained at `step`: (dropped, restarted).
        Without `mix_versions`, a sample begun under a version other than `version` restarts."""
        rules = self.rules
        dropped = restarted = 0
        keep = []
        for group in self.groups:
            stale = [s for s in group.samples if s.versions and rules.is_stale(s.oldest(), step)]
            if version is not None and not stale:
                mixed = [s for s in group.samples if s.versions and not s.finished
                         and rules.restarts_unmixed(s.oldest(), version)]
                for sample in mixed:
                    sample.restart()
                restarted += len(mixed)
            if stale and rules.drops_stale:
                dropped += len(group.samples)
                continue
            for sample in stale:
                sample.restart()
            restarted += len(stale)
            keep.append(group)
        self.groups = keep
        self.totals["dropped"] += dropped
        self.totals["restarted"] += restarted
        return dropped, restarted

    def refill(self, step: int, version: int, taken: int = 0, room: int | None = None) -> int:
        """Admit new prompt groups in data order until `in_flight` are in flight, or only
        until batch `step` can be filled when nothing sampled with `version` could be
        carried to a later batch (see the module docstring); how many were admitted.
        `taken`: complete groups this round will emit (a refill inside the decode, in-flight
        updates): the groups admitted for them go to later batches, so only where `version`
        can be carried there. `room`: instead, the whole groups the engine's free slots
        take now (in-flight updates): up to that many, within the version's window
        (`RolloutRules.target`)."""
        if self.next_position is None:
            self.next_position = step * self.prompts_per_step
        target = self.rules.target(step, version, taken, held=len(self.groups), room=room)
        added = 0
        while len(self.groups) < target:
            position = self.next_position
            budgets = [None if self.length_of is None else self.length_of(position, k)
                       for k in range(self.samples_per_prompt)]
            self.groups.append(PromptGroup(position, list(self.prompt_of(position)),
                                           [Sample(budget=b) for b in budgets], version))
            self.next_position += 1
            added += 1
        self.totals["admitted"] += added * self.samples_per_prompt
        return added

    def must_finish(self, step: int, started: bool = False) -> set[int]:
        """`stale: finish`: indices of the groups that batch `step` must take because later
        batches could not (`RolloutRules.must_finish`), at most a batch of them, oldest
        first; a round does not end while one is open. `started`: groups with no token yet
        count as begun with their admission version (in-flight updates, whose running rows'
        tokens reach the cache only when the call ends). Empty for the other policies."""
        return self.rules.must_finish([g.oldest(started) for g in self.groups], step)

    def take(self) -> list[PromptGroup]:
        """Remove and return the first `prompts_per_step` complete groups (admission order)."""
        chosen = [g for g in self.groups if g.complete][: self.prompts_per_step]
        if len(chosen) < self.prompts_per_step:
            raise RuntimeError(f"only {len(chosen)} of {self.prompts_per_step} prompt groups "
                               "are complete")
        ids = {id(g) for g in chosen}
        self.groups = [g for g in self.groups if id(g) not in ids]
        self.totals["emitted"] += len(chosen) * self.samples_per_prompt
        return chosen

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """The cache as plain lists and ints (a copy: later rounds do not change it)."""
        return {
            "next_position": self.next_position,
            "totals": dict(self.totals),
            "groups": [{"position": g.position, "admitted": g.admitted,
                        "samples": [s.state() for s in g.samples]} for g in self.groups],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (prompts are re-read from their positions)."""
        self.next_position = state["next_position"]
        self.totals = dict(state["totals"])
        self.groups = [PromptGroup(g["position"], list(self.prompt_of(g["position"])),
                                   [self.sample_type(**s) for s in g["samples"]],
                                   g.get("admitted"))
                       for g in state["groups"]]


def _complete_groups(finished: torch.Tensor, row_group: torch.Tensor, groups: int) -> set[int]:
    """Groups with no unfinished row (rows not in the decoder have finished already)."""
    import torch

    open_rows = torch.zeros(groups, dtype=torch.long, device=finished.device)
    open_rows.index_add_(0, row_group, (~finished).long())
    return set((open_rows == 0).nonzero().flatten().tolist())


def decode(cache: RolloutCache, step: int, model: torch.nn.Module, version: int,
           swap: Callable[[], int | None], engine: Any = None,
           **sampling: Any) -> dict[str, float]:
    """Step 3 of the round: decode the unfinished samples until `prompts_per_step` groups are
    complete, adopting staged weights between steps; appends the new tokens to the samples.
    `sampling` (eos_id, pad_id, temperature, top_p, generator) goes to `sampling.Decoder`,
    or with `engine` (rlgraph.engines.static_rollout.StaticRollout, on a GPU) to its static
    decoder, which checks for complete groups and staged weights every `sync_every` steps."""
    import torch

    rows = [(i, s) for i, g in enumerate(cache.groups) for s in g.samples if not s.finished]
    stats = {"carried": float(sum(1 for _, s in rows if s.tokens)), "decode_steps": 0.0,
             "switches": 0.0}
    must = cache.must_finish(step)

    def enough(complete: set[int]) -> bool:
        return len(complete) >= cache.prompts_per_step and must <= complete

    if not rows or enough({i for i, g in enumerate(cache.groups) if g.complete}):
        return stats
    if engine is not None:
        return {**stats, **_decode_static(cache, step, engine, version, swap, rows, enough,
                                          **sampling)}
    from rlgraph.engines.cpu_decode import Decoder

    if cache.length_of is not None:  # forced lengths: only the budget stops a row
        sampling = {**sampling, "eos_id": -1}
    budgets = [(s.budget or cache.max_new_tokens) - len(s.tokens) for _, s in rows]
    decoder = Decoder(model, [cache.groups[i].prompt for i, _ in rows],
                      prefixes=[s.tokens for _, s in rows], budgets=budgets,
                      max_new_tokens=max(budgets), **sampling)
    row_group = torch.tensor([i for i, _ in rows], device=decoder.finished.device)
    while True:
        decoder.step(version)
        stats["decode_steps"] += 1
        complete = _complete_groups(decoder.finished, row_group, len(cache.groups))
        if enough(complete) or decoder.done:
            break
        new = swap()
        if new is not None:  # weights changed: recompute every row's KV under them
            version = new
            decoder.reencode()
            stats["switches"] += 1
    finished = decoder.finished.tolist()
    for (_, sample), (tokens, logps, versions), done in zip(rows, decoder.rows(), finished):
        if tokens and not sample.tokens:
            sample.first_step = step
        sample.tokens += tokens
        sample.logps += logps
        sample.versions += versions
        sample.finished = bool(done)
    return stats


def _decode_static(cache: RolloutCache, step: int, engine: Any, version: int,
                   swap: Callable[[], int | None], rows: list[tuple[int, Sample]],
                   enough: Callable[[set[int]], bool], temperature: float,
                   generator: torch.Generator, top_p: float = 1.0,
                   **_: Any) -> dict[str, float]:
    """`decode` on the static engine: each row a request carrying its sample so far (prompt
    and prefix prefilled under the current weights, budget max_new_tokens, or the sample's
    forced length, minus the prefix)."""
    from rlgraph.engines.static_decode import Request

    requests = [Request(cache.groups[i].prompt, s.budget or cache.max_new_tokens,
                        temperature=temperature, top_p=top_p, request_id=r,
                        ignore_eos=s.budget is not None, tokens=list(s.tokens),
                        logprobs=list(s.logps), versions=list(s.versions))
                for r, (i, s) in enumerate(rows)]
    groups = set(range(len(cache.groups)))

    def enough_rows(finished: set[int]) -> bool:
        return enough(groups - {i for r, (i, _) in enumerate(rows) if r not in finished})

    done, metrics = engine.resume(requests, policy_version=version,
                                  seed=generator.initial_seed(), swap=swap,
                                  enough=enough_rows)
    for (_, sample), c in zip(rows, done):
        if c.tokens and not sample.tokens:
            sample.first_step = step
        sample.tokens, sample.logps, sample.versions = c.tokens, c.logprobs, c.versions
        sample.finished = c.finished
    return metrics


def generate_round(cache: RolloutCache, step: int, model: torch.nn.Module, version: int,
                   swap: Callable[[], int | None], engine: Any = None, inflight: Any = None,
                   **sampling: Any) -> tuple[list[PromptGroup], dict[str, float]]:
    """generate(step) with the cache: evict, refill, decode, emit (see the module docstring).
    `inflight` (an `engines.inflight.InflightDecode`): step 3 keeps rows in the engine across
    calls, refills inside the call and adopts new versions without stopping. Returns the
    emitted groups and the round's `rollout/*` metrics (and, on the static engine, its
    `generate/*` ones)."""
    dropped, restarted = cache.evict(step, version)
    cache.refill(step, version)
    if inflight is not None:
        stats = inflight.decode(cache, step, version, swap,
                                temperature=sampling["temperature"],
                                top_p=sampling.get("top_p", 1.0),
                                seed=sampling["generator"].initial_seed())
    else:
        stats = decode(cache, step, model, version, swap, engine, **sampling)
    groups = cache.take()
    spans = [s.versions[-1] - s.versions[0] for g in groups for s in g.samples if s.versions]
    metrics = {
        **cache_round_metrics(cache, stats, dropped, restarted, max(spans, default=0)),
        **{f"rollout/{k}": stats[k] for k in ("kept", "refilled", "reencoded_tokens")
           if k in stats},
        **{k: v for k, v in stats.items() if k.startswith("generate/")},
    }
    return groups, metrics


def cache_round_metrics(cache: RolloutCache, stats: dict[str, Any], dropped: int, restarted: int,
                  version_span: float) -> dict[str, float]:
    """The `rollout/*` figures every partial-rollout round reports (single- and multi-turn):
    what was dropped, restarted and carried, the version span, decode steps and switches,
    the cache's size and its running totals (a metrics row that misses a round's figures
    still adds up)."""
    return {
        "rollout/dropped": float(dropped),
        "rollout/restarted": float(restarted),
        "rollout/carried": stats["carried"],
        "rollout/version_span": float(version_span),
        "rollout/decode_steps": stats["decode_steps"],
        "rollout/switches": stats["switches"],
        "rollout/cached": float(cache.samples()),
        **{f"rollout/{k}_total": float(v) for k, v in cache.totals.items()},
    }
