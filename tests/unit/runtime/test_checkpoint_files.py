"""Checkpoint files without Ray: no pickle, a checked manifest, a Hugging Face model folder,
resume refusing another graph, run dirs claimed once, weight digests, join failures named.

Every corrupted checkpoint is a one-line error naming the file; a malicious pickle in a run
dir never runs; the checkpoint loads with `AutoModelForCausalLM.from_pretrained` as it is.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlgraph.cli.main import main
from rlgraph.cli.run import prepare
from rlgraph.config.load import load_spec
from rlgraph.model.build import build_model
from rlgraph.model.tokenizer import CharTokenizer
from rlgraph.runtime import checkpoint as ckpt
from rlgraph.runtime import run_dir
from rlgraph.runtime.cluster import existing_cluster_note, join_failure
from rlgraph.runtime.hf_folder import policy_files

GRAPHS = Path(__file__).resolve().parents[3] / "graphs"
QUICKSTART, LONGTAIL = GRAPHS / "quickstart.yaml", GRAPHS / "longtail.yaml"
MARKER_NAME = "pwned"


class Boom:
    """Unpickling this creates a marker file (what a malicious trainer.pt would do)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.makedirs, (self.marker,))


@pytest.fixture(scope="module")
def spec():
    return load_spec(QUICKSTART, ["model.warm_start.steps=0"])


@pytest.fixture(scope="module")
def policy(spec):
    return build_model(spec.model, CharTokenizer(), seed=0)


def save(run: Path, spec, policy, step: int = 3, steps: int = 6, files=None) -> Path:
    """A checkpoint as the runner writes it: weights, optimizer state, a rollout batch."""
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    policy(torch.tensor([[1, 5, 6]])).logits.sum().backward()
    opt.step()
    state = {"weights": policy.state_dict(), "optimizer": opt.state_dict(),
             "policy_version": step, "seed": 0}
    batch = {"step": step, "sequences": torch.arange(12).reshape(3, 4), "prompt_uid": ["a:0"],
             "temperature": 1.0, "extra_info": [{"k": (1, 2)}], "score": math.nan}
    meta = {"graph": spec.name, "spec": spec.to_yaml_dict(), "step": step,
            "policy_version": step, "steps": steps}
    return ckpt.save_checkpoint(run, meta, state, {("generate", step): batch},
                                policy_files=files if files is not None else policy_files(spec))


def one_line_naming(err: BaseException, name: str) -> None:
    text = str(err)
    assert "\n" not in text and name in text, text


def test_round_trip_keeps_every_value(tmp_path, spec, policy):
    save(tmp_path, spec, policy)
    loaded = ckpt.load_checkpoint(tmp_path)
    assert loaded.step == 3 and loaded.state["policy_version"] == 3
    for k, v in policy.state_dict().items():
        assert torch.equal(loaded.state["weights"][k], v), k
    opt = loaded.state["optimizer"]
    assert set(opt["state"]) and all(isinstance(k, int) for k in opt["state"])
    batch = loaded.rollout[("generate", 3)]
    assert torch.equal(batch["sequences"], torch.arange(12).reshape(3, 4))
    assert batch["extra_info"] == [{"k": (1, 2)}] and math.isnan(batch["score"])
    assert not list(tmp_path.glob("checkpoint/*.pt")), "no pickle is written"


def test_checkpoint_is_a_hugging_face_model_folder(tmp_path, spec, policy):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = save(tmp_path / "run", spec, policy)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    ids = CharTokenizer().encode_prompt("3+4=")
    assert tok("3+4=")["input_ids"] == ids
    assert tok.decode(ids, skip_special_tokens=True) == "3+4="
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(model(x).logits, policy(x).logits)
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    with torch.no_grad():
        assert torch.equal(exported(x).logits, policy(x).logits)
    assert not (tmp_path / "hf" / "trainer.json").exists()


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    for i in range(0, 8000, 8):
        data[-1 - i] ^= 0x10
    p.write_bytes(bytes(data))


