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
    attention_mask  [B, P+R]    1 on real tokens
    prompt_len      int         P
    response_mask   [B, R]      1 on response tokens up to and including eos
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
