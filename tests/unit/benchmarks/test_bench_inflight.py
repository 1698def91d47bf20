"""bench/gpu_inflight.py: the windows its plans are rated over."""

from __future__ import annotations

from bench_support import bench_module

gpu_inflight = bench_module("gpu_inflight")
gpu_longtail = bench_module("gpu_longtail")


def run(prefixes: list[int], train_ends: list[float], later_generate: float | None = None
        ) -> dict:
    """A split run's figures: one train a step ending at `train_ends`, its generate before
    it, and (a run stopped on time) a next step's generate that ended after the last
    train."""
    events = []
    for step, end in enumerate(train_ends):
        events += [{"node": "generate", "step": step, "start": end - 2.0, "end": end - 1.0},
                   {"node": "train", "step": step, "start": end - 1.0, "end": end}]
    if later_generate is not None:
        events.append({"node": "generate", "step": len(train_ends),
                       "start": train_ends[-1] - 1.0, "end": later_generate})
    return {"events": events, "mini_batches": 1, "samples_per_step": 10,
            "groups": {"trainer": {}, "rollout": {}}, "lengths": {"prefix_by_step": prefixes}}


def test_the_prefix_counts_positions_trained_without_a_gap() -> None:
    ledger = [{"step": 1, "prompt_uids": ["d:1", "d:3"]}, {"step": 0, "prompt_uids": ["d:0"]},
              {"step": 2, "prompt_uids": ["d:2", "d:5"]}]
    assert gpu_longtail.prefix_by_step(ledger) == [1, 2, 4]


def test_same_work_ends_each_window_where_the_prefix_is_complete_and_counts_every_sample(
        ) -> None:
    # with in-flight updates the long sample holding position 5 ends at step 3; without,
    # at step 5, after two more steps of other prompts: both windows hold it
    ours = run([1, 3, 4, 8], [10.0, 12.0, 14.0, 30.0])
    theirs = run([1, 2, 4, 5, 5, 9], [10.0, 12.0, 14.0, 16.0, 18.0, 34.0])
    work = gpu_inflight.same_work(ours, theirs)
    assert work["prefix"] == 8 and work["until_step"] == 3 and work["other_until_step"] == 5
    assert work["samples_per_s"] == 30 / 20.0  # steps 1-3 after the warm-up's train end
    assert work["other_samples_per_s"] == round(50 / 24.0, 3)  # steps 1-5, prompts past 8 too
    assert gpu_inflight.same_work(ours, None) == {}


def test_a_run_stopped_on_time_is_rated_up_to_its_last_train() -> None:
    # the next step's generate ended 20 s after the last train: it holds no trained sample
    stopped = run([1, 2, 3], [10.0, 12.0, 14.0], later_generate=34.0)
    assert gpu_inflight.window_rate(stopped) == 20 / 4.0


def test_each_split_pair_runs_at_its_own_max_lag() -> None:
    for lag in gpu_inflight.SPLIT_LAGS:
        for mode in (f"split-partial-lag{lag}", f"split-partial-lag{lag}-inflight"):
            lags = [o for o in gpu_inflight.MODES[mode] if o.startswith("schedule.max_lag=")]
            assert lags == [f"schedule.max_lag={lag}"]
            assert ("nodes.generate.inflight=true" in gpu_inflight.MODES[mode]) == (
                mode.endswith("-inflight"))
        plan = next(p for p in gpu_inflight.PLANS if p[2] == f"split-partial-lag{lag}-inflight")
        assert plan[0].endswith(f"max_lag {lag}") and plan[3] == f"split-partial-lag{lag}"


def test_the_one_gpu_model_waits_on_the_oldest_groups_only_without_the_slack() -> None:
    """bench/inflight_colocated.py over the first two versions of the one-GPU streamed plan
    with in-flight updates: filling the version's window to the brim, the second mini-batch
    call waits thousands of steps for the oldest groups (as the GPU call did: 2912 steps at
    112 rows); with a generate sharing train's GPU keeping the oversample's slack it does
    not, and no sample is dropped either way."""
    model = bench_module("inflight_colocated")
    times = {"train_step_s": 3.9, "train_mini_batch_s": 1.25, "reencode_s": 0.18,
             "call_s": 0.14}
    full, slack = (model.run("stream+inflight", 2, times, ["data.prompts_per_step=32"], reserve)
                   for reserve in (False, True))
    assert full["decode_steps"][1] > 2000 and slack["decode_steps"][1] < 400
    assert full["totals"]["dropped"] == slack["totals"]["dropped"] == 0
