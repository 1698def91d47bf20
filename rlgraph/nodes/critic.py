"""`critic`: PPO's value model: a value forward over the step's samples, GAE, and the critic's
own optimizer step (verl: critic.*).

The critic is a model of its own (the policy's architecture with a one-wide value head,
transformers' `...ForTokenClassification` with `num_labels: 1`, as verl builds it), held by the
critic's worker in whichever group the critic is placed; its weights are never sent to
generate. Per step it (1) computes the values V(s_t) of every response token with the weights
it holds, (2) turns the rewards into GAE advantages and returns (`algorithm.gamma`, `lam`),
(3) takes `epochs x mini_batches` AdamW updates of the clipped value loss (verl
`compute_value_loss`: 0.5 * max((V - R)^2, (clip(V, V_old +- value_clip) - R)^2), token-mean),
and adds `values`, `advantages` and `returns` to the batch train receives. Its default edges
run reward -> critic -> train.

In a group of several replicas the critic is data-parallel as train is: every replica holds
a whole copy of the value model, computes the values of its share of the rows (summed into
the whole batch's, which GAE's whitening needs), runs forward / backward on its share of
every mini-batch with the loss scaled by the mini-batch's whole token count, and the
gradients are summed over the replicas, so each takes the step one process would take.
`sharding: fsdp` and `backend: megatron` are not offered for the value model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from rlgraph.nodes.base import MAX_COUNT, NodeKind, inputs_from_kinds
from rlgraph.nodes.parallel_spec import ParallelNodeSpec
from rlgraph.pricing.critic import critic_cost

if TYPE_CHECKING:
    import torch

    from rlgraph.process.workspace import Workspace
    from rlgraph.rl.batch import Batch


class CriticSpec(ParallelNodeSpec):
    """The value model's optimizer (verl: critic.optim.*, critic.ppo_epochs,
    critic.cliprange_value)."""

    kind: Literal["critic"] = "critic"
    lr: float = Field(default=1e-5, ge=1e-12, le=10, description="verl: critic.optim.lr")
    weight_decay: float = Field(default=0.01, ge=0, le=10,
                                description="verl: critic.optim.weight_decay")
    grad_clip: float = Field(default=1.0, ge=1e-6, le=1e6)
    value_clip: float = Field(default=0.5, ge=1e-6, le=1e6,
                              description="verl: critic.cliprange_value")
    epochs: int = Field(default=1, ge=1, le=1000, description="verl: critic.ppo_epochs")
    mini_batches: int = Field(default=1, ge=1, le=MAX_COUNT,
                              description="value updates per epoch")
    micro_batch: int | None = Field(default=None, ge=1, le=MAX_COUNT,
                                    description="sequences per forward/backward (accumulated)")

    @model_validator(mode="after")
    def _replicated_only(self) -> CriticSpec:
        """The value model runs replicated data parallelism only: no FSDP, no megatron."""
        if self.sharding != "none":
            raise ValueError("the critic's value model is replicated on each data-parallel "
                             "rank: sharding: fsdp is not offered for it (write sharding: none)")
        if self.backend != "torch" or self.tp * self.pp * self.ep > 1:
            raise ValueError("the critic's value model runs on backend: torch with tp, pp "
                             "and ep 1 (its group's replicas split the rows)")
        return self


KIND = NodeKind(
    name="critic",
    spec=CriticSpec,
    cost=critic_cost,
    uses_gpu=True,
    default_edges=inputs_from_kinds("reward", "generate"),
    worker="rlgraph.nodes.critic:CriticWorker",
    sequence_passes=True,
    trains=True,
    colour="#b07aa1",
    doc="PPO's value model: values, GAE and its own train step",
    provides=frozenset({"values", "advantages", "returns"}),
)


# transformers' token classifiers drop 10% of the head's input unless told otherwise (a
# random value forward); verl's critic turns it off the same way
NO_DROPOUT = {"classifier_dropout": 0.0}


def build_value_model(workspace: Workspace) -> torch.nn.Module:
    """The critic: the policy's architecture with a one-wide value head (a token
    classifier, num_labels 1, no dropout); the body from `model.path`'s weights or, for a
    preset or `hf_config`, a seeded random init; fp32 on CPU, bf16 on a GPU."""
    import torch
    from transformers import AutoModelForTokenClassification

    from rlgraph.errors import SpecError
    from rlgraph.model.build import model_config

    spec, device = workspace.spec.model, workspace.device
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(workspace.seed + 1)  # not the policy's draw: a different head
        if spec.path is not None:
            try:
                model = AutoModelForTokenClassification.from_pretrained(
                    spec.path, num_labels=1, dtype=dtype, **NO_DROPOUT)
            except (OSError, ValueError) as exc:
                raise SpecError(f"cannot build a value model from '{spec.path}': {exc}",
                                ("model", "path"), hint="give a causal LM transformers can "
                                "load as a token classifier") from None
        else:
            config = model_config(spec, workspace.tokenizer)
            config.num_labels = 1
            for key, value in NO_DROPOUT.items():
                setattr(config, key, value)
            model = AutoModelForTokenClassification.from_config(config, dtype=dtype)
    return model.to(device)


def token_values(model: torch.nn.Module, sequences: torch.Tensor,
                 attention_mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """[B, R] values: V of the state before each response token (the head's output at the
    position that predicts it), with gradient if enabled."""
    from rlgraph.engines.cpu_decode import position_ids

    out = model(input_ids=sequences, attention_mask=attention_mask,
                position_ids=position_ids(attention_mask), use_cache=False)
    width = sequences.shape[1] - prompt_len
    return out.logits[:, prompt_len - 1: prompt_len - 1 + width, 0].float()


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor, clip: float, tokens: torch.Tensor | float
               ) -> tuple[torch.Tensor, float]:
    """verl's clipped value loss, token-mean over `tokens` valid tokens (the whole
    mini-batch's when these rows are one micro-batch of it); and the clipped fraction."""
    import torch

    clipped = old_values + (values - old_values).clamp(-clip, clip)
    plain_sq, clipped_sq = (values - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * (torch.maximum(plain_sq, clipped_sq) * mask).sum() / tokens
    # verl counts tokens whose clipped loss is the larger; only a value moved past the clip
    # range can be (inside it the two agree but for rounding, which must not count)
    binding = (clipped_sq > plain_sq) & ((values - old_values).abs() > clip)
    frac = float((binding.float() * mask).sum() / mask.sum().clamp(min=1))
    return loss, frac


class CriticWorker:
    """Values, GAE and the critic's update for the batch of `step` (module docstring). Every
    replica of its group gets the whole batch and takes its share of the rows; the replicas'
    gradients are summed, so they stay identical."""

    DATA_PARALLEL = "whole"

    def __init__(self, name: str, node: CriticSpec, workspace: Workspace):
        self.name, self.node, self.ws = name, node, workspace
        self.model: Any = None
        self.optimizer: Any = None
        self.synced = False  # replicas start from rank 0's value model (first run)

    def _build(self) -> None:
        import torch

        if self.model is None:
            self.model = build_value_model(self.ws)
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.node.lr,
                                               weight_decay=self.node.weight_decay)

    def run(self, step: int, inputs: dict[str, Batch]) -> Batch:
        """Add `values`, `advantages` and `returns` to the batch, then update the critic."""
        import torch

        from rlgraph.rl.advantages import gae_advantages
        from rlgraph.rl.batch import check_step, merge

        batch = merge(inputs)
        check_step(batch, step, self.name)
        if "rewards" not in batch:
            raise ValueError(f"{self.name}: the batch has no 'rewards'; wire a reward node "
                             "into the critic")
        self._build()
        replicas = self.ws.replicas
        if not self.synced:
            replicas.copy_from_first(self.model)
            self.synced = True
        algo = self.ws.spec.algorithm
        device = next(self.model.parameters()).device
        seqs = batch["sequences"].to(device)
        attn = batch["attention_mask"].to(device)
        mask = batch["response_mask"].float().to(device)
        P = batch["prompt_len"]
        old = torch.zeros(mask.shape, dtype=torch.float32, device=device)
        own = self._own(0, len(seqs))
        with torch.no_grad():
            if own.stop > own.start:
                old[own] = token_values(self.model, seqs[own], attn[own], P) * mask[own]
        replicas.all_reduce(old)  # each rank wrote its rows: the sum is the whole batch's
        advantages, returns = gae_advantages(batch["rewards"].float().cpu(), old.cpu(),
                                             mask.cpu(), algo.gamma, algo.lam)
        figures = [self._update(seqs, attn, mask, old, returns.to(device), P, rows)
                   for _ in range(self.node.epochs)
                   for rows in self._mini_batches(len(seqs))]
        metrics = {k: sum(f[k] for f in figures) / len(figures) for k in figures[0]}
        valid = mask.bool().cpu()
        metrics["critic/values_mean"] = float(old.cpu()[valid].mean()) if valid.any() else 0.0
        metrics["critic/returns_mean"] = float(returns[valid].mean()) if valid.any() else 0.0
        batch["values"], batch["advantages"], batch["returns"] = old.cpu(), advantages, returns
        batch["critic_metrics"] = metrics
        return batch

    def _mini_batches(self, rows: int) -> list[slice]:
        size = -(-rows // self.node.mini_batches)
        return [slice(lo, min(lo + size, rows)) for lo in range(0, rows, size)]

    def _own(self, lo: int, hi: int) -> slice:
        """This data-parallel rank's share of rows [lo, hi) (all of them when alone)."""
        from rlgraph.rl.batch import shard_bounds

        a, b = shard_bounds(hi - lo, self.ws.replicas.dp_rank, self.ws.replicas.dp_world)
        return slice(lo + a, lo + b)

    def _update(self, seqs: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor,
                old: torch.Tensor, returns: torch.Tensor, prompt_len: int, rows: slice
                ) -> dict[str, float]:
        """One AdamW update of the value loss on `rows`, accumulated over micro-batches of
        this rank's share; the replicas' gradients summed before the step."""
        import torch

        tokens = mask[rows].sum().clamp(min=1)
        own = self._own(rows.start, rows.stop)
        size = self.node.micro_batch or max(1, own.stop - own.start)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, clip_sum = 0.0, 0.0
        for lo in range(own.start, own.stop, size):
            sl = slice(lo, min(lo + size, own.stop))
            values = token_values(self.model, seqs[sl], attn[sl], prompt_len)
            loss, frac = value_loss(values, old[sl], returns[sl], mask[sl],
                                    self.node.value_clip, tokens)
            loss.backward()
            share = float(mask[sl].sum() / tokens)
            loss_sum += float(loss.detach())
            clip_sum += share * frac
        replicas = self.ws.replicas
        if replicas.dp_world > 1:
            replicas.sum_gradients(self.model.parameters())
            summed = replicas.all_reduce(torch.tensor([loss_sum, clip_sum], dtype=torch.float64,
                                                      device=tokens.device))
            loss_sum, clip_sum = summed.tolist()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.node.grad_clip)
        self.optimizer.step()
        return {"critic/vf_loss": loss_sum, "critic/vf_clipfrac": clip_sum,
                "critic/grad_norm": float(norm)}

    @staticmethod
    def combine(outs: list[Batch]) -> Batch:
        """Every replica returns the same batch (summed values, same advantages): the
        leader's."""
        return outs[0]

    @staticmethod
    def summary(out: Batch) -> dict[str, Any]:
        """The critic's figures, for the step's metrics row."""
        return {"metrics": dict(out.get("critic_metrics", {}))}

    def state_dict(self) -> dict[str, Any]:
        """The value model's weights and optimizer state (CPU copies), for a checkpoint."""
        import copy

        self._build()
        return {"weights": {k: v.detach().to("cpu", copy=True)
                            for k, v in self.model.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self._build()
        self.model.load_state_dict(state["weights"])
        self.optimizer.load_state_dict(state["optimizer"])
