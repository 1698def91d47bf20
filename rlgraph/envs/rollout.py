"""Multi-turn generation: decode model turns while environments step, until trajectories end.

`AgentRollout.run_round(rows, ...)` advances trajectories (`trajectory.Trajectory`):
1. a trajectory without an environment gets one: `reset` (a new one) or `replay` (one
   restored from a checkpoint: reset, then its recorded turns stepped again, so it goes on
   exactly where it was; a checkpoint never holds observations the env has not given);
2. the trajectories whose environment is ready decode together (`cpu_decode.Decoder`, their
   prompt, context and tokens so far re-encoded as its prefix) until each ends its turn: the
   end-of-sequence token, a stop string the env names (`Env.stop`), or its token budget
   (response_len.max for the whole trajectory, observations included: it then ends,
   'length'). A trajectory whose turn ends is sent to its environment at once, so env steps
   run while the others decode (an env pool of Ray actors, `rlgraph.envs.pool`);
3. an observation is appended as masked tokens (version -1, log-prob 0) and the trajectory
   decodes again in a later wave; the env's `done`, `max_turns`, a timeout, an error or an
   oversized observation end it with its reason (REASONS). A failure prints one line naming
   the trajectory and the reason; the run goes on;
4. with no trajectory ready, it waits for the first env result.
The round ends when every trajectory has ended, or when `enough()` says so (partial
rollout: enough prompt groups are complete); open trajectories keep their tokens, mid-turn
or waiting for an observation, and go on in the next round. Between decode steps `swap()`
may adopt new weights (the live rows are re-encoded), as partial rollout's decode does; on
the turn engine with in-flight updates (`kv`) they keep their KV (`envs.engine_round`).

`agent_round` is partial rollout's generate(t) for trajectories: the rollout cache's evict
and refill (`AgentCache`), `run_round`, then the first complete groups.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlgraph.engines.partial_rollout import PromptGroup, RolloutCache, cache_round_metrics
from rlgraph.envs.load import build_env, load_env_class, stop_strings
from rlgraph.envs.pool import Call, EnvPool
from rlgraph.envs.spec import EnvSpec
from rlgraph.envs.trajectory import FAILURES, Trajectory, trajectory_metrics

if TYPE_CHECKING:
    import torch

    from rlgraph.model.tokenizer import Tokenizer


@dataclass
class Row:
    """A trajectory in a round, with what its environment is given at reset."""

    prompt: list[int]  # prompt token ids
    trajectory: Trajectory
    text: str  # the prompt as text
    sample: dict[str, Any]  # uid, prompt_uid, sample_index, ground_truth, data_source, extra_info


def sample_dict(example: Any, index: int, key: str) -> dict[str, Any]:
    """What `Env.reset` receives about the trajectory's sample."""
    return {"uid": key, "prompt_uid": example.uid, "sample_index": index,
            "ground_truth": example.ground_truth, "data_source": example.data_source,
            "extra_info": dict(example.extra_info)}


