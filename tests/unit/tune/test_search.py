"""`rlgraph tune` (rlgraph/compiler/search*.py): hand-computed optima, exactness against brute
force, never worse than the user's plan, determinism, the CLI's table / tuned yaml / --json."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlgraph.cli.main import main
from rlgraph.compiler import compile_plan
from rlgraph.compiler.placement import place
from rlgraph.config.load import load_spec, validate_spec
from rlgraph.config.safe_yaml import parse_yaml
from rlgraph.errors import SourceMap
from rlgraph.tune import search
from rlgraph.tune.evaluate import Evaluator
from rlgraph.tune.ranking import Leaderboard
from rlgraph.tune.search import _plan_of, _Search, tune
from rlgraph.tune.space import SearchSpace, bell, set_partitions

ROOT = Path(__file__).resolve().parents[3]
TUNE = Path(__file__).parent / "graphs_tune"
SEED_GRAPHS = sorted((ROOT / "graphs").glob("*.yaml"))


def groups_of(plan) -> dict[frozenset, int]:
    """{tasks: GPUs} of a ranked plan, independent of group names and order."""
    return {frozenset(g["tasks"]): g["gpus"] for g in plan.groups}


def brute_force(spec) -> tuple:
    """Rank key of the best plan, simulating every candidate of the space (no pruning)."""
    space = SearchSpace(spec)
    evaluator = Evaluator(space)
    board = Leaderboard(1)
    search = _Search(space, evaluator, board, math.inf)
    for lower, _, _, cand in search.entries():
        ev = evaluator.evaluate(cand)
        if ev.feasible:
            assert lower <= ev.bound_s * (1 + 1e-9), "the cheap lower bound exceeds the bound"
            assert ev.bound_s <= ev.period_s * (1 + 1e-9), "the bound exceeds the period"
            board.offer(_plan_of(ev, space))
    return board.ranked()[0].key()


# ---------------------------------------------------------------- the space


def test_set_partitions_are_bell_many_and_distinct():
    for n in range(1, 7):
        parts = list(set_partitions(list("abcdef"[:n])))
        canon = {frozenset(frozenset(b) for b in p) for p in parts}
        assert len(parts) == len(canon) == bell(n)


def test_sizes_respect_machine_boundaries():
    spec = load_spec(TUNE / "wide-64.yaml")
    space = SearchSpace(spec)
    assert space.sizes == (1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 40, 48, 56, 64)
    assert space.packs([56, 8]) and space.packs([32, 16, 7, 5, 3])
    assert not space.packs([32, 16, 7, 5, 4])  # 7, 5 and 4 need three machines, two are left
    assert not space.packs([7, 7, 7, 7, 7, 7, 7, 7, 2])  # 58 GPUs but 2 does not fit a machine
    assert not space.packs([64, 1])


# ---------------------------------------------------------------- hand-computed optima


def test_colocating_everything_wins():
    """colocate-wins.yaml: 16 gpu-s on 8 GPUs colocated, lag 0: 2.0 s (split: >= 2.25 s)."""
    result = tune(load_spec(TUNE / "colocate-wins.yaml"))
    best = result.best
    assert groups_of(best) == {frozenset({"generate", "train"}): 8}
    assert best.max_lag == 0
    assert best.period_s == pytest.approx(2.0)
    assert result.input.period_s == pytest.approx(2.25)
    assert result.sync_period_s == pytest.approx(2.0)
    assert result.exact
    split = [p for p in result.top if len(p.groups) == 2]
    assert split and min(p.period_s for p in split) == pytest.approx(2.25)


def test_separating_wins_and_ties_go_to_the_smaller_lag():
    """separate-wins.yaml: generate (fixed 4 s) on 1 GPU, train on 7, lag 1: 4.0 s; the user's
    colocated sync plan 7.5 s; lags 2 and 3 tie at 4.0 s, so lag 1 is chosen."""
    result = tune(load_spec(TUNE / "separate-wins.yaml"))
    best = result.best
    assert groups_of(best) == {frozenset({"generate"}): 1, frozenset({"train"}): 7}
    assert best.max_lag == 1
    assert best.period_s == pytest.approx(4.0)
    assert result.input.period_s == pytest.approx(7.5)
    assert result.speedup_vs_input(best) == pytest.approx(1.875)
    assert result.speedup_vs_sync(best) == pytest.approx(1.875)
    assert best.idle_gpus == pytest.approx(0.0, abs=1e-9)


def test_three_forward_passes_share_seven_gpus():
    """three-forward.yaml: generate on 1, {logp, ref_logp, train} on 7, lag 1: 24/7 s."""
    result = tune(load_spec(TUNE / "three-forward.yaml"))
    best = result.best
    assert groups_of(best) == {frozenset({"generate"}): 1,
                               frozenset({"logp", "ref_logp", "train"}): 7}
    assert best.max_lag == 1
    assert best.period_s == pytest.approx(24 / 7)
    assert result.input.period_s == pytest.approx(4.5)


def test_groups_stay_inside_machines():
    """machine-boundary.yaml: train may not take 15 GPUs of 2 x 8; 8 + 8, lag 1: 7.5 s."""
    result = tune(load_spec(TUNE / "machine-boundary.yaml"))
    best = result.best
    assert groups_of(best) == {frozenset({"generate"}): 8, frozenset({"train"}): 8}
    assert best.period_s == pytest.approx(7.5)
    for group in compile_plan(best.spec)["placement"]["groups"]:
        assert len({node for node, _ in group["devices"]}) == 1


def test_calibration_scales_costs_to_every_candidate():
    """Measured train twice its modelled 28 / 8 s: as if 56 gpu-s; 1 + 7 GPUs gives 8 s."""
    spec = load_spec(TUNE / "separate-wins.yaml")
    result = tune(spec, calibration={"train": 7.0, "generate": 4.0})
    assert result.input.period_s == pytest.approx(11.0)
    assert groups_of(result.best) == {frozenset({"generate"}): 1, frozenset({"train"}): 7}
    assert result.best.period_s == pytest.approx(8.0)
    assert result.plan["schedule"]["period_s"] == pytest.approx(8.0)
    assert result.plan["costs"]["train"]["source"] == "calibrated"


# ---------------------------------------------------------------- exactness and safety


@settings(max_examples=16, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(costs=st.lists(st.tuples(st.sampled_from(["seconds", "gpu_seconds", "model"]),
                                st.integers(1, 24)), min_size=4, max_size=4),
       with_ref=st.booleans(), reward=st.integers(0, 3), max_lag=st.integers(0, 2),
       partial=st.booleans(), machines=st.sampled_from([1, 2]))
def test_pruned_search_equals_brute_force(costs, with_ref, reward, max_lag, partial, machines):
    """The bound-pruned enumeration finds the same best plan as simulating every candidate
    (3 or 4 GPU tasks, fixed / per-GPU / modelled costs, 8 GPUs on 1 or 2 machines), and it
    is never worse than the user's plan."""
    nodes = {"generate": {"kind": "generate"}, "logp": {"kind": "logp"},
             "train": {"kind": "train"}, "ref_logp": {"kind": "ref_logp"}}
    if not with_ref:
        del nodes["ref_logp"]
    for (field, value), node in zip(costs, nodes.values()):
        if field != "model":
            node["cost"] = {field: float(value)}
    nodes["reward"] = {"kind": "reward", "cost": {"seconds": reward / 2}}
    nodes["param_update"] = {"kind": "param_update", "cost": {"seconds": 0.25}}
    trainer = ["logp", "train", "ref_logp"] if with_ref else ["logp", "train"]
    data = {"name": "random", "cluster": {"nodes": machines, "gpus_per_node": 8 // machines},
            "data": {"prompts_per_step": 840, "samples_per_prompt": 1},
            "groups": {"trainer": {"share": 0.5, "tasks": trainer},
                       "rollout": {"share": 0.5, "tasks": ["generate"]}},
            "nodes": nodes, "schedule": {"max_lag": max(max_lag, partial),
                                         "partial_rollout": partial}}
    spec = validate_spec(data, SourceMap())
    result = tune(spec, top=1)
    assert result.exact
    assert result.best.key()[:4] == brute_force(spec)[:4]
    assert result.best.period_s <= result.input.period_s * (1 + 1e-9)


def test_tune_imports_neither_torch_nor_ray_nor_rich():
    code = ("import sys, rlgraph.tune.search as s, rlgraph.config.load as p; "
            "s.tune(p.load_spec(sys.argv[1])); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'rich'}))")
    out = subprocess.run([sys.executable, "-c", code, str(TUNE / "three-forward.yaml")],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("path", SEED_GRAPHS, ids=lambda p: p.stem)
def test_never_worse_than_the_seed_config(path, tmp_path, monkeypatch):
    """Every graph in graphs/: the best plan's period <= the user's, plan.json agrees, and
    the tuned yaml compiles to the same placement and period. No wall-time budget: on a
    loaded machine a timed-out search would return another "best found" plan than the CLI's
    run (the search itself is deterministic), so both runs must finish exactly."""
    monkeypatch.setattr(search, "TIME_BUDGET_S", math.inf)
    spec = load_spec(path)
    result = tune(spec)
    best = result.best
    assert result.exact or result.method == "local search"
    assert result.input is not None, result.input_error
    assert best.period_s <= result.input.period_s * (1 + 1e-9)
    assert best.max_lag <= spec.schedule.max_lag
    assert result.plan["schedule"]["period_s"] == pytest.approx(best.period_s, rel=1e-9)
    out = tmp_path / "tuned.yaml"
    assert main(["tune", str(path), "-o", str(out), "--json"]) == 0
    tuned = load_spec(out)
    plan = compile_plan(tuned)
    assert plan["schedule"]["period_s"] == pytest.approx(best.period_s, rel=1e-9)
    assert {frozenset(g["tasks"]): g["gpus"] for g in plan["placement"]["groups"]} == \
        groups_of(best)


def test_refused_input_is_reported_and_a_plan_is_still_found():
    """tp 3 does not divide the user's 4-GPU rollout group: tune says so and finds a plan
    whose generate group is a multiple of 3."""
    spec = load_spec(TUNE / "separate-wins.yaml",
                     ["nodes.generate.tp=3", "groups={r: {share: 0.5, tasks: [generate]},"
                      " t: {share: 0.5, tasks: [train]}}"])
    result = tune(spec)
    assert result.input is None and "tp 3" in result.input_error
    gen = next(g for g in result.best.groups if "generate" in g["tasks"])
    assert gen["gpus"] % 3 == 0
    place(result.best.spec)  # accepted by the placement pass


def test_local_search_is_deterministic_and_reaches_the_optimum():
    spec = load_spec(TUNE / "three-forward.yaml")
    runs = [tune(spec, seed=seed, method="local search") for seed in (0, 0, 1)]
    assert [p.key() for p in runs[0].top] == [p.key() for p in runs[1].top]
    for run in runs:
        assert not run.exact
        assert run.best.period_s == pytest.approx(24 / 7)


def test_tp_choices_are_searched():
    spec = load_spec(ROOT / "graphs" / "verl-one-step-off.yaml")
    result = tune(spec, tp_choices=[1, 2, 4])
    assert result.best.tp in (1, 2, 4)
    plain = tune(spec)
    assert result.best.period_s <= plain.best.period_s * (1 + 1e-9)
    assert result.best.spec.nodes["generate"].tp == result.best.tp


def test_64_gpu_space_in_under_10_seconds():
    spec = load_spec(TUNE / "wide-64.yaml")
    started = time.perf_counter()
    result = tune(spec)
    assert time.perf_counter() - started < 10
    assert result.exact and result.method == "enumeration"
    assert result.best.period_s <= result.input.period_s


# ---------------------------------------------------------------- CLI


def test_cli_table_and_tuned_yaml_keep_the_users_keys(tmp_path, capsys):
    src = TUNE / "separate-wins.yaml"
    out = tmp_path / "tuned.yaml"
    assert main(["tune", str(src), "data.prompt_len=32", "-o", str(out), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "vs sync" in text and "yours" in text and "1.88×" in text
    original, _ = parse_yaml(src.read_text())
    tuned = yaml.safe_load(out.read_text())
    assert tuned["data"]["prompt_len"] == 32  # the override is kept
    original["data"]["prompt_len"] = 32
    for key in original:
        if key not in ("groups", "schedule"):
            assert tuned[key] == original[key], key
    assert tuned["schedule"] == {"max_lag": 1}
    assert sorted(g["share"] * 8 for g in tuned["groups"].values()) == [1, 7]


def test_cli_json_prints_only_the_plan(capsys):
    assert main(["tune", str(TUNE / "colocate-wins.yaml"), "--json", "--seed", "3"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["schedule"]["period_s"] == pytest.approx(2.0)
    assert [g["gpus"] for g in plan["placement"]["groups"]] == [8]


def test_cli_bad_tp_is_a_clear_error(capsys):
    assert main(["tune", str(TUNE / "colocate-wins.yaml"), "--tp", "two"]) == 2
    err = capsys.readouterr().err
    assert "--tp two" in err and "Traceback" not in err


def test_cli_calibrate_reads_a_run_dirs_trace(tmp_path, capsys):
    """A run whose train took 7 s a step (model: 3.5 s) retunes as in the calibration test."""
    spans = [{"ph": "X", "name": node, "ts": step * 20e6, "dur": seconds * 1e6,
              "pid": 1, "tid": 1, "args": {"node": node, "step": step}}
             for step in range(4) for node, seconds in (("generate", 4.0), ("train", 7.0))]
    (tmp_path / "trace.json").write_text(json.dumps({"traceEvents": spans}))
    argv = ["tune", str(TUNE / "separate-wins.yaml"), "--calibrate", str(tmp_path), "--json"]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["schedule"]["period_s"] == pytest.approx(8.0)
    assert sorted(g["gpus"] for g in plan["placement"]["groups"]) == [1, 7]
    assert main(["tune", str(TUNE / "separate-wins.yaml"), "--calibrate",
                 str(tmp_path / "missing")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_a_long_tail_beyond_the_users_lag_bound_is_reported_not_adopted(capsys):
    # the one-GPU long-tail graph allows no lag: the search keeps the synchronous plan, and
    # reports partial rollout at a larger max_lag (the long tail the sync batch waits for)
    graph = ROOT / "bench" / "graphs_gpu" / "longtail-1gpu.yaml"
    result = tune(load_spec(graph))
    assert result.best.max_lag == 0 and not result.best.partial_rollout
    beyond = result.beyond_bound
    assert beyond is not None and beyond["partial_rollout"] and beyond["max_lag"] >= 1
    assert beyond["period_s"] < result.best.period_s / 1.5
    assert result.to_dict()["beyond_bound"] == beyond
    # no tail: every response as long as the others, nothing to gain beyond the bound
    flat = load_spec(graph, ["data.response_len={mean: 512, max: 512}"])
    assert tune(flat).beyond_bound is None
    assert main(["tune", str(graph), "-o", str(ROOT / "out" / "tune-beyond.yaml")]) == 0
    assert "beyond your bound: partial rollout at max_lag" in capsys.readouterr().out
    (ROOT / "out" / "tune-beyond.yaml").unlink()
