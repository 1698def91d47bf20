"""Batched sampling with a KV cache: a decode loop we control, one token per `Decoder.step`.

Prompts are left-padded to a common length P, responses right-padded to R (verl's layout:
`sequences = [prompt | response]`). Each sampled token records its behaviour log-prob
`log_softmax(logits / temperature)` (top-p truncation is not part of it, as in verl and
vLLM) and the policy version that sampled it. Because the loop state lives in `Decoder`, a
caller may stop between steps, swap weights, and continue (partial rollout): `reencode()`
drops the KV cache so the next step recomputes it under the new weights, and a row may start
from a response prefix sampled earlier (it is part of the row's left-padded context) with its
own budget of new tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlgraph.engines.static_ops import sdpa_without_cudnn
from rlgraph.model.build import with_cache
from rlgraph.presets.models import PASS_WIDTH_BLOCK


@dataclass
class Rollout:
    """Sampled sequences; tensors are [B, P + R] or [B, R]."""

    sequences: torch.Tensor  # prompt (left-padded) + response (right-padded)
    attention_mask: torch.Tensor  # 1 on real prompt and response tokens
    prompt_len: int  # P
    response_mask: torch.Tensor  # [B, R]: 1 up to and including eos
    behavior_logp: torch.Tensor  # [B, R]
    token_version: torch.Tensor  # [B, R] policy version that sampled each token; -1 on padding

    @property
    def responses(self) -> torch.Tensor:
        """[B, R] response token ids (pad after eos)."""
        return self.sequences[:, self.prompt_len:]


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids [B, P], mask [B, P]), padded on the left."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids, mask


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: 0 at each row's first real token."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail outside the smallest set of tokens whose mass reaches `top_p`."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(-1, descending=True)
    drop = sorted_probs.cumsum(-1) - sorted_probs > top_p  # mass before this token already enough
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


class Decoder:
    """The state of one batched decode: cache, tokens so far, which rows have finished.

    `prefixes[i]` (optional) is a response prefix row i sampled earlier: it is appended to the
    prompt as context (re-encoded under the current weights) and is not part of what this
    decoder returns. `budgets[i]` (optional) is row i's own limit of new tokens."""

    def __init__(self, model: torch.nn.Module, prompts: list[list[int]], *, max_new_tokens: int,
                 eos_id: int, pad_id: int, temperature: float = 1.0, top_p: float = 1.0,
                 greedy: bool = False, generator: torch.Generator | None = None,
                 use_cache: bool = True, prefixes: list[list[int]] | None = None,
                 budgets: list[int] | None = None):
        self.model, self.eos_id, self.pad_id = model, eos_id, pad_id
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.greedy, self.generator, self.use_cache = greedy, generator, use_cache
        device = next(model.parameters()).device
        contexts = prompts if prefixes is None else [p + q for p, q in zip(prompts, prefixes)]
        self.prompt_ids, self.prompt_mask = (t.to(device) for t in left_pad(contexts, pad_id))
        batch = len(prompts)
        limit = [max_new_tokens] * batch if budgets is None else budgets
        self.budgets = torch.tensor(limit, dtype=torch.long, device=device).clamp(
            max=max_new_tokens)
        self.tokens: list[torch.Tensor] = []
        self.logps: list[torch.Tensor] = []
        self.versions: list[torch.Tensor] = []
        self.alive: list[torch.Tensor] = []  # mask of rows still generating at each step
        self.finished = self.budgets <= 0
        self.cache = None

    @property
    def done(self) -> bool:
        """Every row has emitted eos, or the length limit is reached."""
        return bool(self.finished.all()) or len(self.tokens) >= self.max_new_tokens

    def _next_logits(self) -> torch.Tensor:
        """Logits of the next token for every row, from the cache when there is one."""
        mask = torch.cat([self.prompt_mask, *[a[:, None].long() for a in self.alive]], dim=1)
        if self.use_cache and self.cache is not None:
            ids = self.tokens[-1][:, None]
            pos = position_ids(mask)[:, -1:]
        else:
            ids = torch.cat([self.prompt_ids, *[t[:, None] for t in self.tokens]], dim=1)
            pos = position_ids(mask)
        with sdpa_without_cudnn():  # every step's key length is new
            out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                             **with_cache(self.model, self.cache if self.use_cache else None),
                             use_cache=self.use_cache, logits_to_keep=1)
        if self.use_cache:
            self.cache = out.past_key_values
        return out.logits[:, -1].float()

    def reencode(self) -> None:
        """Forget the KV cache: the next step recomputes it for every row's prompt, prefix and
        tokens so far under the model's current weights (after a weight switch)."""
        self.cache = None

    @torch.no_grad()
    def step(self, policy_version: int = 0) -> bool:
        """Sample one token for every unfinished row; returns False once the decode is done."""
        if self.done:
            return False
        logp_all = torch.log_softmax(self._next_logits() / self.temperature, dim=-1)
        if self.greedy:
            token = logp_all.argmax(-1)
        else:
            probs = top_p_filter(logp_all.exp(), self.top_p)
            token = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
        alive = ~self.finished
        token = torch.where(alive, token, torch.full_like(token, self.pad_id))
        logp = logp_all.gather(-1, token[:, None]).squeeze(-1)
        self.tokens.append(token)
        self.logps.append(torch.where(alive, logp, torch.zeros_like(logp)))
        self.versions.append(torch.where(alive, policy_version, -1))
        self.alive.append(alive)
        self.finished |= alive & ((token == self.eos_id) | (len(self.tokens) >= self.budgets))
        return not self.done

    def rows(self) -> list[tuple[list[int], list[float], list[int]]]:
        """Per row, the new tokens it sampled, their behaviour log-probs and versions (host
        lists, padding left out): what a partial rollout appends to each sample."""
        if not self.tokens:
            return [([], [], []) for _ in range(len(self.finished))]
        alive = torch.stack(self.alive, dim=1).cpu()
        tokens, logps, versions = (torch.stack(x, dim=1).cpu()
                                   for x in (self.tokens, self.logps, self.versions))
        return [(tokens[i][alive[i]].tolist(), logps[i][alive[i]].tolist(),
                 versions[i][alive[i]].tolist()) for i in range(len(alive))]

    def result(self) -> Rollout:
        """The sampled batch so far, as a Rollout."""
        response = torch.stack(self.tokens, dim=1)
        response_mask = torch.stack(self.alive, dim=1).long()
        return Rollout(
            sequences=torch.cat([self.prompt_ids, response], dim=1),
            attention_mask=torch.cat([self.prompt_mask, response_mask], dim=1),
            prompt_len=self.prompt_ids.shape[1],
            response_mask=response_mask,
            behavior_logp=torch.stack(self.logps, dim=1),
            token_version=torch.stack(self.versions, dim=1),
        )


