"""`reward`: score responses with a verifier or a user function (verl's compute_score)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from rlgraph.nodes.base import NodeKind, NodeSpec, inputs_from_kinds
from rlgraph.pricing.reward import reward_cost

if TYPE_CHECKING:
    from rlgraph.rl.batch import Batch
    from rlgraph.worker.workspace import Workspace


# Built-in reward modules that moved; graph.yaml files naming the old module keep working.
MOVED_MODULES = {"rlgraph.rewards": "rlgraph.rl.rewards"}


def current_fn(ref: str | None) -> str | None:
    """A reward `fn` with a moved built-in module renamed to where it lives now."""
    if ref is None:
        return None
    target, sep, attr = ref.rpartition(":")
    return f"{MOVED_MODULES[target]}{sep}{attr}" if target in MOVED_MODULES else ref


class RewardSpec(NodeSpec):
    """`fn: module:function` or `path/to/file.py:function`; default: the task's verifier."""

    kind: Literal["reward"] = "reward"
    fn: str | None = Field(default=None, description="module:function or file.py:function")

    _current_fn = field_validator("fn")(current_fn)

    @model_validator(mode="before")
    @classmethod
    def _no_workers(cls, data: Any) -> Any:
        """`workers` was accepted once and never used: refuse it rather than ignore it."""
        if isinstance(data, dict) and "workers" in data:
            raise ValueError("'workers' is not supported: the reward node scores its samples "
                             "in one process (remove the key; a slow verifier can be given its "
                             "own group or a cost: override)")
        return data


KIND = NodeKind(
    name="reward",
    spec=RewardSpec,
    cost=reward_cost,
    uses_gpu=False,
    default_edges=inputs_from_kinds("generate"),
    worker="rlgraph.nodes.reward:RewardWorker",
    colour="#edc948",
    doc="score responses",
)


class RewardWorker:
    """Adds `rewards`: `fn(data_source, solution_str, ground_truth, extra_info)` per sample.
    A function that raises or returns a non-number stops the run naming fn and sample."""

    def __init__(self, name: str, node: RewardSpec, workspace: Workspace):
        from rlgraph.rl.rewards import DEFAULT_FN, load_reward_fn

        self.name, self.node, self.ws = name, node, workspace
        self.fn_name = node.fn or DEFAULT_FN
        self.fn = load_reward_fn(node.fn, ("nodes", name, "fn"), workspace.base_dir)

    def run(self, step: int, inputs: dict[str, Batch]) -> Batch:
        """Score every response of the batch of `step` (rows dynamic sampling scored already
        keep their rewards); ReMax's greedy responses, once per prompt, give
        `reward_baselines`."""
        import torch

        from rlgraph.rl.batch import check_step, merge
        from rlgraph.rl.rewards import score_samples

        batch = merge(inputs)
        check_step(batch, step, self.name)
        if "rewards" not in batch:
            scores = score_samples(self.fn, self.fn_name, batch["data_source"],
                                   batch["response_text"], batch["ground_truth"],
                                   batch["extra_info"], batch["prompt_uid"], step=step)
            batch["rewards"] = torch.tensor(scores, dtype=torch.float32)
        if "baseline_response_text" in batch:
            counts = torch.unique_consecutive(batch["group"], return_counts=True)[1]
            first = (counts.cumsum(0) - counts).tolist()  # each group's first row

            def pick(key: str) -> list[Any]:
                return [batch[key][i] for i in first]

            base = score_samples(self.fn, self.fn_name, pick("data_source"),
                                 pick("baseline_response_text"), pick("ground_truth"),
                                 pick("extra_info"), pick("prompt_uid"), step=step)
            batch["reward_baselines"] = torch.tensor(base, dtype=torch.float32
                                                     ).repeat_interleave(counts)
        return batch

    @staticmethod
    def summary(out: Batch) -> dict[str, Any]:
        """The step's mean reward, for the driver's ledger."""
        return {"reward/mean": float(out["rewards"].float().mean())} if "rewards" in out else {}