@pytest.mark.parametrize(("name", "damage"), [
    ("model.safetensors", _flip),
    ("model.safetensors", lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])),
    ("model.safetensors", Path.unlink),
    ("trainer.json", lambda p: p.write_text("{garbage")),
    ("meta.json", lambda p: p.write_text("{\"step\": ")),
    ("rollout.safetensors", lambda p: p.write_bytes(b"")),
    ("manifest.json", lambda p: p.write_text("[]")),
])
def test_damaged_checkpoint_is_one_line_naming_the_file(tmp_path, spec, policy, name, damage,
                                                        capsys):
    folder = save(tmp_path, spec, policy, files={})
    damage(folder / name)
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load_checkpoint(tmp_path)
    one_line_naming(err.value, name)
    status = main(["run", str(QUICKSTART), "model.warm_start.steps=0", "--resume",
                   str(tmp_path)])
    out = capsys.readouterr().err
    assert status == 2 and name in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1, out


def test_malicious_pickle_in_a_run_dir_never_runs(tmp_path, spec, policy, capsys):
    import pickle

    marker = tmp_path / MARKER_NAME
    legacy = tmp_path / "legacy"
    (legacy / "checkpoint").mkdir(parents=True)
    (legacy / "checkpoint" / "trainer.pt").write_bytes(pickle.dumps(Boom(str(marker))))
    (legacy / "checkpoint" / "meta.json").write_text(json.dumps({"step": 1}))
    status = main(["run", str(QUICKSTART), "--resume", str(legacy)])
    err = capsys.readouterr().err
    assert status == 2 and "pickle" in err and len(err.strip().splitlines()) == 1, err
    planted = tmp_path / "planted"
    save(planted, spec, policy, files={})
    for name in ("trainer.pt", "rollout.pt", "rollout_cache.pt"):
        (planted / "checkpoint" / name).write_bytes(pickle.dumps(Boom(str(marker))))
    ckpt.load_checkpoint(planted)  # files outside the manifest are never read
    assert not marker.exists(), "a pickle from the run dir was executed"


