"""RL core without Ray: sampling with a KV cache, log-probs, GRPO advantages, the losses."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_support import MICRO, make_spec

from rlgraph.engines.cpu_decode import (
    Decoder,
    length_batches,
    pack,
    sample,
    token_logp,
    token_logp_passes,
    top_p_filter,
)
from rlgraph.model.build import build_model
from rlgraph.model.tokenizer import CharTokenizer
from rlgraph.rl.loss import grpo_advantages, kl_penalty, policy_loss

TOK = CharTokenizer()
PROMPTS = [TOK.encode_prompt(p) for p in ["1+2=", "33+4=", "copy abcd:", "7="]]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    spec = make_spec(model={"hf_config": dict(MICRO)})
    return build_model(spec.model, TOK, seed=3).eval()


def test_same_seed_same_weights_and_vocab_fits_tokenizer() -> None:
    spec = make_spec()
    a, b = build_model(spec.model, TOK, seed=1), build_model(spec.model, TOK, seed=1)
    c = build_model(spec.model, TOK, seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert a.config.vocab_size == TOK.vocab_size  # never samples an id the tokenizer lacks


def test_behaviour_logp_equals_fresh_forward(model: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(0)
    out = sample(model, PROMPTS, max_new_tokens=6, eos_id=TOK.eos_id, pad_id=TOK.pad_id,
                 temperature=0.7, generator=gen, policy_version=5)
    with torch.no_grad():
        fresh = token_logp(model, out.sequences, out.attention_mask, out.prompt_len, 0.7)
    mask = out.response_mask.bool()
    assert mask.sum() > len(PROMPTS)
    torch.testing.assert_close(out.behavior_logp[mask], fresh[mask], atol=1e-4, rtol=1e-4)
    assert (out.token_version[mask] == 5).all() and (out.token_version[~mask] == -1).all()
    assert (out.behavior_logp[~mask] == 0).all()


def test_kv_cache_greedy_equals_no_cache_greedy(model: torch.nn.Module) -> None:
    kwargs = dict(max_new_tokens=8, eos_id=TOK.eos_id, pad_id=TOK.pad_id, greedy=True)
    cached = sample(model, PROMPTS, **kwargs)
    plain = sample(model, PROMPTS, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, plain.sequences)
    torch.testing.assert_close(cached.behavior_logp, plain.behavior_logp, atol=1e-4, rtol=1e-4)


def test_decoder_stops_rows_at_eos_and_can_pause() -> None:
    class EosAfterTwo(torch.nn.Module):
        """A fake LM: always predicts token 5, then eos once a row holds two new tokens."""

        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask, **kw):
            logits = torch.full((*input_ids.shape, TOK.vocab_size), -1e9)
            new = attention_mask.shape[1] - len_prompt
            logits[..., TOK.eos_id if new >= 2 else 5] = 0.0
            return type("Out", (), {"logits": logits, "past_key_values": None})()

    len_prompt = 3
    dec = Decoder(EosAfterTwo(), [[1, 6, 7], [1, 8, 9]], max_new_tokens=10, eos_id=TOK.eos_id,
                  pad_id=TOK.pad_id, use_cache=False)
    assert dec.step(0) and dec.step(0)  # a caller may stop here and resume later
    assert not dec.step(1)  # eos sampled at version 1: the decode ends
    out = dec.result()
    assert out.responses.tolist() == [[5, 5, TOK.eos_id]] * 2
    assert out.token_version.tolist() == [[0, 0, 1]] * 2
    assert out.response_mask.sum() == 6


def test_top_p_keeps_the_smallest_head() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = top_p_filter(probs, 0.7)
    torch.testing.assert_close(kept, torch.tensor([[0.5, 0.3, 0.0, 0.0]]))
    assert torch.equal(top_p_filter(probs, 1.0), probs)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.floats(-3, 3), min_size=2, max_size=6), min_size=1, max_size=5))
def test_grpo_advantages_normalised_per_group(groups: list[list[float]]) -> None:
    rewards = torch.tensor([r for g in groups for r in g])
    index = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    adv = grpo_advantages(rewards, index)
    for i, g in enumerate(groups):
        a = adv[index == i]
        assert abs(float(a.mean())) < 1e-4
        std = torch.tensor(g).std()
        if std > 1e-3:
            assert abs(float(a.std()) - float(std / (std + 1e-6))) < 1e-3
        elif float(std) == 0.0:
            assert a.abs().max() == 0  # a group that agrees carries no signal


def test_grpo_advantages_do_not_mix_groups() -> None:
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 5.0, 5.0]), torch.tensor([0, 0, 1, 1]))
    assert adv[0] > 0 > adv[1] and adv[2] == adv[3] == 0


def _loss_grad(ratio: float, adv: float, clip: float = 0.2) -> float:
    logp = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-float(torch.log(torch.tensor(ratio)))]])
    terms = policy_loss(logp, old, old, torch.tensor([adv]), torch.ones(1, 1), clip, 10.0)
    terms.loss.backward()
    return float(logp.grad)


def test_clipped_loss_has_zero_gradient_outside_the_clip_range() -> None:
    assert _loss_grad(1.5, +1.0) == 0.0  # above 1 + clip with a positive advantage
    assert _loss_grad(0.5, -1.0) == 0.0  # below 1 - clip with a negative advantage
    assert _loss_grad(1.1, +1.0) < 0.0  # inside: the loss pushes log-prob up
    assert _loss_grad(0.9, -1.0) > 0.0
    assert _loss_grad(0.5, +1.0) < 0.0  # pessimistic bound: no clipping on this side


def test_decoupled_correction_uses_behaviour_logp_and_truncates() -> None:
    logp = torch.zeros(1, 3, requires_grad=True)
    old = torch.zeros(1, 3)  # proximal policy = current at the start of the step
    behaviour = torch.log(torch.tensor([[1.0, 0.5, 0.1]]))  # stale sampler: w = 1, 2, 10
    terms = policy_loss(logp, old, behaviour, torch.tensor([1.0]), torch.ones(1, 3),
                        clip=0.2, is_truncation=3.0)
    terms.loss.backward()
    # d loss / d logp_i = -w_i / 3 with w truncated at 3: 1, 2, 3 (not 10).
    torch.testing.assert_close(logp.grad, torch.tensor([[-1 / 3, -2 / 3, -3 / 3]]))
    assert terms.is_truncated_frac == pytest.approx(1 / 3)
    # No lag (behaviour == proximal): every weight is 1.
    same = policy_loss(torch.zeros(1, 3), old, old, torch.tensor([1.0]), torch.ones(1, 3),
                       0.2, 3.0)
    assert same.is_weight_mean == pytest.approx(1.0)


def test_token_mean_ignores_padding() -> None:
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    policy_loss(logp, logp.detach(), logp.detach(), torch.tensor([1.0, 1.0]), mask, 0.2,
                2.0).loss.backward()
    torch.testing.assert_close(logp.grad, -mask.float() / 4)


def test_kl_estimators() -> None:
    logp = torch.log(torch.tensor([0.5, 0.2, 0.9]))
    ref = torch.log(torch.tensor([0.4, 0.4, 0.9]))
    assert torch.allclose(kl_penalty(logp, ref, "k1"), logp - ref)
    k3 = kl_penalty(logp, ref, "k3")
    assert (k3 >= 0).all() and k3[2] == 0
    assert torch.allclose(kl_penalty(logp, ref, "low_var_kl"), k3.clamp(-10, 10))
    far = kl_penalty(torch.tensor([0.0]), torch.tensor([-30.0]), "low_var_kl")
    assert float(far) == 10.0
    # with kl_coef the KL gradient pulls log-probs towards the reference
    x = logp.clone().requires_grad_(True)
    policy_loss(x[None], x.detach()[None], x.detach()[None], torch.zeros(1), torch.ones(1, 3),
                0.2, 2.0, ref_logp=ref[None], kl_coef=1.0, kl_type="k3").loss.backward()
    assert x.grad[0] > 0 > x.grad[1]  # 0.5 > 0.4 is pushed down, 0.2 < 0.4 up


def test_length_batches_trim_widths_and_match_one_pass() -> None:
    # long-tailed lengths: each pass holds at most the token budget (a longer row goes alone),
    # every row lands in one pass wide enough for it, and the log-probs equal one full pass
    tok = CharTokenizer()
    model = build_model(make_spec(model={"hf_config": dict(MICRO)}).model, tok, seed=0).eval()
    gen = torch.Generator().manual_seed(0)
    lengths = [1, 300, 2, 40, 513, 7, 3, 260]
    responses = [torch.randint(3, 20, (n,), generator=gen).tolist() for n in lengths]
    prompts = [tok.encode_prompt("1+2=") for _ in lengths]
    r = pack(prompts, responses, [[0.0] * n for n in lengths], [[0] * n for n in lengths],
             tok.pad_id)
    passes = length_batches(r.response_mask, r.prompt_len, max_tokens=1200)
    rows = torch.cat([i for i, _ in passes]).tolist()
    assert sorted(rows) == list(range(len(lengths)))
    for index, width in passes:
        assert width % 256 == 0 or width == r.response_mask.shape[1]
        assert all(lengths[i] <= width for i in index.tolist())
        assert len(index) == 1 or len(index) * (r.prompt_len + width) <= 1200
    with torch.no_grad():
        whole = token_logp(model, r.sequences, r.attention_mask, r.prompt_len)
        parts = token_logp_passes(model, r.sequences, r.attention_mask, r.prompt_len, 1.0,
                                  passes)
    mask = r.response_mask.bool()
    assert torch.allclose(whole[mask], parts[mask], atol=1e-4)
