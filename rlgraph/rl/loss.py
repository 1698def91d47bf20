"""The RL objective: the clipped and decoupled policy loss, its aggregation, the KL penalty.

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

from rlgraph.rl.advantages import batch_advantages, grpo_advantages

__all__ = ["LOSS_AGGREGATIONS", "LossTerms", "aggregate", "batch_advantages", "grpo_advantages",
           "kl_penalty", "masked_mean", "policy_loss"]

# verl's `loss_agg_mode`s (verl/trainer/ppo/core_algos.py `agg_loss`)
LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                     "seq-mean-token-sum-norm")


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate of the log ratio x = logp - ref_logp: k1 = x;
    abs = |x|; k2 = x^2 / 2 (verl's mse); k3 = exp(-x) + x - 1 (>= 0, unbiased);
    low_var_kl = k3 clamped to [-10, 10] (verl's default for the loss)."""
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind == "k2":
        return 0.5 * log_ratio.square()
    k3 = torch.exp(-log_ratio) + log_ratio - 1
    if kind == "k3":
        return k3
    if kind == "low_var_kl":
        return k3.clamp(-10, 10)
    raise ValueError(f"unknown kl type {kind!r} (k1, abs, k2, k3 or low_var_kl)")


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean: sum over valid tokens / number of valid tokens."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              tokens: torch.Tensor | float | None = None, seqs: float | None = None,
              max_len: int | None = None) -> torch.Tensor:
    """Reduce [B, T] per-token losses to the scalar verl's `loss_agg_mode` names:

    - token-mean: sum over valid tokens / valid tokens;
    - seq-mean-token-sum: each sequence's token sum, averaged over sequences;
    - seq-mean-token-mean: each sequence's token mean, averaged over sequences;
    - seq-mean-token-sum-norm (Dr. GRPO): token sums / `max_len` (a constant: the configured
      response maximum, so no length bias), averaged over sequences.

    `tokens` / `seqs` are the counts of the whole mini-batch when these rows are one
    micro-batch of it, so micro-batches sum to the mini-batch's figure."""
    summed = (per_token * mask).sum(1)
    if mode == "token-mean":
        denom = tokens if tokens is not None else mask.sum().clamp(min=1)
        return summed.sum() / denom
    count = seqs if seqs is not None else max(per_token.shape[0], 1)
    if mode == "seq-mean-token-sum":
        return summed.sum() / count
    if mode == "seq-mean-token-mean":
        return (summed / mask.sum(1).clamp(min=1)).sum() / count
    if mode == "seq-mean-token-sum-norm":
        width = max_len if max_len is not None else per_token.shape[1]
        return summed.sum() / (count * max(width, 1))
    raise ValueError(f"unknown loss aggregation {mode!r} ({', '.join(LOSS_AGGREGATIONS)})")


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor
                       ) -> torch.Tensor:
    """GSPO's per-token log-ratio: sg[mean log-ratio of the sequence] + logp - sg[logp], so
    the value is the sequence's length-normalised ratio and the gradient each token's own
    (verl `compute_policy_loss_gspo`), clamped at 10 for stability as verl does."""
    lengths = mask.sum(-1).clamp(min=1)
    seq = ((logp - old_logp) * mask).sum(-1) / lengths
    return (logp - logp.detach() + seq.detach()[:, None]).clamp(max=10.0)


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
                normaliser: torch.Tensor | None = None, *, clip_high: float | None = None,
                loss_agg: str = "token-mean", ratio_level: str = "token",
                seqs: float | None = None, max_len: int | None = None) -> LossTerms:
    """Decoupled PPO-clip loss over [B, T] tokens plus `kl_coef * KL(ref)`, aggregated by
    `loss_agg` (`aggregate`).

    `clip` is the lower clip range (ratio >= 1 - clip) and `clip_high` the upper one (DAPO's
    clip-higher; default `clip`). `ratio_level` "sequence" is GSPO's length-normalised
    sequence ratio (`sequence_log_ratio`). `advantages` is [B] (one per sequence) or [B, T].
    `normaliser` is the valid-token count and `seqs` the sequence count of the whole batch
    when this is one micro-batch of it (so micro-batches sum to the batch's figure).
    """
    mask = mask.to(logp.dtype)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    high = clip if clip_high is None else clip_high
    log_ratio = (sequence_log_ratio(logp, old_logp, mask) if ratio_level == "sequence"
                 else logp - old_logp)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1 - clip, 1 + high)
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
    loss = aggregate(per_token, mask, loss_agg, tokens=normaliser, seqs=seqs, max_len=max_len)
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
