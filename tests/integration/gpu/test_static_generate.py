"""generate's engine choice: the static decoder on CUDA only, the Decoder elsewhere; the static
path's batch (run here eagerly on CPU) keeps the Decoder path's layout and semantics, for the
synchronous batch and for partial rollout's rounds (carried prefixes, a mid-round switch)."""

from __future__ import annotations

import copy

import pytest
import torch
from rl_support import make_spec

from rlgraph.engines.cpu_decode import sample, token_logp
from rlgraph.nodes import generate as generate_mod
from rlgraph.nodes.generate import GenerateSpec, use_static_engine
from rlgraph.process.workspace import Workspace

DATA = {"response_len": {"mean": 8, "max": 12}}
GEN = {"temperature": 0.7}


def test_static_engine_is_chosen_on_cuda_only() -> None:
    node = GenerateSpec()
    assert use_static_engine(node, "cuda") and use_static_engine(node, "cuda:1")
    assert not use_static_engine(node, "cpu")
    assert not use_static_engine(GenerateSpec(cuda_decode="dynamic"), "cuda")
    assert not use_static_engine(GenerateSpec(engine="sglang"), "cuda")


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


def _partial_run(static: bool, monkeypatch) -> tuple[list[dict], dict[int, dict]]:
    """Four partial-rollout steps of one worker (eos logit raised, so lengths vary and rows
    are carried): version 1 is staged in the middle of round 1, version 2 before round 2.
    The batches and the weights of every version."""
    monkeypatch.setattr(generate_mod, "use_static_engine", lambda *args: static)
    spec = make_spec(data={"prompts_per_step": 2, "samples_per_prompt": 3,
                           "response_len": {"mean": 6, "max": 12}},
                     generate={**GEN, "oversample": 2.0}, max_lag=2)
    spec.schedule.partial_rollout = True
    ws = Workspace(spec, ["generate"], seed=0)
    head = ws.policy.lm_head
    ws.policy.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        ws.policy.lm_head.weight.copy_(head.weight)
        ws.policy.lm_head.bias.zero_()
        ws.policy.lm_head.bias[ws.tokenizer.eos_id] = 2.0
    worker = ws.worker("generate")
    if static:
        worker._static_engine().engine.sync_every = 1
    gen = torch.Generator().manual_seed(5)
    weights = {0: copy.deepcopy(ws.policy.state_dict())}
    for v in (1, 2):
        weights[v] = {k: t + 0.2 * torch.randn(t.shape, generator=gen)
                      for k, t in weights[v - 1].items()}

    def stage(v: int) -> None:
        ws.stage_weights(v, lambda: ws.policy.load_state_dict(weights[v]))

    calls, switch = [0], worker._swap

    def mid_round() -> int | None:  # the second switch check of a round: between steps
        calls[0] += 1
        if calls[0] == 2 and ws.policy_version == 0:
            stage(1)
        return switch()

    batches = []
    for step in range(4):
        calls[0] = 0
        if step == 1:
            worker._swap = mid_round
        if step == 2:
            worker._swap = switch
            stage(2)
        batches.append(worker.run(step))
    return batches, weights


def _check_partial(ws_policy: torch.nn.Module, batches: list[dict],
                   weights: dict[int, dict]) -> None:
    """Layout, masks, lag bound and each token's behaviour log-prob against a fresh forward
    under the weights of the version that sampled it."""
    for batch in batches:
        P, mask = batch["prompt_len"], batch["response_mask"].bool()
        lengths = mask.sum(1)
        assert torch.equal(mask, torch.arange(mask.shape[1])[None, :] < lengths[:, None])
        assert torch.equal(batch["attention_mask"][:, P:], batch["response_mask"])
        versions = batch["token_version"]
        assert (versions[~mask] == -1).all() and (batch["behavior_logp"][~mask] == 0).all()
        assert int((batch["step"] - versions[mask]).max()) <= 2
        assert all(r[m].tolist() == sorted(r[m].tolist()) for r, m in zip(versions, mask))
        for v in versions[mask].unique().tolist():
            ws_policy.load_state_dict(weights[v])
            with torch.no_grad():
                fresh = token_logp(ws_policy, batch["sequences"], batch["attention_mask"], P,
                                   temperature=0.7)
            here = mask & (versions == v)
            torch.testing.assert_close(batch["behavior_logp"][here], fresh[here], atol=2e-4,
                                       rtol=2e-4)


def test_partial_rollout_on_the_static_engine_matches_the_decoder_path(monkeypatch) -> None:
    static, weights = _partial_run(True, monkeypatch)
    dynamic, _ = _partial_run(False, monkeypatch)
    model = Workspace(make_spec(generate=GEN), ["generate"], seed=0).policy
    head = model.lm_head
    model.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    for batches in (static, dynamic):
        assert [set(b) for b in batches] == [set(dynamic[0])] * 4
        assert all(len(b["sequences"]) == 6 and b["group"].tolist() == [0, 0, 0, 1, 1, 1]
                   for b in batches)
        _check_partial(model, batches, weights)
        metrics = [b["metrics"] for b in batches]
        assert sum(m["rollout/carried"] for m in metrics) > 0
        assert metrics[1]["rollout/switches"] == 1 and batches[2]["policy_version"] == 2
        mixed = [b["token_version"][b["response_mask"].bool().any(1)] for b in batches]
        assert any(len(set(r[r >= 0].tolist())) > 1 for m in mixed for r in m)
    assert all(b["metrics"]["generate/static_engine"] == 1.0 for b in static)
    assert set(static[0]["metrics"]) == set(dynamic[0]["metrics"]) | {
        "generate/static_engine", "generate/engine_s", "generate/mean_width",
        "generate/live_share", "generate/prefill_tokens", "generate/looks"}
