"""The `rlgraph` command end to end: compile (--json, files, overrides), schema, timeline,
and the lazily imported run / tune entry points."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlgraph.cli.main import PLAN_FILES, CLIError, _lazy, main, out_dir_for, parse_args
from rlgraph.errors import MissingDependencyError, SpecError
from rlgraph.report.summary import device_ranges

ROOT = Path(__file__).resolve().parents[3]
GRAPHS = sorted((ROOT / "graphs").glob("*.yaml"))
QUICKSTART = ROOT / "graphs" / "quickstart.yaml"
PLAN_KEYS = {"name", "spec", "placement", "costs", "lag", "schedule", "channels", "messages"}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _compiler_ready() -> bool:
    try:
        from rlgraph.compiler import compile_plan  # noqa: F401
    except ImportError:
        return False
    return True


needs_compiler = pytest.mark.skipif(not _compiler_ready(), reason="rlgraph.compiler not built")


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


# ---------------------------------------------------------------- parsing


def test_overrides_may_follow_options() -> None:
    args = parse_args(["run", "g.yaml", "a.b=1", "--steps", "3", "c=2", "--resume", "d"])
    assert (args.graph, args.overrides, args.steps, args.resume) == ("g.yaml", ["a.b=1", "c=2"],
                                                                     3, "d")
    args = parse_args(["compile", "g.yaml", "-o", "x", "schedule.max_lag=-1", "--json"])
    assert args.overrides == ["schedule.max_lag=-1"] and args.out == "x" and args.json
    args = parse_args(["tune", "g.yaml", "--top", "3", "-o", "t.yaml", "--tp", "1,2"])
    assert (args.top, args.out, args.overrides, args.tp, args.seed) == (3, "t.yaml", [], "1,2", 0)
    args = parse_args(["run", "g.yaml", "--no-progress", "--checkpoint-every", "5"])
    assert (args.progress, args.checkpoint_every, args.steps) == (False, 5, None)


def test_an_unknown_baseline_system_is_one_line_with_the_known_ones(
        capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(capsys, "compile", "g.yaml", "--baseline", "versl")
    assert status == 2 and "--baseline: unknown system 'versl'" in err
    assert "did you mean 'verl'?" in err and "prime-rl" in err and "Traceback" not in err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(capsys, "compile", "g.yaml", "--bogus")
    assert status == 2 and "unrecognized arguments: --bogus" in err
    status, _, err = run_cli(capsys, "schema", "x=1")
    assert status == 2 and "unrecognized arguments: x=1" in err
    status, _, err = run_cli(capsys)
    assert status == 2 and "usage: rlgraph" in err


def test_out_dir_default_is_named_after_the_graph() -> None:
    assert out_dir_for("dots hybrid/v2") == Path("out/dots-hybrid-v2")
    assert out_dir_for("///") == Path("out/graph")


def test_device_ranges() -> None:
    assert device_ranges([[0, 0], [0, 1], [0, 2], [0, 3]]) == "n0:0-3"
    assert device_ranges([[n, g] for n in (2, 3) for g in range(8)]) == "n2-3:0-7"
    assert device_ranges([[0, 6], [0, 7], [1, 0], [1, 2]]) == "n0:6-7 n1:0,2"


# ---------------------------------------------------------------- schema


def test_schema_is_json_schema_of_graph_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(capsys, "schema")
    schema = json.loads(out)
    assert status == 0 and err == ""
    assert {"nodes", "groups", "schedule", "cluster"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False


# ---------------------------------------------------------------- lazy subsystems


def test_absent_subsystem_is_a_clear_error() -> None:
    with pytest.raises(CLIError, match=r"rlgraph\.nonexistent does not exist"):
        _lazy("rlgraph.nonexistent", "run_main", "run")
    with pytest.raises(CLIError, match=r"rlgraph\.errors has no run_main\(\) yet"):
        _lazy("rlgraph.errors", "run_main", "run")


def test_missing_dependency_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "needs_pkg.py").write_text("import not_a_real_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingDependencyError, match="not_a_real_package_xyz"):
        _lazy("needs_pkg", "run_main", "run")


def test_run_and_tune_receive_the_parsed_args(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    seen = {}

    def fake_lazy(module: str, attr: str, command: str):
        def entry(args):
            seen[command] = (module, attr, args)
            return 7
        return entry

    monkeypatch.setattr("rlgraph.cli.main._lazy", fake_lazy)
    assert main(["run", "g.yaml", "x=1", "--steps", "2", "--address", "auto"]) == 7
    module, attr, args = seen["run"]
    assert (module, attr) == ("rlgraph.cli.run", "run_main")
    assert (args.graph, args.overrides, args.steps, args.address) == ("g.yaml", ["x=1"], 2,
                                                                      "auto")
    assert main(["tune", "g.yaml", "--json"]) == 7
    assert seen["tune"][:2] == ("rlgraph.cli.tune", "run_tune")


def test_user_errors_print_one_line_but_bugs_keep_their_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(args):
        raise SpecError("tp 3 does not divide 4", ("nodes", "train", "tp"), hint="use 1, 2, 4")

    monkeypatch.setattr("rlgraph.cli.main._lazy", lambda *a: refuse)
    status, out, err = run_cli(capsys, "run", str(QUICKSTART))
    assert status == 2 and out == ""
    assert err == "graph.yaml:1:1: nodes.train.tp: tp 3 does not divide 4 (use 1, 2, 4)\n"

    def crash(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("rlgraph.cli.main._lazy", lambda *a: crash)
    with pytest.raises(ZeroDivisionError):
        main(["run", str(QUICKSTART)])


# ---------------------------------------------------------------- timeline RUN_DIR


def test_timeline_redraws_a_run_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from timeline_support import fake_plan, simulate

    from rlgraph.report.chrome_trace import chrome_trace

    (tmp_path / "plan.json").write_text(fake_plan().to_json())
    (tmp_path / "trace.json").write_text(json.dumps(chrome_trace(simulate(8, 1, 1.3), "run")))
    status, out, err = run_cli(capsys, "timeline", str(tmp_path))
    assert status == 0 and err == "", err
    assert "predicted and measured" in out
    page = (tmp_path / "timeline.html").read_text()
    assert page.count("<svg") == 2 and "measured (run)" in page
    assert (tmp_path / "timeline.png").read_bytes()[:8] == PNG_SIGNATURE


def test_timeline_refuses_a_dir_without_plan(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(capsys, "timeline", str(tmp_path))
    assert status == 2 and "plan.json: no such file" in err and "Traceback" not in err
    (tmp_path / "plan.json").write_text('{"name": "x",\n "schedule": }')
    status, _, err = run_cli(capsys, "timeline", str(tmp_path))
    assert status == 2 and "plan.json:2:" in err and "not valid JSON" in err


# ---------------------------------------------------------------- compile (needs the compiler)


@needs_compiler
def test_compile_json_prints_the_plan_and_nothing_else(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    status, out, err = run_cli(capsys, "compile", str(QUICKSTART), "--json")
    assert status == 0 and err == ""
    plan = json.loads(out)
    assert set(plan) >= PLAN_KEYS
    assert plan["name"] == "quickstart"
    assert plan["schedule"]["period_s"] >= plan["schedule"]["bound_s"] > 0
    assert not (tmp_path / "out").exists(), "--json without -o writes no files"
    status, out, err = run_cli(capsys, "compile", str(QUICKSTART), "--json", "-o", "given")
    assert status == 0 and err == "" and json.loads(out)["name"] == "quickstart"
    assert sorted(p.name for p in (tmp_path / "given").iterdir()) == sorted(PLAN_FILES)


@needs_compiler
def test_compile_writes_four_files_that_parse(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    status, out, err = run_cli(capsys, "compile", str(QUICKSTART), "-o", str(tmp_path), "--png")
    assert status == 0 and err == "", err
    assert "speedup" in out and "period" in out and f"wrote {tmp_path}/" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert set(plan) >= PLAN_KEYS
    trace = json.loads((tmp_path / "timeline.json").read_text())
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"]
    groups = {g["name"] for g in plan["placement"]["groups"]}
    assert groups <= {e["args"]["name"] for e in meta}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans and all(isinstance(e["pid"], int) for e in spans)
    assert any(e["ph"] == "s" for e in trace["traceEvents"])
    page = (tmp_path / "timeline.html").read_text()
    assert "<svg" in page and not re.search(r"(src|href)\s*=\s*[\"']?https?:", page)
    png = (tmp_path / "timeline.png").read_bytes()
    assert png[:8] == PNG_SIGNATURE and len(png) > 20_000
    import matplotlib.image

    assert matplotlib.image.imread(tmp_path / "timeline.png").shape[1] > 1000


@needs_compiler
def test_overrides_change_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    graph = str(ROOT / "graphs" / "verl-one-step-off.yaml")
    _, out, _ = run_cli(capsys, "compile", graph, "--json")
    base = json.loads(out)
    status, out, err = run_cli(capsys, "compile", graph, "schedule.max_lag=0",
                               "groups.actor.share=0.75", "groups.rollout.share=0.25",
                               "data.prompts_per_step=1026", "--json")
    assert status == 0, err
    changed = json.loads(out)
    assert base["lag"]["max_policy_lag"] == 1 and changed["lag"]["max_policy_lag"] == 0
    gpus = {g["name"]: g["gpus"] for g in changed["placement"]["groups"]}
    assert gpus == {"actor": 6, "rollout": 2}
    assert changed["spec"]["schedule"]["max_lag"] == 0


@needs_compiler
@pytest.mark.parametrize("graph", GRAPHS, ids=[g.stem for g in GRAPHS])
def test_every_example_graph_compiles(graph: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(capsys, "compile", str(graph), "--json")
    assert status == 0, err
    plan = json.loads(out)
    sched = plan["schedule"]
    assert sched["period_s"] >= sched["bound_s"] * 0.999 > 0
    assert sched["speedup_vs_sync"] > 0
    assert plan["lag"]["max_policy_lag"] <= plan["spec"]["schedule"]["max_lag"]


@needs_compiler
def test_compile_process_imports_neither_torch_nor_ray(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys
        from rlgraph.cli.main import main
        status = main(["compile", {str(QUICKSTART)!r}, "-o", {str(tmp_path)!r}])
        heavy = sorted(m for m in ("torch", "ray", "transformers") if m in sys.modules)
        print(status, heavy)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.stdout.strip().splitlines()[-1] == "0 []", proc.stdout + proc.stderr


@needs_compiler
def test_calibrate_replaces_modelled_costs_with_measured_ones(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from timeline_support import simulate

    from rlgraph.report.chrome_trace import chrome_trace

    events = simulate(6, max_lag=1)  # same node names as the quickstart
    (tmp_path / "trace.json").write_text(json.dumps(chrome_trace(events, "run")))
    status, out, err = run_cli(capsys, "compile", str(QUICKSTART), "--calibrate", str(tmp_path),
                               "--json")
    assert status == 0, err
    costs = json.loads(out)["costs"]
    assert costs["train"]["source"] == "calibrated"
    assert costs["train"]["seconds"] == pytest.approx(0.5, rel=1e-3)
    status, _, err = run_cli(capsys, "compile", str(QUICKSTART), "--calibrate",
                             str(tmp_path / "missing"), "--json")
    assert status == 2 and "missing" in err and "Traceback" not in err


# ---------------------------------------------------------------- README and CI agree

README = ROOT / "README.md"
FRESH_VENV = "python3 -m venv .venv && . .venv/bin/activate && "
TEST_COMMAND = FRESH_VENV + "pip install torch==2.13.0 && pip install -e '.[test]' && pytest"


def test_ci_runs_the_readme_test_command() -> None:
    text = README.read_text()
    assert TEST_COMMAND in text
    assert FRESH_VENV + "pip install torch==2.13.0 && pip install -e . && " \
        "rlgraph run graphs/quickstart.yaml" in text
    ci = ROOT / ".ci" / "run"
    lines = [line for line in ci.read_text().splitlines() if line.strip()]
    assert lines[-1] == TEST_COMMAND
    assert "rm -rf .venv" in lines, ".ci/run must install into a fresh virtual environment"
    assert "set -euo pipefail" in lines
    assert ci.stat().st_mode & 0o111, ".ci/run must be executable"


@needs_compiler
def test_readme_graph_example_compiles(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    block = re.search(r"## graph.yaml\n\n```yaml\n(.*?)```", README.read_text(), re.S)
    assert block, "README lost its graph.yaml example"
    (tmp_path / "graph.yaml").write_text(block.group(1))
    status, out, err = run_cli(capsys, "compile", str(tmp_path / "graph.yaml"), "--json")
    assert status == 0, err
    assert json.loads(out)["name"] == "dots-hybrid"


# ---------------------------------------------------------------- the first hour


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from rlgraph import __version__

    status, out, _ = run_cli(capsys, "--version")
    assert status == 0 and out.strip() == f"rlgraph {__version__}"


def test_a_dashed_override_is_answered_with_its_right_form(
        capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_cli(capsys, "compile", str(QUICKSTART), "--schedule.max_lag=2")
    assert status == 2 and "usage:" not in err
    assert "write it without dashes" in err and err.rstrip().endswith(": schedule.max_lag=2")


@needs_compiler
@pytest.mark.parametrize(("override", "named", "guess"), [
    ("groups.rolout.share=0.5", "unknown group 'rolout'", "did you mean 'rollout'?"),
    ("nodes.generat.tp=2", "unknown node 'generat'", "did you mean 'generate'?"),
])
def test_an_override_on_a_misspelt_name_says_the_name_is_unknown(
        capsys: pytest.CaptureFixture[str], override: str, named: str, guess: str) -> None:
    status, _, err = run_cli(capsys, "compile", str(QUICKSTART), override, "--json")
    assert status == 2 and named in err and guess in err, err
    assert "required key" not in err and len(err.strip().splitlines()) == 1


@needs_compiler
def test_a_plus_override_adds_a_new_group(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(capsys, "compile", str(QUICKSTART), "groups.trainer.share=0.25",
                               "groups.rollout.share=0.25", "+groups.ref.share=0.5",
                               "+groups.ref.tasks=[ref_logp]", "groups.trainer.tasks=[logp,train]",
                               "--json")
    assert status == 0, err
    assert {g["name"] for g in json.loads(out)["placement"]["groups"]} == {
        "trainer", "rollout", "ref"}


@needs_compiler
def test_compile_without_png_draws_none_and_says_how(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    status, out, err = run_cli(capsys, "compile", str(QUICKSTART), "-o", str(tmp_path))
    assert status == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PLAN_FILES)
    assert "--png" in out


@needs_compiler
def test_advice_names_idle_gpus_and_a_plan_slower_than_sync(
        capsys: pytest.CaptureFixture[str]) -> None:
    graph = Path(__file__).parents[3] / "graphs" / "verl-one-step-off.yaml"
    status, out, err = run_cli(capsys, "compile", str(graph), "groups.actor.share=0.25",
                               "--json")
    assert status == 0, err
    plan = json.loads(out)
    assert any("leave 2 of 8 GPUs idle" in m for m in plan["messages"]), plan["messages"]
    status, out, _ = run_cli(capsys, "compile", str(graph), "--json")
    assert not any("GPUs idle" in m for m in json.loads(out)["messages"])
    for path in (QUICKSTART, graph.with_name("verl-hybrid-engine.yaml")):
        status, out, err = run_cli(capsys, "compile", str(path), "--json")
        plan = json.loads(out)
        slower = [m for m in plan["messages"] if "colocated sync would run" in m]
        assert bool(slower) == (plan["schedule"]["speedup_vs_sync"] < 0.99), plan["messages"]
        assert all("rlgraph tune" in m for m in slower)


def test_tuned_graph_anchors_relative_files_to_the_graphs_folder(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    from rlgraph.cli.tune import anchor_paths

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    (tmp_path / "score.py").write_text("def f(*a): return 0.0\n")
    monkeypatch.chdir(tmp_path.parent)  # the graph's folder is not the working directory
    data = {"data": {"train_files": ["data/train.jsonl", "missing.jsonl"]},
            "nodes": {"reward": {"kind": "reward", "fn": "score.py:f"},
                      "gen": {"kind": "generate", "env": {"fn": "calculator"}},
                      "other": {"kind": "reward", "fn": "rlgraph.rl.rewards:exact_match"}}}
    anchor_paths(data, tmp_path)
    assert data["data"]["train_files"] == [str(tmp_path / "data" / "train.jsonl"),
                                           "missing.jsonl"]
    assert data["nodes"]["reward"]["fn"] == f"{tmp_path / 'score.py'}:f"
    assert data["nodes"]["gen"]["env"]["fn"] == "calculator"
    assert data["nodes"]["other"]["fn"] == "rlgraph.rl.rewards:exact_match"


@needs_compiler
def test_compile_first_steps_prints_a_short_runs_mean_step(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A partial-rollout plan's first steps decode its first rounds, from an empty cache:
    not its steady period; a step count under 2 (nothing after the warm-up) is refused."""
    graph = ROOT / "bench" / "graphs_gpu" / "longtail-1gpu.yaml"
    status, out, _ = run_cli(capsys, "compile", str(graph), "schedule.partial_rollout=true",
                             "schedule.max_lag=2", "data.response_len.sigma=1.5",
                             "--first-steps", "4", "-o", str(tmp_path))
    line = out.strip().splitlines()[-1]
    assert status == 0 and line.startswith("first 4 steps: ")
    mean, steady = (float(x) for x in re.findall(r"([\d.]+) s\b", line))
    assert mean > steady * 1.02  # the long round that finishes the start-up's groups
    assert main(["compile", str(graph), "--first-steps", "1", "-o", str(tmp_path)]) != 0
