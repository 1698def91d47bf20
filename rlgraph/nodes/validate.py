"""`validate`: score the policy on held-out prompts every `every` steps (verl: test_freq).

Validation decodes with generate's engine and weights, so the node must be a task of the
group that holds a generate node: the group is the engine lock (its tasks never overlap)
and the workspace lock guards the weights. Its default edges are generate -> validate ->
train: validate(t) runs after generate(t), on a policy version >= t - max_lag, and before
train(t), so its `val/*` metrics land in the metrics row of step t. On the other steps it
returns at once. After the last step the runtime validates once more, on the trainer's
workspace (the final weights: param_update skips versions no generate would use), so every
run ends with the final policy's `val/accuracy` and `val/reward/mean`.

Cost model: one synchronous greedy batch of `prompts` validation prompts decoded to
`data.response_len.max` by generate's cost model, amortized over `every` steps (the
schedule is periodic; the real run pays it whole on every `every`-th step).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from rlgraph.errors import SpecError, did_you_mean
from rlgraph.nodes.base import (
    MAX_COUNT,
    MAX_STEPS,
    EdgeList,
    GraphSpec,
    NodeKind,
    NodeSpec,
)
from rlgraph.nodes.reward import current_fn
from rlgraph.pricing.validate import validate_cost

if TYPE_CHECKING:
    from rlgraph.process.workspace import Workspace
    from rlgraph.rl.batch import Batch
    from rlgraph.rl.data import Example


class ValidateSpec(NodeSpec):
    """Held-out prompts, how often, and how to sample them (verl: trainer.test_freq)."""

    kind: Literal["validate"] = "validate"
    every: int = Field(default=10, ge=1, le=MAX_STEPS,
                       description="validate on steps 0, every, 2 * every, ...")
    prompts: int = Field(default=64, ge=1, le=MAX_COUNT,
                         description="the first N prompts of the val split")
    task: str | None = Field(default=None, description="built-in task (default: data.task)")
    files: list[str] | None = Field(
        default=None, description="verl-format validation files (default: data.val_files)")
    fn: str | None = Field(default=None, description="reward fn (default: the reward node's)")

    _current_fn = field_validator("fn")(current_fn)
    greedy: bool = Field(default=True, description="argmax decoding; false: sample")
    temperature: float = Field(default=1.0, ge=1e-3, le=100,
                               description="sampling temperature if not "
                               "greedy")

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str | None) -> str | None:
        from rlgraph.rl.data import TASKS

        if task is not None and task not in TASKS:
            hint = did_you_mean(task, TASKS) or f"tasks: {', '.join(TASKS)}"
            raise ValueError(f"unknown task '{task}' ({hint})")
        return task


def engine_of(spec: GraphSpec, name: str) -> str:
    """The generate node whose engine and weights validate node `name` uses: the one in its
    group. Refuses a validate node in a group without one (it would hold no policy)."""
    group = spec.group_of(name)
    gens = [t for t in spec.groups[group].tasks if spec.nodes[t].kind == "generate"] \
        if group else []
    if gens:
        return gens[0]
    homes = [g for g, gs in spec.groups.items()
             if any(spec.nodes[t].kind == "generate" for t in gs.tasks if t in spec.nodes)]
    where = f"group '{homes[0]}'" if homes else "the group of a generate node"
    key = ("groups", group, "tasks", spec.groups[group].tasks.index(name)) if group \
        else ("nodes", name)
    raise SpecError(f"validate node '{name}' is in {f'group {group!r}' if group else 'no group'}"
                    f", which holds no generate node: it decodes with generate's engine and "
                    f"the weights param_update sends there", key,
                    hint=f"list '{name}' in the tasks of {where}")


def validate_edges(name: str, node: NodeSpec, nodes: Mapping[str, NodeSpec]) -> EdgeList:
    """generate -> validate -> train: after the step's rollout, before its train step (the
    train edge carries only the step's val metrics and keeps validate's work in use)."""
    gens = [n for n, s in nodes.items() if s.kind == "generate"]
    trains = [n for n, s in nodes.items() if s.kind == "train"]
    return [(g, name) for g in gens[:1]] + [(name, t) for t in trains]


KIND = NodeKind(
    name="validate",
    spec=ValidateSpec,
    cost=validate_cost,
    uses_gpu=True,
    default_edges=validate_edges,
    worker="rlgraph.nodes.validate:ValidateWorker",
    validates=True,
    colour="#b07aa1",
    doc="score the policy on held-out prompts every `every` steps",
)


def validation_examples(node: ValidateSpec, workspace: Workspace) -> list[Example]:
    """The node's prompts: its files, else its task, else data.val_files, else data.task."""
    from rlgraph.rl.data import DataSource

    data = workspace.spec.data
    if node.files:
        data = data.model_copy(update={"val_files": node.files})
    elif node.task:
        data = data.model_copy(update={"task": node.task, "val_files": None})
    return DataSource(data, "val", workspace.base_dir).validation(node.prompts)


