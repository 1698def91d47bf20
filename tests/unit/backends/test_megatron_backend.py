"""backend megatron: exact weight conversion (always), and, where megatron-core imports, the
GPTModel's logits, log-probs, loss and gradients against the transformers policy (fp32, CPU,
a one-process world)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlgraph.backends.megatron_layout import (
    hf_to_megatron,
    layout_of,
    megatron_to_hf,
    merge_tp,
    split_tp,
)
from rlgraph.config.schema import ModelSpec
from rlgraph.engines.cpu_decode import position_ids, token_logp
from rlgraph.errors import SpecError
from rlgraph.model.build import build_model
from rlgraph.model.tokenizer import build_tokenizer
from rlgraph.rl.loss import policy_loss
from rlgraph.weights.buckets import digest, export_buckets
from rlgraph.weights.dual_buffer import DualBuffer

# megatron-core warns at import about Apex / Transformer Engine it does not need here
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")

SMALL = dict(vocab_size=54, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=96, tie_word_embeddings=False)


def _hf(model_type: str, **over) -> torch.nn.Module:
    """A small random transformers model (seeded)."""
    torch.manual_seed(1)
    config = AutoConfig.for_model(model_type, **{**SMALL, **over})
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    """The `tiny` preset (llama, GQA, tied embeddings) as the workspace builds it."""
    return build_model(ModelSpec(preset="tiny"), build_tokenizer(None), seed=0).eval()


@pytest.mark.parametrize("model_type,over", [("llama", {}), ("qwen2", {}),
                                             ("qwen3", {"head_dim": 32}),
                                             ("llama", {"tie_word_embeddings": True})])
def test_round_trip_is_exact(model_type: str, over: dict) -> None:
    hf = _hf(model_type, **over)
    lay = layout_of(hf.config)
    state = hf.state_dict()
    mg = hf_to_megatron(state, lay)
    assert any("linear_qkv.bias" in k for k in mg) == (model_type == "qwen2")
    assert any("q_layernorm" in k for k in mg) == (model_type == "qwen3")
    back = megatron_to_hf(mg, lay)
    assert set(back) == set(state)
    assert digest(back) == digest(state)


def test_fused_layout_is_megatrons_per_group_order(tiny) -> None:
    lay = layout_of(tiny.config)
    mg = hf_to_megatron(tiny.state_dict(), lay)
    qkv = mg["decoder.layers.0.self_attention.linear_qkv.weight"]
    attn = tiny.model.layers[0].self_attn
    d, per = lay.head_dim, lay.heads // lay.kv_heads
    group1 = qkv[lay.group_rows:2 * lay.group_rows]  # query group 1: its q heads, k, v
    assert torch.equal(group1[:per * d], attn.q_proj.weight[per * d:2 * per * d])
    assert torch.equal(group1[per * d:(per + 1) * d], attn.k_proj.weight[d:2 * d])
    assert torch.equal(group1[(per + 1) * d:], attn.v_proj.weight[d:2 * d])
    fc1 = mg["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:lay.ffn], tiny.model.layers[0].mlp.gate_proj.weight)


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_shards_round_trip_and_compute_the_whole(tp: int) -> None:
    hf = _hf("qwen2", num_attention_heads=8, num_key_value_heads=4)
    lay = layout_of(hf.config, tp)
    full = hf_to_megatron(hf.state_dict(), lay)
    assert lay.padded_vocab % tp == 0 and lay.padded_vocab >= lay.vocab
    shards = split_tp(full, tp)
    assert digest(merge_tp(shards)) == digest(full)
    assert digest(megatron_to_hf(merge_tp(shards), lay)) == digest(hf.state_dict())
    # each rank's fc1 shard is its own [gate; up] pair: the rank-partial MLPs sum to the MLP
    x = torch.randn(3, lay.hidden)
    mlp = hf.model.layers[1].mlp
    partial = 0
    for s in shards:
        gate, up = (x @ s["decoder.layers.1.mlp.linear_fc1.weight"].T).chunk(2, dim=-1)
        partial = partial + (torch.nn.functional.silu(gate) * up) @ \
            s["decoder.layers.1.mlp.linear_fc2.weight"].T
    torch.testing.assert_close(partial, mlp(x), rtol=1e-5, atol=1e-6)
    # rank r's qkv shard holds exactly query groups [r*g/tp, (r+1)*g/tp): its q, k, v heads
    attn = hf.model.layers[1].self_attn
    groups, d, per = lay.kv_heads // tp, lay.head_dim, lay.heads // lay.kv_heads
    rank = tp - 1
    rows = shards[rank]["decoder.layers.1.self_attention.linear_qkv.weight"]
    q = rows.reshape(groups, lay.group_rows, -1)[:, :per * d].reshape(-1, lay.hidden)
    lo = rank * groups * per * d
    assert torch.equal(q, attn.q_proj.weight[lo:lo + groups * per * d])


def test_unsupported_models_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="model_type 'gpt2'"):
        layout_of(AutoConfig.for_model("gpt2"))
    with pytest.raises(SpecError, match="tp=4 does not divide num_key_value_heads=2"):
        layout_of(_hf("llama").config, tp=4)
    config = AutoConfig.for_model("llama", **SMALL, rope_scaling={
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(SpecError, match="rope_type 'linear'"):
        layout_of(config)


# ------------------------------------------------------------------ with megatron-core


def _missing() -> str | None:
    from rlgraph.backends.megatron import megatron_missing

    return megatron_missing()


needs_megatron = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


@pytest.fixture(scope="module")
def world():
    """A one-process gloo world with megatron's tp=pp=1 groups, torn down afterwards so
    later tests can make their own default group."""
    import torch.distributed as dist

    from rlgraph.backends.megatron import init_parallel

    owned = not dist.is_initialized()
    init_parallel(1, 1, 1)
    yield
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if owned:
        dist.destroy_process_group()


def _batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """3 rows, prompt 6 + response 5: left padding, right padding, both."""
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(3, vocab, (3, 11), generator=gen)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[0, :2] = 0
    mask[1, -2:] = 0
    mask[2, :1] = mask[2, -1:] = 0
    return seq, mask, 6


@needs_megatron
@pytest.mark.parametrize("model_type,over", [("tiny", {}), ("qwen2", {}),
                                             ("qwen3", {"head_dim": 32})])
def test_logits_and_logp_match_transformers(world, tiny, model_type: str, over: dict) -> None:
    from rlgraph.backends.megatron import build_megatron_policy

    hf = tiny if model_type == "tiny" else _hf(model_type, **over).eval()
    mg = build_megatron_policy(hf.config, hf.state_dict()).eval()
    seq, mask, prompt = _batch(hf.config.vocab_size)
    with torch.no_grad():
        want = hf(input_ids=seq, attention_mask=mask, position_ids=position_ids(mask)).logits
        got = mg(input_ids=seq, attention_mask=mask).logits
        kept = mg(input_ids=seq, attention_mask=mask, logits_to_keep=4).logits
        lp_hf, lp_mg = token_logp(hf, seq, mask, prompt), token_logp(mg, seq, mask, prompt)
    real = mask.bool()
    assert got.shape == want.shape
    assert (got - want)[real].abs().max() < 2e-5
    assert torch.equal(kept, got[:, -4:])
    valid = mask[:, prompt:].bool()
    assert (lp_mg - lp_hf)[valid].abs().max() < 2e-5
    assert digest(mg.state_dict()) == digest(hf.state_dict())


@needs_megatron
def test_train_step_loss_gradients_and_update_match(world, tiny) -> None:
    from rlgraph.backends.megatron import build_megatron_policy

    hf = copy.deepcopy(tiny).train()
    mg = build_megatron_policy(hf.config, hf.state_dict()).train()
    seq, mask, prompt = _batch(hf.config.vocab_size)
    resp = mask[:, prompt:].float()
    adv = torch.tensor([1.0, -0.5, 0.25])
    losses, norms = [], []
    for model in (hf, mg):
        lp = token_logp(model, seq, mask, prompt)
        old = lp.detach() + 0.01
        loss = policy_loss(lp, old, old, adv, resp, 0.2, 2.0, old - 0.05, 0.1,
                           normaliser=resp.sum()).loss
        loss.backward()
        losses.append(loss.item())
    grads_mg = megatron_to_hf({n: p.grad for n, p in mg.gpt.named_parameters()}, mg.layout,
                              with_lm_head=False)
    for name, p in hf.named_parameters():
        torch.testing.assert_close(grads_mg[name], p.grad, rtol=1e-4, atol=2e-6)
    norms = [float(torch.nn.utils.clip_grad_norm_(hf.parameters(), 0.5)),
             float(mg.clip_grad_norm(0.5))]
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    assert norms[0] == pytest.approx(norms[1], rel=1e-5) and norms[0] > 0.5
    for model in (hf, mg):  # SGD: the update is linear in the gradient (Adam would amplify
        torch.optim.SGD(model.parameters(), lr=0.1).step()  # float noise on ~0 gradients)
    after_hf, after_mg = hf.state_dict(), mg.state_dict()
    assert max((after_mg[k] - after_hf[k]).abs().max() for k in after_hf) < 1e-6
    assert not torch.equal(after_hf["model.norm.weight"], tiny.state_dict()["model.norm.weight"])


@needs_megatron
def test_weights_reach_a_transformers_receiver_and_copies_are_independent(world, tiny) -> None:
    from rlgraph.backends.megatron import build_megatron_policy

    mg = build_megatron_policy(tiny.config, tiny.state_dict())
    ref = copy.deepcopy(mg)
    with torch.no_grad():
        next(mg.parameters()).add_(1.0)  # a "train step"
    live = copy.deepcopy(tiny)
    receiver = DualBuffer(live)
    for bucket in export_buckets(mg.state_dict(), 1, bucket_mb=0.01):
        receiver.receive(bucket)
    assert receiver.complete(1)
    receiver.swap()
    assert digest(live.state_dict()) == digest(mg.state_dict())
    assert digest(ref.state_dict()) == digest(tiny.state_dict()) != digest(mg.state_dict())
    ref.load_state_dict(live.state_dict())
    assert digest(ref.state_dict()) == digest(mg.state_dict())


@needs_megatron
def test_bf16_weights_leave_in_the_dtypes_they_came_in(world, tiny) -> None:
    """megatron keeps norm weights in fp32; the transformers-layout state it sends to a bf16
    generate engine has the engine's dtypes, names and values (the dual buffer refuses a
    dtype mismatch)."""
    from rlgraph.backends.megatron import build_megatron_policy

    half = copy.deepcopy(tiny).to(torch.bfloat16)
    mg = build_megatron_policy(half.config, half.state_dict())
    sent, want = mg.state_dict(), half.state_dict()
    assert {k: v.dtype for k, v in sent.items()} == {k: v.dtype for k, v in want.items()}
    assert digest(sent) == digest(want)


@needs_megatron
def test_pipeline_and_expert_parallel_are_refused(world, tiny) -> None:
    from rlgraph.backends.megatron import build_megatron_policy

    with pytest.raises(SpecError, match="pp=1 only"):
        build_megatron_policy(tiny.config, tiny.state_dict(), pp=2)
    with pytest.raises(SpecError, match="mixture-of-experts"):
        build_megatron_policy(tiny.config, tiny.state_dict(), ep=2)


def _spec(train: dict, logp: dict):
    from rl_support import make_spec

    return make_spec(train={"lr": 1e-2, **train},
                     extra_nodes={"logp": {"kind": "logp", **logp}})


def test_torch_groups_keep_their_model_and_mixed_groups_are_refused(tiny) -> None:
    from rlgraph.backends.megatron import for_group

    spec = _spec({}, {})
    assert for_group(tiny, spec, ["logp", "train"], "cpu") is tiny
    with pytest.raises(SpecError, match="'logp' shares a group") as err:
        for_group(tiny, _spec({"backend": "megatron", "tp": 2}, {}), ["logp", "train"], "cpu")
    assert err.value.key == ("nodes", "logp") and "tp: 2" in err.value.hint
    with pytest.raises(SpecError, match="cannot share a group with 'generate'"):
        for_group(tiny, _spec({"backend": "megatron"}, {}), ["generate", "train"], "cpu")


@needs_megatron
def test_logp_and_train_workers_run_unchanged_on_a_megatron_policy(world) -> None:
    from rlgraph.backends.megatron import MegatronPolicy
    from rlgraph.process.workspace import Workspace

    torch_spec = _spec({}, {})
    mg_spec = _spec({"backend": "megatron"}, {"backend": "megatron"})
    rollout = Workspace(torch_spec, ["generate", "reward"], seed=0)
    gen = rollout.worker("generate").run(0, {})
    scored = rollout.worker("reward").run(0, {"generate": gen})
    # an untrained policy scores 0 everywhere: spread the rewards so advantages are nonzero
    scored["rewards"] = torch.linspace(0.0, 1.0, len(scored["rewards"])).roll(3)
    outs = []
    for spec in (torch_spec, mg_spec):
        ws = Workspace(spec, ["logp", "train"], seed=0)  # builds the backend it names
        old_logp = ws.worker("logp").forward(copy.deepcopy(gen))
        logp = ws.worker("logp").run(0, {"generate": copy.deepcopy(gen)})  # skipped: on-policy
        out = ws.worker("train").run(0, {"reward": copy.deepcopy(scored), "logp": logp})
        assert out["metrics"]["logp/skipped"] == 1.0
        outs.append((old_logp, out["metrics"], ws))
    (lp_t, m_t, ws_t), (lp_m, m_m, ws_m) = outs
    assert isinstance(ws_m.policy, MegatronPolicy)
    assert (lp_t - lp_m).abs().max() < 2e-5
    for key in ("loss/policy", "loss/kl", "actor/grad_norm", "actor/clip_frac"):
        assert m_m[key] == pytest.approx(m_t[key], rel=1e-4, abs=1e-6), key
    assert m_t["actor/grad_norm"] > 0 and ws_m.policy_version == ws_t.policy_version == 1
    # param_update sends the transformers layout whatever the trainer's backend
    sent_t, sent_m = ws_t.export_weights(1.0), ws_m.export_weights(1.0)
    names = [sorted(b["tensors"]) for b in sent_t]
    assert names == [sorted(b["tensors"]) for b in sent_m]
