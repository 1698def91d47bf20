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
    reward node (`reward_baselines`)."""
    rewards, kind = batch["rewards"], algorithm.advantage
    if kind == "group":
        return grpo_advantages(rewards, batch["group"], norm_std=algorithm.norm_adv_by_std)
    if kind == "leave_one_out":
        return rloo_advantages(rewards, batch["group"])
    if kind == "reinforce_pp":
        return reinforce_pp_advantages(rewards, batch["response_mask"].float(), algorithm.gamma)
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
    return remax_advantages(rewards, batch["reward_baselines"])
