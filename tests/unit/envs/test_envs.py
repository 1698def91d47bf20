"""Multi-turn rollouts: the built-in environments, what happens to environments that raise,
hang, return the wrong types or huge observations (one line per trajectory, the run goes
on), the observation mask in the batch, partial rollout's trajectories across rounds and a
checkpoint, and the compiler's pricing of turns."""

from __future__ import annotations

import copy
import functools
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_support import MICRO, make_spec

from rlgraph.envs.calculator import CalculatorEnv, CalculatorError, evaluate
from rlgraph.envs.guess_number import GuessNumberEnv
from rlgraph.envs.rollout import (
    AgentCache,
    AgentRollout,
    Row,
    agent_round,
    round_metrics,
    sample_dict,
)
from rlgraph.envs.spec import EnvSpec
from rlgraph.envs.trajectory import Trajectory, pack_trajectories
from rlgraph.errors import SpecError
from rlgraph.model.tokenizer import CharTokenizer
from rlgraph.rl.data import task_example

TOK = CharTokenizer()

# ---------------------------------------------------------------- the calculator


def test_calculator_parses_arithmetic_itself() -> None:
    assert evaluate("37*8") == "296"
    assert evaluate("2+3*4") == "14" and evaluate("(2+3)*4") == "20"
    assert evaluate("-3--4") == "1" and evaluate("7/2") == "7/2" and evaluate("8/2") == "4"
    for bad in ("", "2+", "3*(4", "1/0", "__import__('os')", "2**3", "a+1", "9" * 40 + "*" +
                "9" * 40, "1+" * 150 + "1"):
        with pytest.raises(CalculatorError):
            evaluate(bad)


@st.composite
def expressions(draw: st.DrawFn, depth: int = 0) -> tuple[str, int]:
    """An integer expression (no division) and its value, built side by side."""
    if depth > 3 or draw(st.booleans()):
        n = draw(st.integers(0, 999))
        return str(n), n
    left, a = draw(expressions(depth + 1))
    right, b = draw(expressions(depth + 1))
    op = draw(st.sampled_from("+-*"))
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return f"({left}{op}{right})", value


@settings(max_examples=60, deadline=None)
@given(expressions())
def test_calculator_agrees_with_integer_arithmetic(case: tuple[str, int]) -> None:
    text, value = case
    assert evaluate(text) == str(value)


def test_calculator_env_turns() -> None:
    env = CalculatorEnv()
    assert env.reset("37*8=", {}) == ""
    assert env.step("<37*8>") == ("=296\n", 0.0, False, {"tool_call": True})
    assert env.step("<37*>") == ("=error\n", 0.0, False, {"tool_call": False})
    assert env.step("296")[2] is True  # no call: the answer, the trajectory ends
    assert env.demonstration("37*8=", {"ground_truth": "296"}) == ["<37*8>", "296"]


def test_guess_number_demonstration_wins() -> None:
    env = GuessNumberEnv(low=1, high=100)
    env.reset("guess", {"uid": "x#0"})
    turns = env.demonstration("guess", {"uid": "x#0"})
    assert 1 <= len(turns) <= 7
    replies = [env.step(t) for t in turns]
    assert replies[-1][:3] == ("correct\n", 1.0, True)
    assert all(r[0] in ("higher\n", "lower\n") for r in replies[:-1])


# ---------------------------------------------------------------- bad environments

