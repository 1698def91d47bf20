"""The RL objective: advantages, the clipped and decoupled policy loss, the KL penalty.

Three policies meet in the loss (AReaL's decoupled PPO, verl's rollout correction):
- behaviour `pi_b`: the weights that sampled the token (`behavior_logp`, possibly stale);
- proximal `pi_prox`: the weights the step starts from (`old_logp`, from `logp` or recomputed);
- current `pi_theta`: the weights being optimised (`logp`, with gradient).
PPO clips `r = pi_theta / pi_prox`; the importance weight `w = pi_prox / pi_b` corrects the
lag between sampling and training and is truncated at `is_truncation` (token-level TIS).
With no lag `pi_b == pi_prox` and `w == 1`: plain PPO / GRPO.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def grpo_advantages(rewards: torch.Tensor, group: torch.Tensor, eps: float = 1e-6,
                    norm_std: bool = True) -> torch.Tensor:
    """(r - mean of its group) / (std of its group + eps): one advantage per sequence."""
    groups, index = torch.unique(group, return_inverse=True)
    count = torch.zeros(len(groups)).index_add_(0, index, torch.ones_like(rewards))
    mean = torch.zeros(len(groups)).index_add_(0, index, rewards) / count
    centred = rewards - mean[index]
    if not norm_std:
        return centred
    var = torch.zeros(len(groups)).index_add_(0, index, centred**2) / (count - 1).clamp(min=1)
    return centred / (var.sqrt()[index] + eps)


def batch_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """PPO without a critic: outcome rewards whitened over the whole batch."""
    return (rewards - rewards.mean()) / (rewards.std() + eps) if len(rewards) > 1 else rewards * 0


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate: k1 = log ratio; k3 = exp(-x) + x - 1 (>= 0, unbiased);
    low_var_kl = k3 clamped to [-10, 10] (verl's default)."""
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    k3 = torch.exp(-log_ratio) + log_ratio - 1
    if kind == "k3":
        return k3
    if kind == "low_var_kl":
        return k3.clamp(-10, 10)
    raise ValueError(f"unknown kl type {kind!r} (k1, k3 or low_var_kl)")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean: sum over valid tokens / number of valid tokens."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


@dataclass
class LossTerms:
    """The loss to backprop and the figures reported with it (detached floats)."""

    loss: torch.Tensor
    policy_loss: float
    kl: float
    clip_frac: float
    is_weight_mean: float
    is_truncated_frac: float


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, behavior_logp: torch.Tensor,
                advantages: torch.Tensor, mask: torch.Tensor, clip: float,
                is_truncation: float, ref_logp: torch.Tensor | None = None,
                kl_coef: float = 0.0, kl_type: str = "low_var_kl",
                normaliser: torch.Tensor | None = None) -> LossTerms:
    """Decoupled PPO-clip loss over [B, T] tokens, token-mean, plus `kl_coef * KL(ref)`.

    `advantages` is [B] (one per sequence) or [B, T]. `normaliser` is the valid-token count of
    the whole batch when this is one micro-batch of it (so micro-batches sum to the token-mean).
    """
    mask = mask.to(logp.dtype)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    ratio = torch.exp(logp - old_logp)
    clipped = ratio.clamp(1 - clip, 1 + clip)
    surrogate = torch.minimum(ratio * adv, clipped * adv)
    weight = torch.exp(old_logp - behavior_logp).detach()
    truncated = weight > is_truncation
    weight = weight.clamp(max=is_truncation)
    per_token = -weight * surrogate
    kl = torch.zeros((), dtype=logp.dtype)
    if ref_logp is not None and kl_coef > 0:
        kl_tok = kl_penalty(logp, ref_logp, kl_type)
        per_token = per_token + kl_coef * kl_tok
        kl = masked_mean(kl_tok.detach(), mask)
    denom = normaliser if normaliser is not None else mask.sum().clamp(min=1)
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        clip_frac = masked_mean(((ratio - clipped).abs() > 0).to(mask.dtype), mask)
        return LossTerms(
            loss=loss,
            policy_loss=float(masked_mean(-weight * surrogate, mask)),
            kl=float(kl),
            clip_frac=float(clip_frac),
            is_weight_mean=float(masked_mean(weight, mask)),
            is_truncated_frac=float(masked_mean(truncated.to(mask.dtype), mask)),
        )