def prompt_text(prompt: Any) -> str:
    """A prompt (text or chat messages) as text."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(str(m.get("content", "")) for m in prompt)


class AgentRollout:
    """The env pool and the decode of multi-turn trajectories (see the module docstring)."""

    def __init__(self, spec: EnvSpec, tokenizer: Tokenizer, max_new_tokens: int,
                 base_dir: str | None = None, name: str = "generate",
                 turn_length: Callable[[str, int], int] | None = None):
        self.spec, self.tok, self.name = spec, tokenizer, name
        self.turn_length = turn_length  # benchmarks: (trajectory key, turn) -> forced length
        self.max_new_tokens = max_new_tokens
        base = None if base_dir is None else __import__("pathlib").Path(base_dir)
        probe = build_env(load_env_class(spec.fn, ("env", "fn"), base), spec.config(), spec.fn)
        self.stop = stop_strings(probe) if turn_length is None else ()
        self.window = max((len(s) for s in self.stop), default=0) + 4  # tokens to decode
        self.pool = EnvPool.of(spec, base_dir)
        self.live: set[str] = set()  # env keys whose environment exists
        self.pending: dict[str, Call] = {}  # env key -> the call in flight
        self.failures: list[str] = []  # one line per trajectory ended by the env, this round
        # the turn engine (engines/turn_decode.TurnDecoder, KV kept across turns), or None:
        # turns decode in waves on cpu_decode.Decoder (cuda_decode: dynamic)
        self.engine: Any = None
        # in-flight weight updates on the turn engine (generate.inflight): 'keep' or
        # 'recompute' (envs/engine_round.py); None: slots freed at each round's end
        self.kv: str | None = None

    # ------------------------------------------------------------ env results

    def _end(self, t: Trajectory, reason: str, detail: str = "") -> None:
        t.finished, t.reason, t.detail = True, reason, detail
        if self.engine is not None:
            self.engine.release([t.env_key])
        if t.env_key in self.live:
            self.live.discard(t.env_key)
            self.pool.close([t.env_key])
        if reason in FAILURES:
            line = (f"{self.name}: env {self.spec.fn}: trajectory {t.key} ended at turn "
                    f"{t.turns}: {reason.replace('_', ' ')}: {detail}")
            self.failures.append(line)
            print(line, file=sys.stderr, flush=True)

    def _observe(self, t: Trajectory, result: dict[str, Any]) -> None:
        """Apply one step's result to its trajectory."""
        t.observed += 1
        if not result["ok"]:
            self._end(t, result["reason"], result.get("error", ""))
            return
        if result["tool_call"] is not None:
            t.tool_calls += 1
            t.tool_ok += int(result["tool_call"])
        t.env_reward += result["reward"]
        if result["done"]:
            self._end(t, "done")
            return
        if t.turns >= self.spec.max_turns:
            self._end(t, "max_turns")
            return
        ids = self.tok.encode_text(result["observation"])
        if len(ids) > self.spec.max_observation_tokens:
            self._end(t, "observation_too_long", f"{len(ids)} tokens, more than "
                      f"max_observation_tokens {self.spec.max_observation_tokens}")
            return
        if len(t.context) + len(t.tokens) + len(ids) >= self.max_new_tokens:
            self._end(t, "length")
            return
        t.tokens += ids
        t.mask += [0] * len(ids)
        t.logps += [0.0] * len(ids)
        t.versions += [-1] * len(ids)
        t.turn_start = len(t.tokens)

    def _apply(self, call: Call, result: Any, by_key: dict[str, Row]) -> None:
        row = by_key.get(call.key)
        if row is None or row.trajectory.finished:  # dropped, or ended meanwhile
            self.pool.close([call.key])
            return
        t = row.trajectory
        if call.what == "step":
            self._observe(t, result)
            return
        results = result if isinstance(result, list) else [result]
        first = results[0]
        if not first["ok"]:
            self._end(t, first["reason"], first.get("error", ""))
            return
        self.live.add(t.env_key)
        if call.what == "reset":
            ids = self.tok.encode_text(first["observation"]) if first["observation"] else []
            if len(ids) > self.spec.max_observation_tokens:
                self._end(t, "observation_too_long", f"reset gave {len(ids)} tokens, more "
                          f"than max_observation_tokens {self.spec.max_observation_tokens}")
                return
            t.context = ids
            return
        for step in results[1:]:  # replay: its steps in order; apply those not yet applied
            if not step["ok"]:
                self._end(t, step["reason"], step.get("error", ""))
                return
        for step in results[1 + t.observed:]:
            self._observe(t, step)

    def _collect(self, by_key: dict[str, Row], wait_s: float) -> int:
        calls = list(self.pending.values())
        done = self.pool.poll(calls, wait_s)
        for call, result in done:
            self.pending.pop(call.key, None)
            self._apply(call, result, by_key)
        return len(done)

    # ------------------------------------------------------------ the round

    def run_round(self, rows: list[Row], model: torch.nn.Module, version: int, step: int,
                  swap: Callable[[], int | None], enough: Callable[[], bool] | None,
                  **sampling: Any) -> dict[str, float]:
        """Advance `rows` until all have ended or `enough()` (see the module docstring);
        `sampling` (eos_id, pad_id, temperature, top_p, generator) goes to the Decoder."""
        self.failures = []
        if self.engine is not None:
            from rlgraph.envs.engine_round import engine_round

            return engine_round(self, self.engine, rows, version, step, swap, enough,
                                **sampling)
        by_key = {r.trajectory.env_key: r for r in rows}
        stats = {"decode_steps": 0.0, "waves": 0.0, "switches": 0.0, "wait_s": 0.0,
                 "carried": float(sum(1 for r in rows if r.trajectory.tokens))}
        self.start(rows)
        while True:
            self._collect(by_key, 0.0)
            if enough is not None and enough():
                break
            open_rows = [r for r in rows if not r.trajectory.finished]
            if not open_rows:
                break
            ready = [r for r in open_rows if r.trajectory.env_key in self.live
                     and r.trajectory.env_key not in self.pending]
            if ready:
                version = self._wave(ready, model, version, step, swap, enough, stats,
                                     by_key, **sampling)
            else:
                start = time.perf_counter()
                self._collect(by_key, self.spec.timeout_s + 1.0)
                stats["wait_s"] += time.perf_counter() - start
        return stats

    def start(self, rows: list[Row]) -> None:
        """Give every open trajectory without an environment one: reset, or a replay of a
        trajectory restored from a checkpoint (its recorded turns stepped again)."""
        for r in rows:
            t = r.trajectory
            if t.finished or t.env_key in self.live or t.env_key in self.pending:
                continue
            if t.actions:  # restored from a checkpoint: rebuild its environment
                self.pending[t.env_key] = self.pool.submit("replay", t.env_key, r.text,
                                                           r.sample, list(t.actions))
            else:
                self.pending[t.env_key] = self.pool.submit("reset", t.env_key, r.text,
                                                           r.sample)

    def _wave(self, rows: list[Row], model: torch.nn.Module, version: int, step: int,
              swap: Callable[[], int | None], enough: Callable[[], bool] | None,
              stats: dict[str, float], by_key: dict[str, Row], **sampling: Any) -> int:
        """Decode one turn of every row (see the module docstring); the version it ends on."""
        from rlgraph.engines.cpu_decode import Decoder

        budgets = [self.max_new_tokens - len(r.trajectory.context) - len(r.trajectory.tokens)
                   for r in rows]
        for r, budget in zip(rows, budgets):
            if budget <= 0:
                self._end(r.trajectory, "length")
        rows = [r for r, b in zip(rows, budgets) if b > 0]
        budgets = [b for b in budgets if b > 0]
        if not rows:
            return version
        trajectories = [r.trajectory for r in rows]
        eos = sampling["eos_id"]
        forced = [None if self.turn_length is None else self.turn_length(t.key, t.turns)
                  for t in trajectories]
        decoder = Decoder(model, [r.prompt for r in rows],
                          prefixes=[t.context + t.tokens for t in trajectories],
                          budgets=budgets, max_new_tokens=max(budgets), **sampling)
        stats["waves"] += 1
        while True:
            decoder.step(version)
            stats["decode_steps"] += 1
            tokens = decoder.tokens[-1].tolist()
            logps = decoder.logps[-1].tolist()
            alive = decoder.alive[-1].tolist()
            finished = decoder.finished.tolist()
            for i, t in enumerate(trajectories):
                if not alive[i]:
                    continue
                if not t.tokens and t.first_step < 0:
                    t.first_step = step
                t.tokens.append(tokens[i])
                t.logps.append(logps[i])
                t.versions.append(version)
                t.mask.append(1)
                ended = (tokens[i] == eos or self._stopped(t) or
                         (forced[i] is not None and len(t.tokens) - t.turn_start >= forced[i]))
                if ended:
                    if not finished[i]:
                        decoder.finished[i] = True
                    action = self.tok.decode(t.tokens[t.turn_start:])
                    t.actions.append(action)
                    self.pending[t.env_key] = self.pool.submit("step", t.env_key, action)
                elif finished[i]:  # the budget ran out mid-turn
                    self._end(t, "length")
            if enough is not None and self.pending:
                self._collect(by_key, 0.0)  # a group may complete while this wave decodes
            if decoder.done or (enough is not None and enough()):
                break
            new = swap()
            if new is not None:  # weights changed: recompute every row's KV under them
                version = new
                decoder.reencode()
                stats["switches"] += 1
        return version

    def _stopped(self, t: Trajectory) -> bool:
        if not self.stop:
            return False
        tail = self.tok.decode(t.tokens[max(t.turn_start, len(t.tokens) - self.window):])
        return any(tail.endswith(s) for s in self.stop)

    def take_env_time(self) -> tuple[float, list[tuple[float, float]]]:
        """Env seconds and merged wall-clock spans of env calls since the last take."""
        return self.pool.take_spans()

    def forget(self, keep: set[str]) -> None:
        """Close the environments of trajectories no longer in flight (dropped groups)."""
        gone = [k for k in self.live if k not in keep]
        self.live -= set(gone)
        self.pool.close(gone)