BAD_ENVS = textwrap.dedent('''
    import time

    ANY = tuple("0123456789abcdefghijklmnopqrstuvwxyz +-*=?:,.()<>")  # one-token turns

    class Raises:
        stop = ANY
        def reset(self, prompt, sample):
            return ""
        def step(self, action):
            raise RuntimeError("tool crashed")

    class Hangs:
        stop = ANY
        def reset(self, prompt, sample):
            return ""
        def step(self, action):
            time.sleep(5)
            return "late", 0.0, False

    class WrongTypes:
        stop = ANY
        def reset(self, prompt, sample):
            return ""
        def step(self, action):
            return 42, "one", "yes"

    class Huge:
        stop = ANY
        def reset(self, prompt, sample):
            return ""
        def step(self, action):
            return "x" * 5000, 0.0, False

    class Echo:
        stop = ANY
        def __init__(self, reward=0.5):
            self.reward = reward
        def reset(self, prompt, sample):
            return "go:"
        def step(self, action):
            return "ok\\n", self.reward, False

    class Digits:  # turns end at a digit: a few tokens each, of varied lengths
        stop = tuple("0123456789")
        def reset(self, prompt, sample):
            return ""
        def step(self, action):
            return "ok\\n", 0.0, False

    class Tool:  # two turns: a successful tool call, then a failed one
        stop = ANY
        def reset(self, prompt, sample):
            self.n = 0
            return ""
        def step(self, action):
            time.sleep(0.02)
            self.n += 1
            return "ok\\n", 0.0, self.n >= 2, {"tool_call": self.n == 1}

    class Async:
        stop = ANY
        async def reset(self, prompt, sample):
            return "go:"
        async def step(self, action):
            return "ok\\n", 1.0, True

    class Refuses:
        def __init__(self, **config):
            raise ValueError("needs a key")
        def reset(self, prompt, sample):
            return ""
        def step(self, action):
            return "", 0.0, True
''')


@pytest.fixture(scope="module")
def env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("envs") / "bad_envs.py"
    path.write_text(BAD_ENVS)
    return path


@functools.cache
def micro_policy() -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    shape = {**{k: v for k, v in MICRO.items() if k != "model_type"},
             "vocab_size": TOK.vocab_size}
    config = AutoConfig.for_model(model_type="llama", **shape)
    return AutoModelForCausalLM.from_config(config).eval()


def rows_of(n: int, key: str = "calc") -> list[Row]:
    examples = [task_example("calc", 0, "train", i) for i in range(n)]
    return [Row(TOK.encode_prompt(ex.prompt), Trajectory(key=f"{ex.uid}#0"), ex.prompt,
                sample_dict(ex, 0, f"{ex.uid}#0")) for ex in examples]


def turn_engine(rows: int, max_len: int) -> object:
    """The turn engine (KV kept across turns) for `rows` trajectories, eager on the CPU."""
    from rlgraph.bench_mode import EngineKnobs
    from rlgraph.engines.turn_decode import TurnDecoder

    return TurnDecoder(micro_policy(), max_batch=rows, max_len=max_len, eos_token_id=TOK.eos_id,
                       sync_every=4, bench=EngineKnobs(min_width=1))


def run_rows(spec: EnvSpec, rows: list[Row], max_new: int = 12, engine: bool = False,
             slots: int | None = None) -> AgentRollout:
    agent = AgentRollout(spec, TOK, max_new)
    if engine:
        agent.engine = turn_engine(slots or len(rows),
                                   max(len(r.prompt) for r in rows) + max_new + 1)
    with torch.no_grad():
        agent.run_round(rows, micro_policy(), 3, 0, lambda: None, None, eos_id=TOK.eos_id,
                        pad_id=TOK.pad_id, generator=torch.Generator().manual_seed(0))
    return agent


