"""What partial rollout's rounds decode in steady state, by a seeded simulation of the rollout
cache's rounds (`engines.partial_rollout`) over the response-length distribution, under the
cache's own admission, eviction and must-finish rules (`rlgraph.rollout_rules`).

A round holds `ceil(oversample * P)` prompt groups of k samples (the carried ones first, then
new ones in data order), decodes every unfinished sample one token a step, and stops at the
first check (every `check_every` steps) where P groups are complete and, with `stale: finish`,
every group that the next batch could no longer train (a token `max_lag` versions old) is
complete too; it emits the first P complete groups in admission order and carries the rest,
whose prompt + prefix the next round re-encodes. The round's cost is not its mean width: the
rows still decoding late in a round are the long carried ones, so a step's KV reads follow
the live rows' own contexts, which this records per stretch of the round.
"""

from __future__ import annotations

import heapq
import math
import random
import threading
from array import array
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat

from rlgraph.lengths import LengthModel
from rlgraph.rollout_rules import RolloutRules

SEGMENTS = 24  # stretches of a round the live rows and their contexts are sampled over
ROUNDS = 24  # rounds simulated; the first WARMUP (an empty cache filling up) are left out
WARMUP = 6
# padded tokens of one prefill call of the static engine (engines/static_decode.py
# PREFILL_TOKENS, whose `_admit` prefills the queue in order, each chunk padded to its
# longest row); tests/unit/pricing/test_rollout_rounds.py checks the two agree
PREFILL_TOKENS = 16384


@dataclass(frozen=True)
class RoundProfile:
    """Mean figures of one steady-state round (per replica)."""

    steps: float  # decode steps a round runs
    # (steps a round, live rows, their mean context, the longest live row's context)
    segments: tuple[tuple[float, float, float, float], ...]
    reencoded_tokens: float  # prompt + prefix tokens of carried rows re-encoded a round
    reencoded_square: float  # sum of their squared lengths (attention of the re-encode)
    carried_groups: float  # groups in flight carried into a round
    decoded_tokens: float  # tokens decoded a round (each sample's tokens once)
    dropped_samples: float = 0.0  # samples a round evicts with their group (stale)
    # padding the engine's prefill chunks add to a round's re-encoded and new rows
    padding_tokens: float = 0.0
    # unfinished rows a round hands the engine (carried and new): each a request in, a
    # completion out (`StaticRollout.resume`)
    submitted_rows: float = 0.0


def _inflight_stop(groups: list[dict], starts: list[int], prompts: int,
                   must: Callable[[], list[int]], check_every: int,
                   room: Callable[[int, int], int], new_group: Callable[[int], dict]) -> int:
    """In-flight updates: the round's last step. The engine looks every `check_every` steps;
    a group is complete at the first look after its longest row's end. At each look (the
    first before any step) the round ends if `prompts` groups are complete with every group
    `must()` names among them, else new groups are admitted until the round holds
    `room(live rows, complete groups)`; they start decoding at once. Appends the admitted
    groups to `groups` and their first steps to `starts`."""
    def look(start: int, left: int) -> int:  # the first look at or after a row's end
        return start + math.ceil(left / check_every) * check_every

    def push(i: int) -> None:  # a look where group i's rows free slots, its last completes it
        for r in set(groups[i]["left"]):
            heapq.heappush(heap, (look(starts[i], r), r == max(groups[i]["left"]), i))

    heap: list[tuple[int, bool, int]] = [(0, False, -1)]  # the first look, before any step
    for i in range(len(groups)):
        push(i)
    done: set[int] = set()
    stop = 0
    due = set(must())
    while heap:
        stop = heap[0][0]
        while heap and heap[0][0] == stop:
            _, completes, i = heapq.heappop(heap)
            if completes:
                done.add(i)
        if len(done) >= prompts and due <= done:
            break
        live = sum(1 for g, a in zip(groups, starts, strict=True) for r in g["left"]
                   if a + r > stop)
        target = room(live, len(done))
        if len(groups) < target:  # free slots: later batches' groups
            while len(groups) < target:
                groups.append(new_group(stop))
                starts.append(stop)
                push(len(groups) - 1)
            due = set(must())  # more groups due by a later call
    return stop


def _restart_older(groups: list[dict], version: int, rules: RolloutRules) -> None:
    """Without `mix_versions` (`rules.restarts_unmixed`): restart every unfinished sample of
    a group begun under another version than `version` (its decoded tokens go back to its
    length). A group's unfinished samples all began under
    one version: its own, or the one they last restarted under (`restarted`); a group with
    no finished sample takes the new version."""
    for g in groups:
        began = g.get("restarted", g["version"])
        if began is None or not rules.restarts_unmixed(began, version):
            continue
        rows = list(zip(g["left"], g["done"], strict=True))
        g["left"] = [r + d if r > 0 else 0 for r, d in rows]  # unfinished: from its prompt
        g["done"] = [0 if r > 0 else d for r, d in rows]
        g["restarted"] = version
        if not any(r == 0 and d > 0 for r, d in rows):
            g["version"] = version


