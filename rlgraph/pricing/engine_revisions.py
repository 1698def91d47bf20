"""rlgraph's own decoder (engine native on a GPU: the static engine) is priced as the revision
that runs the plan, a row of `ENGINE_REVISIONS` (`pricing.engine_revision`, default the
current one, `CURRENT_ENGINE`): the host's time between decode steps, which the GPU idles on,
is a fact of the engine's code, not of the plan. A result measured on an older revision is
priced as that revision (bench/own_runs.py reads the revision a result file records).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineRevision:
    """One revision of rlgraph's static decode engine (engine native on a GPU, CUDA graphs):
    the host's seconds between its decode steps, with the device idle (every field's source:
    `ENGINE_SOURCES[name]`)."""

    name: str
    what: str  # what the revision does differently, and when it reached the main branch
    landed: str  # when it reached the main branch (UTC, "YYYY-MM-DD HH:MM")
    host_seconds_per_step: float  # a look's read, checks, refills and launches, per step
    inflight_host_seconds_per_step: float  # the same with in-flight updates (`inflight`)
    varlen_attention: bool = True  # decode attention by the split-KV varlen kernel, else SDPA
    # in-flight refills take the engine's free slots within the version's window, and
    # must-finish looks ahead (else: a group for each complete one, must-finish at the start)
    slot_refill: bool = True
    # in-flight refills of a generate that shares train's GPU leave the oversample's groups of
    # the window free (`RolloutRules.reserve`; else they fill the whole window)
    shared_gpu_reserve: bool = True


ENGINE_REVISIONS: dict[str, EngineRevision] = {
    "sdpa": EngineRevision(
        name="sdpa", what="compacted slots, each slot's state read on its own, decode "
        "attention through transformers' SDPA (one block per row and KV head, a CUDA graph "
        "per width and attention length), before the varlen split-KV kernel became the "
        "default (2026-11-24 18:43 to 2026-11-25 00:30 UTC)",
        landed="2026-11-24 18:43", host_seconds_per_step=0.85e-3,
        inflight_host_seconds_per_step=0.85e-3, varlen_attention=False, slot_refill=False,
        shared_gpu_reserve=False),
    "per_slot": EngineRevision(
        name="per_slot", what="each slot's finished flag and position read from the host "
        "copy one by one, decode attention by the varlen split-KV kernel; in-flight updates "
        "read a look, then launch the next (2026-11-25 "
        "to 2026-11-27 11:02 UTC)", landed="2026-11-25 00:30",
        host_seconds_per_step=0.66e-3, inflight_host_seconds_per_step=0.66e-3,
        slot_refill=False, shared_gpu_reserve=False),
    "one_copy": EngineRevision(
        name="one_copy", what="the slots read in one host copy (`tolist`); in-flight "
        "updates launch a look's steps before the host reads the last (lookahead); since "
        "2026-11-27 11:02 to 17:02 UTC", landed="2026-11-27 11:02",
        host_seconds_per_step=0.15e-3, inflight_host_seconds_per_step=0.106e-3,
        slot_refill=False, shared_gpu_reserve=False),
    "slot_refill": EngineRevision(
        name="slot_refill", what="one_copy's engine; in-flight refills take the engine's free "
        "slots, whole groups, within the batches the version can still reach, and "
        "must-finish looks ahead over them (counting unstarted groups at their admission "
        "version); 2026-11-27 17:02 to 17:44 UTC", landed="2026-11-27 17:02",
        host_seconds_per_step=0.15e-3, inflight_host_seconds_per_step=0.106e-3,
        shared_gpu_reserve=False),
    "shared_gpu_reserve": EngineRevision(
        name="shared_gpu_reserve", what="slot_refill's engine; where generate shares train's "
        "GPU, in-flight refills leave the oversample's groups of the version's window free "
        "(`RolloutRules.reserve`), so a call can take the groups that complete first; since "
        "2026-11-27 17:44 UTC", landed="2026-11-27 17:44",
        host_seconds_per_step=0.15e-3, inflight_host_seconds_per_step=0.106e-3),
}
CURRENT_ENGINE = "shared_gpu_reserve"  # the revision `rlgraph run` runs today

ENGINE_SOURCES: dict[str, dict[str, str]] = {
    "sdpa": {
        "host_seconds_per_step": "bench/results/gpu-longtail-1gpu.json decode_varlen (H100), "
                                 "the sync/sdpa variant: 18.827 s of wall time over 3632 "
                                 "decode steps of 4.332 device ms: 0.85 ms a step of host "
                                 "work (132 CUDA graphs, one per width and attention length, "
                                 "against the varlen variant's 6 and 0.66 ms in the same "
                                 "call)",
        "inflight_host_seconds_per_step": "no in-flight updates in this revision: the same "
                                          "0.85 ms",
    },
    "per_slot": {
        "host_seconds_per_step": "bench/results/gpu-longtail-1gpu.json decode_varlen (H100, "
                                 "sync/varlen, 2026-11-24/25): 15.845 s of wall time over 3632 "
                                 "decode steps of 3.70 device ms each: 0.66 ms a step of host "
                                 "work between the static engine's graph replays (launch, "
                                 "finished-row checks every sync_every steps, compaction); "
                                 "0.85 / 0.91 ms in the same call's sync/sdpa and "
                                 "partial/varlen",
        "inflight_host_seconds_per_step": "no lookahead in this revision: an in-flight look "
                                          "reads the slots as a call's look does, so the "
                                          "same 0.66 ms a step (its in-flight runs, "
                                          "bench/results/gpu-inflight-h100x4.json, spent "
                                          "~11.5 ms a look of 8 steps outside decode, "
                                          "refill prefills included)",
    },
    "one_copy": {
        "host_seconds_per_step": "bench/results/gpu-inflight.json as of commit 911cb2f, "
                                 "split-partial-lag3 (2x H200, 2026-11-27 11:17 UTC, static "
                                 "engine, sync_every 8): "
                                 "generate/device_idle_s 0.186 + 0.339 s over 1544 + 1936 "
                                 "decode steps (193 + 242 looks) of rounds 1-2: 0.15 ms a "
                                 "step with the device idle (0.150 ms over all three "
                                 "rounds); the turn engine (the same decoder, multi-turn) "
                                 "measured 0.123 ms a step on one H100 "
                                 "(bench/results/gpu-agentic.json at 5206825, "
                                 "decode_host_ms_per_step_measured)",
        "inflight_host_seconds_per_step": "bench/results/gpu-inflight.json as of commit "
                                          "911cb2f, split-partial-lag3-inflight (2x H200, "
                                          "one call): "
                                          "generate/device_idle_s 0.246 s over the 2320 "
                                          "decode steps (290 looks) of rounds 1-2: the "
                                          "engine launches a look's steps before the host "
                                          "reads the last (StaticDecoder.step lookahead), "
                                          "so only the read and the launch idle the device, "
                                          "0.106 ms a step",
    },
    "slot_refill": {
        "host_seconds_per_step": "one_copy's engine and host loop, unchanged: its 0.15 ms "
                                 "(bench/results/gpu-inflight.json @911cb2f)",
        "inflight_host_seconds_per_step": "one_copy's 0.106 ms: the refill rule changed "
                                          "which groups a look admits "
                                          "(engines/inflight.py `_free_slots`, "
                                          "RolloutRules.target with room, at 1c27f3d), not "
                                          "the host's work per step",
    },
    "shared_gpu_reserve": {
        "host_seconds_per_step": "one_copy's engine and host loop, unchanged: its 0.15 ms "
                                 "(bench/results/gpu-inflight.json @911cb2f)",
        "inflight_host_seconds_per_step": "one_copy's 0.106 ms: the reserve changed how many "
                                          "groups a look admits where generate shares "
                                          "train's GPU (RolloutRules.of shares_device, at "
                                          "5c28863), not the host's work per step",
    },
}


def engine_of(spec: Any) -> EngineRevision:
    """The static engine revision that prices `spec`: the graph's `pricing.engine_revision`,
    else the current one."""
    pricing = getattr(spec, "pricing", None)
    chosen = getattr(pricing, "engine_revision", None) or CURRENT_ENGINE
    return ENGINE_REVISIONS[chosen]