def pack(prompts: list[list[int]], responses: list[list[int]], logps: list[list[float]],
         versions: list[list[int]], pad_id: int) -> Rollout:
    """Per-row token lists -> a Rollout in the batch layout (prompt left-padded, response
    right-padded to the longest; behaviour log-prob 0 and version -1 on padding)."""
    ids, mask = left_pad(prompts, pad_id)
    width = max((len(r) for r in responses), default=0)
    rows = len(responses)
    response = torch.full((rows, width), pad_id, dtype=torch.long)
    response_mask = torch.zeros((rows, width), dtype=torch.long)
    logp = torch.zeros((rows, width), dtype=torch.float32)
    version = torch.full((rows, width), -1, dtype=torch.long)
    for i, (r, lp, v) in enumerate(zip(responses, logps, versions)):
        n = len(r)
        response[i, :n] = torch.tensor(r, dtype=torch.long)
        response_mask[i, :n] = 1
        logp[i, :n] = torch.tensor(lp, dtype=torch.float32)
        version[i, :n] = torch.tensor(v, dtype=torch.long)
    return Rollout(sequences=torch.cat([ids, response], dim=1),
                   attention_mask=torch.cat([mask, response_mask], dim=1),
                   prompt_len=ids.shape[1], response_mask=response_mask,
                   behavior_logp=logp, token_version=version)


def sample(model: torch.nn.Module, prompts: list[list[int]], *, max_new_tokens: int,
           eos_id: int, pad_id: int, policy_version: int = 0, **kwargs) -> Rollout:
    """Decode to the end: every row reaches eos or `max_new_tokens`."""
    decoder = Decoder(model, prompts, max_new_tokens=max_new_tokens, eos_id=eos_id,
                      pad_id=pad_id, **kwargs)
    while decoder.step(policy_version):
        pass
    return decoder.result()


def token_logp(model: torch.nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor,
               prompt_len: int, temperature: float = 1.0) -> torch.Tensor:
    """[B, R] log-probs of the response tokens under `model` (with gradient if enabled)."""
    response = sequences[:, prompt_len:]
    width = response.shape[1]
    # a long-tailed batch brings new pass widths for many steps (static_ops.sdpa_without_cudnn)
    with sdpa_without_cudnn():
        out = model(input_ids=sequences, attention_mask=attention_mask,
                    position_ids=position_ids(attention_mask), use_cache=False,
                    logits_to_keep=width + 1)
    logits = out.logits[:, :-1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, response[..., None]).squeeze(-1)




def length_batches(response_mask: torch.Tensor, prompt_len: int, max_tokens: int
                   ) -> list[tuple[torch.Tensor, int]]:
    """Row indices and response width of passes of at most `max_tokens` tokens (padding
    included; a row longer than that goes alone): rows sorted by response length, each pass
    trimmed to its longest response rounded up to PASS_WIDTH_BLOCK, so a batch of long-tailed
    lengths is not padded to its longest everywhere and the pass shapes stay few."""
    width = response_mask.shape[1]
    # a row's length is its last masked token's position + 1 (a multi-turn row's mask has
    # holes at its observations, which the pass must still hold)
    last = width - response_mask.flip(1).long().argmax(1)
    lengths = torch.where(response_mask.any(1), last, torch.zeros_like(last))
    order = torch.argsort(lengths, descending=True, stable=True)
    passes, i = [], 0
    while i < len(order):
        w = min(width, -(-max(int(lengths[order[i]]), 1) // PASS_WIDTH_BLOCK) * PASS_WIDTH_BLOCK)
        n = max(1, max_tokens // (prompt_len + w))
        passes.append((order[i:i + n], w))
        i += n
    return passes


def token_logp_passes(model: torch.nn.Module, sequences: torch.Tensor,
                      attention_mask: torch.Tensor, prompt_len: int, temperature: float,
                      passes: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """`token_logp` of every row, computed pass by pass (`length_batches`); 0 beyond a pass's
    width (padding there)."""
    rows, width = sequences.shape[0], sequences.shape[1] - prompt_len
    out = torch.zeros(rows, width, device=sequences.device)
    for index, w in passes:
        index = index.to(sequences.device)
        cols = prompt_len + w
        out[index, :w] = token_logp(model, sequences[index, :cols], attention_mask[index, :cols],
                                    prompt_len, temperature).float()
    return out
