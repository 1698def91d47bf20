"""Run dirs under attack, without Ray: nothing of the user's is lost, every refusal is one line.

- a streamed run resumes counting versions (not optimizer steps); the "continue with"
  command carries the run's overrides; `schedule.steps=N` on resume is honoured, `-o` beside
  `--resume` refused;
- `run -o DIR` never writes into a folder a run of the same graph did not make;
- `export` writes only inside OUT, never touches a sibling `OUT.tmp/`, refuses links in a
  checkpoint, a file or a too-long name as OUT;
- a crash between a checkpoint's renames, then another in the next save, keeps a valid one;
  `keep_last` / `keep_every` keep what they say;
- meta.json values edited (with the manifest re-hashed to match) are refused by key;
- a run made before a schema key existed resumes (the key takes its default);
- run.lock goes at the end of a run, run.log keeps what was printed, without escapes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from rlgraph.cli.main import main
from rlgraph.cli.run import RunProgress, continue_command, prepare
from rlgraph.cli.run_log import RunLog
from rlgraph.config.load import load_spec
from rlgraph.model.build import build_model
from rlgraph.model.tokenizer import CharTokenizer
from rlgraph.runtime import checkpoint as ckpt
from rlgraph.runtime import run_dir
from rlgraph.runtime.hf_folder import policy_files

GRAPHS = Path(__file__).resolve().parents[3] / "graphs"
QUICKSTART = GRAPHS / "quickstart.yaml"
SMALL = ["model.warm_start.steps=0"]
STREAM = ["model.warm_start.steps=0", "schedule.stream.mini_batches=4"]


@pytest.fixture(scope="module")
def spec():
    return load_spec(QUICKSTART, SMALL)


@pytest.fixture(scope="module")
def policy(spec):
    return build_model(spec.model, CharTokenizer(), seed=0)


def save(run: Path, spec, policy, step: int, steps: int, keep=None, files=None,
         spec_data=None) -> Path:
    meta = {"graph": spec.name, "spec": spec_data or spec.to_yaml_dict(), "step": step,
            "policy_version": step, "steps": steps}
    state = {"weights": policy.state_dict(), "policy_version": step, "seed": 0}
    return ckpt.save_checkpoint(run, meta, state, {}, policy_files=files or {},
                                keep=keep or ckpt.Keep())


def args_for(overrides, resume=None, out=None, steps=None) -> argparse.Namespace:
    return argparse.Namespace(graph=str(QUICKSTART), overrides=list(overrides), steps=steps,
                              out=out, resume=resume, address=None, trust_code=False,
                              checkpoint_every=None)


def one_line(text: str, *needles: str) -> None:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    for needle in needles:
        assert needle in lines[0], lines[0]


# ------------------------------------------------------------------ streamed resume


def test_streamed_run_resumes_counting_versions(tmp_path, policy, capsys):
    """Killed at version 2 of 6 with 4 mini-batches: the checkpoint says optimizer step 8."""
    spec = load_spec(QUICKSTART, STREAM)
    save(tmp_path, spec, policy, step=8, steps=6)
    args = args_for(STREAM, resume=str(tmp_path))
    resumed, _, out = prepare(args)
    assert out == tmp_path and args.resumed_step == 2 and resumed.schedule.steps == 6
    args = args_for([*STREAM, "schedule.steps=9"], resume=str(tmp_path))
    assert prepare(args)[0].schedule.steps == 9, "schedule.steps=N on resume is honoured"
    status = main(["run", str(QUICKSTART), *STREAM, "--resume", str(tmp_path), "--steps", "2"])
    captured = capsys.readouterr()
    assert status == 0
    one_line(captured.out, "already complete: it trained 2 of 2 steps",
             f"rlgraph run {QUICKSTART} model.warm_start.steps=0 "
             f"schedule.stream.mini_batches=4 --resume {tmp_path} --steps 4")
    status = main(["run", str(QUICKSTART), *STREAM, "--resume", str(tmp_path), "-o",
                   str(tmp_path / "elsewhere")])
    assert status == 2
    one_line(capsys.readouterr().err, "cannot move it")


def test_progress_of_a_streamed_run_counts_versions(capsys):
    progress = RunProgress(total=6, first=8, enabled=True, per_step=4)
    for step in range(8, 24):
        progress.update({"step": step, "reward/mean": 0.5})
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("step 6/6 ") and "ETA 0s" in lines[-1], lines
    assert all(not line.startswith(("step 7", "step 12")) for line in lines), lines


def test_continue_command_is_exact_and_quoted(tmp_path):
    args = args_for(["data.response_len={mean: 16, max: 24}", "name=a b"])
    args.trust_code, args.checkpoint_every = True, 2
    command = continue_command(args, tmp_path / "run dir")
    assert command == (f"rlgraph run {QUICKSTART} 'data.response_len={{mean: 16, max: 24}}' "
                       f"'name=a b' --resume '{tmp_path}/run dir' --trust-code "
                       f"--checkpoint-every 2")


def test_failure_advice_names_the_whole_command(tmp_path):
    from rlgraph.cli.run import exact_resume
    from rlgraph.errors import RLGraphError

    args = args_for(["data.seed=3"])
    err = RLGraphError(f"worker died; progress kept: checkpoint at step 2; after fixing the "
                       f"cause, continue with --resume {tmp_path}")
    exact_resume(err, continue_command(args, tmp_path), tmp_path)
    assert str(err).endswith(f"continue with rlgraph run {QUICKSTART} data.seed=3 --resume "
                             f"{tmp_path}")


def test_old_run_resumes_with_a_key_added_since(tmp_path, spec, policy):
    """The run's recorded graph lacks keys added to the schema since (its defaults held)."""
    old = spec.to_yaml_dict()
    del old["checkpoint"]
    del old["nodes"]["reward"]["timeout_s"]
    old["schedule"]["retired_key"] = 3  # and has one the schema dropped since
    save(tmp_path, spec, policy, step=2, steps=4, spec_data=old)
    args = args_for(SMALL, resume=str(tmp_path))
    assert prepare(args)[0].schedule.steps == 4
    with pytest.raises(run_dir.RunDirError) as err:
        prepare(args_for([*SMALL, "schedule.max_lag=3"], resume=str(tmp_path)))
    one_line(str(err.value), "'schedule.max_lag'", "add the override schedule.max_lag=1")


