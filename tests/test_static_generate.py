"""generate's engine choice: the static decoder on CUDA only, the Decoder elsewhere; the static
path's batch (run here eagerly on CPU) keeps the Decoder path's layout and semantics."""

from __future__ import annotations

import pytest
import torch
from rl_support import make_spec

from rlgraph.nodes import generate as generate_mod
from rlgraph.nodes.generate import GenerateSpec, use_static_engine
from rlgraph.sampling import sample, token_logp
from rlgraph.workspace import Workspace

DATA = {"response_len": {"mean": 8, "max": 12}}
GEN = {"temperature": 0.7}


def test_static_engine_is_chosen_on_cuda_only() -> None:
    node = GenerateSpec()
    assert use_static_engine(node, "cuda", partial_rollout=False)
    assert use_static_engine(node, "cuda:1", partial_rollout=False)
    assert not use_static_engine(node, "cpu", partial_rollout=False)
    assert not use_static_engine(node, "cuda", partial_rollout=True)  # Decoder re-encodes
    assert not use_static_engine(GenerateSpec(cuda_decode="dynamic"), "cuda", False)
    assert not use_static_engine(GenerateSpec(engine="sglang"), "cuda", False)


def test_cpu_generate_is_the_decoder_path() -> None:
    ws = Workspace(make_spec(data=DATA, generate=GEN), ["generate"], seed=0)
    worker = ws.worker("generate")
    batch = worker.run(0)
    assert worker.static is None and "metrics" not in batch
    n = ws.spec.data.samples_per_prompt
    _, ids = worker.prompts(0)
    with torch.no_grad():
        ref = sample(ws.policy, [p for p in ids for _ in range(n)], max_new_tokens=12,
                     eos_id=ws.tokenizer.eos_id, pad_id=ws.tokenizer.pad_id, temperature=0.7,
                     generator=ws.generator("generate", 0))
    assert torch.equal(batch["sequences"], ref.sequences)
    assert torch.equal(batch["behavior_logp"], ref.behavior_logp)


def _check(ws: Workspace, batch: dict, version: int, atol: float = 1e-4) -> None:
    """Layout, masks, versions and behaviour log-probs against a fresh forward pass."""
    tok, P = ws.tokenizer, batch["prompt_len"]
    mask = batch["response_mask"].bool()
    response = batch["sequences"][:, P:]
    width = response.shape[1]
    assert width == int(mask.sum(1).max()) <= 12
    lengths = mask.sum(1)
    assert torch.equal(mask, torch.arange(width)[None, :] < lengths[:, None])  # 1s, then 0s
    for row, n in zip(response.tolist(), lengths.tolist()):
        assert tok.eos_id not in row[:n - 1] and (row[n - 1] == tok.eos_id or n == 12)
        assert row[n:] == [tok.pad_id] * (width - n)
    assert torch.equal(batch["token_version"], torch.where(mask, version, -1))
    assert (batch["behavior_logp"][~mask] == 0).all()
    assert torch.equal(batch["attention_mask"][:, P:], batch["response_mask"])
    dev = next(ws.policy.parameters()).device
    with torch.no_grad():
        fresh = token_logp(ws.policy, batch["sequences"].to(dev),
                           batch["attention_mask"].to(dev), P, temperature=0.7).float().cpu()
    torch.testing.assert_close(batch["behavior_logp"][mask], fresh[mask], atol=atol, rtol=atol)


def test_static_path_batch_matches_the_decoder_contract(monkeypatch) -> None:
    monkeypatch.setattr(generate_mod, "use_static_engine", lambda *args: True)
    ws = Workspace(make_spec(data=DATA, generate=GEN), ["generate"], seed=0)
    worker = ws.worker("generate")
    batch = worker.run(0)
    decoder_batch = Workspace(ws.spec, ["generate"], seed=0).worker("generate").run(0)
    assert worker.static is not None
    assert set(batch) == set(decoder_batch) | {"metrics"}
    assert batch["metrics"]["generate/static_engine"] == 1.0
    width = batch["prompt_len"]
    assert decoder_batch["prompt_len"] == width
    assert torch.equal(batch["sequences"][:, :width], decoder_batch["sequences"][:, :width])
    assert batch["response_text"][0] == ws.tokenizer.decode(
        batch["sequences"][0, width:].tolist())
    _check(ws, batch, 0)
    lengths = batch["response_mask"].sum(1)
    assert (lengths < 12).any() and (lengths == 12).any(), "want rows stopped by eos and length"
    again = worker.run(0)  # seeded by (seed, node, step)
    assert torch.equal(again["sequences"], batch["sequences"])
    assert not torch.equal(worker.run(1)["sequences"], batch["sequences"])

    # a weight switch copies in place: the same engine decodes with the new weights
    engine, live = worker.static, {k: v.data_ptr() for k, v in ws.policy.state_dict().items()}
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in ws.policy.state_dict().items()}

    def switch() -> None:
        for k, v in ws.policy.state_dict().items():
            v.copy_(new[k])

    ws.stage_weights(1, switch)
    batch = worker.run(2)
    assert ws.policy_version == 1 and worker.static is engine
    assert {k: v.data_ptr() for k, v in ws.policy.state_dict().items()} == live
    _check(ws, batch, 1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_workspace_generates_with_the_static_engine() -> None:
    ws = Workspace(make_spec(data=DATA, generate={**GEN, "cuda_decode": "graphs"}),
                   ["generate"], seed=0, device="cuda")
    worker = ws.worker("generate")
    batch = worker.run(0)
    engine = worker.static.engine
    graphs = dict(engine._graphs)
    assert graphs and worker.static.graphs == len(graphs)  # captured when built
    _check(ws, worker.run(1), 0, atol=0.05)  # bf16
    assert engine._graphs == graphs and batch["metrics"]["generate/static_engine"] == 1.0
