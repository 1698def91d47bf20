"""Run directories: claimed atomically, held by one run at a time, resumed only by the same graph.

- `claim_default_dir`: `runs/<name>-<time>/` made with an exclusive mkdir (a `-2`, `-3`, ...
  suffix when another run took the name in the same second), so two runs never share one.
- `hold`: an exclusive `flock` on `DIR/run.lock` for the whole run; a second run on the same
  folder is refused in one line (the kernel drops the lock when the process dies, however).
- `check_resume`: `--resume DIR` takes the graph on the command line (never code or spec
  from the run dir); it is compared with the spec the checkpoint was written by and refused,
  naming the first differing key, unless only resume-safe keys differ.
- `export_model`: the Hugging Face model folder of a checkpoint, copied out whole.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from rlgraph.errors import RLGraphError
from rlgraph.runtime import checkpoint as ckpt

LOCK = "run.lock"
RESUME_SAFE = {("schedule", "steps"), ("logging",)}  # keys a resumed run may change
RLGRAPH_FILES = {"meta.json", ckpt.MANIFEST, "trainer.json", "trainer.safetensors",
                 "rollout.json", "rollout.safetensors", "rollout_cache.json",
                 "rollout_cache.safetensors"}


class RunDirError(RLGraphError):
    """A --resume / --out folder that cannot be used."""


def default_run_dir(name: str, now: float | None = None) -> Path:
    """runs/<name>-<YYYYmmdd-HHMMSS>/ (not yet claimed)."""
    safe = re.sub(r"[^\w.-]+", "-", name).strip("-.") or "run"
    return Path("runs") / f"{safe}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"


def claim_default_dir(name: str, now: float | None = None) -> Path:
    """Create a fresh default run dir atomically (never one another run has claimed)."""
    base = default_run_dir(name, now)
    for n in range(1, 10_000):
        folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
        except OSError as exc:
            raise RunDirError(f"cannot create the run dir {folder}: {exc.strerror or exc} "
                              f"(give a writable folder with --out)") from None
    raise RunDirError(f"{base}: 10000 runs of this name in one second; give --out")


def hold(folder: Path) -> Any:
    """Lock `folder` for this process's run; returns the open lock file (keep it open)."""
    import fcntl

    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = (folder / LOCK).open("a+")
    except OSError as exc:
        raise RunDirError(f"cannot write into the run dir {folder}: {exc.strerror or exc} "
                          f"(give a writable folder with --out)") from None
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.seek(0)
        owner = lock.read().strip() or "?"
        lock.close()
        raise RunDirError(f"{folder}: another rlgraph run (pid {owner}) is writing into it; "
                          f"wait for it to end or give another --out") from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def refuse_reuse(folder: Path) -> None:
    """A fresh run must not overwrite the progress of another run in `folder`."""
    ledger = folder / "ledger.jsonl"
    if (folder / ckpt.CHECKPOINT).exists() or (ledger.exists() and ledger.stat().st_size):
        raise RunDirError(f"{folder} holds a run already; continue it with --resume {folder} "
                          f"or give another --out")


def first_difference(saved: Any, given: Any, key: tuple = ()) -> tuple | None:
    """The first key (as a path) where two spec dicts differ, ignoring RESUME_SAFE keys."""
    if key in RESUME_SAFE:
        return None
    if isinstance(saved, dict) and isinstance(given, dict):
        for name in sorted(set(saved) | set(given), key=str):
            if name not in saved or name not in given:
                if (*key, name) not in RESUME_SAFE:
                    return (*key, name)
                continue
            found = first_difference(saved[name], given[name], (*key, name))
            if found is not None:
                return found
        return None
    return None if saved == given else key


def saved_meta(folder: Path) -> dict[str, Any]:
    """meta.json of the run's checkpoint, its files checked against the manifest."""
    paths = ckpt.verified_files(ckpt.checkpoint_folder(folder))
    meta = ckpt.read_json_file(paths["meta.json"])
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
        raise ckpt.CheckpointError(f"{paths['meta.json']}: no integer 'step'; {ckpt.REDO}")
    return meta


def check_resume(folder: Path, spec_data: dict[str, Any], graph: str) -> dict[str, Any]:
    """The checkpoint's meta, after refusing a graph that differs from the run's."""
    if not folder.is_dir():
        raise RunDirError(f"--resume {folder}: not a directory (give the folder a run wrote)")
    meta = saved_meta(folder)
    saved = meta.get("spec")
    if not isinstance(saved, dict):
        raise RunDirError(f"{folder}: its checkpoint does not record the graph it was "
                          f"written by (an older rlgraph); start the run again")
    # compare as JSON would store them (tuples as lists, ...)
    key = first_difference(saved, json.loads(json.dumps(spec_data)))
    if key is not None:
        dotted = ".".join(str(k) for k in key)
        theirs, ours = _at(saved, key), _at(spec_data, key)
        raise RunDirError(f"--resume {folder}: {graph} differs from the run's graph at "
                          f"'{dotted}' (run: {_short(theirs)}, given: {_short(ours)}); resume "
                          f"with the graph and overrides the run started with (only "
                          f"schedule.steps / --steps may change)")
    return meta


def _at(data: Any, key: tuple) -> Any:
    for k in key:
        if not isinstance(data, dict) or k not in data:
            return "<absent>"
        data = data[k]
    return data


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def export_model(source: Path, out: Path) -> list[str]:
    """Copy the Hugging Face model folder of a run's checkpoint (or of a checkpoint folder)
    into `out`, checked against its manifest; returns the file names."""
    folder = source if (source / ckpt.MANIFEST).exists() else ckpt.checkpoint_folder(source)
    paths = ckpt.verified_files(folder)
    names = sorted(n for n in paths if n not in RLGRAPH_FILES)
    if "config.json" not in names:
        raise RunDirError(f"{folder}: no config.json in this checkpoint (written by an older "
                          f"rlgraph); nothing to export")
    if out.exists() and any(out.iterdir()):
        raise RunDirError(f"{out}: exists and is not empty; give a new folder")
    tmp = out.with_name(out.name + ".tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in names:
            shutil.copyfile(paths[name], tmp / name)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RunDirError(f"cannot write {out}: {exc.strerror or exc}") from None
    return names
