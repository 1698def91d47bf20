"""`reward`: score responses with a verifier or a user function (verl's compute_score)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from rlgraph.nodes.base import NodeKind, NodeSpec, inputs_from_kinds
from rlgraph.pricing.reward import reward_cost

if TYPE_CHECKING:
    from rlgraph.process.workspace import Workspace
    from rlgraph.rl.batch import Batch


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
    timeout_s: float = Field(default=60.0, gt=0, le=86_400, allow_inf_nan=False,
                             description="longest one call of a user's fn may take; a call "
                             "that takes longer stops the run with a checkpoint, naming the "
                             "sample (a user's fn runs in a process of its own)")

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
    """Adds `rewards`: `fn(data_source, solution_str, ground_truth, extra_info)` per sample,
    plus the environment's summed step rewards of a multi-turn rollout (`env_reward`).
    A function that raises, returns a non-number or runs past `timeout_s` stops the run
    naming fn and sample; what a user's fn prints travels in the summary (`output`) to the
    run dir's reward.log."""

    def __init__(self, name: str, node: RewardSpec, workspace: Workspace):
        from rlgraph.rl.rewards import DEFAULT_FN, make_scorer

        self.name, self.node, self.ws = name, node, workspace
        self.fn_name = node.fn or DEFAULT_FN
        self.fn = make_scorer(node.fn, ("nodes", name, "fn"), workspace.base_dir)
        self.output = ""

    def run(self, step: int, inputs: dict[str, Batch]) -> Batch:
        """Score every response of the batch of `step` (rows dynamic sampling scored already
        keep their rewards); ReMax's greedy responses, once per prompt, give
        `reward_baselines`."""
        import torch

        from rlgraph.rl.batch import check_step, merge
        from rlgraph.rl.rewards import RewardFnError, score_samples

        batch = merge(inputs)
        check_step(batch, step, self.name)
        if "rewards" not in batch:  # rows dynamic sampling scored keep their rewards
            try:
                scores = score_samples(self.fn, self.fn_name, batch["data_source"],
                                       batch["response_text"], batch["ground_truth"],
                                       batch["extra_info"], batch["prompt_uid"], step=step,
                                       timeout_s=self.node.timeout_s)
            except RewardFnError as err:
                err.output = self._take_output(step)
                raise
            self.output = self._take_output(step)
            batch["rewards"] = torch.tensor(scores, dtype=torch.float32)
            if "env_reward" in batch:  # a multi-turn rollout: the env's step rewards, summed
                batch["rewards"] = batch["rewards"] + batch["env_reward"]
        if "baseline_response_text" in batch:
            counts = torch.unique_consecutive(batch["group"], return_counts=True)[1]
            first = (counts.cumsum(0) - counts).tolist()  # each group's first row

            def pick(key: str) -> list[Any]:
                return [batch[key][i] for i in first]

            base = score_samples(self.fn, self.fn_name, pick("data_source"),
                                 pick("baseline_response_text"), pick("ground_truth"),
                                 pick("extra_info"), pick("prompt_uid"), step=step,
                                 timeout_s=self.node.timeout_s)
            batch["reward_baselines"] = torch.tensor(base, dtype=torch.float32
                                                     ).repeat_interleave(counts)
        return batch

    def _take_output(self, step: int) -> str:
        take = getattr(self.fn, "take_output", None)
        text = take() if take is not None else ""
        return f"--- {self.name} step {step}\n{text}" if text else ""

    def summary(self, out: Batch) -> dict[str, Any]:
        """The step's mean reward, for the driver's ledger, and what fn printed."""
        found: dict[str, Any] = {"output": self.output} if self.output else {}
        self.output = ""
        if "rewards" in out:
            found["reward/mean"] = float(out["rewards"].float().mean())
        return found