_DRAWING = threading.Lock()


@lru_cache(maxsize=16)
def _drawn(m: LengthModel, seed: int) -> tuple[random.Random, array]:
    """The seeded generator of `m`'s lengths and the lengths it has drawn so far."""
    return random.Random(seed), array("q")


class _Lengths:
    """`m.length_at(u)` for u = Random(seed).random(), .random(), ... in order: the same
    sequence for every simulation of `m` and `seed`, each length drawn once per process."""

    def __init__(self, m: LengthModel, seed: int) -> None:
        self.m, self.taken = m, 0
        self.rng, self.drawn = _drawn(m, seed)

    def take(self, n: int) -> list[int]:
        """The next `n` lengths of the sequence."""
        first, self.taken = self.taken, self.taken + n
        if self.taken > len(self.drawn):
            with _DRAWING:  # one draw per place, in order, whichever thread draws it
                while len(self.drawn) < self.taken:
                    self.drawn.append(self.m.length_at(self.rng.random()))
        return self.drawn[first:self.taken].tolist()


@dataclass(frozen=True)
class Forced:
    """A replica's forced lengths (benchmark mode, `bench_mode.forced_length`): data seed
    `seed`, `prompts` of the step's `per_step` data positions from `first` on (the replica's
    share, `nodes.generate`'s `_data_position`)."""

    seed: int
    per_step: int
    first: int
    prompts: int


class _ForcedLengths:
    """The lengths a run forces, group by group in data order: the replica's own n-th prompt
    is data position (n // prompts) x per_step + first + n % prompts."""

    def __init__(self, m: LengthModel, forced: Forced) -> None:
        self.m, self.forced, self.own = m, forced, 0

    def take(self, n: int) -> list[int]:
        """The next group's `n` sample lengths."""
        from rlgraph.bench_mode import forced_length

        f = self.forced
        step, index = divmod(self.own, f.prompts)
        self.own += 1
        position = step * f.per_step + f.first + index
        return [forced_length(f.seed, position, j, self.m) for j in range(n)]


def _alive(runs: list[tuple[int, int, int]]) -> Callable[[float], list[float]]:
    """For `runs` sorted (first step, steps, context): s -> the contexts at step s of the rows
    decoding then (a <= s < a + r, as c + s - a), in the order of `runs`. Rows of one first
    step are sorted by their steps, so the live ones of each are a suffix found by bisection
    (`s - a` is exact: a is a whole number no larger than s)."""
    firsts: list[int] = []
    blocks: list[tuple[int, list[int], list[int]]] = []
    for a, r, c in runs:
        if not firsts or a != firsts[-1]:
            firsts.append(a)
            blocks.append((a, [], []))
        blocks[-1][1].append(r)
        blocks[-1][2].append(c)

    def alive(s: float) -> list[float]:
        out: list[float] = []
        for a, steps, contexts in blocks[:bisect_right(firsts, s)]:
            live = map(s.__radd__, contexts[bisect_right(steps, s - a):])  # c + s
            out += live if a == 0 else map(float.__sub__, live, repeat(float(a)))  # - a
        return out
    return alive


