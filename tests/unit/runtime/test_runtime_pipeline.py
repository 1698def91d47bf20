"""The runtime's state machines and scheduler, driven without Ray on a simulated clock.

The same `Pipeline` the Ray runtime uses is fed completions by a fake executor whose tasks
take fixed durations; its timeline must equal the compiler's simulation (one scheduling
policy), never break a dependency, a group's exclusivity, a channel's capacity or the lag
bound, and a stop + resume from the rollout buffer must train every step exactly once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rl_support import assert_groups_never_overlap
from sim_drive import drive

from rlgraph.compiler.schedule import simulate
from rlgraph.compiler.timed_graph import timed_graph
from rlgraph.config.load import load_spec
from rlgraph.errors import RLGraphError
from rlgraph.graph import build_graph
from rlgraph.runtime.channels import Channel, ChannelError
from rlgraph.runtime.pipeline import Pipeline
from rlgraph.runtime.state_machine import (
    TRANSITIONS,
    Event,
    IllegalTransition,
    NodeMachine,
    NodeState,
)

QUICKSTART = Path(__file__).resolve().parents[3] / "graphs" / "quickstart.yaml"
LAYOUTS = {
    "split": [],
    "hybrid": ["groups={all: {share: 1, tasks: [generate, logp, ref_logp, train]}}"],
    "separate": ["cluster.cpus=4",
                 "groups={g: {share: 0.25, tasks: [generate]}, l: {share: 0.25, tasks: [logp]},"
                 " r: {share: 0.25, tasks: [ref_logp]}, t: {share: 0.25, tasks: [train]}}",
                 "nodes.param_update_logp={kind: param_update, src: train, dst: logp}"],
}


def graph_of(layout: str, max_lag: int):
    spec = load_spec(QUICKSTART, [*LAYOUTS[layout], f"schedule.max_lag={max_lag}"])
    return build_graph(spec)


# ---------------------------------------------------------------- state machine


def test_state_machine_walks_the_seed_cycle_and_refuses_the_rest():
    m = NodeMachine("generate", "generate", ("rollout",))
    m.arm(0)
    assert m.state is NodeState.WAITING_INPUT and m.step == 0
    m.start()
    m.finish("batch")
    assert m.state is NodeState.WAITING_OUTPUT
    assert m.emit() == "batch" and m.state is NodeState.IDLE and m.output is None
    m.arm(1)
    m.close()
    assert m.state is NodeState.DONE
    assert [(a, e, b) for a, e, b, _ in m.history][:4] == [
        (NodeState.IDLE, Event.ARM, NodeState.WAITING_INPUT),
        (NodeState.WAITING_INPUT, Event.START, NodeState.PROCESSING),
        (NodeState.PROCESSING, Event.FINISH, NodeState.WAITING_OUTPUT),
        (NodeState.WAITING_OUTPUT, Event.EMIT, NodeState.IDLE)]
    for state in NodeState:
        for event in Event:
            probe = NodeMachine("x", "train", ())
            probe.state = state
            if (state, event) in TRANSITIONS:
                assert probe.fire(event) is TRANSITIONS[(state, event)]
            else:
                with pytest.raises(IllegalTransition):
                    probe.fire(event)


def test_channel_is_bounded_and_keyed_by_step():
    ch = Channel("generate", "train", 2)
    ch.put(0, "a")
    ch.put(1, "b")
    assert not ch.has_room()
    with pytest.raises(ChannelError):
        ch.put(2, "c")
    assert ch.take(1) == "b" and ch.has_room()
    with pytest.raises(ChannelError):
        ch.take(1)
    with pytest.raises(ChannelError):
        Channel("a", "b", 0)


# ---------------------------------------------------------------- against the compiler


def check_invariants(graph, events, max_lag: int, steps: int) -> None:
    by = {(e["node"], e["step"]): e for e in events}
    kinds = dict(graph.nodes(data="kind"))
    for e in events:
        node, t = e["node"], e["step"]
        assert e["start"] >= by.get((node, t - 1), {"end": 0})["end"] - 1e-9
        for src, _, dist in graph.in_edges(node, data="distance"):
            if dist == 0:
                assert e["start"] >= by[(src, t)]["end"] - 1e-9
            elif (src, t - dist) in by:
                assert e["start"] >= by[(src, t - dist)]["end"] - 1e-9
        if kinds[node] == "generate":
            assert e["version"] >= t - max_lag
    assert_groups_never_overlap(events)
    trains = sorted(e["step"] for e in events if kinds[e["node"]] == "train")
    assert trains == list(range(steps))
    for t in range(steps):  # token lag: train step minus the version that sampled it
        gen = next(e for e in events if kinds[e["node"]] == "generate" and e["step"] == t)
        assert 0 <= t - gen["version"] <= max_lag


durations = st.fixed_dictionaries({
    n: st.sampled_from([0.05, 0.3, 1.0, 2.0, 3.5])
    for n in ("generate", "reward", "logp", "ref_logp", "train", "param_update")})


@settings(max_examples=40, deadline=None)
@given(seconds=durations, max_lag=st.integers(0, 2), layout=st.sampled_from(sorted(LAYOUTS)))
def test_pipeline_equals_the_compilers_simulation(seconds, max_lag, layout):
    graph = graph_of(layout, max_lag)
    seconds = {n: seconds[graph.nodes[n]["kind"] if n not in seconds else n] for n in graph}
    steps = 10
    events = drive(Pipeline(graph, steps=steps, max_lag=max_lag), seconds)
    plain = drive(Pipeline(graph, steps=steps, max_lag=max_lag, chaining=False), seconds)
    assert {(e["node"], e["step"]): e["start"] for e in events} == pytest.approx(
        {(e["node"], e["step"]): e["start"] for e in plain}), "chaining changed the schedule"
    assert not any(e["chained"] for e in plain)
    check_invariants(graph, events, max_lag, steps)
    groups = sorted({g for _, occ in graph.nodes(data="occupies") for g in occ})
    sim = simulate(timed_graph(graph, seconds, groups), steps)
    predicted = {(e["node"], e["step"]): e for e in sim.events(steps)}
    # the runtime skips param_updates whose weights no generate uses: compare before those
    for e in events:
        if e["step"] < steps - max_lag - 3:
            p = predicted[(e["node"], e["step"])]
            assert e["start"] == pytest.approx(p["start"], abs=1e-9), (e, p)


@pytest.mark.parametrize("max_lag", [1, 2])
@pytest.mark.parametrize("train_s", [0.5, 0.8])
def test_lag_gives_real_overlap(max_lag, train_s):
    """Generate-bound (train 0.5): generate(t+1) runs during train(t). Trainer-bound (0.8):
    generate runs max_lag batches ahead, so some generate(t+d), d <= max_lag, does."""
    graph = graph_of("split", max_lag)
    seconds = {"generate": 1.0, "reward": 0.01, "logp": 0.2, "ref_logp": 0.2,
               "train": train_s, "param_update": 0.05}
    events = drive(Pipeline(graph, steps=8, max_lag=max_lag), seconds)
    by = {(e["node"], e["step"]): e for e in events}

    def overlaps(t, d):
        gen, train = by.get(("generate", t + d)), by[("train", t)]
        return gen is not None and gen["start"] < train["end"] and gen["end"] > train["start"]

    if train_s < 0.6 or max_lag == 1:
        assert sum(overlaps(t, 1) for t in range(7)) >= 5
    assert sum(any(overlaps(t, d) for d in range(1, max_lag + 1)) for t in range(7)) >= 5
    assert max(t - by[("generate", t)]["version"] for t in range(8)) >= 1
    assert any(e["chained"] for e in events), "logp -> ref_logp -> train chain on trainer"


def test_max_lag_zero_is_on_policy_and_serial():
    graph = graph_of("split", 0)
    seconds = dict.fromkeys(("generate", "reward", "logp", "ref_logp", "train", "param_update"),
                            0.5)
    events = drive(Pipeline(graph, steps=5, max_lag=0), seconds)
    by = {(e["node"], e["step"]): e for e in events}
    for t in range(5):
        assert by[("generate", t)]["version"] == t
        if t:
            assert by[("generate", t)]["start"] >= by[("param_update", t - 1)]["end"]


@pytest.mark.parametrize("max_lag", [0, 1, 2])
@pytest.mark.parametrize("generate_s", [1.0, 0.3])
def test_stop_and_resume_from_the_rollout_buffer_trains_every_step_once(max_lag, generate_s):
    """A stop asked once train(2) has ended stops at 3, even where train(3) is already
    queued behind logp(3) and ref_logp(3) (a fast generate): it is recalled."""
    graph = graph_of("split", max_lag)
    seconds = {"generate": generate_s, "reward": 0.01, "logp": 0.2, "ref_logp": 0.2,
               "train": 0.6, "param_update": 0.05}
    stopped = Pipeline(graph, steps=8, max_lag=max_lag)
    first = drive(stopped, seconds, stop_after_train=3)
    k = stopped.trained_steps()
    assert k == 3 and not stopped.running, "train(3), queued when the stop came, ran"
    buffer = stopped.rollout_buffer()
    assert all(step >= k for _, step in buffer) and len(buffer) <= max_lag + 1
    if max_lag:
        assert buffer, "with lag, generate ran ahead: its batches must be kept"
    resumed = Pipeline(graph, steps=8, max_lag=max_lag, start_step=k, preloaded=buffer)
    second = drive(resumed, seconds)
    trained = [e["step"] for e in first + second if e["node"] == "train"]
    assert sorted(trained) == list(range(8))
    generated = [e["step"] for e in first + second if e["node"] == "generate"]
    assert sorted(generated) == list(range(8)), "a buffered batch was sampled twice or lost"
    for e in second:
        if e["node"] == "generate":
            assert e["version"] >= k


def test_generate_without_weights_is_refused(tmp_path):
    text = QUICKSTART.read_text().replace("  param_update:", "  # param_update:")
    graph_file = tmp_path / "no_sync.yaml"
    graph_file.write_text(text)
    graph = build_graph(load_spec(graph_file))
    assert "param_update" not in graph
    with pytest.raises(RLGraphError, match="never receives new weights"):
        Pipeline(graph, steps=2, max_lag=1)
    hybrid = build_graph(load_spec(graph_file, LAYOUTS["hybrid"]))
    events = drive(Pipeline(hybrid, steps=4, max_lag=1), dict.fromkeys(hybrid, 0.1))
    assert sorted(e["step"] for e in events if e["node"] == "train") == [0, 1, 2, 3]
