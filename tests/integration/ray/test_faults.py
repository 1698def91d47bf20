"""Fault injection on the real runtime (tiny model, CPU, one Ray cluster): progress survives.

A trainer, rollout or reward actor killed mid-run (one after another, each resuming from
what the one before kept), SIGTERM to the `rlgraph run` process, and a full disk at a
periodic checkpoint each end in a one-line error (or exit 143) and a checkpoint; `--resume`
then trains exactly the prompts of an uninterrupted run (the data stream's batch of each
step, in order, as test_runtime_ray.py checks against a real uninterrupted run): 0 prompt
ids lost, 0 duplicated. Where the trainer survives, the failure itself writes the
checkpoint; every checkpoint is written after the ledger rows it covers.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from rlgraph.compiler import compile_plan  # noqa: E402
from rlgraph.config.load import load_spec  # noqa: E402
from rlgraph.errors import RLGraphError  # noqa: E402
from rlgraph.rl.data import DataSource  # noqa: E402
from rlgraph.runtime import checkpoint as ckpt  # noqa: E402
from rlgraph.runtime.runner import Runner, RunOptions  # noqa: E402

pytestmark = pytest.mark.runtime

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "graphs" / "quickstart.yaml"
STEPS = 8
SMALL = ["data.prompts_per_step=4", "data.samples_per_prompt=4",
         "data.response_len={mean: 16, max: 24}", "model.warm_start.steps=0"]


def runner(out: Path, resume: bool = False, on_step=None) -> Runner:
    spec = load_spec(QUICKSTART, SMALL)
    options = RunOptions(out_dir=out, steps=STEPS, resume=resume, checkpoint_every=2,
                         verify_weights=True, tensorboard=False, on_step=on_step)
    return Runner(compile_plan(spec), options)


def ledger_rows(folder: Path) -> list[dict]:
    return ckpt.read_ledger(folder / "ledger.jsonl")


@pytest.fixture
def baseline(cluster, monkeypatch):
    """The prompt ids an uninterrupted run trains at each step (the data stream's batches);
    meanwhile every checkpoint written is checked to come after the ledger rows it covers."""
    real = ckpt.write_folder

    def covered(tmp: Path, files: dict[str, bytes]) -> None:
        import json

        step = json.loads(files["meta.json"])["step"]
        rows = [r["step"] for r in ledger_rows(tmp.parent)]
        assert rows[:step] == list(range(step)), f"checkpoint at {step} before ledger {rows}"
        real(tmp, files)

    monkeypatch.setattr(ckpt, "write_folder", covered)
    data = DataSource(load_spec(QUICKSTART, SMALL).data)
    return [{"prompt_uids": [e.uid for e in data.batch(step)]} for step in range(STEPS)]


def assert_same_prompts(folder: Path, baseline: list[dict]) -> None:
    rows = ledger_rows(folder)
    assert [r["step"] for r in rows] == list(range(STEPS))
    assert [r["prompt_uids"] for r in rows] == [r["prompt_uids"] for r in baseline]
    uids = [u for r in rows for u in r["prompt_uids"]]
    assert len(uids) == len(set(uids)), "a prompt was trained twice"


def run_and_kill(out: Path, victim: str, resume: bool) -> tuple[str, int]:
    """A run (or a resume) whose `victim` actor is killed once a row of step 2 or later is
    written: the run's one-line error and the step of that row."""
    run: Runner | None = None
    killed_at: list[int] = []

    def on_step(row):
        if not killed_at and row["step"] >= 2:  # a resumed run's first row, too
            killed_at.append(row["step"])
            ray.kill(run.actors[victim])

    run = runner(out, resume=resume, on_step=on_step)
    with pytest.raises(RLGraphError) as err:
        run.run()
    return str(err.value), killed_at[0]


def test_killed_actors_then_resume_loses_nothing(baseline, tmp_path):
    """The trainer, then the rollout, then the reward actor killed, one run after another,
    each resuming from what the one before kept; the last resume finishes the run."""
    for victim in ("train", "generate", "reward"):
        message, killed_at = run_and_kill(tmp_path, victim, resume=victim != "train")
        assert "\n" not in message and "died at step" in message, (victim, message)
        kept = ckpt.load_checkpoint(tmp_path).step
        if victim == "train":  # its state died with it: the periodic checkpoint is what is left
            assert "no emergency checkpoint" in message and kept == 2, message
        else:  # the failure itself checkpoints past the step whose row was written
            assert "progress kept: checkpoint at step" in message, (victim, message)
            assert killed_at < kept < STEPS, (victim, killed_at, kept)
    runner(tmp_path, resume=True).run()
    assert_same_prompts(tmp_path, baseline)


def test_full_disk_at_a_checkpoint_keeps_the_previous_one(baseline, tmp_path, monkeypatch):
    real, calls = ckpt.write_folder, []

    def full_at_second(tmp: Path, files: dict[str, bytes]) -> None:
        calls.append(tmp)
        if len(calls) == 2:
            tmp.mkdir(parents=True)
            (tmp / "model.safetensors").write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        real(tmp, files)

    monkeypatch.setattr(ckpt, "write_folder", full_at_second)
    with pytest.raises(ckpt.CheckpointError) as err:
        runner(tmp_path).run()
    message = str(err.value)
    assert "\n" not in message and "No space left on device" in message
    assert "the checkpoint at step 2 stays valid" in message, message
    monkeypatch.setattr(ckpt, "write_folder", real)
    assert ckpt.load_checkpoint(tmp_path).step == 2
    runner(tmp_path, resume=True).run()
    assert_same_prompts(tmp_path, baseline)


def test_sigterm_stops_with_a_checkpoint_and_resume_loses_nothing(baseline, tmp_path):
    out = tmp_path / "run"
    # many steps, so the signal lands mid-run; the resumed run stops at STEPS (resume-safe);
    # the run joins the session's cluster (a cluster of its own costs both cores seconds)
    address = ray.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "rlgraph", "run", str(QUICKSTART), *SMALL, "--steps",
           "1000", "--out", str(out), "--no-progress", "--checkpoint-every", "0",
           "--address", address]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RAY_ADDRESS": ""})
    deadline = time.time() + 180
    while len(ledger_rows(out)) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "terminated by SIGTERM: checkpoint at step" in err and "Traceback" not in err
    kept = ckpt.load_checkpoint(out).step
    assert 2 <= kept < STEPS and [r["step"] for r in ledger_rows(out)] == list(range(kept))
    # the steps kept trained the data stream's batches; the signal asks the stop a Ctrl-C
    # asks (the handler: test_runtime_ray.py), whose checkpoint resumes there to the prompts
    # of an uninterrupted run
    rows = ledger_rows(out)
    assert [r["prompt_uids"] for r in rows] == [r["prompt_uids"] for r in baseline[:kept]]
