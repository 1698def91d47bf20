"""`logp`: recompute the proximal policy's log-probs of the sampled tokens.

The forward is redundant when the batch was sampled by the weights train starts from and
train updates once on it (one mini-batch, one epoch): the proximal policy is then the policy
being trained, so the PPO ratio is identically 1 and train's own forward, detached, gives the
old log-probs. The compiler proves that from the graph (`skip_reason`: max_lag 0, no partial
rollout, one update) and prices logp at 0; the worker checks it again on every batch (each
token's version is the step's) and runs the forward whenever a batch is off-policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from rlgraph.nodes.base import GraphSpec, NodeKind, NodeSpec, inputs_from_kinds
from rlgraph.nodes.parallel_spec import ParallelNodeSpec
from rlgraph.pricing.logp import forward_cost
from rlgraph.pricing.system import system_of

if TYPE_CHECKING:
    import torch

    from rlgraph.process.workspace import Workspace
    from rlgraph.rl.batch import Batch


class LogpSpec(ParallelNodeSpec):
    """Forward pass of the policy over prompt + response."""

    kind: Literal["logp"] = "logp"


def trained_once(spec: GraphSpec) -> bool:
    """Every train node makes one optimizer update per batch (one mini-batch, one epoch)."""
    trains = [n for n in spec.nodes.values() if n.kind == "train"]
    return bool(trains) and all(getattr(n, "mini_batches", 1) == 1 and getattr(n, "epochs", 1)
                                == 1 for n in trains)


def skip_reason(spec: GraphSpec) -> str | None:
    """Why the old-log-prob forward is provably redundant for every batch of this graph, or
    None: max_lag 0 without partial rollout (every token is sampled by the version train
    starts from) and one update per batch (the proximal policy is the trained one). A plan
    priced as verl's hybrid engine never skips: verl computes old_log_prob on every batch."""
    if spec.schedule.max_lag != 0 or spec.schedule.partial_rollout or not trained_once(spec):
        return None
    if system_of(spec).old_logp_always:
        return None
    return ("skipped: max_lag 0 and one update per batch (mini_batches 1, epochs 1), so the "
            "PPO ratio is 1 and train's own forward, detached, gives the old log-probs")


def on_policy(batch: Batch, version: int) -> bool:
    """Every sampled token of the batch was sampled by policy version `version`."""
    valid = batch["response_mask"].bool()
    return bool((batch["token_version"][valid] == version).all())


KIND = NodeKind(
    name="logp",
    spec=LogpSpec,
    cost=forward_cost,
    uses_gpu=True,
    default_edges=inputs_from_kinds("generate"),
    worker="rlgraph.nodes.logp:LogpWorker",
    proximal_logp=True,
    sequence_passes=True,
    colour="#76b7b2",
    doc="proximal-policy log-probs of the sampled tokens",
    models=frozenset({"policy"}),
)


class LogpWorker:
    """Adds `old_logp`: the sampled tokens' log-probs under the policy train will start from
    (the proximal policy of decoupled PPO), at the generate temperature."""

    model_attr, key = "policy", "old_logp"

    def __init__(self, name: str, node: NodeSpec, workspace: Workspace):
        self.name, self.node, self.ws = name, node, workspace
        self.may_skip = self.key == "old_logp" and trained_once(workspace.spec)

    def run(self, step: int, inputs: dict[str, Batch]) -> Batch:
        """Forward the batch of `step` (no gradient) and add this node's log-probs; an
        on-policy batch trained once gets none (train uses its own forward, detached)."""
        from rlgraph.rl.batch import check_step, merge

        batch = merge(inputs)
        check_step(batch, step, self.name)
        version = step // self.ws.spec.schedule.mini_batches  # streaming: K steps a version
        if self.may_skip and on_policy(batch, version):
            return batch  # train checks the versions again against the weights it holds
        batch[self.key] = self.forward(batch)
        return batch

    def forward(self, batch: Batch) -> torch.Tensor:
        """[B, R] log-probs of the batch's response tokens under this node's model (0 on
        padding), at the generate temperature."""
        import torch

        from rlgraph.engines.cpu_decode import length_batches, token_logp, token_logp_passes

        with self.ws.lock, torch.no_grad():
            model = getattr(self.ws, self.model_attr)
            device = next(model.parameters()).device
            seqs, mask = batch["sequences"].to(device), batch["attention_mask"].to(device)
            budget = getattr(self.node, "micro_tokens", None)
            if budget:
                passes = length_batches(batch["response_mask"], batch["prompt_len"], budget)
                if passes and self.ws.sharded[self.model_attr]:
                    # FSDP's all-gathers: as many forwards as the busiest rank (a repeated
                    # pass writes the same log-probs again)
                    from rlgraph.process.sharding import even_passes

                    passes = even_passes(passes, passes[-1], device)[0]
                logp = token_logp_passes(model, seqs, mask, batch["prompt_len"],
                                         batch["temperature"], passes)
            else:
                logp = token_logp(model, seqs, mask, batch["prompt_len"], batch["temperature"])
        return (logp.cpu() * batch["response_mask"]).float()