@pytest.mark.parametrize("engine", [False, True], ids=["waves", "turn_engine"])
@pytest.mark.parametrize("cls,reason,text", [
    ("Raises", "error", "step raised RuntimeError: tool crashed"),
    ("Hangs", "timeout", "step took longer than timeout_s 0.3"),
    ("WrongTypes", "error", "observation 42 of type int, not str"),
    ("Huge", "observation_too_long", "5000 tokens, more than max_observation_tokens 256"),
])
def test_bad_env_ends_each_trajectory_with_one_line(env_file: Path, cls: str, reason: str,
                                                    text: str, engine: bool,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rows = rows_of(3)
    spec = EnvSpec(fn=f"{env_file}:{cls}", timeout_s=0.3, max_turns=3)
    agent = run_rows(spec, rows, engine=engine)
    ended = [r.trajectory for r in rows]
    assert all(t.finished for t in ended)
    failed = [t for t in ended if t.reason == reason]
    lines = [x for x in capsys.readouterr().err.splitlines() if "trajectory" in x]
    # every trajectory whose turn reached the env failed; the others ran out of tokens
    assert failed and all(t.reason in (reason, "length") for t in ended)
    assert len(lines) == len(failed) == len(agent.failures)
    assert all(text in line and "trajectory calc:train:" in line for line in lines), lines
    metrics, _ = round_metrics(agent, ended)
    assert metrics[f"env/ended_{reason}"] == len(failed)


def test_round_metrics_count_turns_env_time_and_tool_success(env_file: Path) -> None:
    rows = rows_of(3)  # on 2 slots: the third trajectory waits for one to end
    agent = run_rows(EnvSpec(fn=f"{env_file}:Tool", max_turns=4), rows, max_new=30,
                     engine=True, slots=2)
    trajectories = [r.trajectory for r in rows]
    assert [t.reason for t in trajectories] == ["done"] * 3
    metrics, spans = round_metrics(agent, trajectories, {"wait_s": 0.0, "waves": 1.0,
                                                         "decode_steps": 8.0})
    assert metrics["env/turns_mean"] == metrics["env/turns_max"] == 2
    assert metrics["env/tool_calls"] == 6 and metrics["env/tool_success_rate"] == 0.5
    assert metrics["env/seconds"] >= 6 * 0.02 and len(spans) >= 1
    assert metrics["env/ended_timeout"] == metrics["env/ended_error"] == 0
    assert metrics["env/in_flight"] == 0 and metrics["env/decode_steps"] == 8


def test_replicas_env_counts_add_up_and_means_are_weighted() -> None:
    from rlgraph.rl.batch import combine_metrics

    a = {"env/trajectories": 3.0, "env/turns_mean": 2.0, "env/tool_calls": 4.0,
         "env/tool_success_rate": 0.5, "env/ended_timeout": 1.0, "env/in_flight": 2.0,
         "env/seconds": 1.5, "env/reused_tokens": 100.0, "env/decode_steps": 40.0,
         "env/wait_s": 1.0}
    b = {"env/trajectories": 1.0, "env/turns_mean": 6.0, "env/tool_calls": 0.0,
         "env/ended_timeout": 0.0, "env/ended_error": 1.0, "env/in_flight": 1.0,
         "env/seconds": 0.5, "env/reused_tokens": 20.0, "env/decode_steps": 60.0,
         "env/wait_s": 3.0}
    out = combine_metrics([a, b])
    assert out["env/trajectories"] == 4 and out["env/tool_calls"] == 4
    assert out["env/ended_timeout"] == out["env/ended_error"] == 1
    assert out["env/in_flight"] == 3 and out["env/seconds"] == 2.0
    assert out["env/reused_tokens"] == 120
    assert out["env/turns_mean"] == (3 * 2 + 6) / 4  # per trajectory, not per replica
    assert out["env/tool_success_rate"] == 0.5  # the replica without calls has no rate
    assert out["env/decode_steps"] == 60 and out["env/wait_s"] == 2.0  # side by side


def test_async_env_is_awaited(env_file: Path) -> None:
    rows = rows_of(2)
    run_rows(EnvSpec(fn=f"{env_file}:Async", max_turns=3), rows)
    for r in rows:
        t = r.trajectory
        assert t.context == TOK.encode_text("go:")
        assert t.reason in ("done", "length") and (t.reason != "done" or t.env_reward == 1.0)
    assert any(r.trajectory.reason == "done" for r in rows)


def test_run_refuses_file_env_without_trust_and_unbuildable_env(
        env_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rlgraph.cli.main import main

    graph = (Path(__file__).resolve().parents[3] / "graphs" / "agentic-calculator.yaml")
    text = graph.read_text().replace("fn: calculator", f"fn: {env_file}:Refuses")
    path = tmp_path / "graph.yaml"
    path.write_text(text)
    for extra, expected in ((), "--trust-code"), (("--trust-code",), "could not be built"):
        status = main(["run", str(path), "-o", str(tmp_path / "run"), *extra])
        err = capsys.readouterr().err.strip()
        assert status == 2 and "Traceback" not in err, err
        assert len(err.splitlines()) == 1 and expected in err, err
        assert not (tmp_path / "run").exists()  # nothing started


def test_env_that_cannot_be_built_is_one_line_before_the_run(env_file: Path) -> None:
    from rlgraph.envs.load import check_envs

    spec = make_spec(data={"task": "calc"},
                     generate={"env": {"fn": f"{env_file}:Refuses", "colour": "red"}})
    with pytest.raises(SpecError) as err:
        check_envs(spec, None)
    message = str(err.value)
    assert "nodes.generate.env.fn" in message and "needs a key" in message
    assert len(message.splitlines()) == 1
    with pytest.raises(SpecError, match="has no class 'Nope'"):
        check_envs(make_spec(generate={"env": {"fn": f"{env_file}:Nope"}}), None)


# ---------------------------------------------------------------- the batch


@pytest.mark.parametrize("engine", [False, True], ids=["waves", "turn_engine"])
def test_observations_are_masked_and_rewards_summed(env_file: Path, engine: bool) -> None:
    rows = rows_of(4)
    spec = EnvSpec(fn=f"{env_file}:Echo", max_turns=2, reward=0.5)
    run_rows(spec, rows, max_new=30, engine=engine)
    trajectories = [r.trajectory for r in rows]
    rollout = pack_trajectories([r.prompt for r in rows], trajectories, TOK.pad_id)
    P = rollout.prompt_len
    for i, t in enumerate(trajectories):
        ids, mask, _, _ = t.response()
        assert ids[:3] == TOK.encode_text("go:") and mask[:3] == [0, 0, 0]  # reset's text
        observed = [k for k, m in enumerate(mask) if m == 0]
        sampled = [k for k, m in enumerate(mask) if m == 1]
        assert rollout.response_mask[i, observed].sum() == 0
        assert rollout.attention_mask[i, P:][observed].all()  # read as context
        assert (rollout.token_version[i, observed] == -1).all()
        assert (rollout.behavior_logp[i, observed] == 0).all()
        assert (rollout.token_version[i, sampled] == 3).all()
        if t.reason == "max_turns":
            assert t.turns == 2 and t.env_reward == 1.0 and "ok\n" in t.text(TOK)
    assert any(t.reason == "max_turns" for t in trajectories)


def test_length_batches_hold_a_row_with_observation_holes() -> None:
    from rlgraph.engines.cpu_decode import length_batches

    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]])
    (index, width), = length_batches(mask, 4, 10_000)
    assert width >= 6 and index.tolist() == [0, 1]


