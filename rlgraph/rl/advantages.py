"""Advantage estimators: one function per algorithm family, verl's definitions.

Every estimator maps a step's rewards (one outcome reward per sequence) to advantages the
policy loss multiplies: a [B] tensor (one per sequence) or a [B, R] one (per response token).
`group` holds the index of each row's prompt (rows of one prompt form a GRPO group).

- `grpo_advantages`: (r - group mean) / (group std + eps); without the std for Dr. GRPO
  (verl `compute_grpo_outcome_advantage`, `norm_adv_by_std_in_grpo`).
- `rloo_advantages`: r minus the mean of the other rows of its group (verl
  `compute_rloo_outcome_advantage`: r * n / (n - 1) - mean * n / (n - 1)).
- `reinforce_pp_advantages`: the discounted return of each response token, whitened over every
  valid token of the batch (verl `compute_reinforce_plus_plus_outcome_advantage`).
- `remax_advantages`: r minus the reward of the prompt's greedy response (verl
  `compute_remax_outcome_advantage`).
- `gae_advantages`: generalized advantage estimation from a critic's values, whitened over the
  batch's valid tokens, and the returns the critic regresses on (verl
  `compute_gae_advantage_return`).
- `batch_advantages`: outcome rewards whitened over the batch (PPO without a critic).

With `algorithm.reward_kl_coef` beta > 0 (verl's `use_kl_in_reward`, `apply_kl_penalty`),
each response token's reward is its outcome reward (on the last token) minus
beta * KL(policy || reference) of that token, the KL taken on the log-probs of the policy the
step starts from (a logp node's `old_logp`, else the sampler's `behavior_logp`, verl's
`old_log_probs`). The outcome estimators then see each sequence's reward sum (GRPO, RLOO,
batch), the token returns (REINFORCE++) or the returns-to-go minus the greedy reward (ReMax),
as verl's do with `token_level_rewards`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def _group_index(group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(index of each row's group in 0..G-1, rows per group)."""
    groups, index = torch.unique(group, return_inverse=True)
    count = torch.zeros(len(groups)).index_add_(0, index, torch.ones(len(group)))
    return index, count


def grpo_advantages(rewards: torch.Tensor, group: torch.Tensor, eps: float = 1e-6,
                    norm_std: bool = True) -> torch.Tensor:
    """(r - mean of its group) / (std of its group + eps): one advantage per sequence."""
    index, count = _group_index(group)
    mean = torch.zeros(len(count)).index_add_(0, index, rewards) / count
    centred = rewards - mean[index]
    if not norm_std:
        return centred
    var = torch.zeros(len(count)).index_add_(0, index, centred**2) / (count - 1).clamp(min=1)
    return centred / (var.sqrt()[index] + eps)