# ------------------------------------------------------------------ -o DIR


def test_run_out_refuses_a_folder_it_did_not_make(tmp_path, capsys):
    mine = tmp_path / "mine"
    for name in ("plan.json", "metrics.jsonl", "trace.json"):
        (mine / name).parent.mkdir(exist_ok=True)
        (mine / name).write_text("the user's\n")
    for name in ("checkpoint.old", "checkpoint.tmp"):
        (mine / name).mkdir()
        (mine / name / "keep.txt").write_text("the user's\n")
    before = sorted((p.relative_to(mine), p.read_bytes()) for p in mine.rglob("*")
                    if p.is_file())
    status = main(["run", str(QUICKSTART), *SMALL, "-o", str(mine), "--steps", "1"])
    assert status == 2
    one_line(capsys.readouterr().err, "no `rlgraph run` wrote", "give another -o")
    after = sorted((p.relative_to(mine), p.read_bytes()) for p in mine.rglob("*")
                   if p.is_file())
    assert after == before, "a file of the user's changed"
    (tmp_path / "file").write_text("x")
    with pytest.raises(run_dir.RunDirError, match="not a folder"):
        run_dir.refuse_reuse(tmp_path / "file", "quickstart")
    other = tmp_path / "other"
    other.mkdir()
    run_dir.mark(other, "another-graph")
    (other / "plan.json").write_text("{}")
    with pytest.raises(run_dir.RunDirError, match="a run of the graph 'another-graph'"):
        run_dir.refuse_reuse(other, "quickstart")
    run_dir.refuse_reuse(other, "another-graph")  # its own earlier run, nothing trained
    run_dir.refuse_reuse(tmp_path / "new", "quickstart")
    (tmp_path / "empty").mkdir()
    run_dir.refuse_reuse(tmp_path / "empty", "quickstart")