@lru_cache(maxsize=512)
def simulate(m: LengthModel, prompts: int, k: int, oversample: float, max_lag: int,
             stale: str, check_every: int, prompt_len: int,
             generate_lag: int | tuple[int, ...] = 0,
             seed: int = 0, stride: int = 1, inflight: bool = False,
             reencode: bool = True, mix_versions: bool = True,
             slots: int | None = None, slot_refill: bool = True,
             shares_device: bool = False, first_lags: tuple[int, ...] = (),
             window: tuple[int, int] | None = None,
             forced: Forced | None = None,
             after_on_policy: int | None = None) -> RoundProfile:
    """Run the cache's rounds with lengths drawn from `m` (seeded) and average the steady
    ones (after WARMUP). `generate_lag`: versions the round's weights lag its step (0 where
    generate runs after the previous train step, as in one colocated group), or a cycle of
    lags, round t taking `generate_lag[t % len]` (a colocated group that runs two generate
    calls before their two train steps: (0, 1)). `stride` K > 1:
    streaming, one call per mini-batch of `prompts` groups, version = call // K, the whole
    batch's K x oversample x prompts groups in flight, admitted only while their version can
    still be trained (`RolloutCache.refill`). `inflight` (`engines.inflight`): a completed
    group's place is refilled inside the round (`_inflight_stop`), and carried rows keep
    their KV cache, re-encoded only with `reencode` (kv: recompute, once a version); a
    look admits the whole groups the engine's free slots take (`slots`: the engine's, at
    most a row for every group in flight), within the version's window
    (`RolloutRules.target` with `room`, as `engines.inflight` refills), and must-finish
    counts a group with no token yet at its admission version; engine revisions before
    that rule (`slot_refill` False) refilled the round's complete groups (`taken`) and
    fixed the must-finish groups at the round's start. `shares_device` (generate in train's
    group, in flight): the refills leave the oversample's groups of the window free
    (`RolloutRules.of`, as the generate node sets it).
    Without `mix_versions` (streaming without partial rollout) a sample never spans versions:
    an unfinished one begun under an older version restarts from its prompt (as
    `RolloutCache.evict` does; with `stale: restart` a stale group restarts whole here, where
    the cache restarts only its samples older than the bound).
    `first_lags` and `window` price a run's first rounds rather than the steady ones: round
    t < len(first_lags) takes lag `first_lags[t]` (its start-up's, `lag.startup_lags`), and
    the profile averages rounds window[0] <= t < window[1] of a cache empty at the first.
    `forced`: the lengths a benchmark-mode run forces (`Forced`) instead of seeded draws.
    `after_on_policy`: the lag of a round that follows an on-policy batch (every token of
    the version train starts from: the runtime skips its old-log-prob forward, so a group
    whose train waits on a batch from outside it runs the next generate first; the first
    round's batch is always one), where the start-up's schedule says (`lag.startup_lags`)."""
    lengths = _ForcedLengths(m, forced) if forced is not None else _Lengths(m, seed)
    lags = generate_lag if isinstance(generate_lag, tuple) else (generate_lag,)
    rules = RolloutRules.of(prompts=prompts, oversample=oversample * stride, max_lag=max_lag,
                            stale=stale, stride=stride, mix_versions=mix_versions,
                            shares_device=shares_device and inflight)
    engine = min(slots, rules.in_flight * k) if slots else rules.in_flight * k
    groups: list[dict] = []  # {"version": first token's, "left": [remaining], "done": [...]}
    totals = {"steps": 0.0, "re": 0.0, "re2": 0.0, "carried": 0.0, "tokens": 0.0,
              "dropped": 0.0, "pad": 0.0, "rows": 0.0}
    segments: list[tuple[float, float, float, float]] = []
    counted = 0
    first, last = window or (WARMUP, ROUNDS)
    warm = first * stride
    on_policy = False  # the previous round's batch
    for t in range(last * stride):
        call = t // stride
        lag = first_lags[call] if call < len(first_lags) else lags[call % len(lags)]
        if after_on_policy is not None and on_policy:
            lag = after_on_policy
        version = call - lag
        if groups:  # evict: a group holding a token too old for batch t (finish: the
            kept = []  # overflow beyond a batch of must-finish groups) is dropped or restarted
            for g in groups:
                if any(g["done"]) and rules.is_stale(g["version"], t):
                    if rules.drops_stale:
                        totals["dropped"] += k if t >= warm else 0
                        continue
                    g["left"] = [r + d for r, d in zip(g["left"], g["done"], strict=True)]
                    g["done"] = [0] * k
                    g["version"] = version
                kept.append(g)
            groups = kept
        _restart_older(groups, version, rules)
        carried = len(groups)
        target = rules.target(t, version)

        def room(live: int, complete: int, t: int = t, version: int = version,
                 groups: list[dict] = groups) -> int:
            # in-flight updates refill inside the round: whole groups into the free slots
            if not slot_refill:  # (earlier engines: a group for each complete one)
                return rules.target(t, version, min(complete, prompts))
            return rules.target(t, version, held=len(groups), room=(engine - live) // k)

        re_tokens = re_square = 0.0
        queue = []  # rows the round prefills, in queue order: carried, then new
        for g in groups:  # carried rows: prompt and prefix re-encoded under this round's weights
            for r, d in zip(g["left"], g["done"], strict=True):
                if r > 0 and d > 0 and (reencode or not inflight):
                    re_tokens += prompt_len + d
                    re_square += (prompt_len + d) ** 2
                    queue.append(prompt_len + d)
        admitted = len(groups)

        def new_group(_: int, version: int = version) -> dict:
            # in flight, a group's version is that of its first token (set when it decodes
            # one: a group admitted in a round that decodes nothing starts later)
            return {"version": None if inflight else version, "admitted": version,
                    "left": lengths.take(k), "done": [0] * k}

        while len(groups) < target:
            groups.append(new_group(0))
        submitted = sum(1 for g in groups for r in g["left"] if r > 0)
        queue += [prompt_len] * (k * (len(groups) - admitted))
        padding = chunk_padding(queue) if queue and queue[0] > prompt_len else 0
        need = [max(g["left"]) for g in groups]  # steps until each group is complete
        must = sorted(rules.must_finish([g["version"] if any(g["done"]) else None
                                         for g in groups], t))
        starts = [0] * len(groups)
        if inflight:
            def due(t: int = t, groups: list[dict] = groups, fixed: list[int] = must
                    ) -> list[int]:
                if not slot_refill:  # (earlier engines: the groups due at the start)
                    return fixed
                # a group with no token yet counts as begun with its admission version
                return sorted(rules.must_finish(
                    [g["version"] if g["version"] is not None else g["admitted"]
                     for g in groups],
                    t))

            stop = _inflight_stop(groups, starts, prompts, due, check_every, room, new_group)
        else:
            end = sorted(need)[prompts - 1]
            if must:
                end = max(end, max(need[i] for i in must))
            stop = min(max(need), math.ceil(end / check_every) * check_every)
        if t >= warm:  # a round whose batch is already complete decodes nothing, and counts
            # rows: (first step, steps decoded this round, context at its first step)
            runs = sorted((a, min(r, stop - a), prompt_len + d) for g, a in zip(groups, starts)
                          for r, d in zip(g["left"], g["done"], strict=True)
                          if r > 0 and a < stop)
            counted += 1
            totals["steps"] += stop
            totals["re"] += re_tokens
            totals["re2"] += re_square
            totals["carried"] += carried
            totals["pad"] += padding
            totals["rows"] += submitted
            totals["tokens"] += sum(r for _, r, _ in runs)
            width = stop / SEGMENTS
            live = _alive(runs)
            for j in range(SEGMENTS):
                s = (j + 0.5) * width
                alive = live(s)
                if alive:
                    segments.append((width, len(alive), sum(alive) / len(alive), max(alive)))
        for g, a in zip(groups, starts, strict=True):
            ran = max(0, stop - a)
            if g["version"] is None and ran > 0:
                g["version"] = version
            g["done"] = [d + min(r, ran) for r, d in zip(g["left"], g["done"], strict=True)]
            g["left"] = [max(0, r - ran) for r in g["left"]]
        complete = [i for i, g in enumerate(groups) if max(g["left"]) == 0][:prompts]
        on_policy = version == call and all(groups[i]["version"] == version
                                            and "restarted" not in groups[i]
                                            for i in complete)
        chosen = set(complete)
        groups = [g for i, g in enumerate(groups) if i not in chosen]
    n = max(1, counted)
    merged = _merge(segments, n)
    return RoundProfile(totals["steps"] / n, merged, totals["re"] / n, totals["re2"] / n,
                        totals["carried"] / n, totals["tokens"] / n, totals["dropped"] / n,
                        totals["pad"] / n, totals["rows"] / n)


def chunk_padding(rows: list[int], budget: int = PREFILL_TOKENS) -> int:
    """Padding tokens the static engine's prefill adds to `rows` (lengths in queue order):
    `StaticDecoder._admit` closes a chunk before a row that would take it past `budget`
    padded tokens and pads every row of a chunk to its longest."""
    padded = longest = count = 0
    for n in rows:
        if count and (count + 1) * max(longest, n) > budget:
            padded += count * longest
            longest = count = 0
        count += 1
        longest = max(longest, n)
    return padded + count * longest - sum(rows)


def _merge(segments: list[tuple[float, float, float, float]], rounds: int
           ) -> tuple[tuple[float, float, float, float], ...]:
    """The rounds' stretches pooled by live rows and longest context (steps per round, live
    rows, mean context, longest context): few points for a cost of (rows, contexts)."""
    bins: dict[tuple[int, int], list[float]] = {}
    for steps, live, context, longest in segments:
        key = (int(math.log2(max(1.0, live)) * 4), int(math.log2(max(1.0, longest)) * 4))
        b = bins.setdefault(key, [0.0, 0.0, 0.0, 0.0])
        b[0] += steps
        b[1] += steps * live
        b[2] += steps * live * context
        b[3] += steps * longest
    return tuple((s / rounds, rows / s, kv / rows, top / s) for s, rows, kv, top in
                 (bins[key] for key in sorted(bins)) if s > 0 and rows > 0)


def pooled(profiles: list[RoundProfile]) -> RoundProfile:
    """The mean round of several profiles of as many rounds each (seeds of one window)."""
    n = len(profiles)
    segments = [s for p in profiles for s in p.segments]

    def mean(field: str) -> float:
        return sum(getattr(p, field) for p in profiles) / n

    return RoundProfile(mean("steps"), _merge(segments, n), mean("reencoded_tokens"),
                        mean("reencoded_square"), mean("carried_groups"),
                        mean("decoded_tokens"), mean("dropped_samples"), mean("padding_tokens"),
                        mean("submitted_rows"))
