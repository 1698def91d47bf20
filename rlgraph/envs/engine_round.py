"""Multi-turn rounds on the turn engine (`rlgraph.engines.turn_decode.TurnDecoder`): every
trajectory keeps its KV in its slot across turns, as a real agent loop does.

A round (`engine_round`, `AgentRollout.run_round`'s body when the agent has an engine):
1. trajectories without an environment get one (reset, or replay of a restored one);
2. each trajectory whose environment is ready starts its turn: a `Request` whose prompt is the
   trajectory so far (prompt, context, turns and observations) and whose budget is what is
   left of response_len.max (or a benchmark's forced turn length). A trajectory that decoded
   a turn in this round goes on in its parked slot, so only its last token and the new
   observation are encoded; the others (new, carried from an earlier round) are prefilled
   whole;
3. the engine decodes every running turn `sync_every` steps at a time; a turn that ends
   (eos, its budget, or a stop string the env names: the tokens after it are dropped) goes
   to its environment at once, the others keep decoding, and its observation is appended
   (masked) when it comes back: the trajectory's next turn joins the next step;
4. with no turn running it waits for the first env result.
The round ends when every trajectory has ended or `enough()` says so; running turns are
interrupted (their tokens kept, mid-turn), slots freed: the next round's weights may differ.
Between steps `swap()` may adopt new weights: running turns are re-encoded under them and
parked K/V is no longer reused.

In-flight weight updates (`generate.inflight`, `agent.kv` set) keep the KV instead, as the
single-turn in-flight rows do (`engines.inflight`): at round end running turns are paused in
their slots (`TurnDecoder.pause`), and a carried trajectory's next round goes on there,
encoding only its last token; a trajectory no longer in the round (ended, dropped, restarted
under a new environment key) frees its slot at the next round's start. With `kv: keep` a
version swapped in mid-round only changes the version its next tokens record: running turns
and parked slots keep their K/V, computed under the versions that sampled the tokens before
(PipelineRL's in-flight updates); with `kv: recompute` a swap re-encodes as above, and a
round under a new version re-encodes the parked trajectories it goes on with.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlgraph.engines.static_decode import Completion, Request

if TYPE_CHECKING:
    from rlgraph.engines.turn_decode import TurnDecoder
    from rlgraph.envs.rollout import AgentRollout, Row


def _stop_at(agent: AgentRollout, tokens: list[int], start: int) -> int | None:
    """Index of the first token at or after `start` that completes one of the env's stop
    strings in a turn's `tokens`, if any."""
    for k in range(start, len(tokens)):
        tail = agent.tok.decode(tokens[max(0, k + 1 - agent.window):k + 1])
        if any(tail.endswith(s) for s in agent.stop):
            return k
    return None