def test_run_lock_goes_and_run_log_keeps_plain_lines(tmp_path):
    lock = run_dir.hold(tmp_path)
    assert (tmp_path / "run.lock").exists()
    with RunLog(tmp_path):
        print("\x1b[31mred\x1b[0m line")
        print("to stderr", file=sys.stderr)
        print("50%\r100% done")
    run_dir.release(tmp_path, lock)
    assert not (tmp_path / "run.lock").exists()
    run_dir.hold(tmp_path).close()  # and a next run takes it
    text = (tmp_path / "run.log").read_text()
    assert "\x1b" not in text and "red line" in text and "to stderr" in text
    assert "100% done" in text and "50%" not in text


# ------------------------------------------------------------------ export


def test_export_writes_only_inside_out(tmp_path, spec, policy):
    run = tmp_path / "run"
    save(run, spec, policy, step=1, steps=2, files=policy_files(spec))
    sibling = tmp_path / "model.tmp"
    sibling.mkdir()
    (sibling / "notes.txt").write_text("the user's")
    names = run_dir.export_model(run, tmp_path / "model")
    assert (sibling / "notes.txt").read_text() == "the user's"
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == names
    (tmp_path / "afile").write_text("x")
    for out, needle in ((tmp_path / "afile", "not a folder"),
                        (tmp_path / ("n" * 300), "255"),
                        (tmp_path / "model", "not empty")):
        with pytest.raises(run_dir.RunDirError) as err:
            run_dir.export_model(run, out)
        one_line(str(err.value), needle)
    assert (tmp_path / "afile").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "model", "model.tmp", "run"]


def test_export_follows_no_link_out_of_the_run_dir(tmp_path, spec, policy):
    run = tmp_path / "run"
    save(run, spec, policy, step=1, steps=2, files=policy_files(spec))
    secret = tmp_path / "secret.txt"
    secret.write_text("outside")
    folder = run / "checkpoint"
    data = (folder / "config.json").read_bytes()
    (folder / "config.json").unlink()
    link = tmp_path / "config-link.json"
    link.write_bytes(data)
    (folder / "config.json").symlink_to(link)  # same bytes: the manifest's hash matches
    with pytest.raises(ckpt.CheckpointError) as err:
        run_dir.export_model(run, tmp_path / "out")
    one_line(str(err.value), "config.json", "a link")
    assert not (tmp_path / "out").exists()
    (folder / "config.json").unlink()
    (folder / "config.json").write_bytes(data)
    (run / "checkpoint").rename(run / "real")
    (run / "checkpoint").symlink_to(secret.parent)
    with pytest.raises(ckpt.CheckpointError, match="a symbolic link"):
        run_dir.export_model(run, tmp_path / "out")


# ------------------------------------------------------------------ checkpoints


def test_two_crashes_in_a_row_keep_a_valid_checkpoint(tmp_path, spec, policy, monkeypatch):
    save(tmp_path, spec, policy, step=2, steps=9)
    real = Path.rename

    def crash_before_the_new_one_is_in_place(self, target):
        if Path(self).name == "checkpoint.tmp":
            raise OSError(5, "Input/output error (injected crash)")
        return real(self, target)

    monkeypatch.setattr(Path, "rename", crash_before_the_new_one_is_in_place)
    for step in (3, 4):  # the first crash moved step 2 aside; the second must not lose it
        with pytest.raises(ckpt.CheckpointError, match="the checkpoint at step 2 stays valid"):
            save(tmp_path, spec, policy, step=step, steps=9)
        assert ckpt.load_checkpoint(tmp_path).step == 2
    monkeypatch.setattr(Path, "rename", real)
    save(tmp_path, spec, policy, step=5, steps=9)
    assert ckpt.load_checkpoint(tmp_path).step == 5


