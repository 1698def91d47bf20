"""The space `rlgraph tune` searches (the evaluation of one plan in it: `rlgraph.tune.evaluate`).

A candidate plan is a `Candidate`: a partition of the grouped tasks into colocated groups
(`blocks`), whole GPUs per group (`sizes`), `max_lag`, `partial_rollout` and generate's `tp`.

- Partitions: every set partition of the tasks the user put in groups (Bell(n) of them; one
  block is the colocated plan).
- Sizes respect machine boundaries: a group smaller than a machine packs inside one machine,
  a larger one takes whole machines. Per group, a size is kept only if the placement pass
  accepts the group alone (tp / pp / ep divide it, the batch splits over its data-parallel
  replicas, the model fits), so its checks are reused, not copied. A size vector is kept only
  if no group could take a larger accepted size with the rest unchanged: in the cost models a
  group with more GPUs is never slower, so a vector leaving such GPUs unused cannot win.
- `max_lag` runs over 0..the user's bound; partial rollout is tried only where the user turned
  it on (it changes what a sample is: tokens of several versions), and only with max_lag >= 1.
- generate's tp runs over the choices given (`tune(..., tp_choices=...)`), else stays as written.
- Sharding: a group whose model state does not fit its GPUs replicated gets `sharding: fsdp`
  on its torch passes (train, logp, ref_logp) where that makes it fit (`SearchSpace.sharding`):
  FSDP costs collectives and saves memory only, so a group that fits replicated stays so.
- A multi-turn generate's env workers: the fewest, at most the graph's, that step every
  trajectory in flight at once (`env_workers`; more never lowers the env's cost).
- Streaming (only where the user set `schedule.stream`): the mini-batches per version run
  over `stream_choices` (the divisors of prompts_per_step among 1, 2, 4, 8, 16 and the
  user's), tried on the best layouts the search found (`_Search.refine_mini_batches`): costs
  do not depend on it, only the mini-batch timed graph does. A layout that puts generate
  beside train cannot stream and is priced without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlgraph.compiler import MAX_SIMULATED_LAG
from rlgraph.compiler.period_bound import Bound
from rlgraph.compiler.placement import Placement, place
from rlgraph.compiler.timed_graph import TimedGraph
from rlgraph.config.schema import GroupSpec, Spec
from rlgraph.errors import SpecError
from rlgraph.nodes import KINDS

Block = tuple[str, ...]
PRUNE_TOLERANCE = 1e-7  # a bound above cutoff * (1 + this) cannot win (float noise aside)
COLOCATED = "colocated"


@dataclass(frozen=True)
class Candidate:
    """One plan of the search space."""

    blocks: tuple[Block, ...]
    sizes: tuple[int, ...]
    max_lag: int
    partial_rollout: bool
    tp: int | None = None  # generate's tp; None keeps the graph's
    mini_batches: int | None = None  # streaming's mini-batches per version; None: the graph's
    inflight: bool | None = None  # generate's in-flight updates; None: the graph's

    @property
    def layout(self) -> tuple:
        """Everything but the lag: candidates sharing it share placement and costs."""
        return (self.blocks, self.sizes, self.partial_rollout, self.tp, self.mini_batches,
                self.inflight)


@dataclass
class Evaluation:
    """What the compiler says of a candidate: period (None if pruned by its bound) and more."""

    candidate: Candidate
    spec: Spec | None
    bound_s: float
    period_s: float | None = None
    idle_gpus: float = 0.0
    tg: TimedGraph | None = None
    bound: Bound | None = None
    error: str | None = None  # why the placement pass refused it

    @property
    def feasible(self) -> bool:
        """Placed without error and simulated."""
        return self.error is None and self.period_s is not None


def env_workers(node: Any, spec: Spec, partial: bool) -> Any:
    """A multi-turn generate with the fewest env workers (at most the graph's) whose threads
    step all its trajectories in flight at once: the env's cost never falls with more (the
    pool then holds every trajectory), so this is the search's optimum of that dimension,
    with the fewest actors. Other nodes as they are."""
    env = getattr(node, "env", None)
    if env is None:
        return node
    rows = spec.data.samples_per_step() * (float(node.oversample) if partial else 1.0)
    workers = max(1, min(env.workers, math.ceil(rows / env.threads)))
    return node.model_copy(update={"env": env.model_copy(update={"workers": workers})})


def streamed(spec: Spec) -> int | None:
    """A plan's mini-batches per version, None when it does not stream."""
    return spec.schedule.stream.mini_batches if spec.schedule.stream is not None else None


def in_flight(spec: Spec) -> bool:
    """Whether a plan's generate takes new weights in flight (`generate.inflight`)."""
    return any(getattr(n, "inflight", False) for n in spec.nodes.values())