class AgentCache(RolloutCache):
    """The rollout cache of partial rollout, holding trajectories: admitted groups get one
    `Trajectory` per sample (keyed by prompt uid and sample index), checkpoints keep every
    trajectory's turns, and a restored trajectory's environment is replayed."""

    sample_type = Trajectory

    def __init__(self, *, key_of: Callable[[int], str], **kwargs: Any):
        super().__init__(**kwargs)
        self.key_of = key_of  # data position -> prompt uid

    def refill(self, step: int, version: int) -> int:
        """Admit groups as the cache does; their samples are trajectories."""
        before = len(self.groups)
        added = super().refill(step, version)
        for group in self.groups[before:]:
            uid = self.key_of(group.position)
            group.samples = [Trajectory(key=f"{uid}#{k}", budget=s.budget)
                             for k, s in enumerate(group.samples)]
        return added


def agent_round(cache: AgentCache, agent: AgentRollout, step: int, model: torch.nn.Module,
                version: int, swap: Callable[[], int | None],
                row_of: Callable[[PromptGroup, int, Trajectory], Row], **sampling: Any
                ) -> tuple[list[PromptGroup], dict[str, float]]:
    """generate(step) with partial rollout over trajectories: evict, refill, run the round
    until `prompts_per_step` groups are complete (and, `stale: finish`, the groups that must
    be trained now), emit them. Returns the groups and the round's rollout/* metrics."""
    dropped, restarted = cache.evict(step, version)
    cache.refill(step, version)
    rows = [row_of(g, k, s) for g in cache.groups for k, s in enumerate(g.samples)]
    agent.forget({r.trajectory.env_key for r in rows})
    must = cache.must_finish(step)

    def enough() -> bool:
        complete = {i for i, g in enumerate(cache.groups) if g.complete}
        return len(complete) >= cache.prompts_per_step and must <= complete

    stats = agent.run_round(rows, model, version, step, swap, enough, **sampling)
    groups = cache.take()
    spans = [max(v for v in s.versions if v >= 0) - min(v for v in s.versions if v >= 0)
             for g in groups for s in g.samples if any(v >= 0 for v in s.versions)]
    metrics = {
        **cache_round_metrics(cache, stats, dropped, restarted, max(spans, default=0)),
        **engine_metrics(stats),
        # trajectories still open after the round (mid-turn or waiting for the env)
        "env/in_flight": float(sum(not s.finished for g in cache.groups for s in g.samples)),
    }
    return groups, metrics


