"""StaticDecoder on CPU (eager, no CUDA graphs): the same tokens as transformers' generate."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlgraph.bench_mode import EngineKnobs
from rlgraph.engines.static_decode import Request, StaticDecoder
from rlgraph.presets.models import MODEL_PRESETS

MAX_NEW = 12


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = {k: v for k, v in MODEL_PRESETS["tiny"].items() if k != "model_type"}
    cfg.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(**cfg, initializer_range=0.2, attn_implementation="sdpa"))
    m.eval()
    m.generation_config.eos_token_id = None
    m.generation_config.pad_token_id = 0
    return m


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, (n,), generator=g).tolist() for n in (3, 9, 5, 2, 7, 4)]


def _reference(model, prompt: list[int], n: int = MAX_NEW) -> list[int]:
    with torch.no_grad():
        ids = torch.tensor([prompt])  # explicit mask: token 0 is a real token here, not padding
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                             do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def references(model) -> list[list[int]]:
    return [_reference(model, p) for p in _prompts()]


@pytest.mark.parametrize("sync_every", [1, 5])
def test_greedy_matches_generate_with_refill(model, references, sync_every) -> None:
    dec = StaticDecoder(model, max_batch=3, max_len=32, sync_every=sync_every, attn_block=8)
    lengths = [MAX_NEW, 5, 9, 3, MAX_NEW, 7]  # slots free up at different steps
    reqs = [Request(p, n, temperature=0.0, request_id=i)
            for i, (p, n) in enumerate(zip(_prompts(), lengths))]
    out = {c.request.request_id: c for c in dec.run(reqs)}
    assert sorted(out) == list(range(len(reqs)))
    for i, (ref, n) in enumerate(zip(references, lengths)):
        assert out[i].tokens == ref[:n], f"request {i}"
        assert out[i].finish_reason == "length" and out[i].versions == [0] * n
    assert len(set(references[0])) > 3, "the reference model must not be degenerate"
    if sync_every == 1:  # a finished slot takes the next prompt before the next step
        assert dec.stats["idle_slot_steps_with_queue"] == 0
        assert dec.stats["prefills"] >= 4


def test_lookahead_steps_give_the_same_tokens_and_report_a_look_late(model, references) -> None:
    """step(lookahead=True) launches the next steps before the host looks at what finished:
    the same greedy tokens with refills, each completion one look late, the rest from drain."""
    dec = StaticDecoder(model, max_batch=3, max_len=32, sync_every=2, attn_block=8)
    lengths = [MAX_NEW, 5, 9, 3, MAX_NEW, 7]
    dec.submit(Request(p, n, temperature=0.0, request_id=i)
               for i, (p, n) in enumerate(zip(_prompts(), lengths)))
    out: dict[int, object] = {}
    looks = 0
    while dec.busy:
        for c in dec.step(lookahead=True):
            out[c.request.request_id] = c
        looks += 1
        if looks == 1:
            assert out == {} and dec.stats["looks"] == 0, "a first look only admits"
    assert not dec.drain()
    assert sorted(out) == list(range(6))
    for i, (ref, n) in enumerate(zip(references, lengths)):
        assert out[i].tokens == ref[:n] and out[i].finish_reason == "length", f"request {i}"
    dec.submit([Request(_prompts()[3], 3, temperature=0.0, request_id="last")])
    dec.step(lookahead=True)
    dec.step(lookahead=True)  # its last token is sampled in these launched steps
    (last,) = dec.drain()
    assert last.request.request_id == "last" and last.tokens == references[3][:3]
    assert not dec.busy


def test_interrupt_and_resume_reproduce_the_sequence(model, references) -> None:
    dec = StaticDecoder(model, max_batch=4, max_len=32, sync_every=1, attn_block=8)
    dec.submit(Request(p, MAX_NEW, temperature=0.0, request_id=i)
               for i, p in enumerate(_prompts()[:4]))
    for _ in range(4):
        assert dec.step() == []
    done = dec.swap_weights(lambda: 1)  # same weights, new version: resumes re-encode prefixes
    assert done == [] and len(dec.queue) == 4 and dec.policy_version == 1
    out = {c.request.request_id: c for c in dec.run()}
    for i in range(4):
        assert out[i].tokens == references[i]
        n_old = out[i].versions.count(0)
        assert n_old == 5, "prefill token + 4 decode steps were sampled under version 0"
        assert out[i].versions == [0] * n_old + [1] * (MAX_NEW - n_old)


def test_interrupt_returns_prefixes(model, references) -> None:
    dec = StaticDecoder(model, max_batch=2, max_len=32, sync_every=3, attn_block=8)
    dec.submit([Request(_prompts()[0], MAX_NEW, temperature=0.0, request_id="a")])
    dec.step()
    (c,) = dec.interrupt()
    assert not c.finished and c.finish_reason == "interrupted"
    assert c.tokens == references[0][:len(c.tokens)] and 0 < len(c.tokens) < MAX_NEW
    assert not dec.busy
    (final,) = dec.run([c.resume()])
    assert final.tokens == references[0]


def test_eos_stops_a_slot(model, references) -> None:
    ref = references[1]
    eos = ref[4]
    dec = StaticDecoder(model, max_batch=2, max_len=32, eos_token_id=eos, sync_every=2,
                        attn_block=8)
    (c,) = dec.run([Request(_prompts()[1], MAX_NEW, temperature=0.0)])
    stop = ref.index(eos)
    assert c.tokens == ref[:stop + 1] and c.finish_reason == "eos"


def test_sampled_logprobs_match_the_model(model) -> None:
    torch.manual_seed(3)
    dec = StaticDecoder(model, max_batch=4, max_len=32, sync_every=4, attn_block=8)
    reqs = [Request(p, MAX_NEW, temperature=1.0, top_p=tp)
            for p, tp in zip(_prompts()[:4], (1.0, 0.9, 1.0, 0.5))]
    for c in dec.run(reqs):
        seq = torch.tensor([c.request.prompt + c.tokens])
        with torch.no_grad():
            logp = torch.log_softmax(model(seq).logits[0].float(), -1)
        n = len(c.request.prompt)
        want = logp[n - 1:-1].gather(-1, torch.tensor(c.tokens)[:, None]).squeeze(-1)
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=1e-4, rtol=1e-4)


def test_bad_request_is_refused(model) -> None:
    dec = StaticDecoder(model, max_batch=2, max_len=16)
    with pytest.raises(ValueError, match="max_len=16"):
        dec.submit([Request(list(range(10)), 10)])


def test_fused_projections_keep_parameters_and_tokens(model, references) -> None:
    import copy

    fused = copy.deepcopy(model)
    dec = StaticDecoder(fused, max_batch=3, max_len=32, sync_every=4, attn_block=8,
                        bench=EngineKnobs(fuse=True))
    shapes = {n: p.shape for n, p in model.named_parameters()}
    assert {n: p.shape for n, p in fused.named_parameters()} == shapes
    reqs = [Request(p, MAX_NEW, temperature=0.0, request_id=i) for i, p in enumerate(_prompts())]
    out = {c.request.request_id: c.tokens for c in dec.run(reqs)}
    assert [out[i] for i in range(len(reqs))] == references
    # an in-place weight update through the parameters (what a WeightReceiver does) reaches the
    # fused GEMMs: both models change the same way
    plain = copy.deepcopy(model)
    g = torch.Generator().manual_seed(5)
    seq = torch.tensor([_prompts()[1]])
    with torch.no_grad():
        before = fused(seq).logits
        for name in ("model.layers.1.self_attn.k_proj.weight", "model.layers.2.mlp.up_proj.weight"):
            delta = torch.randn(shapes[name], generator=g)
            dict(plain.named_parameters())[name].add_(delta)
            dict(fused.named_parameters())[name].add_(delta)
        after = fused(seq).logits
        torch.testing.assert_close(after, plain(seq).logits)
    assert not torch.allclose(after, before)


def test_ignore_eos_runs_to_the_forced_length(model) -> None:
    # a benchmark's forced length: eos (every token here) does not stop the row, the budget does
    dec = StaticDecoder(model, max_batch=2, max_len=32, eos_token_id=list(range(64)),
                        sync_every=3)
    out = dec.run([Request([1, 2, 3], 7, temperature=0.0, request_id="forced",
                           ignore_eos=True),
                   Request([4, 5], 7, temperature=0.0, request_id="eos")])
    got = {c.request.request_id: c for c in out}
    assert len(got["forced"].tokens) == 7 and got["forced"].finish_reason == "length"
    assert len(got["eos"].tokens) == 1 and got["eos"].finish_reason == "eos"


def test_prefill_in_token_chunks_matches_one_prefill(model, references, monkeypatch) -> None:
    # resumed rows carry long prefixes: the prefill is cut into chunks of PREFILL_TOKENS
    # padded tokens, and greedy decoding gives the same tokens as transformers' generate
    from rlgraph.engines import static_decode

    monkeypatch.setattr(static_decode, "PREFILL_TOKENS", 12)
    dec = StaticDecoder(model, max_batch=6, max_len=32, sync_every=4, attn_block=8)
    reqs = [Request(p, MAX_NEW, temperature=0.0, request_id=i) for i, p in enumerate(_prompts())]
    out = {c.request.request_id: c for c in dec.run(reqs)}
    assert [out[i].tokens for i in range(len(reqs))] == references
    assert dec.stats["prefills"] >= 4  # 6 prompts of 2-9 tokens, at most 12 padded a chunk


@pytest.mark.parametrize("attention", ["sdpa", "matmul", "varlen"])
def test_compaction_moves_live_rows_down_and_keeps_the_tokens(model, references,
                                                              attention) -> None:
    # six rows finishing at different steps: the step narrows to 4, 2, 1 slots, the live rows
    # move down with their K/V, and greedy tokens still match transformers' generate
    dec = StaticDecoder(model, max_batch=6, max_len=32, sync_every=2, attn_block=8,
                        bench=EngineKnobs(attention_kind=attention, min_width=1, trace=True))
    lengths = [2, 3, 4, 6, 9, MAX_NEW]
    reqs = [Request(p, n, temperature=0.0, request_id=i)
            for i, (p, n) in enumerate(zip(_prompts(), lengths))]
    out = {c.request.request_id: c for c in dec.run(reqs)}
    assert [out[i].tokens for i in range(6)] == [r[:n] for r, n in zip(references, lengths)]
    assert dec.stats["slot_moves"] >= 2
    widths = [t["width"] for t in dec.trace]
    assert widths[0] == 6 and widths[-1] == 1 and widths == sorted(widths, reverse=True)
    assert all(t["live"] <= t["width"] for t in dec.trace)
    assert dec.stats["slot_steps"] < 6 * dec.stats["decode_steps"]


@given(st.integers(1, 300), st.integers(1, 64), st.data())
@settings(max_examples=60, deadline=None)
def test_slot_widths_hold_the_occupied_slots(slots: int, min_width: int, data) -> None:
    from rlgraph.engines.compaction import SlotWidths

    widths = SlotWidths(slots, max_len=1000, attn_block=128, min_width=min_width)
    occupied = sorted(data.draw(st.sets(st.integers(0, slots - 1), min_size=1)))
    width = widths.width_for(len(occupied))
    assert len(occupied) <= width <= slots
    moved = dict(SlotWidths.moves(occupied, width))
    after = sorted(moved.get(b, b) for b in occupied)
    assert len(set(after)) == len(occupied) and after[-1] < width
    # padding to a block never reads more K/V than full width pads
    assert width * widths.block(width) <= slots * 128 or widths.block(width) == 128
    assert all(a >= width > b for a, b in moved.items())
