"""The turn engine keeps a trajectory's KV across turns: a turn decoded after encoding only
the observation gives the tokens and log-probs of re-encoding the whole trajectory, with
parked slots moved by compaction and released when their trajectory ends."""

from __future__ import annotations

import pytest
import torch

from rlgraph.bench_mode import EngineKnobs
from rlgraph.engines.static_decode import Request, StaticDecoder
from rlgraph.engines.turn_decode import TurnDecoder, common_prefix


def tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
def test_kept_kv_turns_match_whole_reencoding(attention: str) -> None:
    model = tiny_llama()
    kw = dict(max_batch=4, max_len=128, eos_token_id=None, sync_every=3,
              bench=EngineKnobs(attention_kind=attention, min_width=1))
    engine, whole = TurnDecoder(model, **kw), StaticDecoder(model, **kw)
    seqs = {i: [1 + i, 2, 3, 4 + i][:2 + i] for i in range(3)}
    for turn in range(3):
        lengths = {i: 2 + (i + turn) % 4 for i in seqs}
        engine.extend([Request(list(s), lengths[i], temperature=0, request_id=i)
                       for i, s in seqs.items()])
        kept = {}
        while engine.decoding:
            kept.update({c.request.request_id: c for c in engine.step()})
        again = {c.request.request_id: c for c in whole.run(
            [Request(list(s), lengths[i], temperature=0, request_id=i) for i, s in seqs.items()])}
        for i in seqs:
            assert kept[i].tokens == again[i].tokens
            assert max(abs(a - b) for a, b in zip(kept[i].logprobs, again[i].logprobs)) < 1e-4
            seqs[i] += kept[i].tokens + [7, 8, 9][:1 + i]  # the observation
        if turn == 0:  # trajectory 0 ends: its slot frees, slot 2 moves down (compaction)
            engine.release([0])
            del seqs[0]
    assert sorted(engine.parked) == [0, 1] and engine.stats["slot_moves"] >= 1
    # only the observations (and each turn's last token) were encoded after the first turn
    assert engine.stats["reused_tokens"] > 2 * engine.stats["extend_tokens"]
    engine.invalidate()  # new weights: the next turn re-encodes everything
    engine.extend([Request(seqs[1] + [5], 2, temperature=0, request_id=1)])
    assert engine.stats["extend_tokens"] >= len(seqs[1]) + 1
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2


def test_paused_turn_goes_on_in_its_slot_as_if_never_stopped() -> None:
    model = tiny_llama()
    kw = dict(max_batch=3, max_len=64, eos_token_id=None, sync_every=3,
              bench=EngineKnobs(min_width=1))
    engine, straight = TurnDecoder(model, **kw), StaticDecoder(model, **kw)
    prompts = {i: [1 + i, 2, 3 + i] for i in range(2)}
    whole = {c.request.request_id: c.tokens for c in straight.run(
        [Request(list(p), 10, temperature=0, request_id=i) for i, p in prompts.items()])}
    engine.extend([Request(list(p), 10, temperature=0, request_id=i)
                   for i, p in prompts.items()])
    engine.step()  # 3 of 10 tokens: the call ends mid-turn
    paused = {c.request.request_id: c for c in engine.pause()}
    assert all(not c.finished for c in paused.values()) and not engine.decoding
    assert engine.parked_ids == {0, 1}
    before = engine.stats["extend_tokens"]
    engine.extend([Request(prompts[i] + c.tokens, 10 - len(c.tokens), temperature=0,
                           request_id=i) for i, c in paused.items()])
    assert engine.stats["extend_tokens"] - before == 2  # each turn's last sampled token
    rest = {}
    while engine.decoding:
        rest.update({c.request.request_id: c.tokens for c in engine.step()})
    for i, c in paused.items():
        assert c.tokens + rest[i] == whole[i]