def test_keep_last_and_keep_every(tmp_path, spec, policy):
    keep = ckpt.Keep(last=2, every=4)
    for step in range(1, 10):
        save(tmp_path, spec, policy, step=step, steps=9, keep=keep)
    assert ckpt.load_checkpoint(tmp_path).step == 9
    assert sorted(ckpt.archived(tmp_path)) == [4, 8]
    keep = ckpt.Keep(last=3)
    save(tmp_path, spec, policy, step=10, steps=12, keep=keep)
    assert sorted(ckpt.archived(tmp_path)) == [8, 9]
    assert ckpt.load_checkpoint(tmp_path).step == 10
    assert run_dir.saved_meta(tmp_path)["step"] == 10


def rehash(folder: Path) -> None:
    manifest = json.loads((folder / ckpt.MANIFEST).read_text())
    for name, entry in manifest["files"].items():
        data = (folder / name).read_bytes()
        entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (folder / ckpt.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("key,value", [("steps", "x"), ("steps", -1), ("step", -3),
                                       ("steps", 1e30), ("policy_version", 0.5),
                                       ("trace_end_s", float("nan"))])
def test_edited_meta_is_refused_by_key(tmp_path, spec, policy, capsys, key, value):
    save(tmp_path, spec, policy, step=2, steps=4)
    meta_file = tmp_path / "checkpoint" / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta[key] = value
    meta_file.write_text(json.dumps(meta))
    rehash(tmp_path / "checkpoint")
    status = main(["run", str(QUICKSTART), *SMALL, "--resume", str(tmp_path)])
    assert status == 2
    one_line(capsys.readouterr().err, "meta.json", f"'{key}'")


@pytest.mark.parametrize("name,text,needle", [
    ("trace.json", '{"traceEvents": [{"ph": "X", "ts": "x"}]}', "traceEvents[0].ts"),
    ("trace.json", "{not json", "not valid JSON"),
    ("metrics.jsonl", '{"step": 0}\n{"step"\n{"step": 2}\n', "metrics.jsonl:2"),
    ("ledger.jsonl", '{"step": 0}\n[]\n{"step": 2}\n', "ledger.jsonl:2")])
def test_resume_refuses_damaged_run_files_before_ray_starts(tmp_path, spec, policy, capsys,
                                                           name, text, needle):
    save(tmp_path, spec, policy, step=2, steps=4)
    (tmp_path / name).write_text(text)
    assert main(["run", str(QUICKSTART), *SMALL, "--resume", str(tmp_path)]) == 2
    one_line(capsys.readouterr().err, needle)


def test_a_fifo_in_a_checkpoint_never_blocks(tmp_path, spec, policy):
    save(tmp_path, spec, policy, step=2, steps=4)
    target = tmp_path / "checkpoint" / "trainer.json"
    target.unlink()
    os.mkfifo(target)
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load_checkpoint(tmp_path)
    one_line(str(err.value), "trainer.json", "not a regular file")


def test_warm_start_cache_is_data_keyed_by_contents(tmp_path, monkeypatch):
    from rlgraph.process import warm_start as ws

    monkeypatch.setenv("RLGRAPH_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "train.jsonl"
    row = {"prompt": "1+1=", "reward_model": {"ground_truth": "2"}}
    data.write_text(json.dumps(row) + "\n")
    spec = load_spec(QUICKSTART, ["model.warm_start.steps=1", "model.warm_start.batch_size=2",
                                  f"data.train_files=[{data}]"])
    tok = CharTokenizer()
    first = ws.cache_path(spec, 0, tok)
    data.write_text(json.dumps({**row, "reward_model": {"ground_truth": "3"}}) + "\n")
    assert ws.cache_path(spec, 0, tok) != first, "edited data must not reuse stale weights"
    model = build_model(spec.model, tok, seed=0)
    losses = ws.warm_start(model, tok, spec, 0)
    files = sorted(p.suffix for p in (tmp_path / "cache" / "warm_start").iterdir())
    assert files == [".json", ".safetensors"]
    again = build_model(spec.model, tok, seed=1)
    assert ws.warm_start(again, tok, spec, 0) == losses
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                 again.state_dict().values()))
