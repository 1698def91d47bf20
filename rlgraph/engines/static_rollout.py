"""The static decoder as `generate`'s GPU engine (engine: native on a CUDA device).

`StaticRollout` holds one `StaticDecoder`, built once per workspace and sized from the spec
(slots: the samples of one step, or the rows a partial rollout keeps in flight; positions:
prompt_len + response_len.max), and samples a batch into the `Rollout` layout of
`rlgraph.engines.cpu_decode.sample`: prompts left-padded, responses right-padded to the longest, the
behaviour log-prob log_softmax(logits / temperature) of every sampled token (top-p
truncation not part of it), the policy version of every token, and pad / 0 / -1 after a
row's eos or length stop. Weights change in place (dual-buffer swap, checkpoint
load, a colocated optimizer step), so the captured CUDA graphs read the new values with no
rebuild. `resume` is partial rollout's decode on this engine (partial_rollout.decode).
Projections are not fused: an NCCL weight receiver holds the parameters' storage from
the start of the run, and a colocated group trains them. Slots are compacted (a step covers
the narrowest power-of-two width holding the occupied slots) unless the step is compiled
(each width would be its own compile).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from rlgraph.engines.cpu_decode import Rollout, pack
from rlgraph.engines.static_decode import Completion, Request, StaticDecoder


def seed_device(device: torch.device, seed: int) -> None:
    """Seed the default generator the decoder samples from (inside and outside CUDA graphs,
    whose replays read its current seed and offset)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        torch.cuda.default_generators[index].manual_seed(seed)
    else:
        torch.manual_seed(seed)


class StaticRollout:
    """One StaticDecoder reused across steps; `sample` is `cpu_decode.sample`'s twin.

    Every attention length's step is compiled and captured when the engine is built (at most
    MAX_COMPILED_LENGTHS lengths when compiling: each is its own compile), so no capture runs
    later beside a weight receive on another thread."""

    MAX_COMPILED_LENGTHS = 4

    def __init__(self, model: torch.nn.Module, *, slots: int, max_len: int, eos_id: int,
                 compile: bool, top_p: float, sync_every: int = 8):
        block = 128
        if compile:
            block *= -(-max_len // (self.MAX_COMPILED_LENGTHS * block))
        self.engine = StaticDecoder(model, max_batch=slots, max_len=max_len,
                                    eos_token_id=eos_id, sync_every=sync_every, attn_block=block,
                                    compile=compile, timing=True, compact=not compile)
        self.graphs = self.engine.warmup(use_top_p=top_p < 1.0)

    def sample(self, prompts: list[list[int]], *, max_new_tokens: int, pad_id: int,
               policy_version: int, temperature: float, top_p: float,
               seed: int, lengths: list[int] | None = None) -> tuple[Rollout, dict[str, float]]:
        """Decode every prompt to eos or `max_new_tokens` (`lengths`: a benchmark's forced
        length per prompt, eos ignored); the rollout and the call's `generate/*` metrics
        (decode steps, device ms per decode step, wall seconds)."""
        requests = [Request(list(p), max_new_tokens if lengths is None else lengths[i],
                            temperature=temperature, top_p=top_p, request_id=i,
                            ignore_eos=lengths is not None) for i, p in enumerate(prompts)]
        rows, metrics = self.resume(requests, policy_version=policy_version, seed=seed,
                                    swap=lambda: None, enough=lambda finished: False)
        rollout = pack(prompts, [c.tokens for c in rows], [c.logprobs for c in rows],
                       [c.versions for c in rows], pad_id)
        metrics["generate/decode_steps"] = metrics.pop("decode_steps")
        del metrics["switches"]
        return rollout, metrics

    def resume(self, rows: list[Request], *, policy_version: int, seed: int,
               swap: Callable[[], int | None], enough: Callable[[set[int]], bool]
               ) -> tuple[list[Completion], dict[str, float]]:
        """Partial rollout's decode: continue every row (request_id: its index; prompt and
        earlier tokens re-encoded under the current weights) until `enough(ids of the finished
        rows)` or all finish, checked every `sync_every` decode steps; in between `swap()`
        may adopt staged weights, and the live rows are then re-encoded under them. One
        completion per row, in order (the unfinished ones interrupted), and the metrics."""
        eng = self.engine  # rows beyond its slots queue and take a slot as one frees
        eng.set_policy_version(policy_version)
        seed_device(eng.device, seed)
        before, start = dict(eng.stats), time.perf_counter()
        eng.submit(rows)
        done: list[Completion] = []
        switches = 0
        while eng.busy:
            done += eng.step()
            if enough({c.request.request_id for c in done}):
                break
            new = swap()
            if new is not None:  # KV from the old weights is dropped: re-prefill the live rows
                stopped = eng.interrupt()
                eng.set_policy_version(new)
                eng.submit([c.resume() for c in stopped if not c.finished], front=True)
                done += [c for c in stopped if c.finished]
                switches += 1
        done += eng.interrupt()
        while eng.queue:  # resubmitted after a swap, not admitted again
            r = eng.queue.popleft()
            done.append(Completion(r, r.tokens, r.logprobs, r.versions, "interrupted"))
        by_id = {c.request.request_id: c for c in done}
        metrics = {**self.metrics_since(before, start), "switches": float(switches)}
        return [by_id[i] for i in range(len(rows))], metrics

    def metrics_since(self, before: dict[str, float], start: float) -> dict[str, float]:
        """The engine's `generate/*` metrics since `before` (a copy of its stats) and `start`
        (perf_counter): wall seconds, decode steps, looks (launches of `sync_every` steps),
        slots a step covered (compaction narrows it), the share of them live, device ms a
        step, device seconds of prefills and slot moves, and the wall seconds the device
        spent on none of them (`device_idle_s`: the host's looks); `decode_steps` too."""
        eng = self.engine
        steps = eng.stats["decode_steps"] - before["decode_steps"]
        slots = eng.stats["slot_steps"] - before["slot_steps"]
        prefill = eng.stats["prefill_tokens"] - before["prefill_tokens"]
        metrics = {"generate/static_engine": 1.0, "generate/engine_s": time.perf_counter() - start,
                   "decode_steps": float(steps), "generate/prefill_tokens": float(prefill)}
        if steps:
            metrics["generate/mean_width"] = slots / steps
            metrics["generate/live_share"] = (eng.stats["busy_slot_steps"]
                                              - before["busy_slot_steps"]) / max(1, slots)
        if eng.timing and steps:
            ms = {k: eng.stats[k] - before[k] for k in ("decode_ms", "prefill_ms", "move_ms")}
            metrics["generate/decode_ms_per_step"] = ms["decode_ms"] / steps
            metrics["generate/prefill_s"] = ms["prefill_ms"] / 1e3
            metrics["generate/move_s"] = ms["move_ms"] / 1e3
            # the call's wall time the device spent on none of them: the host's looks
            metrics["generate/device_idle_s"] = max(
                0.0, metrics["generate/engine_s"] - sum(ms.values()) / 1e3)
        if steps:
            metrics["generate/looks"] = float(eng.stats["looks"] - before["looks"])
        return metrics
