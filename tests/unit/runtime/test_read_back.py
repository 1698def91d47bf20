"""Files rlgraph reads back, data files and user functions, attacked: one line, never a hang.

- trace.json / plan.json / metrics.jsonl / ledger.jsonl as a FIFO, a folder, malformed
  shapes, NaN / 1e300 / negative times: refused in one line naming the file;
- a torn last line of metrics.jsonl is dropped, a damaged middle line refused; the rewrite
  is atomic (a failure mid-write leaves the previous file);
- data files: not UTF-8, a corrupt parquet, empty, wrong columns: refused at compile time
  with the file and its 1-based line;
- a reward function that hangs stops at `timeout_s`, one that prints megabytes is capped,
  one whose exception is 5 MB of coloured text is one short line without escapes;
- lone surrogates in a name or an override: one line, no run dir left behind; `tune` on a
  1,024-slot cluster gives shares the schema takes;
- hypothesis: a run dir mutated anywhere reads back or is refused in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlgraph.cli.main import main
from rlgraph.compiler.calibrate import CalibrationError, load_calibration
from rlgraph.config.load import load_spec
from rlgraph.config.schema import GroupSpec
from rlgraph.errors import RLGraphError, SpecError
from rlgraph.rl.rewards import RewardFnError, make_scorer, score_samples
from rlgraph.runtime import checkpoint as ckpt
from rlgraph.runtime.metrics import read_rows, replace_text
from rlgraph.runtime.tracing import load_events

GRAPHS = Path(__file__).resolve().parents[3] / "graphs"
QUICKSTART = GRAPHS / "quickstart.yaml"


def span(node="generate", step=0, ts=0.0, dur=1e6, **args) -> dict:
    return {"ph": "X", "name": node, "cat": node, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": {"node": node, "step": step, **args}}


def one_line(text: str, *needles: str) -> None:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    for needle in needles:
        assert needle in lines[0], lines[0]


# ------------------------------------------------------------------ traces and calibration


@pytest.mark.parametrize("dur,needle", [(float("nan"), "dur"), (1e300, "dur"), (-5.0, "dur")])
def test_calibrate_refuses_impossible_durations(tmp_path, capsys, dur, needle):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": [span(step=s, dur=dur if s == 1 else 1e6)
                                                 for s in range(4)]}))
    started = time.time()
    status = main(["compile", str(QUICKSTART), "--calibrate", str(trace), "--json"])
    assert status == 2 and time.time() - started < 60
    one_line(capsys.readouterr().err, "trace.json", needle)


@pytest.mark.parametrize("trace", [
    [1, 2], {"traceEvents": {"a": 1}}, {"traceEvents": [span(step="x")]},
    {"traceEvents": [span(ts=-1)]}, {"traceEvents": [span(occupies="g")]},
    {"traceEvents": [{"ph": "X", "ts": 0, "dur": 1, "args": []}]},
    {"traceEvents": [{"ph": "X", "ts": 0, "dur": 1}]}, "text"])
def test_timeline_and_resume_refuse_malformed_traces(tmp_path, capsys, trace):
    main(["compile", str(QUICKSTART), "-o", str(tmp_path)])
    capsys.readouterr()
    (tmp_path / "trace.json").write_text(json.dumps(trace))
    assert main(["timeline", str(tmp_path)]) == 2
    one_line(capsys.readouterr().err, "trace.json")
    with pytest.raises(RLGraphError):
        load_events(tmp_path / "trace.json")


@pytest.mark.parametrize("name", ["trace.json", "plan.json"])
def test_a_fifo_in_place_of_a_file_never_blocks(tmp_path, capsys, name):
    main(["compile", str(QUICKSTART), "-o", str(tmp_path)])
    capsys.readouterr()
    (tmp_path / name).unlink(missing_ok=True)
    os.mkfifo(tmp_path / name)
    started = time.time()
    assert main(["timeline", str(tmp_path)]) == 2
    if name == "trace.json":
        assert main(["compile", str(QUICKSTART), "--calibrate", str(tmp_path), "--json"]) == 2
    assert time.time() - started < 30
    err = capsys.readouterr().err
    assert all("FIFO" in line for line in err.strip().splitlines()), err


def test_shares_of_a_1024_slot_cluster_are_valid():
    GroupSpec(share=1 / 1024, tasks=["generate"])
    GroupSpec(share=1 / (4096 * 64), tasks=["generate"])  # one GPU of the largest cluster
    with pytest.raises(ValueError, match="less than 1e-06"):
        GroupSpec(share=1e-300, tasks=["generate"])


# ------------------------------------------------------------------ metrics and ledger


def test_metrics_torn_last_line_is_dropped_and_damage_refused(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "rew')
    assert [r["step"] for r in read_rows(path)] == [0, 1]
    for text, needle in (('{"step": 0}\n[1]\n{"step": 2}\n', ":2: not a mapping"),
                         ('{"step": 0}\n{"st\n{"step": 2}\n', ":2: not a JSON row"),
                         ('{"step": -1}\n', "step"), ('{"step": "x"}\n', "step"),
                         (b"\xff\xfe\n", "not UTF-8")):
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        with pytest.raises(RLGraphError) as err:
            read_rows(path)
        one_line(str(err.value), "metrics.jsonl", needle)
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text('{"step": 0, "prompt_uids": []}\n"a"\n{"step": 1}\n')
    with pytest.raises(ckpt.CheckpointError, match=":2: not a mapping"):
        ckpt.read_ledger(ledger)


def test_metrics_rewrite_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0}\n')

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        replace_text(path, '{"step": 0}\n{"step": 1}\n')
    assert path.read_text() == '{"step": 0}\n' and os.listdir(tmp_path) == ["metrics.jsonl"]


# ------------------------------------------------------------------ data files


def graph_with_data(tmp_path: Path, data: Path) -> Path:
    graph = tmp_path / "graph.yaml"
    text = QUICKSTART.read_text().replace("  task: ", "  train_files: [" + str(data) + "]\n"
                                          "  task: ")
    graph.write_text(text)
    return graph


@pytest.mark.parametrize("content,needle", [
    (b"\xff\xfe{}\n", "not UTF-8"),
    (b"", "holds no rows"),
    (b'{"prompt": "a", "reward_model": {"ground_truth": "1"}}\n\n{"question": "b"}\n',
     "line 3: the row has no 'prompt'"),
    (b'{"prompt": "a"}\n', "reward_model.ground_truth"),
    (b"PAR1garbage", "not a readable parquet file"),
])
def test_data_files_are_checked_at_compile_time(tmp_path, capsys, content, needle):
    data = tmp_path / ("train.parquet" if content.startswith(b"PAR1") else "train.jsonl")
    data.write_bytes(content)
    graph = graph_with_data(tmp_path, data)
    assert main(["compile", str(graph), "--json"]) == 2
    one_line(capsys.readouterr().err, "data.train_files.0", needle)


# ------------------------------------------------------------------ user reward functions


REWARD = '''\
import sys, time
def score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "hang":
        time.sleep(600)
    if solution_str == "loud":
        sys.stdout.write("x" * 5_000_000)
    if solution_str == "boom":
        raise ValueError("\\x1b[31m" + "red " * 1_250_000 + "\\x1b[0m")
    print("scored", solution_str)
    return 1.0
'''


def score(fn, responses, timeout_s=5.0):
    n = len(responses)
    return score_samples(fn, "reward.py:score", ["t"] * n, responses, ["1"] * n, [{}] * n,
                         [f"t:{i}" for i in range(n)], step=3, timeout_s=timeout_s)


def test_reward_timeout_output_cap_and_one_line_errors(tmp_path):
    (tmp_path / "reward.py").write_text(REWARD)
    fn = make_scorer("reward.py:score", ("nodes", "reward", "fn"), tmp_path)
    try:
        assert score(fn, ["a", "b"]) == [1.0, 1.0]
        assert fn.take_output() == "scored a\nscored b\n"
        started = time.time()
        with pytest.raises(RewardFnError) as err:
            score(fn, ["a", "hang", "c"], timeout_s=1.0)
        assert time.time() - started < 20
        one_line(str(err.value), "on sample 1", "timeout_s=1 s")
        assert score(fn, ["loud"]) == [1.0]  # a fresh process after the timeout
        out = fn.take_output()
        assert len(out) < 70_000 and "more bytes of output dropped" in out
        with pytest.raises(RewardFnError) as err:
            score(fn, ["boom"])
        text = str(err.value)
        one_line(text, "raised ValueError", "more characters")
        assert "\x1b" not in text and len(text) < 2000
    finally:
        fn.close()
    with pytest.raises(SpecError, match=r"loading bad\.py:score failed"):
        (tmp_path / "bad.py").write_text("raise SystemExit(3)\n")
        make_scorer("bad.py:score", ("nodes", "reward", "fn"), tmp_path)


# ------------------------------------------------------------------ names


def test_lone_surrogates_are_refused_before_a_run_dir_exists(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    graph = tmp_path / "g.yaml"
    graph.write_text('name: "a\\udc80b"\n' + "\n".join(
        line for line in QUICKSTART.read_text().splitlines() if not line.startswith("name:")))
    assert main(["run", str(graph), "--steps", "1"]) == 2
    one_line(capsys.readouterr().err, "g.yaml:1:1", "lone surrogate")
    assert main(["run", str(QUICKSTART), "name=a\udcffb", "--steps", "1"]) == 2
    one_line(capsys.readouterr().err, "not UTF-8")
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ mutated run dirs


@pytest.fixture(scope="module")
def run_dir_copy(tmp_path_factory):
    """A run dir as a run leaves it (plan, trace, metrics, ledger, a checkpoint)."""
    import torch

    from rlgraph.model.build import build_model
    from rlgraph.model.tokenizer import CharTokenizer

    folder = tmp_path_factory.mktemp("run")
    assert main(["compile", str(QUICKSTART), "model.warm_start.steps=0", "-o",
                 str(folder)]) == 0
    spec = load_spec(QUICKSTART, ["model.warm_start.steps=0"])
    policy = build_model(spec.model, CharTokenizer(), seed=0)
    meta = {"graph": spec.name, "spec": spec.to_yaml_dict(), "step": 2, "policy_version": 2,
            "steps": 4, "trace_end_s": 3.0}
    ckpt.save_checkpoint(folder, meta, {"weights": policy.state_dict(), "policy_version": 2,
                                        "x": torch.ones(2)}, {})
    (folder / "trace.json").write_text(json.dumps({"traceEvents": [
        span(node=n, step=s, ts=s * 1e6, dur=5e5) for s in range(2) for n in ("generate",
                                                                              "train")]}))
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.5})
                                                  + "\n" for s in range(2)))
    (folder / "ledger.jsonl").write_text("".join(json.dumps({"step": s, "prompt_uids": ["a"]})
                                                 + "\n" for s in range(2)))
    return folder


FILES = ["plan.json", "trace.json", "metrics.jsonl", "ledger.jsonl", "checkpoint/meta.json",
         "checkpoint/manifest.json", "checkpoint/trainer.json", "checkpoint/model.safetensors"]
VALUES = st.sampled_from([None, -1, -3.5, 1e300, float("nan"), float("inf"), "x", [], {},
                          [[1]], 2**70, True])


def mutate(path: Path, how: str, at: int, value) -> None:
    data = path.read_bytes()
    if how == "value" and path.suffix not in (".json", ".jsonl"):
        how = "flip"  # a binary file: no value to replace
    if how == "truncate":
        path.write_bytes(data[: at % (len(data) + 1)])
    elif how == "flip":
        i = at % max(len(data), 1)
        path.write_bytes(data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:] if data else b"\x00")
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif how == "folder":
        path.unlink()
        path.mkdir()
    elif how == "link":
        path.unlink()
        path.symlink_to("/etc/hostname")
    elif how == "value":  # one value replaced, the manifest re-hashed to match
        try:
            doc = json.loads(data)
        except ValueError:
            doc = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
            target = doc[at % len(doc)]
            target[sorted(target)[at % len(target)]] = value
            path.write_text("".join(json.dumps(r) + "\n" for r in doc))
        else:
            node = doc
            while isinstance(node, dict) and node:
                key = sorted(node)[at % len(node)]
                if not isinstance(node[key], dict) or at % 3 == 0:
                    node[key] = value
                    break
                node = node[key]
            path.write_text(json.dumps(doc))
        if path.parent.name == "checkpoint" and path.name != "manifest.json":
            import hashlib

            manifest = json.loads((path.parent / "manifest.json").read_text())
            entry = manifest["files"].get(path.name)
            if entry:
                body = path.read_bytes()
                entry.update(sha256=hashlib.sha256(body).hexdigest(), bytes=len(body))
                (path.parent / "manifest.json").write_text(json.dumps(manifest))


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(FILES),
       how=st.sampled_from(["truncate", "flip", "fifo", "folder", "link", "value"]),
       at=st.integers(0, 10_000), value=VALUES)
def test_a_mutated_run_dir_reads_back_or_is_refused_in_one_line(run_dir_copy, tmp_path, name,
                                                                   how, at, value):
    from rlgraph.compiler.plan import Plan
    from rlgraph.readback import read_json
    from rlgraph.runtime.run_dir import saved_meta

    folder = tmp_path / f"m{time.monotonic_ns()}"
    shutil.copytree(run_dir_copy, folder, symlinks=True)
    mutate(folder / name, how, at, value)
    readers = [lambda: saved_meta(folder), lambda: ckpt.load_checkpoint(folder),
               lambda: read_rows(folder / "metrics.jsonl"),
               lambda: ckpt.read_ledger(folder / "ledger.jsonl"),
               lambda: load_events(folder / "trace.json"),
               lambda: load_calibration(folder),
               lambda: Plan.from_dict(read_json(folder / "plan.json"), "plan.json")]
    for read in readers:
        try:
            read()
        except (RLGraphError, CalibrationError) as err:
            assert "\n" not in str(err), str(err)
    shutil.rmtree(folder)