class ValidateWorker:
    """Every `every` steps: decode the validation prompts with the group's policy (under the
    workspace lock, so a weight commit never lands mid-decode) and score them. Returns
    `{"step", "metrics": {"val/reward/mean", "val/policy_version", ...}}`; other steps
    return `{"step"}` at once. Among replicas, rank 0 alone validates."""

    DATA_PARALLEL = "leader"

    def __init__(self, name: str, node: ValidateSpec, workspace: Workspace):
        from rlgraph.rl.rewards import DEFAULT_FN, make_scorer

        self.name, self.node, self.ws = name, node, workspace
        if workspace.policy is None:
            engine_of(workspace.spec, name)  # raises the clear error
            raise SpecError(f"validate node '{name}' shares no workspace with a policy",
                            ("nodes", name))
        fn = node.fn or next((s.fn for s in workspace.spec.nodes.values()
                              if s.kind == "reward" and s.fn), None)
        self.fn_name = fn or DEFAULT_FN
        self.fn = make_scorer(fn, ("nodes", name, "fn"), workspace.base_dir)
        self.timeout_s = next((s.timeout_s for s in workspace.spec.nodes.values()
                               if s.kind == "reward"), None)
        self.examples = validation_examples(node, workspace)
        self.ids = [workspace.tokenizer.encode_prompt(ex.prompt) for ex in self.examples]

    def run(self, step: int, inputs: dict[str, Batch]) -> Batch:
        """Validate on steps 0, every, 2 * every, ...; otherwise nothing."""
        if step % self.node.every:
            return {"step": step}
        return self.validate(step)

    def validate(self, step: int) -> Batch:
        """Decode and score the validation prompts with the policy held now: `val/accuracy`
        (the fraction scoring 1.0, exact match) beside `val/reward/mean`."""
        import torch

        from rlgraph.engines.cpu_decode import sample
        from rlgraph.rl.rewards import score_samples

        tok, ws, exs = self.ws.tokenizer, self.ws, self.examples
        with ws.lock, torch.no_grad():
            version = ws.policy_version
            rollout = sample(ws.policy, self.ids, max_new_tokens=ws.spec.data.response_len.max,
                             eos_id=tok.eos_id, pad_id=tok.pad_id, policy_version=version,
                             greedy=self.node.greedy, temperature=self.node.temperature,
                             generator=ws.generator(self.name, step))
        texts = [tok.decode(r) for r in rollout.responses.tolist()]
        scores = score_samples(self.fn, self.fn_name, [ex.data_source for ex in exs], texts,
                               [ex.ground_truth for ex in exs], [ex.extra_info for ex in exs],
                               [ex.uid for ex in exs], timeout_s=self.timeout_s)
        lengths = rollout.response_mask.sum(1).float()
        return {"step": step, "metrics": {
            "val/reward/mean": sum(scores) / len(scores),
            "val/accuracy": sum(score == 1.0 for score in scores) / len(scores),
            "val/policy_version": float(version),
            "val/length/mean": float(lengths.mean()),
            "val/length/max": float(lengths.max()),
            "val/samples": float(len(scores)),
        }}