# ---------------------------------------------------------------- partial rollout


@pytest.mark.parametrize("engine", [False, True], ids=["waves", "turn_engine"])
def test_partial_rollout_carries_trajectories_and_resumes_exactly(env_file: Path,
                                                                  engine: bool) -> None:
    spec = EnvSpec(fn=f"{env_file}:Digits", max_turns=3)

    def new_agent() -> AgentRollout:
        agent = AgentRollout(spec, TOK, 24)
        if engine:  # the cache's 4 groups of 2 in flight
            agent.engine = turn_engine(8, 40)
        return agent

    def new_cache() -> AgentCache:
        return AgentCache(prompts_per_step=2, samples_per_prompt=2, oversample=2.0, max_lag=1,
                          stale="drop", max_new_tokens=24,
                          prompt_of=lambda p: TOK.encode_prompt(task_example(
                              "calc", 0, "train", p).prompt),
                          key_of=lambda p: f"calc:train:{p}")

    def row_of(group, k, t):
        ex = task_example("calc", 0, "train", group.position)
        return Row(group.prompt, t, ex.prompt, sample_dict(ex, k, t.key))

    policy = micro_policy()

    def round_(cache: AgentCache, agent: AgentRollout, step: int) -> list:
        with torch.no_grad():
            groups, _ = agent_round(cache, agent, step, policy, step, lambda: None, row_of,
                                    eos_id=TOK.eos_id, pad_id=TOK.pad_id,
                                    generator=torch.Generator().manual_seed(step))
        return groups

    cache, agent = new_cache(), new_agent()
    with torch.no_grad():
        first, metrics = agent_round(cache, agent, 0, policy, 0, lambda: None, row_of,
                                     eos_id=TOK.eos_id, pad_id=TOK.pad_id,
                                     generator=torch.Generator().manual_seed(0))
    assert len(first) == 2 and all(g.complete for g in first)
    state = copy.deepcopy(cache.state_dict())
    open_ = [s for g in cache.groups for s in g.samples if not s.finished]
    carried = [s for s in open_ if s.tokens]
    assert carried, "some trajectory should be carried into the next step"
    assert metrics["env/in_flight"] == len(open_)
    # resume: a fresh cache and env pool from the checkpoint go on as the live ones do
    resumed_cache, resumed_agent = new_cache(), new_agent()
    resumed_cache.load_state_dict(state)
    live = round_(cache, agent, 1)
    again = round_(resumed_cache, resumed_agent, 1)
    assert [g.position for g in live] == [g.position for g in again]
    for a, b in zip(live, again):
        for s, t in zip(a.samples, b.samples):
            assert (s.tokens, s.mask, s.actions, s.reason) == (t.tokens, t.mask, t.actions,
                                                               t.reason)
    trained = [g.position for g in first + live]
    assert len(trained) == len(set(trained))  # none duplicated


