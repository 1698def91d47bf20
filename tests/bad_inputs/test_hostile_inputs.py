"""Hostile or mistaken input: what tests/bad_inputs/ cannot hold as a file, the
bounds every numeric key declares, rewards that are not finite, reward modules that must
not run, and a property test over mutations of every graph in graphs/.

Every refusal goes through the CLI's `main` in this process (fast), and must be exit 2 with
one line on stderr and no traceback; a mutated graph may also compile (exit 0).
"""

from __future__ import annotations

import copy
import errno
import json
import math
import os
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from rlgraph.cli.main import main
from rlgraph.nodes.base import StrictModel
from rlgraph.rl.rewards import MAX_ABS_REWARD, RewardFnError, score_samples

ROOT = Path(__file__).resolve().parents[2]
GRAPHS = sorted((ROOT / "graphs").glob("*.yaml"))
QUICKSTART = (ROOT / "graphs" / "quickstart.yaml").read_text()
HF_CONFIG = QUICKSTART.replace(  # the numbers of an inline model config get mutated too
    "  preset: tiny\n", "  hf_config: {hidden_size: 64, num_hidden_layers: 2, "
    "num_attention_heads: 4, num_key_value_heads: 2, intermediate_size: 128, "
    "vocab_size: 128}\n")
SOURCES = [path.read_text() for path in GRAPHS] + [HF_CONFIG]


def compile_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`rlgraph compile ARGS` in this process: (status, stdout, stderr)."""
    status = main(["compile", *args])
    out, err = capsys.readouterr()
    return status, out, err


def assert_refused(status: int, out: str, err: str, *texts: str) -> None:
    """Exit 2, one line on stderr holding every text, nothing on stdout, no traceback."""
    assert status == 2, err
    assert "Traceback" not in err and out == ""
    assert len(err.strip().splitlines()) == 1, err
    for text in texts:
        assert text in err, err


# ---------------------------------------------------------------- files git cannot hold


def test_utf16_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = tmp_path / "utf16.yaml"
    graph.write_bytes(QUICKSTART.encode("utf-16"))
    assert_refused(*compile_cli([str(graph)], capsys), "utf16.yaml:1:1", "UTF-16 text")


@pytest.mark.parametrize("name,what", [("/dev/zero", "a device"), (".", "a directory")])
def test_non_regular_files_are_refused(name: str, what: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = str(tmp_path) if name == "." else name
    assert_refused(*compile_cli([path], capsys), f"the graph is {what}, not a file")


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "graph.yaml"
    os.mkfifo(fifo)  # nobody writes to it: a blocking open would wait forever
    proc = subprocess.run([sys.executable, "-m", "rlgraph", "compile", str(fifo)],
                          capture_output=True, text=True, timeout=60)
    assert_refused(proc.returncode, proc.stdout, proc.stderr, "the graph is a FIFO")


def test_oversized_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = tmp_path / "big.yaml"
    graph.write_text(QUICKSTART + "# padding\n" * 200_000)
    assert_refused(*compile_cli([str(graph)], capsys), "big.yaml", "more than a graph's limit")


def test_file_name_too_long(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = tmp_path / ("g" * 300 + ".yaml")
    status, out, err = compile_cli([str(graph)], capsys)
    assert_refused(status, out, err, "the file name is too long (305 characters)")
    assert len(err) < 300  # the name is shortened in the message


@pytest.mark.parametrize("out_dir,text", [
    ("/dev/null/out", "Not a directory"),
    ("TMP/" + "o" * 300, "File name too long (300 characters in one name)"),
])
def test_unwritable_out_is_refused(out_dir: str, text: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = out_dir.replace("TMP", str(tmp_path))
    assert_refused(*compile_cli([str(ROOT / "graphs" / "quickstart.yaml"), "-o", out_dir],
                                capsys), "cannot write the plan there", text)


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC])
def test_read_only_or_full_out_is_refused(code: int, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The file system's refusal is simulated (a read-only mount needs root)."""
    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code), str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    assert_refused(*compile_cli([str(ROOT / "graphs" / "quickstart.yaml"), "-o",
                                 str(tmp_path / "out")], capsys), os.strerror(code))


# ---------------------------------------------------------------- references