def engine_metrics(stats: dict[str, float]) -> dict[str, float]:
    """The round's decode figures: env wait, decode calls (waves, or prefill calls on the
    turn engine), decode steps, and on the turn engine the tokens prefilled, those whose
    KV was kept across turns, the seconds of the engine's work (`engine_s`: the round less
    its waits for the env), of its prefill calls (`extend_s`) and its decode calls
    (`step_s`), and the device ms of a decode step and of the prefills (CUDA)."""
    out = {"env/wait_s": stats["wait_s"], "env/decode_waves": stats["waves"],
           "env/decode_steps": stats["decode_steps"]}
    for key in ("prefill_tokens", "reused_tokens", "engine_s", "extend_s", "step_s"):
        if key in stats:
            out[f"env/{key}"] = stats[key]
    if stats.get("decode_ms") and stats["decode_steps"]:
        out["env/decode_ms_per_step"] = stats["decode_ms"] / stats["decode_steps"]
    if stats.get("prefill_ms"):  # device ms of the round's prefills (CUDA)
        out["env/prefill_ms"] = stats["prefill_ms"]
    return out


def batch_fields(trajectories: list[Trajectory], tokenizer: Tokenizer) -> dict[str, Any]:
    """What a multi-turn batch adds to generate's: each row's whole text (model turns and
    observations), the env's summed reward, why each trajectory ended and its turns."""
    import torch

    return {"response_text": [t.text(tokenizer) for t in trajectories],
            "env_reward": torch.tensor([t.env_reward for t in trajectories],
                                       dtype=torch.float32),
            "env_end": [t.reason for t in trajectories],
            "env_turns": [t.turns for t in trajectories]}


def round_metrics(agent: AgentRollout, trajectories: list[Trajectory],
                  stats: dict[str, float] | None = None
                  ) -> tuple[dict[str, float], list[tuple[float, float]]]:
    """The round's env/* metrics (`stats`: run_round's, where the caller did not report
    them) and the wall-clock spans of its env calls (the timeline's env lane)."""
    seconds, spans = agent.take_env_time()
    metrics = trajectory_metrics(trajectories)
    metrics["env/seconds"] = seconds
    if stats is not None:
        metrics.update(engine_metrics(stats))
        metrics["env/in_flight"] = 0.0  # a synchronous batch ends every trajectory
    return metrics, spans
