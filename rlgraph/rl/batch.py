"""The Batch: a plain dict of CPU tensors and lists that flows along the graph's edges.

Each worker returns its inputs merged with the keys it adds, so `train` (fed by reward,
logp and ref_logp) sees everything `generate` produced. B = prompts_per_step *
samples_per_prompt sequences; P = prompt width (left-padded); R = response width.

Written by generate:
    step            int         train step whose batch this is (data position = step)
    policy_version  int         version generate held when the batch started
    temperature     float       sampling temperature; every log-prob uses logits / temperature
    prompt_uid      list[str]   stable id of each row's prompt (task:split:index or file:row)
    data_position   list[int]   position of the prompt in the seeded data stream
    group           [B] long    index of the prompt within the step (GRPO groups)
    prompt, data_source, ground_truth, extra_info   list, per row (verl's fields)
    response_text   list[str]   decoded response up to eos
    sequences       [B, P+R]    prompt (left-padded) + response (right-padded) token ids
    attention_mask  [B, P+R]    1 on real tokens (observations of a multi-turn rollout too)
    prompt_len      int         P
    response_mask   [B, R]      1 on the tokens the policy sampled, up to and including eos
                                (0 on a multi-turn trajectory's observation tokens: they are
                                out of the loss, the KL term, the ratios and the lag)
    env_reward, env_end, env_turns  multi-turn only: per row, the env's summed step rewards
                                [B] float, why the trajectory ended, its model turns
    behavior_logp   [B, R]      log-prob of each token under the weights that sampled it
    token_version   [B, R]      policy version that sampled each token (-1 on padding)
Written by reward:   rewards   [B] float
Written by logp:     old_logp  [B, R]  proximal policy (the weights train starts from)
Written by ref_logp: ref_logp  [B, R]  frozen reference
Returned by train (a new, small dict: the batch is consumed):
    step, policy_version (after the step), trained_uids (the step's prompt uids, in order),
    metrics: reward/mean, reward/std, lag/max, lag/mean (lag = step - token_version over
    every trained token), loss/policy, loss/kl, actor/clip_frac, actor/is_weight_mean,
    actor/is_truncated_frac, actor/grad_norm, actor/entropy (mean -behavior_logp),
    actor/lr, response/length_mean, samples, tokens, policy/version.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Batch = dict[str, Any]


def merge(inputs: Mapping[str, Batch]) -> Batch:
    """Union of the predecessors' batches (they share generate's keys; each adds its own)."""
    out: Batch = {}
    for batch in inputs.values():
        out.update(batch)
    return out


def check_step(batch: Batch, step: int, node: str) -> None:
    """A worker must only see the batch of its own step (channels deliver in order)."""
    if batch.get("step") != step:
        raise ValueError(f"{node}: got the batch of step {batch.get('step')} at step {step}")


# ----------------------------------------------------------------------------- data parallel


def shard_bounds(items: int, rank: int, world: int) -> tuple[int, int]:
    """[lo, hi) of `items` that replica `rank` of `world` takes: contiguous, sizes within 1."""
    base, extra = divmod(items, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def rows(batch: Batch) -> int:
    """B, the number of sequences of a batch."""
    return len(batch["group"])


def group_rows(batch: Batch, rank: int, world: int) -> slice:
    """Rows of replica `rank`: whole GRPO groups (rows of one prompt stay together; a
    group's rows are contiguous and groups in order, as generate writes them)."""
    group = batch["group"]
    groups = int(group.max()) + 1 if len(group) else 0
    lo, hi = shard_bounds(groups, rank, world)
    starts = [int(i) for i in (group >= lo).nonzero()[:1]] or [len(group)]
    ends = [int(i) for i in (group >= hi).nonzero()[:1]] or [len(group)]
    return slice(starts[0], ends[0])


def sample_rows(batch: Batch, rank: int, world: int) -> slice:
    """Rows of data-parallel rank `rank` of `world`, sharded by sample: contiguous, sizes
    within one, a GRPO group's rows possibly on two ranks (what needs a whole group, the
    advantages, is computed on the whole batch: train takes it whole)."""
    return slice(*shard_bounds(rows(batch), rank, world))


def take_rows(batch: Batch, where: slice, regroup: bool = True) -> Batch:
    """The batch restricted to rows `where` (every per-row tensor or list; scalars kept);
    `group` renumbered from 0, or kept as it is with `regroup=False` (a share of a batch
    cut by sample, joined back by `concat_rows(..., regroup=False)`)."""
    import torch

    count = rows(batch)
    out: Batch = {}
    for key, value in batch.items():
        if isinstance(value, (torch.Tensor, list)) and len(value) == count:
            value = value[where]
        out[key] = value
    if regroup and len(out["group"]):
        out["group"] = out["group"] - out["group"].min()
    return out


PADDING = {"token_version": -1}  # the pad value of a key, where not 0
SUMMED = {"rollout/dropped", "rollout/restarted", "rollout/carried", "rollout/cached",
          "sync/bytes", "env/trajectories", "env/tool_calls", "env/in_flight",
          "env/seconds", "env/prefill_tokens", "env/reused_tokens"}  # counts that add up
SUMMED_PREFIXES = ("env/ended_",)  # trajectories ended for each reason
MAXED = {"rollout/version_span", "rollout/decode_steps",
         "env/decode_steps"}  # replicas run side by side
WEIGHTED = {  # per-trajectory means: weighted by the count each replica's mean is over
    "env/turns_mean": "env/trajectories", "env/observation_tokens_mean": "env/trajectories",
    "env/reward_mean": "env/trajectories", "env/tool_success_rate": "env/tool_calls"}


def concat_rows(parts: list[Batch], regroup: bool = True) -> Batch:
    """Replicas' batches of one step as one batch: rows in replica order, `group` renumbered
    (each part's from where the previous ended; `regroup=False`: kept, for shares of one
    batch cut by sample), prompts re-padded on the left and responses on the right to the
    widest; `metrics` combined by `combine_metrics`."""
    import torch

    parts = [p for p in parts if rows(p)] or parts[:1]
    first = parts[0]
    prompt = max(p.get("prompt_len", 0) for p in parts)
    response = max((p["response_mask"].shape[1] for p in parts if "response_mask" in p),
                   default=0)
    out: Batch = dict(first)
    offset, grouped = 0, []
    for p in parts:
        grouped.append(p["group"] + offset if regroup else p["group"])
        offset += int(p["group"].max()) + 1 if len(p["group"]) else 0
    out["group"] = torch.cat(grouped)
    for key, value in first.items():
        if key == "group" or not isinstance(value, (list, torch.Tensor)):
            continue
        if len(value) != rows(first):
            continue
        if isinstance(value, list):
            out[key] = [x for p in parts for x in p[key]]
        else:
            out[key] = torch.cat([_repad(p, key, prompt, response) for p in parts])
    if "prompt_len" in first:
        out["prompt_len"] = prompt
    if any("metrics" in p for p in parts):
        out["metrics"] = combine_metrics([p.get("metrics", {}) for p in parts])
    return out


def _repad(part: Batch, key: str, prompt: int, response: int) -> Any:
    """`part[key]` at widths (prompt, response): a [B, P+R] key padded on both sides, a
    [B, R] key on the right; other tensors as they are."""
    import torch

    value = part[key]
    if value.dim() != 2 or "response_mask" not in part:
        return value
    own_prompt, own_response = part.get("prompt_len", 0), part["response_mask"].shape[1]
    fill = PADDING.get(key, 0)
    if value.shape[1] == own_prompt + own_response:
        pads = (prompt - own_prompt, response - own_response)
    elif value.shape[1] == own_response:
        pads = (0, response - own_response)
    else:
        return value
    return torch.nn.functional.pad(value, pads, value=fill) if any(pads) else value


def combine_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Replicas' metrics of one task: counts (SUMMED, SUMMED_PREFIXES, `*_total`) added,
    MAXED and `*max*` maximised, per-trajectory means (WEIGHTED) weighted by the count
    they are over, the rest averaged."""
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for p in parts for k in p):
        values = [float(p[key]) for p in parts if key in p]
        if key.endswith("_total") or key in SUMMED or key.startswith(SUMMED_PREFIXES):
            out[key] = sum(values)
        elif key in MAXED or "max" in key:
            out[key] = max(values)
        elif key in WEIGHTED and all(WEIGHTED[key] in p for p in parts if key in p):
            weights = [float(p[WEIGHTED[key]]) for p in parts if key in p]
            total = sum(weights)
            out[key] = (sum(v * w for v, w in zip(values, weights)) / total if total
                        else sum(values) / len(values))
        else:
            out[key] = sum(values) / len(values)
    return out


def sample_table(batch: Batch, trained_version: int, count: int) -> list[dict[str, Any]]:
    """Up to `count` rows of a trained batch, spread over its prompts, as the samples table
    shows them: prompt, response, reward, the (oldest) version that sampled the row, and its
    lag behind `trained_version`."""
    total = rows(batch)
    picks = sorted({i * total // count for i in range(min(count, total))})
    out = []
    for i in picks:
        prompt = batch["prompt"][i]
        if not isinstance(prompt, str):
            prompt = "\n".join(str(m.get("content", "")) for m in prompt)
        versions = batch["token_version"][i][batch["response_mask"][i].bool()]
        version = int(versions.min()) if len(versions) else trained_version
        out.append({"step": int(batch["step"]), "prompt": prompt,
                    "response": batch["response_text"][i],
                    "reward": float(batch["rewards"][i]), "version": version,
                    "lag": trained_version - version})
    return out