def test_reward_module_is_parsed_never_run(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "executed"
    (tmp_path / "score.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0\n")
    graph = tmp_path / "graph.yaml"
    graph.write_text(QUICKSTART.replace("reward: {kind: reward}",
                                        "reward: {kind: reward, fn: 'score.py:compute_score'}"))
    status, out, err = compile_cli([str(graph), "--json"], capsys)
    assert status == 0, err
    assert json.loads(out)["spec"]["nodes"]["reward"]["fn"] == "score.py:compute_score"
    assert not marker.exists(), "compile ran the reward module"
    status, out, err = compile_cli([str(graph), "nodes.reward.fn=score.py:compute", "--json"],
                                   capsys)
    assert_refused(status, out, err, "'score.py' defines no function 'compute'")
    assert not marker.exists()


@pytest.mark.parametrize("ref, file", [("score.py:compute_score", "score.py"),
                                       ("score_module:compute_score", "score_module.py")])
def test_run_executes_no_code_from_files_unless_trusted(
        ref: str, file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "executed"
    (tmp_path / file).write_text(
        f"open({str(marker)!r}, 'w').close()\n\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return 1.0\n")
    graph = tmp_path / "graph.yaml"
    graph.write_text(QUICKSTART.replace("reward: {kind: reward}",
                                        f"reward: {{kind: reward, fn: '{ref}'}}"))
    monkeypatch.chdir(tmp_path)  # a module beside the graph, in the working directory
    out_dir = tmp_path / "run"
    status = main(["run", str(graph), "--steps", "1", "-o", str(out_dir), "--no-progress"])
    out, err = capsys.readouterr()
    assert_refused(status, out, err, "would run Python code from")
    assert "graph.yaml:" in err and "--trust-code" in err
    assert not marker.exists(), "run executed the reward file"
    assert not out_dir.exists(), "a refused run left a run dir behind"


# ---------------------------------------------------------------- every numeric key bounded


def _sections() -> list[type[BaseModel]]:
    """Every spec section class: subclasses of StrictModel, all loaded by rlgraph.config.schema."""
    import rlgraph.config.schema  # noqa: F401  (loads every node kind)

    found, todo = [], [StrictModel]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def _numeric(annotation: object) -> bool:
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (
        typing.Union, types.UnionType) else (annotation,)
    return any(a in (int, float) for a in args)


def test_every_numeric_key_has_a_lower_and_an_upper_bound() -> None:
    checked = 0
    for cls in _sections():
        assert cls.model_config.get("allow_inf_nan") is False, cls.__name__
        for name, field in cls.model_fields.items():
            if not _numeric(field.annotation):
                continue
            kinds = {type(m).__name__ for m in field.metadata}
            assert kinds & {"Ge", "Gt"}, f"{cls.__name__}.{name} has no lower bound"
            assert kinds & {"Le", "Lt"}, f"{cls.__name__}.{name} has no upper bound"
            checked += 1
    assert checked >= 40


# ---------------------------------------------------------------- rewards


@pytest.mark.parametrize("value", [math.inf, -math.inf, 1e308, MAX_ABS_REWARD * 2])
def test_reward_that_is_not_finite_is_refused_at_its_step(value: float) -> None:
    def fn(data_source: str, solution_str: str, ground_truth: str,
           extra_info: dict | None = None) -> float:
        return value if solution_str == "bad" else 1.0

    with pytest.raises(RewardFnError) as err:
        score_samples(fn, "score.py:fn", ["t", "t"], ["ok", "bad"], ["1", "2"], [{}, {}],
                      ["add:train:7", "add:train:8"], step=3)
    text = str(err.value)
    assert "at step 3 on sample 1 (prompt add:train:8" in text and repr(value) in text
    assert "\n" not in text


# ---------------------------------------------------------------- property test


EXTREMES = [0, -1, 1, 1e-300, -1e-300, 1e300, 2**64 + 1, 10**30, 0.5, -0.0,
            math.inf, -math.inf, math.nan, "x", None, True, [], {}, [1, [2]], {"a": 1}]
YAML_ATTACKS = [
    lambda t: t + "merged: {<<: {a: 1}}\n",
    lambda t: t + "? [a, b]\n: 1\n",
    lambda t: t.replace("name:", "name: !!python/name:os.system\nold_name:", 1),
    lambda t: t + "loop: &l [*l]\n",
    lambda t: t + "deep: " + "[" * 3000 + "]" * 3000 + "\n",
    lambda t: t + "a: &a [1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")),
    lambda t: t + "big: 1" + "0" * 400 + "\n",
    lambda t: t[: len(t) // 2] + "\0" + t[len(t) // 2:],
    lambda t: t + "\t bad: indent\n",
    lambda t: t[: len(t) // 3],
]


def _paths(data: object, prefix: tuple = ()) -> list[tuple]:
    """Every key path of a parsed graph (mappings and lists)."""
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out += _paths(value, (*prefix, i))
    return out


def _at(data: object, path: tuple) -> object:
    for key in path:
        data = data[key]  # type: ignore[index]
    return data


def _mutate(data: dict, path: tuple, how: str, value: object) -> None:
    parent = _at(data, path[:-1])
    last = path[-1]
    if how == "delete":
        del parent[last]
    elif how == "rename" and isinstance(parent, dict):
        parent[f"{last}x"] = parent.pop(last)
    else:
        parent[last] = copy.deepcopy(value)  # EXTREMES' lists and dicts are shared


@st.composite
def mutated_graphs(draw: st.DrawFn) -> bytes:
    """A graph of graphs/ with one to three mutations, or one YAML-level attack."""
    text = draw(st.sampled_from(SOURCES))
    if draw(st.integers(0, 4)) == 0:
        return draw(st.sampled_from(YAML_ATTACKS))(text).encode()
    data = yaml.safe_load(text)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(data)
        if not paths:
            break
        numbers = [p for p in paths if isinstance(_at(data, p), int | float)
                   and not isinstance(_at(data, p), bool)]
        if numbers and draw(st.booleans()):  # numbers replaced by extremes, half the time
            path, how = draw(st.sampled_from(numbers)), "replace"
        else:
            path = draw(st.sampled_from(paths))
            how = draw(st.sampled_from(["replace", "replace", "delete", "rename"]))
        _mutate(data, path, how, draw(st.sampled_from(EXTREMES)))
    return yaml.safe_dump(data, allow_unicode=True).encode()


@settings(max_examples=150, deadline=5000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(mutated_graphs())
def test_mutated_graphs_compile_or_fail_in_one_line(tmp_path_factory: pytest.TempPathFactory,
                                                    capsys: pytest.CaptureFixture[str],
                                                    text: bytes) -> None:
    folder = tmp_path_factory.mktemp("fuzz")
    graph = folder / "graph.yaml"
    graph.write_bytes(text)
    status, out, err = compile_cli([str(graph), "--json"], capsys)
    assert status in (0, 2), err
    assert "Traceback" not in err
    if status == 2:
        assert out == "" and len(err.strip().splitlines()) == 1, err
        assert str(graph) in err or "<override" in err, err
    else:
        assert json.loads(out)["schedule"]["period_s"] >= 0


OVERRIDE_VALUES = [".inf", "-.inf", ".nan", "1e-300", "1.0e+300", str(2**64 + 1), "1" + "0" * 400,
                   "[]", "{}", "null", "x", "{<<: {a: 1}}", "!!python/name:os.system", "[" * 50,
                   "&a [*a]", "'\0'", "-1", "0"]


@st.composite
def overridden_graphs(draw: st.DrawFn) -> tuple[Path, str]:
    """A graph of graphs/ and one `key=value` override of one of its keys (or a new one)."""
    graph = draw(st.sampled_from(GRAPHS))
    paths = [p for p in _paths(yaml.safe_load(graph.read_text()))
             if all(isinstance(k, str) for k in p)]
    path = draw(st.sampled_from(paths))
    if draw(st.integers(0, 5)) == 0:
        path = (*path, "extra")
    return graph, ".".join(path) + "=" + draw(st.sampled_from(OVERRIDE_VALUES))


@settings(max_examples=60, deadline=5000,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(overridden_graphs())
def test_hostile_overrides_compile_or_fail_in_one_line(capsys: pytest.CaptureFixture[str],
                                                       case: tuple[Path, str]) -> None:
    graph, override = case
    status, out, err = compile_cli([str(graph), override, "--json"], capsys)
    assert status in (0, 2), err
    assert "Traceback" not in err
    if status == 2:
        assert out == "" and len(err.strip().splitlines()) == 1, err