def test_resume_takes_the_command_line_graph_and_refuses_another(tmp_path, spec, policy,
                                                                 capsys):
    save(tmp_path, spec, policy, step=3, steps=6, files={})
    args = argparse.Namespace(graph=str(QUICKSTART), overrides=["model.warm_start.steps=0"],
                              steps=None, out=None, resume=str(tmp_path), address=None)
    resumed, _, out = prepare(args)
    assert out == tmp_path and resumed.schedule.steps == 6 and args.resumed_step == 3
    args.steps = 12
    assert prepare(args)[0].schedule.steps == 12, "steps are resume-safe"
    with pytest.raises(run_dir.RunDirError, match=r"'algorithm\.kl_coef'.*run: 0\.001"):
        prepare(argparse.Namespace(**{**vars(args), "overrides": [
            "model.warm_start.steps=0", "algorithm.kl_coef=0.5"]}))
    status = main(["run", str(LONGTAIL), "--resume", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and "differs from the run's graph at '" in err
    assert len(err.strip().splitlines()) == 1, err
    status = main(["run", str(QUICKSTART), "model.warm_start.steps=0", "--resume",
                   str(tmp_path), "--steps", "3"])
    captured = capsys.readouterr()
    assert status == 0 and "already complete" in captured.out


def test_run_dirs_are_claimed_once_and_held_by_one_run(tmp_path, monkeypatch):
    go = tmp_path / "go"
    claim = (f"import pathlib, time\nfrom rlgraph.runtime.run_dir import claim_default_dir\n"
             f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.001)\n"
             f"print(claim_default_dir('race', 1e9))")
    runs = [subprocess.Popen([sys.executable, "-c", claim], cwd=tmp_path, text=True,
                             stdout=subprocess.PIPE) for _ in range(8)]
    time.sleep(2)  # every process imported and waits
    go.touch()  # eight runs claim a dir in the same second, at the same moment
    claimed = [proc.communicate(timeout=120)[0].strip() for proc in runs]
    assert all(claimed) and len(set(claimed)) == 8, claimed
    lock = run_dir.hold(tmp_path / "r")
    with pytest.raises(run_dir.RunDirError, match="another rlgraph run"):
        run_dir.hold(tmp_path / "r")
    lock.close()
    run_dir.hold(tmp_path / "r").close()  # free again once the first run ends
    run_dir.mark(tmp_path / "r", "race")
    (tmp_path / "r" / "ledger.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(run_dir.RunDirError, match="--resume"):
        run_dir.refuse_reuse(tmp_path / "r", "race")


def test_full_disk_keeps_the_previous_checkpoint(tmp_path, spec, policy, monkeypatch):
    save(tmp_path, spec, policy, step=2, files={})
    real_open = Path.open

    def full(self, mode="r", *a, **k):
        if "checkpoint.tmp" in str(self) and "w" in mode and self.name == "trainer.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(self, mode, *a, **k)

    monkeypatch.setattr(Path, "open", full)
    with pytest.raises(ckpt.CheckpointError) as err:
        save(tmp_path, spec, policy, step=4, files={})
    one_line_naming(err.value, "No space left on device")
    assert "step 2 stays valid" in str(err.value)
    monkeypatch.setattr(Path, "open", real_open)
    assert ckpt.load_checkpoint(tmp_path).step == 2
    assert not (tmp_path / "checkpoint.tmp").exists()


def test_corrupted_sync_is_caught_by_the_digest():
    from rl_support import make_spec

    from rlgraph.process.workspace import Workspace
    from rlgraph.weights.buckets import WeightSyncError, digest

    spec = make_spec()
    sender, receiver = Workspace(spec, ["train"]), Workspace(spec, ["generate"])
    sent = {"version": 1, "digest": digest(sender.policy.state_dict())}
    for bucket in sender.export_weights(bucket_mb=0.01):
        receiver.receive_bucket(bucket)
    param_update = receiver.worker("param_update")
    param_update.check_digest(sent, "param_update at step 0")  # intact: passes
    next(iter(receiver._buffer.staging.values())).view(-1)[0] += 1.0
    with pytest.raises(WeightSyncError, match="param_update at step 0: the weights of version 1"):
        param_update.check_digest(sent, "param_update at step 0")


def test_join_failures_name_the_cause():
    # the texts Ray 2.60 printed when joining a RAY_AUTH_MODE=token cluster (ray start --head)
    refused = ("[W gcs_client.cc:210] Failed to get cluster ID from GCS server: "
               "Unauthenticated: RPC error: InvalidAuthToken: Authentication token is "
               "missing or incorrect\n") * 20
    lost = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    assert "set RAY_AUTH_MODE=token" in join_failure("a:1", lost, refused, {})
    assert "refused the token from RAY_AUTH_TOKEN" in join_failure(
        "a:1", lost, refused, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "x"})
    missing = RuntimeError("Token authentication is enabled but no authentication token was "
                           "found. Ensure ...")
    assert "no token found here" in join_failure("a:1", missing, "", {"RAY_AUTH_MODE": "token"})
    mismatch = RuntimeError("Version mismatch: The cluster was started with:\n    Ray: 2.50.0\n"
                            "    Python: 3.10.1\nThis process on node 1 was started with:\n"
                            "    Ray: 2.60.0\n    Python: 3.11.2\n")
    text = join_failure("a:1", mismatch, "", {})
    assert "version mismatch (Ray: 2.50.0, Python: 3.10.1 there; Ray: 2.60.0" in text
    assert all("\n" not in join_failure("a:1", e, refused, {}) for e in (lost, mismatch))


def test_a_stale_session_file_is_named_and_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert existing_cluster_note() is None
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")
    assert "stale Ray session file" in existing_cluster_note()