def test_inflight_trajectories_keep_their_kv_across_swaps_and_rounds(env_file: Path) -> None:
    # in-flight updates (kv: keep) against re-encoding at a swap and at each round, with
    # the same weights under both versions: the same greedy trajectories, fewer prefills;
    # a resume from the checkpoint after step 0 re-encodes and goes on as the live run
    policy = micro_policy()
    states: list[dict] = []

    def row_of(group, k, t):
        ex = task_example("calc", 0, "train", group.position)
        return Row(group.prompt, t, ex.prompt, sample_dict(ex, k, t.key))

    def run(kv: str | None, state: dict | None = None) -> tuple[list, float, AgentRollout, set]:
        agent = AgentRollout(EnvSpec(fn=f"{env_file}:Echo", max_turns=3), TOK, 24,
                             turn_length=lambda key, turn: 6 if key[11] in "13" else 1)
        agent.engine, agent.kv = turn_engine(8, 40), kv  # groups 1 and 3 carried
        cache = AgentCache(prompts_per_step=2, samples_per_prompt=2, oversample=2.0,
                           max_lag=1, stale="drop", max_new_tokens=24,
                           prompt_of=lambda p: TOK.encode_prompt(task_example(
                               "calc", 0, "train", p).prompt),
                           key_of=lambda p: f"calc:train:{p}")
        if state is not None:
            cache.load_state_dict(copy.deepcopy(state))
        calls = iter(range(1000))
        trained, prefilled, carried = [], 0.0, set()
        for step in range(2) if state is None else [1]:
            swap = (lambda: 1 if next(calls) == 1 else None) if step == 0 else (lambda: None)
            with torch.no_grad():  # step 0 swaps in version 1 after its second decode call
                groups, metrics = agent_round(cache, agent, step, policy, step, swap, row_of,
                                              eos_id=TOK.eos_id, pad_id=TOK.pad_id,
                                              temperature=0.0)
            trained += [(s.tokens, s.versions, s.reason) for g in groups for s in g.samples]
            prefilled += metrics["env/prefill_tokens"]
            if step == 0:
                states.append(copy.deepcopy(cache.state_dict()))
                assert metrics["rollout/switches"] == 1
                carried = {s.env_key for g in cache.groups for s in g.samples
                           if s.tokens and not s.finished}
                assert agent.engine.parked_ids == (carried if kv else set())
        return trained, prefilled, agent, carried

    recomputed, recompute_prefill, _, _ = run(None)  # every slot freed at a round's end
    kept, keep_prefill, _, carried = run("keep")  # carried turns paused in their slots
    assert carried and kept == recomputed
    assert {v for tokens, versions, _ in kept for v in versions} - {-1} == {0, 1}
    assert keep_prefill < recompute_prefill
    resumed, _, _, _ = run("keep", states[-1])
    assert resumed == kept[4:]  # step 1's two groups, as the live run trained them


# ---------------------------------------------------------------- the compiler