def set_partitions(items: Sequence[str]) -> Iterator[list[list[str]]]:
    """Every partition of `items` into non-empty blocks, each exactly once."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in set_partitions(rest):
        yield [[first], *part]
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1:]]


def bell(n: int) -> int:
    """Number of partitions of n items."""
    row = [1]
    for _ in range(n):
        nxt = [row[-1]]
        for value in row:
            nxt.append(nxt[-1] + value)
        row = nxt
    return row[0]


class SearchSpace:
    """Choices of one graph: tasks, machine-aligned sizes, lags, partial rollout, tp."""

    def __init__(self, spec: Spec, tp_choices: Sequence[int] | None = None):
        self.spec = spec
        self.tasks: tuple[str, ...] = tuple(t for g in spec.groups.values() for t in g.tasks)
        cluster = spec.cluster
        self.slots = cluster.slots()
        self.per_node = self.slots if cluster.local else cluster.gpus_per_node
        self.machines = 1 if cluster.local else cluster.nodes
        self.sizes = tuple(range(1, self.per_node + 1)) + tuple(
            self.per_node * k for k in range(2, self.machines + 1))
        # lags beyond what compile simulates are not searched (compile time stays bounded)
        self.lags = tuple(range(min(spec.schedule.max_lag, MAX_SIMULATED_LAG) + 1))
        self.partials = (False, True) if spec.schedule.partial_rollout else (False,)
        has_generate = any(KINDS[node.kind].samples for node in spec.nodes.values())
        self.tps: tuple[int | None, ...] = tuple(dict.fromkeys(tp_choices)) \
            if tp_choices and has_generate else (None,)
        self.user_blocks = {name: tuple(g.tasks) for name, g in spec.groups.items()}
        stream, prompts = spec.schedule.stream, spec.data.prompts_per_step
        self.stream_choices: tuple[int, ...] = tuple(sorted(
            {k for k in (1, 2, 4, 8, 16) if prompts % k == 0} | {stream.mini_batches})
        ) if stream is not None else ()
        self._packs: dict[tuple[int, ...], bool] = {}
        self._sharding: dict[tuple, tuple[str, ...] | None] = {}
        # in-flight updates are tried only where the user turned them on (kv: keep changes
        # the behaviour policy a little), with and without (`_Search.refine_inflight`)
        self.inflight = any(getattr(n, "inflight", False) for n in spec.nodes.values())

    def canonical(self, blocks: Sequence[Sequence[str]]) -> tuple[Block, ...]:
        """Blocks in the order of their first task, tasks in the user's order."""
        order = {t: i for i, t in enumerate(self.tasks)}
        sorted_blocks = [tuple(sorted(b, key=order.__getitem__)) for b in blocks]
        return tuple(sorted(sorted_blocks, key=lambda b: order[b[0]]))

    def partitions(self) -> list[tuple[Block, ...]]:
        """Every partition (canonical), fewest groups first."""
        order = {t: i for i, t in enumerate(self.tasks)}
        out = [self.canonical(part) for part in set_partitions(list(self.tasks))
               if all(self.holds_policy(block) for block in part)]
        return sorted(out, key=lambda p: (len(p), [[order[t] for t in b] for b in p]))

    def holds_policy(self, block: Sequence[str]) -> bool:
        """A block that needs the policy gets it: logp runs beside train or generate (which
        param_update feeds) or a param_update delivers to it; validate shares generate's
        engine, so it stays beside a generate."""
        nodes = self.spec.nodes
        fed = {n.dst for n in nodes.values() if KINDS[n.kind].carries_weights}
        roles = [KINDS[nodes[t].kind] for t in block]
        samples = any(r.samples for r in roles)
        if any(r.validates for r in roles) and not samples:
            return False
        return (not any(r.proximal_logp for r in roles) or samples
                or any(r.advances_policy for r in roles) or bool(fed & set(block)))

    def lags_for(self, partial: bool) -> tuple[int, ...]:
        """max_lag values allowed with this partial-rollout setting (partial needs >= 1)."""
        return tuple(lag for lag in self.lags if lag >= 1) if partial else self.lags

    def names(self, blocks: Sequence[Block]) -> list[str]:
        """Group names: the user's where the tasks match, 'colocated' for all, else tasks."""
        out: list[str] = []
        for block in blocks:
            name = next((n for n, b in self.user_blocks.items() if set(b) == set(block)), None)
            if name is None:
                name = COLOCATED if len(block) == len(self.tasks) else "-".join(block)
            base, k = name, 2
            while name in out:
                name, k = f"{base}-{k}", k + 1
            out.append(name)
        return out

    def spec_for(self, cand: Candidate) -> Spec:
        """The candidate as a Spec: shares = GPUs / slots, so placement gives exactly `sizes`;
        each group sharded as `sharding` says."""
        groups = {name: GroupSpec(share=size / self.slots, tasks=list(block))
                  for name, block, size in zip(self.names(cand.blocks), cand.blocks, cand.sizes)}
        sharded = [t for block, size in zip(cand.blocks, cand.sizes)
                   for t in self.sharding(block, size, cand.tp) or ()]
        return self.variant(groups, cand.max_lag, cand.partial_rollout, cand.tp,
                            cand.mini_batches, cand.inflight, sharded)

    def sharding(self, block: Block, size: int, tp: int | None) -> tuple[str, ...] | None:
        """The block's nodes to shard with FSDP on `size` GPUs: none where the placement
        pass accepts the block as written, its torch passes where only sharded it fits (or
        divides), None where neither is accepted."""
        key = (block, size, tp)
        if key not in self._sharding:
            group = {"probe": GroupSpec(share=size / self.slots, tasks=list(block))}
            shardable = tuple(t for t in block
                              if getattr(self.spec.nodes[t], "sharding", None) == "none"
                              and getattr(self.spec.nodes[t], "backend", "torch") == "torch")
            self._sharding[key] = None
            for nodes in ((), shardable) if shardable else ((),):
                try:
                    place(self.variant(group, 0, False, tp, sharded=nodes))
                except SpecError:
                    continue
                self._sharding[key] = nodes
                break
        return self._sharding[key]

    def variant(self, groups: dict[str, GroupSpec], lag: int, partial: bool,
                tp: int | None, mini_batches: int | None = None,
                inflight: bool | None = None, sharded: Sequence[str] = ()) -> Spec:
        """The user's spec with other groups, lag, partial rollout, generate tp,
        streaming's mini-batches, in-flight updates (None: the user's, kept where the
        plan has the rollout cache and a lag for them, `compiler.lag.check_inflight`) and
        `sharding: fsdp` on the `sharded` nodes."""
        spec = self.spec
        update: dict[str, Any] = {"max_lag": lag, "partial_rollout": partial}
        stream = spec.schedule.stream
        if stream is not None and not self.streams(groups):
            update["stream"] = None  # a group that trains and generates cannot stream
        elif stream is not None and mini_batches is not None:
            update["stream"] = stream.model_copy(update={"mini_batches": mini_batches})
        schedule = spec.schedule.model_copy(update=update)
        holds = lag >= 1 and (partial or schedule.stream is not None)
        nodes = {}
        for n, node in spec.nodes.items():
            change: dict[str, Any] = {}
            if tp is not None and KINDS[node.kind].samples:
                change["tp"] = tp
            if n in sharded:
                change["sharding"] = "fsdp"
            if getattr(node, "inflight", False) or inflight:
                change["inflight"] = holds and (node.inflight if inflight is None else inflight)
            nodes[n] = node.model_copy(update=change) if change else node
        nodes = {n: env_workers(node, spec, partial) for n, node in nodes.items()}
        return spec.model_copy(update={"groups": groups, "schedule": schedule, "nodes": nodes})

    def streams(self, groups: Mapping[str, GroupSpec]) -> bool:
        """Whether `schedule.stream` can hold under these groups: no group both generates
        and trains (`rlgraph.compiler.lag.check_stream`)."""
        nodes = self.spec.nodes
        for group in groups.values():
            roles = [KINDS[nodes[t].kind] for t in group.tasks if t in nodes]
            if any(r.samples for r in roles) and any(r.advances_policy for r in roles):
                return False
        return True

    def packs(self, sizes: Sequence[int]) -> bool:
        """Whole-machine groups take free machines; smaller ones best-fit inside machines."""
        if sum(sizes) > self.slots:
            return False
        key = tuple(sorted(sizes))
        if key not in self._packs:
            self._packs[key] = self._best_fit(key)
        return self._packs[key]

    def _best_fit(self, sizes: Sequence[int]) -> bool:
        whole = sum(s // self.per_node for s in sizes if s >= self.per_node)
        if whole > self.machines:
            return False
        free = [self.per_node] * (self.machines - whole)
        for s in sorted((s for s in sizes if s < self.per_node), reverse=True):
            fits = [i for i, room in enumerate(free) if room >= s]
            if not fits:
                return False
            best = min(fits, key=lambda i: (free[i], i))
            free[best] -= s
        return True

    def size_vectors(self, choices: Sequence[Sequence[int]], valid: Sequence[Sequence[int]]
                     ) -> Iterator[tuple[int, ...]]:
        """Packable size vectors, one of `choices[i]` per block, that leave no block room to
        take its next larger accepted size (`valid[i]`)."""
        k = len(choices)
        if any(not c for c in choices):
            return
        rest = [sum(min(c) for c in choices[i + 1:]) for i in range(k)]
        bigger = [{s: next((v for v in valid[i] if v > s), None) for s in choices[i]}
                  for i in range(k)]

        def rec(i: int, prefix: tuple[int, ...], used: int) -> Iterator[tuple[int, ...]]:
            if i == k:
                yield prefix
                return
            for s in choices[i]:
                if used + s + rest[i] <= self.slots:
                    yield from rec(i + 1, (*prefix, s), used + s)

        for sizes in rec(0, (), 0):
            if not self.packs(sizes):
                continue
            if not any(bigger[i][s] is not None
                       and self.packs((*sizes[:i], bigger[i][s], *sizes[i + 1:]))
                       for i, s in enumerate(sizes)):
                yield sizes

    def aligned(self, placement: Placement) -> bool:
        """Every group inside one machine, or on whole machines."""
        for group in placement.groups.values():
            if group.gpus <= self.per_node and len(group.nodes()) > 1:
                return False
        return True
