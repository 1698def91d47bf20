"""DAPO's dynamic sampling (verl: algorithm.filter_groups): a step's batch of groups whose
rewards are not all equal, drawn batch after batch.

A group whose samples all score the same has zero GRPO advantage: it costs a forward and
backward and teaches nothing. With `algorithm.dynamic_sampling.enable`, generate scores each
drawn batch with the graph's reward function, keeps the groups with unequal rewards, and
draws the next batch of prompts until the step has `prompts_per_step` such groups or
`max_draws` batches were drawn; a batch still short then is filled with dropped groups (verl
raises instead; a filled group only adds no signal). Draw d of step s reads prompt batch
s * max_draws + d of the data stream, so steps never share prompts and a resumed run draws
the same ones. The kept rows carry their `rewards`, which the reward node keeps.

The compiler prices generate and reward at the expected number of draws
(`DynamicSamplingSpec.expected_draws`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlgraph.nodes.generate import GenerateWorker
    from rlgraph.rl.batch import Batch


def reward_fn_of(worker: GenerateWorker) -> tuple[Any, str, float | None]:
    """The graph's reward scorer (its first reward node's `fn`, isolated as the reward node
    runs it; made once per worker), the fn's name and its timeout."""
    from rlgraph.rl.rewards import DEFAULT_FN, make_scorer

    spec = worker.ws.spec
    name, node = next(((n, s) for n, s in spec.nodes.items() if s.kind == "reward"),
                      (None, None))
    ref = getattr(node, "fn", None)
    scorer = getattr(worker, "dynamic_scorer", None)
    if scorer is None:
        scorer = make_scorer(ref, ("nodes", name or "reward", "fn"), worker.ws.base_dir)
        worker.dynamic_scorer = scorer
    return scorer, ref or DEFAULT_FN, getattr(node, "timeout_s", None)


def informative_groups(rewards: Any, group: Any) -> list[int]:
    """Indices of the groups whose rewards are not all equal, in order."""
    out = []
    for g in range(int(group.max()) + 1 if len(group) else 0):
        values = rewards[group == g]
        if len(values) and bool((values != values[0]).any()):
            out.append(g)
    return out


def group_slices(group: Any) -> list[slice]:
    """The rows of each group (contiguous, in order)."""
    bounds = (group[1:] != group[:-1]).nonzero().squeeze(-1).tolist() if len(group) else []
    starts = [0, *(b + 1 for b in bounds)]
    ends = [*(b + 1 for b in bounds), len(group)]
    return [slice(a, b) for a, b in zip(starts, ends) if b > a]


def dynamic_batch(worker: GenerateWorker, step: int) -> Batch:
    """This replica's share of step `step`: groups with unequal rewards from up to
    `max_draws` drawn batches (module docstring)."""
    import torch

    from rlgraph.rl.batch import concat_rows, take_rows
    from rlgraph.rl.rewards import score_samples

    spec = worker.ws.spec.algorithm.dynamic_sampling
    fn, fn_name, timeout_s = reward_fn_of(worker)
    need = worker.share[1] - worker.share[0]
    kept: list[Batch] = []
    dropped: list[Batch] = []
    draws = 0
    for draw in range(spec.max_draws):
        batch = worker.draw(step, step * spec.max_draws + draw, (worker.name, step, draw))
        draws += 1
        scores = score_samples(fn, fn_name, batch["data_source"], batch["response_text"],
                               batch["ground_truth"], batch["extra_info"],
                               batch["prompt_uid"], step=step, timeout_s=timeout_s)
        batch["rewards"] = torch.tensor(scores, dtype=torch.float32)
        good = set(informative_groups(batch["rewards"], batch["group"]))
        for g, rows in enumerate(group_slices(batch["group"])):
            (kept if g in good else dropped).append(take_rows(batch, rows))
        if len(kept) >= need:
            break
    filled = max(0, need - len(kept))
    parts = kept[:need] + dropped[:filled]
    out = concat_rows(parts)
    out["step"] = step
    metrics = dict(out.get("metrics", {}))
    metrics.update({"dynamic/draws": float(draws),
                    "dynamic/kept_groups": float(min(len(kept), need)),
                    "dynamic/filled_groups": float(filled),
                    "dynamic/informative_frac": len(kept) / max(1, draws * need)})
    out["metrics"] = metrics
    return out
