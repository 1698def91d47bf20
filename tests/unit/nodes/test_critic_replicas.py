"""The critic is data-parallel like train: two gloo replicas, each running its share of the
rows, compute the values, advantages and returns one process computes and take the same
value-model steps (figures and weights after two steps); a sharded critic is refused."""

from __future__ import annotations

import io
from typing import Any

import pytest
import torch
from rank_support import run_ranks
from rl_support import make_spec

from rlgraph.errors import SpecError

# 15 rows in mini-batches of 8 and 7: the ranks' shares (4 + 4, 4 + 3) and a micro-batch of
# 3 rows make uneven pass counts
CRITIC = {"lr": 1e-2, "mini_batches": 2, "micro_batch": 3}
KEYS = ("values", "advantages", "returns")


def _spec() -> Any:
    return make_spec(data={"prompts_per_step": 5, "samples_per_prompt": 3},
                     algorithm={"name": "ppo"}, extra_nodes={"critic": CRITIC})


def _one_process() -> tuple[list[dict], list[dict], dict[str, torch.Tensor]]:
    """Two steps in one process: the scored batches, the critic's outputs, its weights."""
    from rlgraph.process.workspace import Workspace

    ws = Workspace(_spec(), ["generate", "reward", "critic"])
    batches, outs = [], []
    for step in range(2):
        scored = ws.worker("reward").run(step, {"generate": ws.worker("generate").run(step, {})})
        scored["rewards"] = (torch.arange(len(scored["rewards"])) % 2).float()  # signal
        batches.append(scored)
        out = ws.worker("critic").run(step, {"reward": dict(scored)})
        outs.append({**{k: out[k] for k in KEYS}, "metrics": out["critic_metrics"]})
    return batches, outs, dict(ws.worker("critic").model.state_dict())


def _rank(rank: int, port: int, batches: list[dict], queue: Any) -> None:
    from rlgraph.process.replicas import Replicas
    from rlgraph.process.workspace import Workspace

    torch.set_num_threads(1)
    replicas = Replicas(rank, 2)
    replicas.join("127.0.0.1", port, "gloo")
    ws = Workspace(_spec(), ["critic"], seed=0, replicas=replicas)
    outs = []
    for step, batch in enumerate(batches):
        out = ws.worker("critic").run(step, {"reward": dict(batch)})
        outs.append({**{k: out[k] for k in KEYS}, "metrics": out["critic_metrics"]})
    data = io.BytesIO()  # bytes: this process exits before the queue is read
    torch.save((rank, outs, dict(ws.worker("critic").model.state_dict())), data)
    queue.put(data.getvalue())


def test_two_critic_replicas_train_as_one_process() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        batches, ref_outs, ref_weights = _one_process()
    finally:
        torch.set_num_threads(threads)
    results = run_ranks(_rank, 2, batches)
    for rank, outs, weights in results:
        for got, ref in zip(outs, ref_outs):
            for key in KEYS:
                torch.testing.assert_close(got[key], ref[key], atol=1e-5, rtol=1e-4)
            for key in ("critic/vf_loss", "critic/grad_norm", "critic/vf_clipfrac"):
                assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-4,
                                                            abs=1e-6), (rank, key)
        for name, tensor in ref_weights.items():  # the same two steps were taken
            torch.testing.assert_close(weights[name], tensor, atol=1e-5, rtol=1e-4)
    assert ref_outs[1]["metrics"]["critic/grad_norm"] > 0


@pytest.mark.parametrize("bad", [{"sharding": "fsdp"}, {"tp": 2}])
def test_a_sharded_critic_is_refused(bad: dict) -> None:
    with pytest.raises(SpecError, match="critic's value model"):
        make_spec(algorithm={"name": "ppo"}, extra_nodes={"critic": bad})
