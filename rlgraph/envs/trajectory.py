"""A multi-turn trajectory: the model's turns and the environment's observations in one token
stream, with a mask that tells them apart, and how a batch of them becomes a `Rollout`.

Layout of one trajectory after its prompt: `context` (what `reset` appended, observation
tokens) then `tokens`: model turns and observations interleaved. `mask` is 1 on a token the
policy sampled and 0 on an observation token; observation tokens have behaviour log-prob 0
and policy version -1. In the batch, `response_mask` is that mask (so the loss, the KL term,
the importance ratios and the lag metrics skip observations) while `attention_mask` is 1 on
every real token (the policy reads observations as context).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rlgraph.engines.partial_rollout import Sample

if TYPE_CHECKING:
    from rlgraph.engines.cpu_decode import Rollout
    from rlgraph.model.tokenizer import Tokenizer

# why a trajectory ended: the env said done, it used max_turns, it reached response_len.max,
# an env call took longer than timeout_s, the env raised or returned something else than the
# contract's types, or an observation was longer than max_observation_tokens
REASONS = ("done", "max_turns", "length", "timeout", "error", "observation_too_long")
FAILURES = ("timeout", "error", "observation_too_long")


@dataclass
class Trajectory(Sample):
    """A sample of a multi-turn rollout (partial_rollout.Sample plus the env's side)."""

    key: str = ""  # the trajectory's uid: prompt uid '#' sample index
    attempt: int = 0  # restarts so far (a restarted trajectory gets a fresh environment)
    context: list[int] = field(default_factory=list)  # reset's text, as observation tokens
    mask: list[int] = field(default_factory=list)  # per token of `tokens`: 1 sampled, 0 observed
    turn_start: int = 0  # index in `tokens` where the model's current turn began
    actions: list[str] = field(default_factory=list)  # the model's finished turns, as sent
    observed: int = 0  # actions whose observation has been applied
    env_reward: float = 0.0  # the steps' rewards, summed
    reason: str = ""  # why it ended (REASONS), '' while open
    detail: str = ""  # the one-line detail of a failure
    tool_calls: int = 0  # steps that reported a tool call (info['tool_call'])
    tool_ok: int = 0  # of those, the successful ones

    @property
    def env_key(self) -> str:
        """The key of this attempt's environment in the pool."""
        return f"{self.key}/{self.attempt}"

    @property
    def turns(self) -> int:
        """Model turns finished so far."""
        return len(self.actions)

    def restart(self) -> None:
        """Forget every token and turn: the trajectory starts again in a new environment."""
        super().restart()
        self.context, self.mask, self.actions = [], [], []
        self.turn_start = self.observed = self.tool_calls = self.tool_ok = 0
        self.env_reward, self.reason, self.detail = 0.0, "", ""
        self.attempt += 1

    def response(self) -> tuple[list[int], list[int], list[float], list[int]]:
        """(token ids, mask, behaviour log-probs, versions) after the prompt, context included."""
        n = len(self.context)
        return (self.context + self.tokens, [0] * n + self.mask, [0.0] * n + self.logps,
                [-1] * n + self.versions)

    def text(self, tokenizer: Tokenizer) -> str:
        """The whole trajectory as text: each model turn and observation decoded on its own
        (an end-of-sequence token ends a turn, not the text)."""
        ids, mask, _, _ = self.response()
        parts, start = [], 0
        for i in range(1, len(ids) + 1):
            if i == len(ids) or mask[i] != mask[start] or (mask[i - 1] and ids[i - 1] ==
                                                           tokenizer.eos_id):
                parts.append(tokenizer.decode(ids[start:i]))
                start = i
        return "".join(parts)


def pack_trajectories(prompts: list[list[int]], trajectories: list[Trajectory], pad_id: int
                      ) -> Rollout:
    """Prompts and trajectories -> a Rollout in the batch layout (prompt left-padded,
    trajectory right-padded; `response_mask` 0 on observations, `attention_mask` 1 on them)."""
    import torch

    from rlgraph.engines.cpu_decode import Rollout, left_pad

    ids, prompt_mask = left_pad(prompts, pad_id)
    parts = [t.response() for t in trajectories]
    rows, width = len(parts), max((len(p[0]) for p in parts), default=0)
    response = torch.full((rows, width), pad_id, dtype=torch.long)
    real = torch.zeros((rows, width), dtype=torch.long)
    sampled = torch.zeros((rows, width), dtype=torch.long)
    logp = torch.zeros((rows, width), dtype=torch.float32)
    version = torch.full((rows, width), -1, dtype=torch.long)
    for i, (tokens, mask, logps, versions) in enumerate(parts):
        n = len(tokens)
        response[i, :n] = torch.tensor(tokens, dtype=torch.long)
        real[i, :n] = 1
        sampled[i, :n] = torch.tensor(mask, dtype=torch.long)
        logp[i, :n] = torch.tensor(logps, dtype=torch.float32)
        version[i, :n] = torch.tensor(versions, dtype=torch.long)
    return Rollout(sequences=torch.cat([ids, response], 1),
                   attention_mask=torch.cat([prompt_mask, real], 1), prompt_len=ids.shape[1],
                   response_mask=sampled, behavior_logp=logp, token_version=version)


def trajectory_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """`env/*` figures of finished trajectories: turns, observation tokens, tool calls and
    their success rate, and how many ended for each reason."""
    n = max(1, len(trajectories))
    turns = [t.turns for t in trajectories]
    calls = sum(t.tool_calls for t in trajectories)
    out = {
        "env/trajectories": float(len(trajectories)),
        "env/turns_mean": sum(turns) / n,
        "env/turns_max": float(max(turns, default=0)),
        "env/observation_tokens_mean": sum(len(t.context) + t.mask.count(0)
                                           for t in trajectories) / n,
        "env/reward_mean": sum(t.env_reward for t in trajectories) / n,
        "env/tool_calls": float(calls),
        **{f"env/ended_{reason}": float(sum(t.reason == reason for t in trajectories))
           for reason in REASONS},
    }
    if calls:
        out["env/tool_success_rate"] = sum(t.tool_ok for t in trajectories) / calls
    return out
