"""A decode loop we control, for partial rollout and sample supplementation.

`StaticDecoder` runs a transformers causal LM's own forward over a preallocated KV cache of
`max_batch` slots x `max_len` positions. Each slot holds one sequence with its own position, so
sequences start, stop and restart independently:

- **slots**: a free slot takes the next queued `Request` (refill) with one batched prefill of the
  new prompts; the rest keep decoding. A request that carries already generated tokens (resume)
  is re-encoded from position 0 under the current weights: KV computed under older weights is
  never reused.
- **decode step**: one token for every slot: forward, GPU sampling, per-slot bookkeeping
  (tokens, log-probs, policy versions, EOS and length stops) all in static GPU tensors, so on
  CUDA it is captured once per (width, attention length, top-p, greedy) as a CUDA graph and
  replayed `sync_every` times before the host looks at the slots (`compile=True`: the step
  runs through torch.compile first).
- **attention** (`EngineKnobs.attention_kind`): "varlen" (`varlen_attention.py`; the default
  on CUDA without compile): each row reads the K/V blocks up to its own position, long rows
  split over the GPU (flex attention); "sdpa" / "matmul" (the CPU default): the cache is sliced to
  a bucketed attention length (the longest live sequence rounded up) for every row;
  grouped-head one-token queries.
- **compaction** (`compact=True`): a step covers only slots [0, width), the narrowest power
  of two holding the occupied slots; occupied slots beyond it move down first (K/V and state,
  see `compaction.py`), so a long tail of a few rows decodes at a few rows' cost.
- **interrupt**: `interrupt()` stops every running sequence and returns its prefix;
  `swap_weights(commit)` does interrupt, commit new weights in place, resume, in one call;
  `peek()` reads the running sequences without stopping them, `cancel(ids)` drops some
  (in-flight weight updates keep rows in their slots across calls: `inflight.py`).
- **fast path on a GPU**: `compile=True` and `EngineKnobs.fuse` (compiled step, fused
  projections, `fusion.py`; inference-only): 1.43 / 2.91 ms a step at batch 64 / 256 on an
  H200, 4.7x / 4.0x the HBM roofline (bench/results/gpu-decode.json, before varlen attention).

`rlgraph run` decodes with it on GPUs (generate's synchronous path, see `static_rollout.py`).
The CPU path is the same code run eagerly (no graphs): tests compare it token for token with
transformers' own `generate`. Supported: decoder-only models whose attention goes through
transformers' AttentionInterface with full (not sliding-window) attention (Llama, Qwen2/3,
Mistral-style); models that post-process logits (soft-capping) are not.

Settings only benchmarks choose (attention kernel, fused projections, CUDA graphs, the
narrowest width, a per-call trace) come in one `rlgraph.bench_mode.EngineKnobs` (`bench`).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rlgraph.bench_mode import EngineKnobs
from rlgraph.engines import varlen_attention
from rlgraph.engines.compaction import SlotWidths
from rlgraph.engines.slot_cache import SlotKVCache
from rlgraph.engines.static_ops import attention, attention_matmul, sample, sdpa_without_cudnn
from rlgraph.model.build import with_cache

ATTN_NAMES = {"sdpa": "rlgraph_static", "matmul": "rlgraph_static_matmul",
              "varlen": "rlgraph_static_varlen"}
PREFILL_TOKENS = 16384  # padded tokens of one prefill call (see StaticDecoder._admit)


@dataclass
class Request:
    """A prompt to continue; `tokens`/`logprobs`/`versions` hold what earlier runs generated."""

    prompt: list[int]
    max_new_tokens: int
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    request_id: Any = None
    ignore_eos: bool = False  # a benchmark's forced length: only max_new_tokens stops it
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


@dataclass
class Completion:
    """A finished or interrupted sequence: generated tokens, their log-probs and policy versions."""

    request: Request
    tokens: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str  # "eos" | "length" | "interrupted"

    @property
    def finished(self) -> bool:
        """False when the sequence was interrupted and can be resumed."""
        return self.finish_reason != "interrupted"

    def resume(self) -> Request:
        """The request that continues this prefix (re-encoded under the weights current then)."""
        return replace(self.request, tokens=list(self.tokens), logprobs=list(self.logprobs),
                       versions=list(self.versions))


class StaticDecoder:
    """Slots of independent sequences decoded by one static-shape step (see module docstring)."""

    def __init__(self, model: torch.nn.Module, max_batch: int, max_len: int, *,
                 eos_token_id: int | Iterable[int] | None = None, sync_every: int = 8,
                 attn_block: int | None = 128, compile: bool | str = False,
                 policy_version: int = 0, timing: bool = False, compact: bool = True,
                 bench: EngineKnobs | None = None):
        knobs = bench or EngineKnobs()  # benchmark-only settings (rlgraph.bench_mode)
        attention_kind, fuse, min_width = knobs.attention_kind, knobs.fuse, knobs.min_width
        cuda_graphs, trace = knobs.cuda_graphs, knobs.trace
        from transformers import AttentionInterface

        AttentionInterface.register(ATTN_NAMES["sdpa"], attention)
        AttentionInterface.register(ATTN_NAMES["matmul"], attention_matmul)
        AttentionInterface.register(ATTN_NAMES["varlen"], varlen_attention.attention)
        p, cfg = next(model.parameters()), model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        if attention_kind == "auto":
            # varlen inside a torch.compile'd step runs (1.1-1.4x faster on an H200) but its
            # greedy tokens part from the uncompiled step's and the attention recompiles per
            # layer and width (gpu-longtail-1gpu.json: decode_compiled): sdpa there
            attention_kind = ("varlen" if p.is_cuda and not compile
                              and varlen_attention.available(head_dim) else "sdpa")
        if attention_kind == "varlen" and not varlen_attention.available(head_dim):
            raise ValueError(f"attention_kind 'varlen' needs flex attention and heads of at "
                             f"least {varlen_attention.MIN_HEAD_DIM} (this model's: {head_dim})")
        if attention_kind not in ATTN_NAMES:
            raise ValueError(f"attention_kind {attention_kind!r}: one of auto, "
                             f"{', '.join(ATTN_NAMES)}")
        self.attention = attention_kind
        if fuse:
            from rlgraph.engines.fusion import fuse_projections

            fuse_projections(model)
        self.model = model.eval()
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
            raise ValueError("StaticDecoder supports full attention only; this model "
                             f"has layer types {sorted(set(cfg.layer_types))}")
        self.device, self.dtype = p.device, p.dtype
        self.B, self.L = max_batch, max_len
        self.sync_every = max(1, sync_every)
        self.attn_block = attn_block or max_len
        self.widths = SlotWidths(max_batch, max_len, self.attn_block, min_width, compact)
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.policy_version = policy_version
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        dev, B, L = self.device, max_batch, max_len
        z = dict(device=dev, dtype=torch.long)
        self.cur_tok, self.pos, self.ngen = (torch.zeros(B, **z) for _ in range(3))
        self.max_new = torch.ones(B, **z)
        self.done = torch.ones(B, dtype=torch.bool, device=dev)
        self.stop_on_eos = torch.ones(B, dtype=torch.bool, device=dev)
        self.temperature = torch.ones(B, device=dev)
        self.top_p = torch.ones(B, device=dev)
        self.version_t = torch.tensor(policy_version, **z)
        self.out_tok = torch.zeros(B, L, **z)
        self.out_ver = torch.zeros(B, L, **z)
        self.out_logp = torch.zeros(B, L, device=dev)
        self.arange_L = torch.arange(L, device=dev)
        eos = [] if eos_token_id is None else (
            [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
        self.eos = torch.tensor(eos or [-1], **z)
        varlen = attention_kind == "varlen"
        self.cache_len = varlen_attention.padded_len(L) if varlen else L  # whole mask blocks
        self.cache = SlotKVCache(cfg.num_hidden_layers, B, kv_heads, head_dim, self.cache_len,
                                 self.dtype, dev, self.pos)
        self.row_mask = varlen_attention.RowLengthMask(
            self.pos, self.done, self.cache_len, heads // kv_heads) if varlen else None
        mode = compile if isinstance(compile, str) else None
        self._step = torch.compile(self._decode_step, dynamic=False, mode=mode) if compile \
            else self._decode_step
        self._graphs: dict[tuple[int, int, bool, bool], torch.cuda.CUDAGraph] = {}
        self._pool: Any = None
        self.queue: deque[Request] = deque()
        self.slots: list[Request | None] = [None] * B
        self.timing = timing and self.device.type == "cuda"  # device time of decode steps
        self._events: list[tuple[Any, Any, dict | None]] = []
        self._phases: list[tuple[str, Any, Any]] = []  # (stats key, start, end): prefill, moves
        # trace: one record per decode call (live rows, width, attention length, steps, the
        # live rows' summed positions, device ms per step when timing)
        self.trace: list[dict] | None = [] if trace else None
        self.stats: dict[str, float] = dict(
            decode_steps=0, slot_steps=0, busy_slot_steps=0, idle_slot_steps_with_queue=0,
            prefills=0, prefill_tokens=0, decode_ms=0.0, slot_moves=0, looks=0,
            prefill_ms=0.0, move_ms=0.0)

    # ------------------------------------------------------------------ public API

    def submit(self, requests: Iterable[Request], front: bool = False) -> None:
        """Queue requests; `front=True` puts them before those already waiting (resumes)."""
        reqs = list(requests)
        for r in reqs:
            room = self.L - len(r.prompt) - len(r.tokens)
            if not r.prompt or r.max_new_tokens - len(r.tokens) < 1 or \
                    r.max_new_tokens - len(r.tokens) > room:
                raise ValueError(
                    f"request {r.request_id!r}: prompt {len(r.prompt)} + generated "
                    f"{len(r.tokens)} tokens, max_new_tokens {r.max_new_tokens}: needs a non-empty "
                    f"prompt, at least one new token and at most max_len={self.L} positions")
        if front:
            self.queue.extendleft(reversed(reqs))
        else:
            self.queue.extend(reqs)

    @property
    def busy(self) -> bool:
        """Whether any slot is occupied or any request waits."""
        return bool(self.queue) or any(s is not None for s in self.slots)

    def step(self, lookahead: bool = False) -> list[Completion]:
        """Refill free slots, decode up to `sync_every` tokens per slot, return what finished.

        `lookahead=True` (in-flight updates: rows never stop at a call's end): read the slots
        the previous call's steps left, launch the next `sync_every` steps, then refill the
        free slots (their prefill queues behind the steps; the new rows join the next
        launch) and return at once with what had finished: the host's work on those
        completions, and its launches of the prefill, overlap the steps on the GPU instead of
        idling it. A row that finishes in the launched steps comes back from the next call
        (or `drain`)."""
        with torch.no_grad(), self._attn_impl():
            if lookahead:
                done, pos = self._read_slots()  # waits for the steps launched last time
                out = self._collect([b for b, r in enumerate(self.slots)
                                     if r is not None and done[b]])
                live = [b for b, r in enumerate(self.slots) if r is not None and not done[b]]
                if live:
                    self._launch(live, [pos[b] for b in live])
                self._admit()
                return out
            self._admit()
            done, pos = self._read_slots()
            out = self._collect([b for b, r in enumerate(self.slots)
                                 if r is not None and done[b]])
            if out:  # a prefill can finish a sequence (EOS / one token): refill right away
                self._admit()
                done, pos = self._read_slots()
            live = [b for b, r in enumerate(self.slots) if r is not None and not done[b]]
            if not live:
                return out
            self._launch(live, [pos[b] for b in live])
            done, _ = self._read_slots()
            return out + self._collect(
                [b for b, r in enumerate(self.slots) if r is not None and done[b]])

    def drain(self) -> list[Completion]:
        """Wait for launched steps and return (and free) the sequences they finished: the end
        of a run of `step(lookahead=True)` calls."""
        with torch.no_grad():
            done, _ = self._read_slots()
            return self._collect([b for b, r in enumerate(self.slots)
                                  if r is not None and done[b]])

    def _launch(self, live: list[int], at: list[int]) -> None:
        """Queue `sync_every` decode steps over the occupied slots (`live`: those decoding,
        `at`: their positions), compacting slots first."""
        steps = self.sync_every
        need = max(at) + steps
        use_top_p = any(self.slots[b].top_p < 1.0 for b in live)
        greedy = all(self.slots[b].temperature <= 0 for b in live)
        occupied = [b for b, r in enumerate(self.slots) if r is not None]
        width = self.widths.width_for(len(occupied))
        if occupied[-1] >= width:
            self._move_slots(SlotWidths.moves(occupied, width), need)
        attn_len = self.widths.attn_len(width, need) if self.row_mask is None \
            else self.cache_len  # varlen: one graph per width, each row its own length
        record = None if self.trace is None else {
            "live": len(live), "width": width, "attn_len": attn_len, "steps": steps,
            "live_positions": int(sum(at))}
        start, began = self._event(), time.perf_counter()
        for _ in range(steps):
            self._run(attn_len, width, use_top_p, greedy)
        if start is not None:
            self._events.append((start, self._event(), record))
        elif record is not None:  # host time: only the CPU runs synchronously
            cpu_ms = (time.perf_counter() - began) * 1e3 / steps
            self.trace.append({**record, **({"ms_per_step": cpu_ms}
                                            if self.device.type == "cpu" else {})})
        self.stats["looks"] += 1
        self.stats["decode_steps"] += steps
        self.stats["slot_steps"] += steps * width
        self.stats["busy_slot_steps"] += steps * len(live)
        if self.queue:
            self.stats["idle_slot_steps_with_queue"] += steps * (self.B - len(live))

    def run(self, requests: Iterable[Request] = ()) -> list[Completion]:
        """Generate until every submitted request has finished."""
        self.submit(requests)
        out: list[Completion] = []
        while self.busy:
            out += self.step()
        return out

    def interrupt(self) -> list[Completion]:
        """Stop every running sequence; finished ones come back finished, the rest interrupted."""
        with torch.no_grad():
            done, _ = self._read_slots()
            occupied = [b for b, r in enumerate(self.slots) if r is not None]
            return self._collect(occupied, interrupted={b for b in occupied if not done[b]})

    def peek(self) -> list[Completion]:
        """Every running sequence so far, as an interrupted completion, without stopping it
        (what a checkpoint of rows that stay in their slots keeps)."""
        with torch.no_grad():
            done, _ = self._read_slots()
            live = [b for b, r in enumerate(self.slots) if r is not None and not done[b]]
            return self._collect(live, interrupted=set(live), free=False)

    def cancel(self, request_ids: Iterable[Any]) -> int:
        """Drop the queued or running requests with these ids, freeing their slots; how many
        were dropped."""
        ids = set(request_ids)
        if not ids:
            return 0
        kept = [r for r in self.queue if r.request_id not in ids]
        dropped = len(self.queue) - len(kept)
        self.queue = deque(kept)
        slots = [b for b, r in enumerate(self.slots) if r is not None and r.request_id in ids]
        for b in slots:
            self.slots[b] = None
        if slots:
            self.done[torch.tensor(slots, device=self.device)] = True
        return dropped + len(slots)

    def swap_weights(self, commit: Callable[[], int | None]) -> list[Completion]:
        """Partial rollout at a weight update: interrupt, `commit()` the new weights (returns the
        new policy version), resume the interrupted prefixes first; returns the finished ones."""
        stopped = self.interrupt()
        version = commit()
        if version is not None:
            self.set_policy_version(version)
        self.submit([c.resume() for c in stopped if not c.finished], front=True)
        return [c for c in stopped if c.finished]

    def warmup(self, use_top_p: bool, greedy: bool = False) -> int:
        """Compile and capture the step of every attention length now (on CUDA), so that no
        capture happens later, e.g. while another thread receives weights; returns how many
        graphs were captured. Run it while no slot is occupied."""
        if not self.cuda_graphs:
            return 0
        keys = self.widths.keys() if self.row_mask is None else \
            [(w, self.cache_len) for w in self.widths.widths]
        with torch.no_grad(), self._attn_impl():
            for width, attn_len in keys:
                self._run(attn_len, width, use_top_p, greedy)
        return len(keys)

    def set_policy_version(self, version: int) -> None:
        """The version recorded for tokens sampled from now on."""
        self.policy_version = version
        self.version_t.fill_(version)

    # ------------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _attn_impl(self):
        """Route the model's attention through `static_ops.attention` for our calls only."""
        cfg = self.model.config
        old = cfg._attn_implementation
        cfg._attn_implementation = ATTN_NAMES[self.attention]
        try:
            yield
        finally:
            cfg._attn_implementation = old

    def _event(self) -> Any:
        if not self.timing:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def _read_slots(self) -> tuple[list[bool], list[int]]:
        done, pos = torch.stack([self.done.long(), self.pos]).tolist()  # waits for queued steps
        for start, end, record in self._events:
            ms = start.elapsed_time(end)
            self.stats["decode_ms"] += ms
            if record is not None and self.trace is not None:
                self.trace.append({**record, "ms_per_step": ms / record["steps"]})
        self._events.clear()
        for key, start, end in self._phases:
            self.stats[key] += start.elapsed_time(end)
        self._phases.clear()
        return [d != 0 for d in done], pos

    def _admit(self) -> dict[int, int]:
        """Queued requests take the free slots (one prefill per chunk); {slot: position}."""
        free = [b for b, r in enumerate(self.slots) if r is None]
        if not free or not self.queue:
            return {}
        start = self._event()
        take = [(b, self.queue.popleft()) for b in free[:len(self.queue)]]
        for b, r in take:
            self.slots[b] = r
        # in chunks of at most PREFILL_TOKENS padded tokens (queue order): resumed rows carry
        # prefixes of thousands of tokens, and one prefill of all of them runs out of memory
        # (seen on an H200: 20 GiB asked for at 768 slots of up to 8200 positions)
        chunk: list[tuple[int, Request]] = []
        longest = 0
        for b, r in take:
            n = len(r.prompt) + len(r.tokens)
            if chunk and (len(chunk) + 1) * max(longest, n) > PREFILL_TOKENS:
                self._prefill([c for c, _ in chunk], [q for _, q in chunk])
                chunk, longest = [], 0
            chunk.append((b, r))
            longest = max(longest, n)
        self._prefill([c for c, _ in chunk], [q for _, q in chunk])
        if start is not None:
            self._phases.append(("prefill_ms", start, self._event()))
        return {b: len(r.prompt) + len(r.tokens) for b, r in take}

    def _prefill(self, slots: list[int], reqs: list[Request],
                 starts: list[int] | None = None) -> None:
        """Encode prompt + earlier tokens of new slots from position 0; sample their next token.
        `starts[i]`: positions of slot i's sequence already in its KV (a multi-turn slot kept
        across turns, `turn_decode.TurnDecoder`): only the rest is encoded, attending to them."""
        dev = self.device
        seqs = [r.prompt + r.tokens for r in reqs]
        starts = starts or [0] * len(seqs)
        news = [s[a:] for s, a in zip(seqs, starts)]
        n, t = len(seqs), max(len(s) for s in news)
        ids = self._h2d([s + [0] * (t - len(s)) for s in news])
        lengths = self._h2d([len(s) for s in seqs])
        rows = self._h2d(slots)
        offset = self._h2d(starts)
        positions = (offset[:, None] + self.arange_L[:t][None, :]).clamp(max=self.L - 1)
        mask = None
        if any(starts):  # each new token attends to the slot's kept positions and itself
            end = min(self.L, max(a + t for a in starts))
            mask = (self.arange_L[:end][None, None, :] <= positions[:, :, None])[:, None]
            self.cache.mode, self.cache.attn_len = "extend", end
            self.cache.extend_at(starts, [len(s) for s in news])
        else:
            self.cache.mode = "prefill"
        self.cache.rows = rows
        try:
            with sdpa_without_cudnn():  # prefills come in ever new shapes
                hidden = self.base(input_ids=ids, position_ids=positions, attention_mask=mask,
                                   **with_cache(self.base, self.cache),
                                   use_cache=True).last_hidden_state
        finally:
            self.cache.mode, self.cache.rows = "decode", None
        last = hidden[torch.arange(n, device=dev), lengths - offset - 1]
        temp = self._h2d([r.temperature for r in reqs], torch.float)
        top_p = self._h2d([r.top_p for r in reqs], torch.float)
        tok, logp = sample(self.lm_head(last), temp,
                           top_p if any(r.top_p < 1.0 for r in reqs) else None,
                           greedy_only=all(r.temperature <= 0 for r in reqs))
        max_new = self._h2d([r.max_new_tokens - len(r.tokens) for r in reqs])
        stop_on_eos = self._h2d([not r.ignore_eos for r in reqs], torch.bool)
        self.temperature[rows], self.top_p[rows], self.max_new[rows] = temp, top_p, max_new
        self.stop_on_eos[rows] = stop_on_eos
        self.out_tok[rows, 0], self.out_logp[rows, 0] = tok, logp
        self.out_ver[rows, 0] = self.version_t
        self.cur_tok[rows], self.pos[rows] = tok, lengths
        self.ngen[rows] = 1
        self.done[rows] = (self._is_eos(tok) & stop_on_eos) | (max_new <= 1)
        self.stats["prefills"] += 1
        self.stats["prefill_tokens"] += int(sum(len(s) for s in news))

    def _decode_step(self, attn_len: int, width: int, use_top_p: bool, greedy: bool) -> None:
        """One token for every slot in [0, width); all inputs and outputs are (views of) the
        static state tensors."""
        n = width
        self.cache.attn_len, self.cache.width = attn_len, n
        pos, ngen, done, cur = self.pos[:n], self.ngen[:n], self.done[:n], self.cur_tok[:n]
        mask = (self.arange_L[:attn_len][None, :] <= pos[:, None])[:, None, None, :] \
            if self.row_mask is None else self.row_mask.build(n)
        hidden = self.base(input_ids=cur[:, None], position_ids=pos[:, None],
                           attention_mask=mask, **with_cache(self.base, self.cache),
                           use_cache=True).last_hidden_state
        tok, logp = sample(self.lm_head(hidden[:, -1]), self.temperature[:n],
                           self.top_p[:n] if use_top_p else None, greedy_only=greedy)
        active = ~done
        rows = self.cache.slot_index[:n]
        idx = ngen.clamp(max=self.L - 1)
        self.out_tok[rows, idx] = torch.where(active, tok, self.out_tok[rows, idx])
        self.out_logp[rows, idx] = torch.where(active, logp, self.out_logp[rows, idx])
        self.out_ver[rows, idx] = torch.where(active, self.version_t, self.out_ver[rows, idx])
        step = active.long()
        ngen.add_(step)
        pos.add_(step)
        cur.copy_(torch.where(active, tok, cur))
        done.logical_or_(active & ((self._is_eos(tok) & self.stop_on_eos[:n])
                                   | (ngen >= self.max_new[:n])))

    def _move_slots(self, moves: list[tuple[int, int]], upto: int) -> None:
        """Move occupied slots (K/V up to position `upto`, state, generated tokens) into free
        ones: `moves` is (from, to) pairs."""
        start = self._event()
        src = self._h2d([a for a, _ in moves])
        dst = self._h2d([b for _, b in moves])
        self.cache.move(src, dst, min(self.L, upto))
        for t in (self.cur_tok, self.pos, self.ngen, self.max_new, self.done, self.stop_on_eos,
                  self.temperature, self.top_p, self.out_tok, self.out_logp, self.out_ver):
            t[dst] = t[src]
        self.done[src] = True
        for a, b in moves:
            self.slots[b], self.slots[a] = self.slots[a], None
        self.stats["slot_moves"] += len(moves)
        if start is not None:
            self._phases.append(("move_ms", start, self._event()))

    def _h2d(self, values: list, dtype: torch.dtype = torch.long) -> torch.Tensor:
        """`values` on the device without waiting for the steps queued there (a pinned copy
        on a GPU: a pageable one would wait for the stream)."""
        host = torch.tensor(values, dtype=dtype)
        if self.device.type != "cuda":
            return host
        return host.pin_memory().to(self.device, non_blocking=True)

    def _is_eos(self, tok: torch.Tensor) -> torch.Tensor:
        return (tok[:, None] == self.eos[None, :]).any(-1)

    def _run(self, *key: Any) -> None:
        """One decode step for graph key (attn_len, width, use_top_p, greedy): replayed or
        eager."""
        if not self.cuda_graphs:
            self._step(*key)
            return
        if key not in self._graphs:
            self._graphs[key] = self._capture(*key)
        self._graphs[key].replay()

    def _capture(self, *key: Any) -> torch.cuda.CUDAGraph:
        """Warm up (and compile) on a side stream, then capture one step as a CUDA graph.

        The warm-up really runs, so the slot state is saved and restored around it; the K/V it
        writes at each slot's position are rewritten by the next real step.
        """
        state = [self.cur_tok, self.pos, self.ngen, self.done, self.out_tok, self.out_logp,
                 self.out_ver]
        saved = [t.clone() for t in state]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._step(*key)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            self._step(*key)
        for t, s in zip(state, saved):
            t.copy_(s)
        return graph

    def _collect(self, slots: list[int], interrupted: set[int] = frozenset(),
                 free: bool = True) -> list[Completion]:
        """Read the generated tokens of `slots` back to the host and free those slots (unless
        `free` is False: `peek`)."""
        if not slots:
            return []
        rows = torch.tensor(slots, device=self.device)
        n = self.ngen[rows].cpu().tolist()
        width = max(n, default=0)  # only the generated columns cross to the host
        tok, logp, ver = (x[rows, :width].cpu()
                          for x in (self.out_tok, self.out_logp, self.out_ver))
        eos = set(self.eos.tolist())
        out = []
        for i, b in enumerate(slots):
            r = self.slots[b]
            new = tok[i, :n[i]].tolist()
            if b in interrupted:
                reason = "interrupted"
            else:
                reason = "eos" if new and new[-1] in eos and not r.ignore_eos else "length"
            out.append(Completion(r, r.tokens + new, r.logprobs + logp[i, :n[i]].tolist(),
                                  r.versions + ver[i, :n[i]].tolist(), reason))
            if free:
                self.slots[b] = None
        if free:
            self.done[rows] = True
        return out
