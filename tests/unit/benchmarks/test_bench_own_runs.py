"""bench/own_runs.py: which measured figure a run is priced against."""

from __future__ import annotations

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