def rloo_advantages(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Leave-one-out baseline: r_i - mean of the group's other rewards (0 for a lone row)."""
    index, count = _group_index(group)
    total = torch.zeros(len(count)).index_add_(0, index, rewards)
    n = count[index]
    others = (total[index] - rewards) / (n - 1).clamp(min=1)
    return torch.where(n > 1, rewards - others, torch.zeros_like(rewards))


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the valid tokens (var unbiased, as verl's)."""
    mask = mask.to(values.dtype)
    count = mask.sum().clamp(min=1)
    mean = (values * mask).sum() / count
    var = (((values - mean) ** 2) * mask).sum() / (count - 1).clamp(min=1)
    return (values - mean) * torch.rsqrt(var + eps)


def token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, R]: each sequence's outcome reward on its last valid response token, 0 elsewhere."""
    out = torch.zeros(mask.shape, dtype=rewards.dtype)
    lengths = mask.sum(1).long()
    rows = (lengths > 0).nonzero().squeeze(-1)
    out[rows, lengths[rows] - 1] = rewards[rows]
    return out


def discounted_returns(per_token: torch.Tensor, mask: torch.Tensor, gamma: float
                       ) -> torch.Tensor:
    """[B, R] returns sum_k gamma^k r_{t+k} over each row's valid tokens."""
    returns = torch.zeros_like(per_token)
    running = torch.zeros(per_token.shape[0], dtype=per_token.dtype)
    for t in reversed(range(per_token.shape[1])):
        running = per_token[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    return returns


def reinforce_pp_advantages(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0
                            ) -> torch.Tensor:
    """REINFORCE++: token returns of the outcome reward, whitened over the batch's tokens."""
    mask = mask.to(rewards.dtype)
    returns = discounted_returns(token_rewards(rewards, mask), mask, gamma)
    return masked_whiten(returns, mask) * mask


def remax_advantages(rewards: torch.Tensor, baselines: torch.Tensor) -> torch.Tensor:
    """ReMax: each sequence's reward minus its prompt's greedy-response reward."""
    return rewards - baselines


def remax_token_advantages(per_token: torch.Tensor, baselines: torch.Tensor, mask: torch.Tensor
                           ) -> torch.Tensor:
    """ReMax on per-token rewards: each token's reward-to-go (undiscounted) minus the greedy
    response's reward, on the valid tokens (verl `compute_remax_outcome_advantage`)."""
    mask = mask.to(per_token.dtype)
    to_go = (per_token * mask).flip(-1).cumsum(-1).flip(-1)
    return (to_go - baselines.to(per_token.dtype)[:, None]) * mask


def reward_kl(algorithm: Any, batch: Mapping[str, Any]) -> torch.Tensor | None:
    """[B, R] per-token KL(policy || reference) the reward is charged (0 off the response), or
    None when `algorithm.reward_kl_coef` is 0. The policy's log-probs are the proximal ones
    where a logp node gave them, else the sampler's."""
    if not algorithm.reward_kl_coef:
        return None
    if "ref_logp" not in batch:
        raise ValueError(f"algorithm.reward_kl_coef {algorithm.reward_kl_coef} found no "
                         "'ref_logp' in the batch: it needs a ref_logp node feeding train")
    from rlgraph.rl.loss import kl_penalty

    logp = batch["old_logp"] if "old_logp" in batch else batch["behavior_logp"]
    mask = batch["response_mask"].to(logp.dtype)
    return kl_penalty(logp.float(), batch["ref_logp"].float(), algorithm.reward_kl_type) * mask


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                   gamma: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """([B, R] whitened GAE advantages, [B, R] returns = raw advantages + values) for outcome
    rewards on each row's last valid token; padding carries no value and no TD error."""
    mask = mask.to(values.dtype)
    per_token = token_rewards(rewards.to(values.dtype), mask)
    next_value = torch.zeros(values.shape[0], dtype=values.dtype)
    running = torch.zeros(values.shape[0], dtype=values.dtype)
    out = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = per_token[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        running = step * mask[:, t] + (1 - mask[:, t]) * running
        out[:, t] = running
    returns = out + values
    return masked_whiten(out, mask) * mask, returns


def batch_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """PPO without a critic: outcome rewards whitened over the whole batch."""
    return (rewards - rewards.mean()) / (rewards.std() + eps) if len(rewards) > 1 else rewards * 0


def compute_advantages(algorithm: Any, batch: Mapping[str, Any]) -> torch.Tensor:
    """The advantages `algorithm.advantage` names for a step's batch ([B] or [B, R]). GAE's
    come from the critic node (`advantages` in the batch); ReMax's baselines from the
    reward node (`reward_baselines`); a KL in the reward (`reward_kl`) is charged first."""
    rewards, kind = batch["rewards"], algorithm.advantage
    kl = reward_kl(algorithm, batch) if kind != "gae" else None
    per_token = None
    if kl is not None:
        mask = batch["response_mask"].float()
        per_token = token_rewards(rewards.float(), mask) - algorithm.reward_kl_coef * kl
        rewards = per_token.sum(1)  # the sequence's score, as verl's outcome estimators sum
    if kind == "group":
        return grpo_advantages(rewards, batch["group"], norm_std=algorithm.norm_adv_by_std)
    if kind == "leave_one_out":
        return rloo_advantages(rewards, batch["group"])
    if kind == "reinforce_pp":
        mask = batch["response_mask"].float()
        if per_token is None:
            return reinforce_pp_advantages(rewards, mask, algorithm.gamma)
        return masked_whiten(discounted_returns(per_token, mask, algorithm.gamma), mask) * mask
    if kind == "batch":
        return batch_advantages(rewards)
    needs = {"gae": ("advantages", "a critic node feeding train (nodes: {critic: {}})"),
             "greedy_baseline": ("reward_baselines", "a reward node after generate")}
    key, what = needs[kind]
    if key not in batch:
        raise ValueError(f"algorithm {algorithm.name} ({kind} advantages) found no '{key}' in "
                         f"the batch: it needs {what}")
    if kind == "gae":
        return batch["advantages"]
    if per_token is not None:
        return remax_token_advantages(per_token, batch["reward_baselines"],
                                      batch["response_mask"])
    return remax_advantages(rewards, batch["reward_baselines"])
