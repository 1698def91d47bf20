"""bench/own_runs.py: which measured figure a run is priced against."""

from __future__ import annotations

import json

from bench_support import bench_module

from rlgraph import lengths

own_runs = bench_module("own_runs")


def test_a_streamed_run_that_only_filled_its_pipeline_has_no_steady_state() -> None:
    filled = {"mini_batches": 4, "max_lag": 3, "step_s_all": [1.0] * 16}  # 4 versions
    assert own_runs.only_filled(filled)
    assert not own_runs.only_filled(dict(filled, step_s_all=[1.0] * 20))  # a fifth version
    assert not own_runs.only_filled(dict(filled, version_s=[1.0] * 10))
    assert not own_runs.only_filled({"step_s_all": [1.0] * 2})  # not streamed


def test_the_stated_mean_reproduces_the_measured_clipped_mean() -> None:
    class Stated:
        mean, max, dist, sigma, alpha = 512.0, 4096, "lognormal", 1.5, 1.5

    mean = own_runs.stated_mean(Stated, 420.0)
    assert mean > 420.0  # the clip at max takes mass off the top
    model = lengths.LengthModel(mean, 4096, "lognormal", 1.5)
    assert abs(lengths.moments(model)[0] - 420.0) < 1e-3
    # a clipped lognormal's mean tops out below max: past it the answer stays below max
    assert own_runs.stated_mean(Stated, 5000.0) < 4096


def test_every_run_of_a_result_file_is_found_at_any_depth() -> None:
    data = {"graph": {"name": "inline"}, "command": "python bench/x.py",
            "modes": {"sync": {"schedule": {"max_lag": 0}, "step_s": [3.0, 1.0, 2.0]}},
            "part": {"runs": {"a": {"graph": "g.yaml", "overrides": ["k.a=1"],
                                    "step_s_median": 2.0}}},
            "notes": ["no run here"]}
    found = own_runs.find_runs("f.json", data)
    assert [f.name for f in found] == ["sync", "part/a"]
    assert [f.section for f in found] == ["", "part"]
    assert found[0].graph == {"name": "inline"} and found[1].graph == "g.yaml"
    assert own_runs.measured_step(found[0].run) == 1.5  # after the warm-up step
    graph, overrides = own_runs.graph_of(found[0])
    assert graph == {"name": "inline"} and overrides == ["schedule.max_lag=0"]


def test_a_scale_plan_kept_only_as_its_summary_row_gets_its_script_overrides() -> None:
    file = own_runs.RESULTS / "gpu-scale.json"
    found = {f.name: f for f in own_runs.find_runs(file.name, json.loads(file.read_text()))}
    graph, overrides = own_runs.graph_of(found["split-fsdp-partial-lag3"])
    assert graph.name == "colocated-sync.yaml"
    assert "nodes.train.sharding=fsdp" in overrides
    assert "cluster.gpus_per_node=4" in overrides and "schedule.max_lag=3" in overrides


def test_a_run_is_priced_as_the_engine_revision_that_measured_it() -> None:
    recorded = {"machine": {"engine_revision": "one_copy"},
                "modes": {"a": {"graph": "g.yaml", "step_s_median": 1.0},
                          "b": {"graph": "g.yaml", "step_s_median": 1.0,
                                "machine": {"engine_revision": "per_slot"}}}}
    found = {f.name: f for f in own_runs.find_runs("new.json", recorded)}
    assert own_runs.engine_revision_of(found["a"]) == "one_copy"  # the file's record
    assert own_runs.engine_revision_of(found["b"]) == "per_slot"  # the run's own wins
    silent = {"runs": [{"name": "x", "graph": "g.yaml", "step_s_median": 1.0}]}
    (old,) = own_runs.find_runs("gpu-e2e-dp.json", silent)
    assert own_runs.engine_revision_of(old) == own_runs.OLDEST_ENGINE
    (tagged,) = own_runs.find_runs("gpu-agentic.json", silent)  # a date without its time
    assert own_runs.engine_revision_of(tagged) == "one_copy"
    for date, engine in (("2026-11-27 13:58 UTC", "one_copy"), ("2026-11-27 08:13 UTC",
                                                                  "per_slot")):
        dated = dict(silent, parts={"a": {"date": date}})
        (run,) = own_runs.find_runs("new.json", dated)
        assert own_runs.engine_revision_of(run) == engine, date


def test_only_a_run_whose_policy_chose_its_lengths_is_priced_at_its_trained_mean() -> None:
    forced = own_runs.spec_of(own_runs.ROOT / "bench/graphs_gpu/longtail-1gpu.yaml", [])
    chosen = own_runs.spec_of(own_runs.ROOT / "graphs/longtail.yaml", [])
    assert not own_runs.policy_lengths(forced) and own_runs.policy_lengths(chosen)


def test_a_short_window_is_priced_as_the_rounds_it_holds() -> None:
    """The window of a run's spans names the generate calls it holds; a colocated partial
    rollout whose window begins before the round simulation's warm-up is priced over those
    rounds, a split one (its generator runs ahead of train) and a late window are not."""
    events = [{"node": "generate", "step": 0, "start": 0.0, "end": 10.0},
              {"node": "generate", "step": 1, "start": 10.0, "end": 14.0},
              {"node": "train", "step": 0, "start": 14.0, "end": 15.0},
              {"node": "train", "step": 1, "start": 15.0, "end": 16.0},
              {"node": "generate", "step": 2, "start": 16.0, "end": 26.0},
              {"node": "train", "step": 2, "start": 26.0, "end": 27.0},
              {"node": "generate", "step": 3, "start": 27.0, "end": 30.0},
              {"node": "train", "step": 3, "start": 30.0, "end": 31.0}]
    run = {"events": events, "partial_rollout": True, "step_s_all": [15, 1, 11, 4]}
    assert own_runs.window_of(run) == (7.5, (2, 4))
    assert own_runs.measured_rounds(run) == (2, 4)
    assert own_runs.measured_rounds({"step_s_all": [9.0, 1.0, 2.0, 3.0], "step_s_steady_mean": 2,
                                     "partial_rollout": True}) == (1, 3)
    graph = own_runs.ROOT / "bench" / "graphs_gpu" / "longtail-1gpu.yaml"
    partial = ["schedule.partial_rollout=true", "schedule.max_lag=2"]
    spec = own_runs.spec_of(graph, partial)
    assert own_runs.settles_after(spec, (2, 4))
    assert not own_runs.settles_after(spec, (own_runs.WARMUP, own_runs.WARMUP + 2))
    assert not own_runs.settles_after(own_runs.spec_of(graph, []), (2, 4))  # synchronous
    split = own_runs.spec_of(graph, [*partial, "cluster.gpus_per_node=2", 'groups={"t": '
                                     '{"share": 0.5, "tasks": ["logp", "train"]}, "r": '
                                     '{"share": 0.5, "tasks": ["generate"]}}'])
    assert not own_runs.settles_after(split, (2, 4))
