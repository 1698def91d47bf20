"""`train`: one optimizer step of the policy (GRPO / PPO loss, KL, importance weights)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from rlgraph.nodes.base import (
    MAX_COUNT,
    MAX_STEPS,
    NodeKind,
    NodeSpec,
    inputs_from_kinds,
)
from rlgraph.nodes.parallel_spec import ParallelNodeSpec
from rlgraph.pricing.train import train_cost

if TYPE_CHECKING:
    import torch

    from rlgraph.process.workspace import Workspace
    from rlgraph.rl.batch import Batch


class TrainSpec(ParallelNodeSpec):
    """Optimizer settings of the policy (verl: actor_rollout_ref.actor.*)."""

    kind: Literal["train"] = "train"
    lr: float = Field(default=1e-6, ge=1e-12, le=10)
    grad_clip: float = Field(default=1.0, ge=1e-6, le=1e6)
    weight_decay: float = Field(default=0.0, ge=0, le=10)
    micro_batch: int | None = Field(default=None, ge=1, le=MAX_COUNT,
                                    description="sequences per forward/backward (accumulated)")
    mini_batches: int = Field(default=1, ge=1, le=MAX_COUNT,
                              description="optimizer updates per epoch "
                              "(verl: train batch / ppo_mini_batch_size)")
    epochs: int = Field(default=1, ge=1, le=1000,
                        description="passes over the batch (verl: ppo_epochs)")
    warmup_steps: int = Field(default=0, ge=0, le=MAX_STEPS,
                              description="linear lr warmup, in train steps")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        default="constant", description="after the warmup: constant, or a cosine / linear "
        "decay to min_lr_ratio x lr at the last step (verl: optim.lr_scheduler_type)")
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1,
                                description="where a decaying schedule ends, as a fraction of "
                                "lr (verl: optim.min_lr_ratio)")
    old_logp: Literal["proximal", "rollout"] = Field(
        default="proximal", description="without a logp node, the old log-probs of an "
        "off-policy batch: 'proximal' recomputes them with the weights the step starts from "
        "(decoupled PPO); 'rollout' takes the behaviour log-probs the sampler recorded, no "
        "forward (verl fully_async: old_log_prob from the rollout)")


def adamw(node: NodeSpec, policy: Any) -> Any:
    """The optimizer train steps: AdamW over the policy's parameters, `lr` and
    `weight_decay` as the node says."""
    import torch

    return torch.optim.AdamW(policy.parameters(), lr=node.lr, weight_decay=node.weight_decay)


KIND = NodeKind(
    name="train",
    spec=TrainSpec,
    cost=train_cost,
    uses_gpu=True,
    default_edges=inputs_from_kinds("reward|logp|ref_logp|critic", "generate"),
    worker="rlgraph.nodes.train:TrainWorker",
    advances_policy=True,
    sequence_passes=True,
    trains=True,
    colour="#4e79a7",
    doc="one optimizer step of the policy",
    models=frozenset({"policy"}),
    optimizer=adamw,
)


class TrainWorker:
    """One train step on the batch of `step`: advantages (`algorithm.advantage`: group, GAE
    from the critic, leave-one-out, REINFORCE++, ReMax's greedy baseline), then
    `epochs x mini_batches` AdamW updates of the decoupled PPO-clip loss with KL (aggregated
    by `algorithm.loss_agg`, micro-batches accumulated, gradient clipped). Returns the
    metrics, including the lag of every trained token, and the new policy version (one
    version per train step).

    Among a group's replicas each gets the whole batch (advantages and the token-mean need
    all of it) and runs forward / backward on its share of every mini-batch; the gradients,
    each scaled by the mini-batch's whole token count, are summed over the replicas, so every
    replica takes the step a lone process would."""

    DATA_PARALLEL = "whole"

    def __init__(self, name: str, node: TrainSpec, workspace: Workspace):
        self.name, self.node, self.ws = name, node, workspace
        self.trained_once = node.mini_batches == 1 and node.epochs == 1
        self.shapes: set[tuple[int, int]] = set()  # (rows, columns) of the passes run so far
        self.new_shapes = 0

    def run(self, step: int, inputs: dict[str, Batch]) -> Batch:
        """Train on the batch of `step`; policy_version becomes step's version + 1. Streaming
        (`schedule.stream`): `step` is an optimizer step t*K + j on mini-batch j of version t,
        the version advances after its last mini-batch, and a token's lag is t minus the
        version that sampled it."""
        import torch

        from rlgraph.engines.cpu_decode import token_logp_passes
        from rlgraph.nodes.logp import on_policy
        from rlgraph.rl.advantages import compute_advantages, reward_kl
        from rlgraph.rl.batch import check_step, merge, sample_table
        from rlgraph.rl.lr_schedule import lr_at
        from rlgraph.versions import oldest_trainable

        batch = merge(inputs)
        check_step(batch, step, self.name)
        if "rewards" not in batch:
            raise ValueError(f"{self.name}: the batch has no 'rewards'; wire a reward node "
                             "into train")
        algo, ws = self.ws.spec.algorithm, self.ws
        rewards = batch["rewards"]
        adv = compute_advantages(algo, batch)
        device = next(ws.policy.parameters()).device
        t = {k: batch[k].to(device) for k in ("sequences", "attention_mask", "behavior_logp")}
        k = ws.spec.schedule.mini_batches  # streaming: step is mini-batch step % k
        # the lag bound, token by token: a token sampled by a version older than this step's
        # floor is left out of the loss (and counted: `lag/stale_tokens`, in the ledger)
        stale = batch["response_mask"].bool() & (
            batch["token_version"] < oldest_trainable(step, ws.spec.schedule.max_lag, k))
        trained = batch["response_mask"].bool() & ~stale
        t["mask"], t["adv"] = trained.float().to(device), adv.to(device)
        if "ref_logp" in batch:
            t["ref_logp"] = batch["ref_logp"].to(device)
        allocator = _allocator_counters(device)
        self.new_shapes = 0
        with ws.lock:
            rows = len(rewards)
            size = -(-rows // self.node.mini_batches)
            own_forward = from_rollout = False
            window = on_policy(batch, ws.policy_version)  # sampled by this version's weights
            if "old_logp" in batch:
                t["old_logp"] = batch["old_logp"].to(device)
            elif k > 1 and step % k and window:
                # streaming: the proximal policy of a version's later mini-batches is the
                # version's own (the rollout's log-probs, verl fully_async), as the step's
                # start is for an unstreamed step's mini-batches: the clip stays anchored
                t["old_logp"] = t["behavior_logp"].clone()
            elif self.node.old_logp == "rollout" and not (self.trained_once and window):
                # the behaviour policy is the proximal one: the clip anchors to the sampler's
                # log-probs and the importance weight is 1 (verl fully_async's choice)
                t["old_logp"], from_rollout = t["behavior_logp"].clone(), True
            elif self.trained_once and window:
                # the proximal policy is the trained one: its log-probs are the first (and
                # only) forward of `_update`, detached; the ratio is 1 (logp.py's docstring)
                own_forward = True
            else:  # the proximal policy is the one this step starts from
                t["old_logp"] = torch.zeros_like(t["behavior_logp"])
                shares = ([slice(0, rows)] if ws.replicas.dp_world == 1 else
                          [self._own(lo, min(lo + size, rows)) for lo in range(0, rows, size)])
                with torch.no_grad():
                    for own in shares:
                        t["old_logp"][own] = token_logp_passes(
                            ws.policy, t["sequences"][own], t["attention_mask"][own],
                            batch["prompt_len"], batch["temperature"],
                            self._even(self._passes(t["mask"][own], batch["prompt_len"]),
                                       device))
            lr = lr_at(self.node.lr, ws.policy_version, ws.spec.schedule.steps,
                       self.node.warmup_steps, self.node.lr_schedule, self.node.min_lr_ratio)
            for group in ws.optimizer.param_groups:
                group["lr"] = lr
            if k > 1 and not own_forward:  # streaming: this version's tokens anchor to the
                fresh = batch["token_version"].to(device) == ws.policy_version  # rollout's
                t["old_logp"] = torch.where(fresh, t["behavior_logp"], t["old_logp"])
            updates = [self._update(t, slice(lo, lo + size), batch, own_forward)
                       for _ in range(self.node.epochs) for lo in range(0, rows, size)]
            if (step + 1) % k == 0:  # of version step // k
                ws.policy_version += 1
            version = ws.policy_version
        valid = batch["response_mask"].bool()
        lag = (step // k - batch["token_version"][trained]).float()
        metrics = {key: sum(u[key] for u in updates) / len(updates) for key in updates[0]}
        metrics.update({
            "reward/mean": float(rewards.mean()),
            "reward/accuracy": float((rewards == 1.0).float().mean()),
            "reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
            "lag/max": float(lag.max()) if lag.numel() else 0.0,
            "lag/mean": float(lag.mean()) if lag.numel() else 0.0,
            "lag/stale_tokens": float(stale.sum()),
            "actor/entropy": float(-(batch["behavior_logp"][valid]).mean()) if valid.any()
            else 0.0,
            "response/length_mean": float(batch["response_mask"].sum(1).float().mean()),
            "samples": float(rows),
            "tokens": float(batch["attention_mask"].sum()),
            "policy/version": float(version),
            "stream/mini_batch": float(step % k),
            "actor/lr": lr,
            "logp/skipped": float(own_forward),
            "logp/from_rollout": float(from_rollout),
            "train/new_pass_shapes": float(self.new_shapes),
            **{f"train/{k}": v - allocator[k] for k, v in _allocator_counters(device).items()},
        })
        charged = reward_kl(algo, batch) if algo.advantage != "gae" else None
        if charged is not None:  # verl's names: each sequence's token mean, averaged
            per_seq = charged.sum(1) / batch["response_mask"].sum(1).clamp(min=1)
            metrics["actor/reward_kl_penalty"] = float(per_seq.mean())
            metrics["actor/reward_kl_penalty_coeff"] = algo.reward_kl_coef
        uids = list(dict.fromkeys(batch["prompt_uid"]))
        out = {"step": step, "policy_version": version, "metrics": metrics,
               "trained_uids": uids, "stale_tokens": int(stale.sum())}
        logging = ws.spec.logging
        if logging.samples_every and step % k == 0 and (step // k) % logging.samples_every == 0:
            out["sample_table"] = sample_table(batch, step // k, logging.samples)
        return out

    def _passes(self, mask: torch.Tensor, prompt_len: int) -> list[tuple[torch.Tensor, int]]:
        """The forward/backward passes over these rows (indices into them, response width):
        `micro_tokens` per pass (length-sorted, trimmed widths), else `micro_batch` rows (or
        all) at the full width."""
        import torch

        from rlgraph.engines.cpu_decode import length_batches

        rows, width = mask.shape
        if self.node.micro_tokens:
            return length_batches(mask.cpu(), prompt_len, self.node.micro_tokens)
        size = self.node.micro_batch or max(1, rows)
        return [(torch.arange(lo, min(lo + size, rows)), width) for lo in range(0, rows, size)]

    def _even(self, passes: list[tuple[torch.Tensor, int]], device: torch.device
              ) -> list[tuple[torch.Tensor, int]]:
        """Forward-only passes padded to the busiest rank's count where the policy is
        sharded (a repeated pass writes the same log-probs again)."""
        if not self.ws.sharded["policy"] or not passes:
            return passes
        from rlgraph.process.sharding import even_passes

        return even_passes(passes, passes[-1], device)[0]

    def _own(self, lo: int, hi: int) -> slice:
        """This data-parallel rank's share of rows [lo, hi) (all of them when alone)."""
        from rlgraph.rl.batch import shard_bounds

        a, b = shard_bounds(hi - lo, self.ws.replicas.dp_rank, self.ws.replicas.dp_world)
        return slice(lo + a, lo + b)

    @staticmethod
    def summary(out: Batch) -> dict[str, Any]:
        """What the driver reads of a step: its figures, the samples it trained on (the
        ledger, with the tokens left out for exceeding the lag bound), the policy version it
        made, and on logging steps a samples table."""
        return {"metrics": dict(out.get("metrics", {})),
                "trained_uids": list(out.get("trained_uids", [])),
                "stale_tokens": int(out.get("stale_tokens", 0)),
                "policy_version": int(out.get("policy_version", 0)),
                "sample_table": list(out.get("sample_table", []))}

    @staticmethod
    def combine(outs: list[Batch]) -> Batch:
        """Every replica returns the same step (summed figures, same batch): the leader's."""
        return outs[0]

    def _update(self, t: dict, rows: slice, batch: Batch, own_forward: bool = False
                ) -> dict[str, float]:
        """One optimizer update on `rows`, accumulated over micro-batches; its figures.
        `own_forward`: the old log-probs are this forward's, detached (on-policy, one update)."""
        import torch

        from rlgraph.engines.cpu_decode import token_logp
        from rlgraph.presets.models import PASS_WIDTH_BLOCK
        from rlgraph.process.sharding import even_passes, full_tensor, gradient_scale
        from rlgraph.rl.loss import policy_loss

        algo, policy, optimizer = self.ws.spec.algorithm, self.ws.policy, self.ws.optimizer
        sharded = self.ws.sharded["policy"]
        scale = gradient_scale() if sharded else 1.0  # FSDP averages; the ranks' sum is meant
        tokens = t["mask"][rows].sum().clamp(min=1)
        seqs = max(1, len(t["mask"][rows]))
        optimizer.zero_grad(set_to_none=True)
        figures = {"loss/policy": 0.0, "loss/kl": 0.0, "actor/clip_frac": 0.0,
                   "actor/is_weight_mean": 0.0, "actor/is_truncated_frac": 0.0}
        own = self._own(rows.start, min(rows.stop, len(t["mask"])))
        P = batch["prompt_len"]
        passes = self._passes(t["mask"][own], P)
        real = len(passes)
        if sharded:  # FSDP's all-gathers: every rank runs the busiest rank's count of
            # passes; the extra ones (row 0, a short width) add zero to the gradients
            fill = (torch.tensor([-own.start]), min(t["mask"].shape[1], PASS_WIDTH_BLOCK))
            passes, real = even_passes(passes, fill, tokens.device)
        for number, (index, w) in enumerate(passes):
            sl = (own.start + index).to(tokens.device)

            def cut(key: str, cols: int, sl: torch.Tensor = sl) -> torch.Tensor:
                return t[key][sl, :cols]

            if (len(index), P + w) not in self.shapes:
                self.shapes.add((len(index), P + w))
                self.new_shapes += 1
            logp = token_logp(policy, cut("sequences", P + w), cut("attention_mask", P + w),
                              P, batch["temperature"])
            old = logp.detach() * cut("mask", w) if own_forward else cut("old_logp", w)
            adv = t["adv"][sl] if t["adv"].dim() == 1 else t["adv"][sl, :w]
            terms = policy_loss(logp, old, cut("behavior_logp", w), adv,
                                cut("mask", w), algo.clip_low, algo.is_truncation,
                                cut("ref_logp", w) if "ref_logp" in t else None,
                                algo.kl_coef, algo.kl_type, normaliser=tokens,
                                clip_high=algo.clip_high, loss_agg=algo.loss_agg,
                                ratio_level=algo.ratio_level, seqs=seqs,
                                max_len=self.ws.spec.data.response_len.max)
            if number >= real:
                (terms.loss * 0.0).backward()
                continue
            (terms.loss * scale).backward()
            share = float(cut("mask", w).sum() / tokens)
            figures["loss/policy"] += share * terms.policy_loss
            figures["loss/kl"] += share * terms.kl
            figures["actor/clip_frac"] += share * terms.clip_frac
            figures["actor/is_weight_mean"] += share * terms.is_weight_mean
            figures["actor/is_truncated_frac"] += share * terms.is_truncated_frac
        replicas = self.ws.replicas
        if replicas.dp_world > 1:
            if not sharded:  # FSDP sums them itself (reduce-scatter in the backward)
                replicas.sum_gradients(policy.parameters())
            summed = replicas.all_reduce(torch.tensor(list(figures.values()), dtype=torch.float64,
                                                      device=tokens.device))
            figures = dict(zip(figures, summed.tolist()))
        clip = getattr(policy, "clip_grad_norm", None)  # megatron: the norm over its tp group
        grad_norm = (clip(self.node.grad_clip) if clip is not None else
                     torch.nn.utils.clip_grad_norm_(policy.parameters(), self.node.grad_clip))
        optimizer.step()
        figures["actor/grad_norm"] = float(full_tensor(grad_norm))
        return figures


def _allocator_counters(device: torch.device) -> dict[str, float]:
    """The CUDA caching allocator's running counts (retries after a failed allocation free
    every cached block: a device-wide sync; device mallocs and frees); empty off CUDA."""
    import torch

    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    return {"alloc_retries": float(stats.get("num_alloc_retries", 0)),
            "device_mallocs": float(stats.get("num_device_alloc", 0)),
            "device_frees": float(stats.get("num_device_free", 0))}