def engine_round(agent: AgentRollout, engine: TurnDecoder, rows: list[Row], version: int,
                 step: int, swap: Callable[[], int | None], enough: Callable[[], bool] | None,
                 eos_id: int, temperature: float = 1.0, top_p: float = 1.0, generator: Any = None,
                 **_: Any) -> dict[str, float]:
    """Advance `rows` on `engine` until all have ended or `enough()` (see the module
    docstring); the round's stats (decode steps, turns started, prefill calls, env wait)."""
    by_key = {r.trajectory.env_key: r for r in rows}
    stats = {"decode_steps": 0.0, "waves": 0.0, "switches": 0.0, "wait_s": 0.0,
             "carried": float(sum(1 for r in rows if r.trajectory.tokens)),
             "reused_tokens": 0.0, "extend_s": 0.0, "step_s": 0.0}
    before, began = dict(engine.stats), time.perf_counter()
    if agent.kv is not None:  # in flight: slots of trajectories no longer in the round go
        engine.release(engine.parked_ids - {r.trajectory.env_key for r in rows
                                            if not r.trajectory.finished})
        if agent.kv == "recompute" and engine.policy_version != version:
            engine.invalidate()
    engine.set_policy_version(version)
    if generator is not None:
        from rlgraph.engines.static_rollout import seed_device

        seed_device(engine.device, generator.initial_seed())
    agent.start(rows)
    running: set[str] = set()  # env keys with a turn in the engine
    scanned: dict[str, int] = {}  # stop strings: turn tokens already searched

    def finished(c: Completion) -> None:
        key = c.request.request_id
        running.discard(key)
        scanned.pop(key, None)
        t = by_key[key].trajectory
        tokens, logps, versions = c.tokens, c.logprobs, c.versions
        if agent.stop and c.finish_reason != "interrupted":
            cut = _stop_at(agent, tokens, 0)
            if cut is not None:
                tokens, logps, versions = tokens[:cut + 1], logps[:cut + 1], versions[:cut + 1]
        if tokens and not t.tokens and t.first_step < 0:
            t.first_step = step
        t.tokens += tokens
        t.logps += logps
        t.versions += versions
        t.mask += [1] * len(tokens)
        if c.finish_reason == "interrupted" or t.finished:
            return
        turn = t.tokens[t.turn_start:]
        if agent.turn_length is not None:  # a benchmark's forced turn length
            ended = len(turn) >= agent.turn_length(t.key, t.turns)
        else:
            ended = bool(turn) and (turn[-1] == eos_id or (bool(agent.stop) and _stop_at(
                agent, turn, len(turn) - 1) is not None))
        if not ended and len(t.context) + len(t.tokens) >= agent.max_new_tokens:
            agent._end(t, "length")
            return
        action = agent.tok.decode(t.tokens[t.turn_start:])
        t.actions.append(action)
        agent.pending[key] = agent.pool.submit("step", key, action)

    while True:
        agent._collect(by_key, 0.0)
        if enough is not None and enough():
            break
        open_rows = [r for r in rows if not r.trajectory.finished]
        if not open_rows:
            break
        requests = []
        for r in open_rows:
            t = r.trajectory
            key = t.env_key
            if key in running or key not in agent.live or key in agent.pending:
                continue
            budget = agent.max_new_tokens - len(t.context) - len(t.tokens)
            if budget <= 0:
                agent._end(t, "length")
                continue
            forced = None if agent.turn_length is None else \
                agent.turn_length(t.key, t.turns) - (len(t.tokens) - t.turn_start)
            turn = budget if forced is None else max(1, min(budget, forced))
            requests.append(Request(r.prompt + t.context + t.tokens, turn,
                                    temperature=temperature, top_p=top_p, request_id=key,
                                    ignore_eos=forced is not None))
            running.add(key)
        if requests:
            began_extend = time.perf_counter()
            engine.extend(requests)
            stats["extend_s"] += time.perf_counter() - began_extend
            stats["waves"] += 1
        if not running or not engine.can_step:  # nothing to decode until an env answers
            start = time.perf_counter()
            agent._collect(by_key, agent.spec.timeout_s + 1.0)
            stats["wait_s"] += time.perf_counter() - start
            continue
        began_step = time.perf_counter()
        completions = engine.step()
        stats["step_s"] += time.perf_counter() - began_step
        for c in completions:
            finished(c)
        if agent.stop and running:
            stops = []
            for c in engine.peek():
                key = c.request.request_id
                if _stop_at(agent, c.tokens, scanned.get(key, 0)) is not None:
                    stops.append(key)
                scanned[key] = len(c.tokens)
            for c in engine.finish(stops):
                finished(c)
        new = swap()
        if new is not None and agent.kv == "keep":  # every slot keeps its K/V
            version = new
            engine.set_policy_version(new)
            stats["switches"] += 1
        elif new is not None:  # the running turns' KV is recomputed under the new weights
            version = new
            stopped = engine.interrupt()
            engine.invalidate()
            engine.set_policy_version(new)
            engine.submit([c.resume() for c in stopped if not c.finished], front=True)
            for c in stopped:
                if c.finished:
                    finished(c)
            stats["switches"] += 1
    for c in engine.interrupt() if agent.kv is None else engine.pause():
        finished(c)
    while engine.queue:  # queued turns not started: nothing decoded this round
        running.discard(engine.queue.popleft().request_id)
    if agent.kv is None:
        engine.release_all()
    engine._read_slots()  # collects the device times of the last decode calls
    for key in ("decode_steps", "reused_tokens", "prefill_tokens", "decode_ms", "prefill_ms"):
        stats[key] = engine.stats[key] - before[key]
    stats["engine_s"] = time.perf_counter() - began - stats["wait_s"]
    return stats