def test_compiler_prices_turns_and_env_latency() -> None:
    from rl_support import cost_spec

    from rlgraph.compiler.costs import node_costs
    from rlgraph.compiler.placement import place
    from rlgraph.graph import build_graph

    messages: list[str] = []

    def generate(env: dict, cuda_decode: str = "graphs", node: dict | None = None,
                 **schedule: object) -> tuple[float, str]:
        spec = cost_spec(nodes={"generate": {"env": env, "cuda_decode": cuda_decode,
                                             **(node or {})},
                                "reward": {}, "logp": {},
                                "train": {"activation_checkpointing": True},
                                "param_update": {}},
                         schedule={"max_lag": 1, **schedule})
        costs, notes = node_costs(spec, build_graph(spec), place(spec))
        messages[:] = notes
        return costs["generate"].seconds, costs["generate"].detail

    one, detail = generate({"fn": "calculator", "max_turns": 1})
    four, _ = generate({"fn": "calculator", "max_turns": 4})
    assert "multi-turn" in detail and four > one  # more waves, each re-prefilled
    slow, _ = generate({"fn": "calculator", "max_turns": 4, "latency_s": 5.0})
    assert slow >= four + 5.0  # at least one env step a wave
    assert any("the environment bounds the step" in m for m in messages)  # the compiler says so
    partial, detail = generate({"fn": "delay", "max_turns": 8, "turns": 2, "latency_s": 1.0},
                               partial_rollout=True)
    sync, _ = generate({"fn": "delay", "max_turns": 8, "turns": 2, "latency_s": 1.0})
    assert "partial rollout" in detail and partial < sync  # the long tail of turns carried
    inflight, detail = generate({"fn": "delay", "max_turns": 8, "turns": 2, "latency_s": 1.0},
                                node={"inflight": True}, partial_rollout=True)
    assert "in their slots" in detail and inflight < partial  # carried: nothing re-encoded
    with pytest.raises(SpecError, match="turn engine"):  # inflight without the turn engine
        generate({"fn": "delay"}, cuda_decode="dynamic", node={"inflight": True},
                 partial_rollout=True)
    # the turn engine keeps each trajectory's KV: cheaper than waves that re-encode it
    assert "KV kept across turns" in detail
    waves, detail = generate({"fn": "delay", "max_turns": 8, "turns": 2, "latency_s": 1.0},
                             cuda_decode="dynamic")
    assert "waves" in detail and waves > sync


def test_tune_gives_the_fewest_env_workers_that_hold_the_batch(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml
    from rl_support import cost_spec

    from rlgraph.cli.main import main
    from rlgraph.tune.space import env_workers

    spec = cost_spec(nodes={"generate": {"env": {"fn": "delay", "workers": 16, "threads": 8}},
                            "reward": {}, "logp": {}, "train": {}, "param_update": {}})
    node = spec.nodes["generate"]  # 32 prompts x 4 samples = 128 trajectories
    assert env_workers(node, spec, partial=False).env.workers == 16
    assert env_workers(node, spec, partial=True).env.workers == 16  # 256 in flight: capped
    few = node.model_copy(update={"env": node.env.model_copy(update={"threads": 64})})
    assert env_workers(few, spec, partial=False).env.workers == 2
    assert env_workers(spec.nodes["train"], spec, partial=False) is spec.nodes["train"]
    # rlgraph tune writes them into tuned.yaml and says so, also where the user's plan wins
    graph = Path(__file__).parents[3] / "graphs" / "agentic-calculator.yaml"
    out = tmp_path / "tuned.yaml"
    assert main(["tune", str(graph), "nodes.generate.env.workers=8", "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["nodes"]["generate"]["env"]["workers"] == 1
    assert "env workers: generate 1 (the graph's 8)" in capsys.readouterr().out


def test_env_calls_have_their_own_timeline_lane(tmp_path: Path) -> None:
    import json

    from rlgraph.runtime.tracing import Tracer, load_events

    tracer = Tracer(t0=100.0)
    tracer.record("generate", "generate", 0, 100.0, 101.0, ["rollout"])
    tracer.record_env("generate", 0, [(100.2, 100.4), (100.5, 100.6)])
    path = tracer.write(tmp_path / "trace.json", "t", ["rollout"], {"generate": "generate"})
    trace = json.loads(path.read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("name") == "process_name"}
    env = [e for e in trace["traceEvents"] if e.get("cat") == "env"]
    assert len(env) == 2 and {names[e["pid"]] for e in env} == {"env"}
    # a resumed run reads back the task spans only (the env lane names no graph node)
    assert [e["node"] for e in load_events(path)] == ["generate"]
