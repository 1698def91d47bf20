"""Timeline rendering: Chrome trace round trip, flow arrows, HTML without network, real PNG."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from timeline_support import fake_plan, simulate

from rlgraph.report.chrome_trace import chrome_trace, events_from_trace
from rlgraph.report.timeline import (
    fmt_seconds,
    render_html,
    steady_period,
    write_timeline,
)


def test_simulated_pipeline_overlaps_generate_with_train() -> None:
    events = simulate(8, max_lag=1)
    span = {(e["node"], e["step"]): (e["start"], e["end"]) for e in events}
    overlaps = [t for t in range(7) if span[("generate", t + 1)][0] < span[("train", t)][1]]
    assert overlaps, "with max_lag 1 generate(t+1) must run while train(t) runs"
    sync = simulate(8, max_lag=0)
    sync_span = {(e["node"], e["step"]): (e["start"], e["end"]) for e in sync}
    assert all(sync_span[("generate", t + 1)][0] >= sync_span[("param_update", t)][1]
               for t in range(7))


def test_chrome_trace_has_processes_threads_and_one_span_per_occupied_group() -> None:
    plan = fake_plan(steps=6)
    events = plan["schedule"]["events"]
    trace = chrome_trace(events, "t", ["trainer", "ref", "rollout"])
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert names == {1: "trainer", 2: "ref", 3: "rollout", 4: "cpu"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all(isinstance(e["pid"], int) and isinstance(e["tid"], int) for e in spans)
    updates = [e for e in spans if e["name"] == "param_update"]
    assert len(updates) == 2 * 6 and {e["pid"] for e in updates} == {1, 3}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta
               if e["name"] == "thread_name"}
    for span in spans:
        assert threads[(span["pid"], span["tid"])] == span["name"]
        assert span["cat"] == span["name"]  # kind of each node in this plan = its name
    assert json.loads(json.dumps(trace)) == trace


def test_flow_arrows_join_generate_and_train_of_the_same_step() -> None:
    events = simulate(6, max_lag=1)
    trace = chrome_trace(events, "t", ["trainer", "ref", "rollout"])
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    starts = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "s"}
    ends = {e["id"]: e for e in trace["traceEvents"] if e["ph"] == "f"}
    assert len(starts) == len(ends) == 6 and starts.keys() == ends.keys()
    for flow_id, s in starts.items():
        f = ends[flow_id]
        step = int(s["name"].split()[-1])
        gen = next(e for e in spans if e["name"] == "generate" and e["args"]["step"] == step)
        train = next(e for e in spans if e["name"] == "train" and e["args"]["step"] == step)
        assert gen["ts"] <= s["ts"] <= gen["ts"] + gen["dur"] and s["pid"] == gen["pid"]
        assert f["ts"] == train["ts"] and f["pid"] == train["pid"] and f["bp"] == "e"


def test_events_survive_the_round_trip() -> None:
    events = simulate(5, max_lag=2)
    back = events_from_trace(chrome_trace(events, "t"))
    assert len(back) == len(events)
    key = lambda e: (e["node"], e["step"])  # noqa: E731
    for a, b in zip(sorted(events, key=key), sorted(back, key=key)):
        assert (a["node"], a["step"], a["group"], a["occupies"]) == \
               (b["node"], b["step"], b["group"], b["occupies"])
        assert b["start"] == pytest.approx(a["start"], abs=1e-6)
        assert b["end"] == pytest.approx(a["end"], abs=1e-6)
        assert b["kind"] == a["node"]


event_strategy = st.fixed_dictionaries({
    "node": st.sampled_from(["generate", "train", "reward", "param_update", "my_scorer"]),
    "step": st.integers(0, 50),
    "start": st.floats(0, 1e4, allow_nan=False),
    "dur": st.floats(0, 100, allow_nan=False),
    "occupies": st.lists(st.sampled_from(["a", "b", "c"]), max_size=2, unique=True),
})


@settings(max_examples=60, deadline=None)
@given(st.lists(event_strategy, max_size=25))
def test_round_trip_property(raw: list[dict]) -> None:
    unique = {(r["node"], r["step"]): r for r in raw}.values()  # a node runs a step once
    events = [{"node": r["node"], "step": r["step"], "start": r["start"],
               "end": r["start"] + r["dur"], "group": (r["occupies"] or [None])[0],
               "occupies": r["occupies"]} for r in unique]
    trace = chrome_trace(events, "prop")
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == sum(max(1, len(e["occupies"])) for e in events)
    back = {(e["node"], e["step"]): e for e in events_from_trace(trace)}
    assert back.keys() == {(e["node"], e["step"]) for e in events}
    for e in events:
        b = back[(e["node"], e["step"])]
        assert b["occupies"] == e["occupies"] and b["group"] == e["group"]
        assert b["end"] - b["start"] == pytest.approx(e["end"] - e["start"], abs=1e-5)


def test_steady_period_reads_the_pipeline_rate() -> None:
    events = simulate(20, max_lag=1)
    ends = sorted(e["end"] for e in events if e["node"] == "train")
    assert steady_period(events) == pytest.approx(ends[-1] - ends[-2], rel=1e-6)
    assert steady_period(events[:3]) is None


@pytest.mark.parametrize("seconds, text", [(2.5e-4, "250 µs"), (0.0123, "12.3 ms"),
                                           (2.414, "2.41 s"), (612.4, "612 s"), (None, "–")])
def test_fmt_seconds(seconds: float | None, text: str) -> None:
    assert fmt_seconds(seconds) == text


def test_html_is_self_contained_and_labels_every_lane() -> None:
    plan = fake_plan()
    page = render_html(plan)
    assert page.count("<svg") == 1 and "</html>" in page
    assert not re.search(r"(src|href)\s*=\s*[\"']?https?:", page)
    assert "<script" not in page and "http" not in page
    for lane in ("trainer (4 GPUs)", "ref (2 GPUs)", "rollout (2 GPUs)", ">cpu<"):
        assert lane in page
    events = plan["schedule"]["events"]
    window = max(e["end"] for e in events if e["step"] < 10)
    drawn = [e for e in events if e["start"] < window]  # the first 10 steps' time window
    assert any(e["step"] >= 10 for e in drawn)
    bars = sum(max(1, len(e["occupies"])) for e in drawn)
    assert page.count("<title>") == 1 + bars  # the page title + one hover title per bar
    assert "period 1.1 s/step" in page and "speedup 1.91×" in page
    assert "steps 0–9 of 16" in page


def test_write_timeline_with_measured_draws_both(tmp_path: Path) -> None:
    plan = fake_plan()
    measured = simulate(12, max_lag=1, scale=1.2)
    paths = write_timeline(tmp_path, plan, measured)
    assert [p.name for p in paths] == ["timeline.json", "timeline.html", "timeline.png"]
    trace = json.loads(paths[0].read_text())
    assert len(events_from_trace(trace)) == len(plan["schedule"]["events"])
    assert trace["otherData"]["period_s"] == 1.1
    page = paths[1].read_text()
    assert page.count("<svg") == 2 and "measured (run)" in page
    assert f"measured period {fmt_seconds(steady_period(measured))}/step" in page
    png = paths[2].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(paths[2]).shape
    assert width > 1000 and height > 500
